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
        self.warned_unwritable = False

    def lookup(self, key: str) -> tuple[dict[str, bytes] | None, str]:
        """(outputs, how): from the local store (hit), the remote (fetched), or None.

        An action fetched over a network is kept in the local store, verified
        (never hashed again). One fetched from a directory on this machine's own
        disk is not: it is read back as fast as a local copy would be, and the
        copy would cost a write per file and the disk space twice.
        """
        found = self.local.lookup(key)
        if found is not None:
            return found, HIT
        if self.remote is not None:
            fetched = self.remote.lookup_verified(key)
            if fetched is not None:
                if not self.remote.local_disk:
                    self._keep(key, *fetched)
                return fetched[0], FETCHED
        return None, COMPILED

    def _keep(self, key: str, found: dict[str, bytes], digests: dict[str, str]) -> None:
        try:
            self.local.store(key, found, digests)  # verified on fetch: not hashed
        except OSError as exc:
            self.store_failed(exc)
        except Exception as exc:  # a copy the build can do without: never stop the build
            from kiln.logconfig import get_logger

            get_logger("cache").warning("could not keep action %s locally: %s", key, exc)

    def store(self, key: str, outputs: dict[str, bytes]) -> None:
        """Store outputs just built, locally and (uploads on) in the remote."""
        digests = self.local.store(key, outputs)
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


def write_last_build(local_dir: str, counts: dict) -> None:
    """What the last build did with the cache, for ``kiln cache stats``."""
    from pathlib import Path

    path = Path(local_dir) / "last-build.json"
    write_bytes_atomic(path, json.dumps(counts, sort_keys=True).encode())
