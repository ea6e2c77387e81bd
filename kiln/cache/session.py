"""One build's view of the cache: the local store, the remote behind it, and counters.

A process keeps one session per configuration, so the circuit breaker and
"warned once" state last for the whole build in that process.
"""

from __future__ import annotations

import json
import threading

from kiln.cache.config import CacheConfig
from kiln.cache.store import LocalStore
from kiln.fsutil import write_bytes_atomic

HIT, FETCHED, COMPILED = "hit", "fetched", "compiled"
_sessions: dict[tuple, CacheSession] = {}
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

    def lookup(self, key: str) -> tuple[dict[str, bytes] | None, str]:
        """(outputs, how): from the local store (hit), the remote (fetched), or None."""
        found = self.local.lookup(key)
        if found is not None:
            return found, COMPILED if key in self.produced else HIT
        if self.remote is not None:
            found = self.remote.lookup(key)
            if found is not None:
                self.local.store(key, found)
                return found, FETCHED
        return None, COMPILED

    def store(self, key: str, outputs: dict[str, bytes]) -> None:
        digests = self.local.store(key, outputs)
        if self.remote is not None:
            self.remote.store(key, outputs, digests)

    def store_failed(self, exc: OSError) -> None:
        """Say once per process that the local store cannot be written; the build goes on."""
        if self.warned_unwritable:
            return
        self.warned_unwritable = True
        from kiln.logconfig import get_logger

        get_logger("cache").warning(
            "the artifact cache %s cannot be written (%s): building without storing; "
            "set KILN_CACHE_DIR to a writable directory, or KILN_CACHE=0 to turn it off",
            self.config.local_dir,
            exc.strerror or exc,
        )


def session_for(config: CacheConfig) -> CacheSession:
    key = tuple(sorted(config.to_dict().items()))
    with _lock:
        found = _sessions.get(key)
        if found is None:
            found = _sessions[key] = CacheSession(config)
        return found


def write_last_build(local_dir: str, counts: dict) -> None:
    """What the last build did with the cache, for ``kiln cache stats``."""
    from pathlib import Path

    path = Path(local_dir) / "last-build.json"
    write_bytes_atomic(path, json.dumps(counts, sort_keys=True).encode())
