"""One build's view of the cache: the local store, the remote behind it, and counters.

A process keeps one session per configuration, so the circuit breaker and
"warned once" state last for the whole build in that process.
"""

from __future__ import annotations

import json
import threading

from kiln.cache.config import CacheConfig
from kiln.cache.store import FileSource, LocalStore
from kiln.fsutil import write_bytes_atomic

HIT, FETCHED, COMPILED = "hit", "fetched", "compiled"
_sessions: dict[CacheConfig, CacheSession] = {}
_lock = threading.Lock()


class CacheSession:
    def __init__(self, config: CacheConfig):
        self.config = config
        self.local = LocalStore(config.local_dir)
        self.remote = None
        if config.remote:
            from kiln.cache.remote import RemoteStore

            self.remote = RemoteStore(
                config.remote,
                upload=config.upload,
                timeout=config.timeout,
                breaker_dir=config.local_dir,
            )
        # keys whose outputs were built in this build by a remote executor: compiled, not hits
        self.produced: set[str] = set()
        self.warned_unwritable = False
        self._lock = threading.Lock()
        # fetched ahead into the local store (tasks/prefetch.py): fetches when found, not hits
        self.prefetched: set[str] = set()
        self.missing_remotely: set[str] = set()  # keys a walk found nowhere: not asked again
        # fetched with keep=False, by key: (output digests, the outputs themselves) until
        # keep_written stores them
        self.unkept: dict[str, tuple[dict[str, str], dict[str, bytes]]] = {}
        self.prefetcher = None
        self._claimed: set[str] = set()  # chains tasks took before the prefetcher started

    def lookup(self, key: str, *, keep: bool = True) -> tuple[dict[str, bytes] | None, str]:
        """(outputs, how): from the local store (hit), the remote (fetched), or None.

        ``keep`` False: a fetched action is not stored locally yet; it waits
        in ``unkept`` for ``keep_written`` (see there).
        """
        found = self.local.lookup(key)
        if found is not None:
            return found, self._how_stored(key)
        if self.remote is not None and key not in self.missing_remotely:
            fetched = self.remote.lookup_verified(key)
            if fetched is not None:
                self._fetched(key, *fetched, keep=keep)
                return fetched[0], FETCHED
        return None, COMPILED

    def lookup_run(
        self, key: str, next_key, *, keep: bool = True
    ) -> list[tuple[str, dict[str, bytes], str]]:
        """[(key, outputs, how)] of ``key``, then of the actions after it fetched in the same trip.

        A local hit is ``key`` alone. On a local miss the remote gives the
        run of actions that follow (``RemoteStore.lookup_run``), all kept
        locally (``keep`` False: see ``lookup``). Empty: ``key`` is in
        neither store.
        """
        found = self.local.lookup(key)
        if found is not None:
            return [(key, found, self._how_stored(key))]
        return [
            (fetched, outputs, FETCHED)
            for fetched, outputs, _ in self.fetch_run(key, next_key, keep=keep)
        ]

    def fetch_run(
        self, key: str, next_key, *, ahead: bool = False, keep: bool = True
    ) -> list[tuple[str, dict[str, bytes], dict[str, str]]]:
        """The remote's run of actions from ``key`` (RemoteStore.lookup_run), kept locally.

        The action the run stopped at is one the remote lacks (or holds
        damaged): it is not asked for again this build. ``ahead``: fetched
        ahead of its task (tasks/prefetch.py). ``keep``: see ``lookup``.
        """
        if self.remote is None or key in self.missing_remotely:
            return []
        run = self.remote.lookup_run(key, next_key)
        for fetched, outputs, digests in run:
            if ahead:
                self.keep_prefetched(fetched, outputs, digests)
            else:
                self._fetched(fetched, outputs, digests, keep=keep)
        if not self.remote.broken:
            after = next_key(len(run), run[-1][2]) if run else key
            if after is not None:
                self.missing_remotely.add(after)
        return run

    def _how_stored(self, key: str) -> str:
        if key in self.produced:
            return COMPILED
        return FETCHED if key in self.prefetched else HIT

    def _fetched(
        self, key: str, found: dict[str, bytes], digests: dict[str, str], *, keep: bool
    ) -> None:
        """Copy a fetched action into the local store, or hold it back for ``keep_written``.

        Kept before its artifacts are written, its blobs become the
        artifacts' files too (hard links, see LocalStore.place). Copying
        them on a thread behind the build, as plain files, cost a clean
        clone more than either way.
        """
        if keep:
            self._keep(key, found, digests)
        else:
            with self._lock:
                self.unkept[key] = (digests, found)

    def held_back(self, key: str, outputs: dict[str, bytes]) -> dict[str, str] | None:
        """The digests of ``outputs`` when they are the fetched action held back under ``key``.

        None for any other outputs, such as a local hit for the same key
        after a held-back action was never written: only the very bytes
        fetched and verified may become the blobs of the files written.
        """
        held = self.unkept.get(key)
        return held[0] if held is not None and held[1] is outputs else None

    def keep_written(
        self,
        key: str,
        found: dict[str, bytes],
        sources: dict[str, FileSource] | None = None,
    ) -> None:
        """Store a fetched action held back by ``keep=False``, its artifacts now written.

        ``sources``: by output name, (path, identity) of the files just
        written with those very bytes: the blobs become hard links to them
        (LocalStore.put_blob), so a clean clone writes each artifact once
        and stores it for a link. Nothing for a key not held back (a hit).
        """
        with self._lock:
            held = self.unkept.pop(key, None)
        if held is None:
            return
        digests, fetched = held
        if fetched is not found:  # other bytes were written: store the fetched ones, copied
            sources = None
        self._keep(key, fetched, digests, sources)

    def keep_prefetched(self, key: str, found: dict[str, bytes], digests: dict[str, str]) -> None:
        """Store an action fetched ahead of its task (on a prefetch thread: at once)."""
        self.prefetched.add(key)  # first: a lookup that finds it stored counts a fetch
        self._keep(key, found, digests)

    def claim(self, chain: str | None) -> None:
        """A task is about to look up the chain named ``chain``: the prefetcher leaves it."""
        if chain is None:
            return
        with self._lock:
            prefetcher = self.prefetcher
            if prefetcher is None:
                self._claimed.add(chain)
                return
        prefetcher.claim(chain)  # outside the lock: it may wait for the chain's walk

    def prefetch(self, make) -> None:
        """Start ``make(chains already claimed)``, the build's prefetcher, once."""
        with self._lock:
            if self.prefetcher is None:
                self.prefetcher = make(set(self._claimed))

    def flush(self) -> None:
        """Stop fetching ahead: every walk under way has put its actions in the local store."""
        with self._lock:
            prefetcher, self.prefetcher = self.prefetcher, None
        if prefetcher is not None:
            prefetcher.stop()

    def _keep(
        self,
        key: str,
        found: dict[str, bytes],
        digests: dict[str, str],
        sources: dict[str, FileSource] | None = None,
    ) -> None:
        try:
            self.local.store(key, found, digests, sources)  # verified on fetch: not hashed again
        except OSError as exc:
            self.store_failed(exc)
        except Exception as exc:  # a copy the build can do without: never stop the writer
            from kiln.logconfig import get_logger

            get_logger("cache").warning("could not keep action %s locally: %s", key, exc)

    def store(
        self,
        key: str,
        outputs: dict[str, bytes],
        sources: dict[str, FileSource] | None = None,
    ) -> None:
        """Store outputs just built; ``sources``: files holding them (see LocalStore.store)."""
        digests = self.local.store(key, outputs, sources=sources)
        if self.remote is not None:
            self.remote.store(key, outputs, digests)

    def store_failed(self, exc: OSError) -> None:
        """Say once per process that the local store cannot be written; the build goes on."""
        if self.warned_unwritable:
            return
        self.warned_unwritable = True
        from kiln.logconfig import warn

        # on the real stderr: a logger's message from inside an action went to doit's capture
        warn(
            f"the artifact cache {self.config.local_dir} cannot be written "
            f"({exc.strerror or exc}): building without storing; set KILN_CACHE_DIR "
            "to a writable directory, or KILN_CACHE=0 to turn it off"
        )


def session_for(config: CacheConfig) -> CacheSession:
    # a frozen dataclass is its own key: hashing it costs far less than listing its fields
    found = _sessions.get(config)
    if found is not None:
        return found
    with _lock:
        found = _sessions.get(config)
        if found is None:
            found = _sessions[config] = CacheSession(config)
        return found


def flush_sessions() -> None:
    """Finish every session's background writes (before reporting what the build did)."""
    for session in list(_sessions.values()):
        session.flush()


def write_last_build(local_dir: str, counts: dict) -> None:
    """What the last build did with the cache, for ``kiln cache stats``."""
    from pathlib import Path

    path = Path(local_dir) / "last-build.json"
    write_bytes_atomic(path, json.dumps(counts, sort_keys=True).encode())
