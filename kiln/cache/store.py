"""The local store: blobs by sha256 and action entries, plain files under one directory.

Layout: ``cas/ab/<digest>`` holds bytes whose sha256 is ``<digest>``;
``ac/cd/<key>.json`` maps an action key to its output digests. Every write
is atomic (temp file + rename, or a hard link made under its final name),
so concurrent builds sharing the directory never see half an object, and
two writers of one key write the same bytes.

A blob and the build artifact holding the same bytes share one file (a
hard link) where both live on one file system: a clean clone then writes
each artifact once, not twice. Two rules keep that safe. Every blob read
is hashed, so a blob changed through its other name (an artifact edited in
place) is dropped, never returned. And a blob's mtime is never touched,
since it is also the artifact's, which doit compares: a read touches the
action entry instead, and ``gc`` drops the least recently used entries and
the blobs no entry left needs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kiln.fsutil import holds, stat_identity, write_bytes_atomic
from kiln.tempnames import temp_path

# link(2) failures that mean "no hard links between these two places" (others, such as
# EMLINK or a protected_hardlinks EPERM, are about one file: copy it, link the next)
_NO_LINKS = {errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP}
# An identity (size, mtime, inode) read this close to the file's mtime may miss a
# same-size write in the same tick of a coarse file system clock (ext4 and tmpfs
# before Linux 6.13 tick every few ms): such a file is compared by content instead.
RACY_NS = 2_000_000_000
# The output names an action entry may hold: one primary output (a stage's
# artifact, a test report, an IREE module) and, beside an artifact, side
# artifacts "side/<file name>" written next to it.
PRIMARY_OUTPUTS = ("artifact", "report", "vmfb")
SIDE_PREFIX = "side/"
# A whole stage chain's entry (tasks/dag/chain_action.py): its stages' records, and its files
# "file/<path inside the instance's out dir>", a few plain components deep
CHAIN_RECORD = "record"
FILE_PREFIX = "file/"
MAX_FILE_DEPTH = 4
# A file holding a blob's very bytes: (path, (size, mtime_ns, inode) as it was read or written)
FileSource = tuple[str, tuple[int, int, int]]
_DIGEST = re.compile(r"[0-9a-f]{64}")
_PLAIN_FILE = re.compile(r"[^/\\\x00]{1,255}")  # one path component, nothing that climbs


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_cache_dir() -> Path:
    """$KILN_CACHE_DIR, else ~/.cache/kiln; ``~`` expanded, as a CI file's env: block leaves it."""
    return Path(os.environ.get("KILN_CACHE_DIR") or "~/.cache/kiln").expanduser()


@dataclass
class StoreSize:
    entries: int
    blobs: int
    bytes: int
    shared: int = 0  # bytes of blobs that are also a build's artifacts (hard links)


class LocalStore:
    """Blobs and action entries under ``root`` (``<KILN_CACHE_DIR>/store``)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        # the hot paths build file names as strings: pathlib costs more than the I/O here
        self._cas = os.path.join(root, "cas")
        self._ac = os.path.join(root, "ac")
        # blobs this process wrote or verified, by digest: (path, identity then, when);
        # a link to one is trusted while its file still has that identity (see ``place``)
        self._known: dict[str, tuple[str, tuple[int, int, int], int]] = {}
        self.links = True  # False once the file system refused a hard link: copy instead

    def blob_path(self, digest: str) -> Path:
        return Path(self._blob_file(digest))

    def action_path(self, key: str) -> Path:
        return Path(self._action_file(key))

    def _blob_file(self, digest: str) -> str:
        return f"{self._cas}/{digest[:2]}/{digest}"

    def _action_file(self, key: str) -> str:
        return f"{self._ac}/{key[:2]}/{key}.json"

    # -- blobs ---------------------------------------------------------------
    def get_blob(self, digest: str) -> bytes | None:
        """The bytes stored under ``digest``, or None; a damaged blob is dropped, never returned."""
        path = self._blob_file(digest)
        try:
            with open(path, "rb") as f:
                identity = stat_identity(os.fstat(f.fileno()))
                data = f.read()
        except OSError:
            return None
        if sha256(data) != digest:
            _unlink(path)
            return None
        self._known[digest] = (path, identity, time.time_ns())
        return data

    def put_blob(
        self,
        data: bytes,
        digest: str | None = None,
        source: FileSource | None = None,
    ) -> str:
        """Store ``data``; ``digest`` is its sha256 when the caller has just verified it.

        ``source``: (path, identity) of a file that held exactly ``data`` when
        it had that identity (an artifact just written or read): the blob is
        then a hard link to it, checked to be that very file, not a copy.
        """
        digest = digest or sha256(data)
        path = self._blob_file(digest)
        try:
            if stat.S_ISREG(os.stat(path).st_mode):
                return digest
            _remove_squatter(path)  # a directory (made by hand) in the blob's place
        except OSError:
            pass
        if source is not None and self.links:
            linked = self._link_in(source, path)
            if linked is not None:
                if linked:
                    self._known[digest] = (path, source[1], time.time_ns())
                return digest  # linked, or another writer stored it first
        write_bytes_atomic(path, data)
        try:
            self._known[digest] = (path, stat_identity(os.stat(path)), time.time_ns())
        except OSError:
            pass
        return digest

    def _link_in(self, source: FileSource, path: str) -> bool | None:
        """Make ``path`` a hard link to ``source``'s file if it still is the file it was.

        True: linked; False: stored by another writer first; None: not linked.
        """
        try:
            try:
                os.link(source[0], path)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.link(source[0], path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in _NO_LINKS:
                self.links = False
            return None
        try:
            same = stat_identity(os.stat(path)) == source[1]
        except OSError:
            same = False
        if not same:  # replaced since it was read: the link may hold other bytes
            _unlink(path)
            return None
        return True

    def place(self, digest: str, target: str, data: bytes) -> bool:
        """Write ``data`` (whose sha256 is ``digest``) to ``target`` atomically.

        A hard link to the blob when this process wrote or verified it and
        its file is unchanged since, else a plain write; ``target`` is left
        alone (mtime too) when it already holds ``data``. True when written.
        """
        known = self._known.get(digest) if self.links else None
        if known is None:
            return write_bytes_atomic(target, data)
        blob, identity, seen_at = known
        try:
            current = os.lstat(target)  # a symlink is replaced, never kept (write_bytes_atomic)
        except OSError:
            current = None
        if current is not None and stat.S_ISREG(current.st_mode) and current.st_size == len(data):
            if stat_identity(current) == identity or holds(target, data):
                return False  # already that very file, or those very bytes
        head = os.path.dirname(target)
        tmp = temp_path(target)
        try:
            try:
                os.link(blob, tmp)
            except FileNotFoundError:
                if not os.path.exists(blob):
                    raise
                os.makedirs(head or ".", exist_ok=True)
                os.link(blob, tmp)
            if stat_identity(os.stat(tmp)) != identity or (
                seen_at - identity[1] < RACY_NS and not holds(tmp, data)
            ):
                raise FileNotFoundError(blob)  # the blob changed since: not that file
            os.replace(tmp, target)
            return True
        except OSError as exc:
            _unlink(tmp)
            if exc.errno in _NO_LINKS:
                self.links = False
            return write_bytes_atomic(target, data)
        except BaseException:  # Ctrl-C: no temp file left behind
            _unlink(tmp)
            raise

    # -- action entries --------------------------------------------------------
    def get_action(self, key: str) -> dict[str, str] | None:
        """Output name -> digest recorded for ``key``, or None (unknown or unreadable)."""
        path = self._action_file(key)
        try:
            with open(path, "rb") as f:
                outputs = parse_action_entry(f.read())
        except OSError:
            return None
        if outputs is None:
            _unlink(path)
            return None
        _touch(path)
        return outputs

    def put_action(self, key: str, outputs: dict[str, str]) -> None:
        path = self._action_file(key)
        try:
            write_bytes_atomic(path, action_entry(outputs))
        except IsADirectoryError:  # a directory (made by hand) in the entry's place
            _remove_squatter(path)
            write_bytes_atomic(path, action_entry(outputs))

    def lookup(self, key: str) -> dict[str, bytes] | None:
        """The outputs of ``key``, all present and verified, or None."""
        outputs = self.get_action(key)
        if outputs is None:
            return None
        found = {}
        for name, digest in outputs.items():
            data = self.get_blob(digest)
            if data is None:
                return None
            found[name] = data
        return found

    def store(
        self,
        key: str,
        outputs: dict[str, bytes],
        digests: dict[str, str] | None = None,
        sources: dict[str, FileSource] | None = None,
    ) -> dict[str, str]:
        """Store the outputs of ``key``; ``digests``: theirs by name, when already verified.

        ``sources``: by name, (path, identity) of files holding those very
        bytes, to link rather than copy (see ``put_blob``).
        """
        known = digests or {}
        files = sources or {}
        digests = {
            name: self.put_blob(data, known.get(name), files.get(name))
            for name, data in outputs.items()
        }
        self.put_action(key, digests)
        return digests

    # -- maintenance -----------------------------------------------------------
    def files(self, kind: str) -> list[Path]:
        base = self.root / kind
        if not base.is_dir():
            return []
        return [p for p in base.glob("*/*") if p.is_file() and not p.name.startswith(".")]

    def size(self) -> StoreSize:
        blobs = [st for p in self.files("cas") if (st := _stat(p)) is not None]
        actions = self.files("ac")
        total = sum(st.st_size for st in blobs) + sum(_size(p) for p in actions)
        shared = sum(st.st_size for st in blobs if st.st_nlink > 1)
        return StoreSize(entries=len(actions), blobs=len(blobs), bytes=total, shared=shared)

    def gc(self, max_bytes: int) -> tuple[int, int]:
        """Drop least recently used action entries until the store fits ``max_bytes``.

        Returns (files removed, bytes freed). A blob goes with the last entry
        that names it; blobs no entry names (a build storing right now, or
        left by a killed one) take their turn by their own age. An entry
        whose blob is gone is only a miss, so the order is always safe.
        """
        shutil.rmtree(self.root / "breakers", ignore_errors=True)  # past builds' markers
        blobs = {p.name: (p, st) for p in self.files("cas") if (st := _stat(p)) is not None}
        entries = []
        for path in self.files("ac"):
            st = _stat(path)
            if st is None:
                continue
            try:
                outputs = parse_action_entry(path.read_bytes()) or {}
            except OSError:
                outputs = {}
            entries.append((st.st_mtime_ns, 1, path, st, set(outputs.values())))
        needed = Counter(d for *_, digests in entries for d in digests)
        orphans = [
            (st.st_mtime_ns, 0, p, st, set()) for d, (p, st) in blobs.items() if d not in needed
        ]
        total = sum(st.st_size for _, st in blobs.values()) + sum(e[3].st_size for e in entries)
        removed = freed = 0
        for _, _, path, st, digests in sorted(entries + orphans, key=lambda e: (e[0], e[1])):
            if total <= max_bytes:
                break
            dropped = [(path, st)]
            for digest in digests:
                needed[digest] -= 1
                if needed[digest] == 0 and digest in blobs:
                    dropped.append(blobs.pop(digest))
            for file, file_st in dropped:
                _unlink(file)
                total -= file_st.st_size
                removed += 1
                freed += file_st.st_size
        return removed, freed

    def verify(self) -> tuple[int, list[str]]:
        """Re-hash every blob and parse every entry; drop the bad ones. (checked, dropped)."""
        checked, dropped = 0, []
        for kind in ("cas", "ac"):  # what is neither a file nor a link to one is in the way
            base = self.root / kind
            for path in base.glob("*/*") if base.is_dir() else ():
                if not path.is_file() and not path.is_symlink():
                    checked += 1
                    _remove_squatter(path)
                    dropped.append(str(path))
        for path in self.files("cas"):
            checked += 1
            try:
                ok = sha256(path.read_bytes()) == path.name
            except OSError:
                ok = False
            if not ok:
                _unlink(path)
                dropped.append(str(path))
        for path in self.files("ac"):
            checked += 1
            try:
                ok = parse_action_entry(path.read_bytes()) is not None
            except OSError:
                ok = False
            if not ok:
                _unlink(path)
                dropped.append(str(path))
        return checked, dropped


def action_entry(outputs: dict[str, str]) -> bytes:
    return json.dumps({"outputs": outputs}, sort_keys=True).encode()


def parse_action_entry(raw: bytes) -> dict[str, str] | None:
    """The outputs of an action entry, or None when it is not one of ours.

    An entry comes from whoever can write the team cache: its digests must be
    digests (one names a file under ``cas/``, which a damaged blob deletes) and
    its output names ones Kiln writes (a side output's name becomes a file
    name next to the artifact).
    """
    try:
        outputs = json.loads(raw)["outputs"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(outputs, dict) or not outputs:
        return None
    for name, digest in outputs.items():
        if not (isinstance(digest, str) and _DIGEST.fullmatch(digest) and _output_name_ok(name)):
            return None
    if CHAIN_RECORD in outputs:
        return outputs if all(_is_chain_output(name) for name in outputs) else None
    primary = [name for name in outputs if name in PRIMARY_OUTPUTS]
    side = len(outputs) - len(primary)
    if len(primary) != 1 or (side and primary[0] != "artifact"):
        return None
    return outputs


def _is_chain_output(name: str) -> bool:
    if name == CHAIN_RECORD:
        return True
    if not name.startswith(FILE_PREFIX):
        return False
    parts = name[len(FILE_PREFIX) :].split("/")
    return len(parts) <= MAX_FILE_DEPTH and all(
        p not in (".", "..") and _PLAIN_FILE.fullmatch(p) is not None for p in parts
    )


def _output_name_ok(name: str) -> bool:
    if name in PRIMARY_OUTPUTS or _is_chain_output(name):
        return True
    if not name.startswith(SIDE_PREFIX):
        return False
    file = name[len(SIDE_PREFIX) :]
    return file not in (".", "..") and _PLAIN_FILE.fullmatch(file) is not None


def _touch(path: str | os.PathLike) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _remove_squatter(path: str | os.PathLike) -> None:
    """Remove whatever is at ``path`` (a directory too), never through a link."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        _unlink(path)


def _unlink(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _size(path: Path) -> int:
    st = _stat(path)
    return 0 if st is None else st.st_size


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None
