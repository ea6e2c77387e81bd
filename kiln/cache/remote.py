"""The remote store: the same layout as the local one, at any fsspec URL.

Every call runs under a deadline (but for a directory on a local disk,
which cannot hang: kiln/cache/local_disk.py) and a circuit breaker: the
first failure (server down, permission denied, timeout) prints one warning
and turns the remote off for the rest of the build, which goes on locally.
Fetched blobs are verified against their digest; a bad object is reported
once, naming the key, and never used.
"""

from __future__ import annotations

import os
import queue
import secrets
import threading
import time

from kiln.cache.local_disk import on_local_disk
from kiln.cache.store import action_entry, parse_action_entry, sha256
from kiln.errors import KilnError
from kiln.logconfig import warn

DISTRIBUTED_EXTRA = "pip install 'kiln-kernels[distributed]'"
# Backends whose single PUT is atomic: no temp key needed.
ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}


def open_filesystem(url: str, timeout: float):
    """(filesystem, root path) for ``url``; a missing fsspec is one clear error."""
    try:
        import fsspec
    except ImportError:
        raise KilnError(
            f"the remote cache {url!r} needs fsspec, which is not installed",
            hint=DISTRIBUTED_EXTRA,
        ) from None
    options: dict = {}
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get("KILN_S3_ENDPOINT_URL")
        options = {
            "config_kwargs": {
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"max_attempts": 1},
            },
        }
        if endpoint:
            options["endpoint_url"] = endpoint
        # a fresh client per process: s3fs sessions do not survive a fork
        options["skip_instance_cache"] = True
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise KilnError(
            f"the remote cache {url!r} needs a filesystem package that is not installed: {exc}",
            hint=DISTRIBUTED_EXTRA,
        ) from None
    except ValueError as exc:
        raise KilnError(f"bad remote cache URL {url!r}: {exc}") from None
    return fs, root.rstrip("/"), protocol


def shared_breaker(directory: str, url: str) -> str | None:
    """The marker file that trips the breaker in every process of this build (-n N).

    Named by ``KILN_BUILD_ID``, which the `kiln` command sets for its
    worker processes; without it each process keeps its own breaker.
    """
    build = os.environ.get("KILN_BUILD_ID")
    if not build or not directory:
        return None
    return os.path.join(directory, "breakers", f"{build}-{sha256(url.encode())[:16]}")


def claim(path: str) -> bool:
    """Create ``path`` if nobody has: True for the one process that did."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True


class DeadlineCaller:
    """Runs calls on one long-lived daemon thread and waits for each at most a deadline.

    A backend stuck past the deadline (a dead NFS server) keeps that thread,
    which is abandoned and cannot hold up the exit; the next call gets a new one.
    """

    def __init__(self):
        self._jobs: queue.SimpleQueue | None = None

    def call(self, fn, args: tuple, timeout: float, progress: list | None = None) -> dict | None:
        """{"value": ...} or {"error": exc}; None when no answer came in time.

        ``progress``: a one-item list where ``fn`` puts ``time.monotonic()``
        after each step of a call made of several reads; the deadline then
        runs from the last step, so each read gets ``timeout``, not the whole.
        One caller per calling thread: calls through it never overlap.
        """
        done = threading.Event()
        outcome: dict = {}
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(self._jobs,), name="kiln-remote-cache", daemon=True
            ).start()
        jobs = self._jobs
        last_step = progress or [time.monotonic()]
        jobs.put((fn, args, outcome, done))
        while not done.wait(max(last_step[0] + timeout - time.monotonic(), 0.0)):
            if time.monotonic() >= last_step[0] + timeout:
                self._jobs = None  # that thread is stuck: leave it behind
                jobs.put(None)  # and let it end if it ever comes back
                return None
        return outcome


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, args, outcome, done = job
        outcome.update(call_outcome(fn, args, BaseException))  # all of it, to the caller
        done.set()


def call_outcome(fn, args: tuple, catch: type[BaseException] = Exception) -> dict:
    """``{"value": fn(*args)}``, or ``{"error": exc}`` for an exception of ``catch``."""
    try:
        return {"value": fn(*args)}
    except catch as exc:
        return {"error": exc}


class RemoteStore:
    """Blobs and action entries at an fsspec URL, behind a deadline and a circuit breaker."""

    def __init__(
        self, url: str, *, upload: bool = True, timeout: float = 10.0, breaker_dir: str = ""
    ):
        self.url = url
        self.breaker = shared_breaker(breaker_dir, url)
        self.upload = upload
        self.timeout = timeout
        self.broken = False
        self.warned_keys: set[str] = set()
        self.fetched_bytes = 0
        self.uploaded_bytes = 0
        self._lock = threading.Lock()
        self._callers = threading.local()  # one serving thread per calling thread
        self.fs, self.root, self.protocol = None, "", url.split("://", 1)[0]
        self.local_disk = False  # a directory on this machine's disk: called here, no deadline
        self._open()

    def _open(self) -> None:
        """Make the filesystem client under the deadline: some backends connect right away.

        A URL no fsspec backend here can open (pipeline.yaml's is checked
        when it loads; KILN_REMOTE_CACHE's only for its form, see
        ``check_remote_url``) is the remote being unusable, as is a server
        that refuses or does not answer: one warning, and a local build.
        """
        outcome = DeadlineCaller().call(open_filesystem, (self.url, self.timeout), self.timeout)
        if outcome is None:
            self._trip(f"no answer within {self.timeout:g} s while connecting")
        elif isinstance(outcome.get("error"), KilnError):  # a protocol fsspec cannot open
            self._trip(outcome["error"].message)
        elif "error" in outcome:
            error = outcome["error"]
            self._trip(f"{type(error).__name__} while connecting: {error}")
        else:
            self.fs, self.root, self.protocol = outcome["value"]
            self.local_disk = self.protocol == "file" and on_local_disk(self.root)

    def _call(self, what: str, fn, *args, progress: list | None = None, writing: bool = False):
        """fn(*args) within the deadline; on any failure trip the breaker and return None.

        ``progress``: see ``DeadlineCaller.call`` (a call of several reads).
        A missing file is a miss when reading; ``writing``, it is a missing
        bucket or root (s3fs says NoSuchBucket so), and the remote is down.

        The call runs on a daemon thread: a backend stuck past the deadline
        (a dead NFS server) is abandoned and cannot hold up the exit. A
        directory on a local disk is read here (``local_disk``): it cannot hang.
        """
        if self.broken:
            return None
        if self.breaker is not None and os.path.exists(self.breaker):
            self.broken = True  # another process of this build found the remote down
            return None
        if self.local_disk:  # a directory on a local disk: a read cannot hang (local_disk.py)
            outcome = call_outcome(fn, args)  # Ctrl-C goes on up, as from the caller's wait
        else:
            caller = getattr(self._callers, "caller", None)
            if caller is None:
                caller = self._callers.caller = DeadlineCaller()
            outcome = caller.call(fn, args, self.timeout, progress)
        if outcome is None:
            self._trip(f"no answer within {self.timeout:g} s while {what}")
            return None
        error = outcome.get("error")
        if error is None:
            return outcome.get("value")
        if isinstance(error, FileNotFoundError) and not writing:
            return None
        self._trip(f"{type(error).__name__} while {what}: {error}")
        return None

    def _trip(self, reason: str) -> None:
        with self._lock:
            if self.broken:
                return
            self.broken = True
        if self.breaker is not None and not claim(self.breaker):
            return  # another process of this build has warned already
        warn(
            f"remote cache {self.url} is unavailable ({reason}); "
            "building locally without it for the rest of this build"
        )

    def _bad_object(self, key: str, why: str) -> None:
        if key not in self.warned_keys:
            self.warned_keys.add(key)
            warn(f"remote cache object for action {key} is {why}; ignored, rebuilding locally")

    def _path(self, kind: str, name: str) -> str:
        return f"{self.root}/{kind}/{name[:2]}/{name}"

    def lookup(self, key: str) -> dict[str, bytes] | None:
        """The verified outputs of ``key`` from the remote, or None."""
        found = self.lookup_verified(key)
        return None if found is None else found[0]

    def lookup_verified(self, key: str) -> tuple[dict[str, bytes], dict[str, str]] | None:
        """(outputs, their digests by name) of ``key``, every blob checked; or None."""
        progress = [time.monotonic()]
        read = self._call(f"reading action {key}", self._read, key, progress, progress=progress)
        if read is None or read[0] is False:
            return None
        outputs, blobs = read
        found = self._verified(key, outputs, blobs)
        return None if found is None else (found, outputs)

    def _verified(
        self, key: str, outputs: dict[str, str] | None, blobs: dict[str, bytes]
    ) -> dict[str, bytes] | None:
        """The outputs of ``key``'s entry, each blob checked against its digest; or None."""
        if outputs is None:
            self._bad_object(key, "not a Kiln action entry")
            return None
        found = {}
        for name, digest in outputs.items():
            data = blobs.get(digest)
            if data is None:
                if not self.broken:
                    self._bad_object(key, f"missing its output {name!r}")
                return None
            if sha256(data) != digest:
                self._bad_object(key, f"corrupt (output {name!r} does not match digest {digest})")
                return None
            found[name] = data
        with self._lock:  # pool and Dask builds look up from threads side by side
            self.fetched_bytes += sum(len(data) for data in found.values())
        return found

    def _read(
        self, key: str, progress: list
    ) -> tuple[dict[str, str] | None | bool, dict[str, bytes]]:
        """(output name -> digest, digest -> bytes) of ``key``'s entry; (False, {}): none.

        None for an entry that is not one of Kiln's. Each read sets
        ``progress[0]``: the deadline is per read, not for the whole lookup.
        """
        try:
            outputs = parse_action_entry(self.fs.cat_file(self._path("ac", key)))
        except FileNotFoundError as exc:
            if _no_bucket(exc):  # not a miss: the cache would stay empty without a word
                raise MissingBucket(str(exc)) from None
            return False, {}
        except IsADirectoryError:  # one damaged object, not the remote: reported by key
            return None, {}
        progress[0] = time.monotonic()
        if outputs is None:
            return None, {}
        paths = [self._path("cas", d) for d in sorted(set(outputs.values()))]
        return outputs, self._read_blobs(paths, progress) if paths else {}

    def _read_blobs(
        self, paths: list[str], progress: list | None = None
    ) -> dict[str, bytes | None]:
        """digest -> bytes of every blob, in one call (concurrent on async backends).

        Keyed by the file name, the digest: backends may normalize the paths
        they return. A missing blob is absent or None. ``progress``: set after
        each read where the backend reads one blob after the other (see
        ``DeadlineCaller.call``).
        """
        if len(paths) == 1 or (progress is not None and not getattr(self.fs, "async_impl", False)):
            found = {}
            for path in paths:
                try:
                    found[path] = self.fs.cat_file(path)
                except (FileNotFoundError, IsADirectoryError):  # its action is reported
                    continue
                if progress is not None:
                    progress[0] = time.monotonic()
        else:
            found = self.fs.cat(paths, on_error="return")
        blobs = {}
        for path, data in found.items():
            if isinstance(data, (FileNotFoundError, IsADirectoryError)):
                continue
            if isinstance(data, BaseException):
                raise data
            blobs[path.rstrip("/").rsplit("/", 1)[-1]] = data
        return blobs

    def store(self, key: str, outputs: dict[str, bytes], digests: dict[str, str]) -> int:
        """Upload the outputs, then the entry naming them: no reader sees a dangling entry.

        Returns the blob bytes sent (a blob the remote holds already is not sent again).
        """
        if not self.upload or self.broken:
            return 0
        sent = 0
        for name, data in outputs.items():
            path = self._path("cas", digests[name])
            what = f"uploading {name} of {key}"
            written = self._call(what, self._put, path, data, True, writing=True)
            if written is None:
                return sent
            sent += written
        with self._lock:
            self.uploaded_bytes += sent
        entry = action_entry(digests)
        what = f"uploading action {key}"
        self._call(what, self._put, self._path("ac", key), entry, False, writing=True)
        return sent

    def has_action(self, key: str) -> bool | None:
        """Whether the remote holds an entry for ``key``; None when the remote is unavailable."""
        if self.fs is None:  # never opened (a protocol no backend here knows): unavailable
            return None
        return self._call(f"looking for action {key}", self.fs.exists, self._path("ac", key))

    def _put(self, path: str, data: bytes, skip_if_present: bool) -> int:
        """Write ``data`` at ``path`` atomically; the bytes written (0: a valid blob was there)."""
        if skip_if_present and key_is_valid_blob(self.fs, path):
            return 0
        parent = path.rsplit("/", 1)[0]
        if self.protocol in ATOMIC_PUT:
            self.fs.pipe_file(path, data)
            return len(data)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.{path.rsplit('/', 1)[1]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        self.fs.pipe_file(tmp, data)
        try:
            self.fs.mv(tmp, path)
        except Exception:
            try:
                self.fs.rm_file(tmp)
            finally:
                raise
        return len(data)

    def close(self) -> None:
        """Nothing to release: calls run on their own daemon threads."""


class MissingBucket(OSError):
    """The remote's bucket does not exist (a misspelt URL): the remote is unusable."""


def _no_bucket(exc: FileNotFoundError) -> bool:
    # s3fs and gcsfs turn NoSuchBucket into FileNotFoundError, keeping the service's words
    text = str(exc).lower()
    return "nosuchbucket" in text or "bucket does not exist" in text


def key_is_valid_blob(fs, path: str) -> bool:
    """Whether the blob at ``path`` exists with the right bytes (a bad one gets overwritten)."""
    try:
        return sha256(fs.cat_file(path)) == path.rsplit("/", 1)[1]
    except FileNotFoundError:
        return False
    except IsADirectoryError:  # a directory squatting on the blob's name: make room
        fs.rm(path, recursive=True)
        return False
