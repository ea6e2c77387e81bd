"""The local store: blobs by sha256 and action entries, plain files under one directory.

Layout: ``cas/ab/<digest>`` holds bytes whose sha256 is ``<digest>``;
``ac/cd/<key>.json`` maps an action key to its output digests. Every write
is atomic (temp file + rename), so concurrent builds sharing the directory
never see half an object, and two writers of one key write the same bytes.
A read touches the file's mtime: ``gc`` drops the least recently used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from kiln.fsutil import write_bytes_atomic


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


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
        _touch(path)
        return data

    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data``; ``digest`` is its sha256 when the caller has just verified it."""
        digest = digest or sha256(data)
        path = self._blob_file(digest)
        if not os.path.exists(path):
            write_bytes_atomic(path, data)
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
        write_bytes_atomic(self._action_file(key), action_entry(outputs))

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
        blobs = self.files("cas")
        actions = self.files("ac")
        total = sum(_size(p) for p in blobs) + sum(_size(p) for p in actions)
        return StoreSize(entries=len(actions), blobs=len(blobs), bytes=total)

    def gc(self, max_bytes: int) -> tuple[int, int]:
        """Drop least recently used files until the store fits ``max_bytes``.

        Returns (files removed, bytes freed). An action entry whose blob
        is gone is a miss, so removing blobs before entries is safe.
        """
        shutil.rmtree(self.root / "breakers", ignore_errors=True)  # past builds' markers
        files = [(p, p.stat()) for p in self.files("cas") + self.files("ac")]
        total = sum(st.st_size for _, st in files)
        removed = freed = 0
        for path, st in sorted(files, key=lambda item: item[1].st_mtime_ns):
            if total <= max_bytes:
                break
            _unlink(path)
            total -= st.st_size
            removed += 1
            freed += st.st_size
        return removed, freed

    def verify(self) -> tuple[int, list[str]]:
        """Re-hash every blob and parse every entry; drop the bad ones. (checked, dropped)."""
        checked, dropped = 0, []
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
    """The outputs of an action entry, or None when it is not one of ours."""
    try:
        outputs = json.loads(raw)["outputs"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(outputs, dict) or not all(
        isinstance(v, str) and len(v) == 64 for v in outputs.values()
    ):
        return None
    return outputs


def _touch(path: str | os.PathLike) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _unlink(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
