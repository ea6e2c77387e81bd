"""The local store: blobs by sha256 and action entries, plain files under one directory.

Layout: ``cas/ab/<digest>`` holds bytes whose sha256 is ``<digest>``;
``ac/cd/<key>.json`` maps an action key to its output digests. Every write
is atomic (temp file + rename),
so concurrent builds sharing the directory never see half an object, and
two writers of one key write the same bytes.

Every blob is a file of its own, never shared with an out dir's artifact:
an artifact edited in place (an editor saving ``kernel.visa``) changes that
project's file only, never the store or another project that fetched the
same bytes. Every blob read is hashed, so a blob damaged on disk is
dropped, never returned. A read touches the action entry, and ``gc`` drops
the least recently used entries and the blobs no entry left needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kiln.fsutil import write_absent_atomic, write_bytes_atomic

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


class LocalStore:
    """Blobs and action entries under ``root`` (``<KILN_CACHE_DIR>/store``)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        # the hot paths build file names as strings: pathlib costs more than the I/O here
        self._cas = os.path.join(root, "cas")
        self._ac = os.path.join(root, "ac")

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
                data = f.read()
        except OSError:
            return None
        if sha256(data) != digest:
            _unlink(path)
            return None
        return data

    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data``; ``digest`` is its sha256 when the caller has just verified it."""
        digest = digest or sha256(data)
        path = self._blob_file(digest)
        try:
            if stat.S_ISREG(os.stat(path).st_mode):
                return digest
            _remove_squatter(path)  # a directory (made by hand) in the blob's place
        except OSError:
            pass
        write_absent_atomic(path, data)  # found absent just now: no second look
        return digest

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
        self, key: str, outputs: dict[str, bytes], digests: dict[str, str] | None = None
    ) -> dict[str, str]:
        """Store the outputs of ``key``; ``digests``: theirs by name, when already verified."""
        known = digests or {}
        digests = {name: self.put_blob(data, known.get(name)) for name, data in outputs.items()}
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
        return StoreSize(entries=len(actions), blobs=len(blobs), bytes=total)

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
