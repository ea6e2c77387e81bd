"""`kiln cache push`: copy into the team cache what the local store holds and it lacks.

A build uploads what it compiles, never what it finds in the local store:
checking the remote for every local hit would cost a request per action
on every build. A machine whose store was warm before the team cache
existed (a developer's laptop, a CI runner that keeps KILN_CACHE_DIR
between jobs) fills the team cache with one push instead.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kiln.cache.remote import RemoteStore
from kiln.cache.store import LocalStore

PUSH_THREADS = 8  # requests in flight: a push is mostly waiting on the remote


@dataclass
class PushResult:
    pushed: int = 0  # actions uploaded
    present: int = 0  # actions the remote had already
    damaged: int = 0  # local entries whose blobs were missing or bad (dropped, not pushed)
    bytes: int = 0  # bytes of the blobs uploaded (the remote skips those it holds)
    stopped: bool = False  # the remote went unavailable: the rest was not pushed


def action_keys(local: LocalStore) -> list[str]:
    """Every action key the local store has an entry for, sorted."""
    return sorted(p.name.removesuffix(".json") for p in local.files("ac") if p.suffix == ".json")


def push(local: LocalStore, remote: RemoteStore, threads: int = PUSH_THREADS) -> PushResult:
    """Upload each local action the remote lacks: its blobs first, then its entry."""
    result = PushResult()

    def one(key: str) -> tuple[str, int]:
        present = remote.has_action(key)
        if present is None:
            return "stopped", 0
        if present:
            return "present", 0
        digests = local.get_action(key)
        # each blob verified against its digest: a damaged one is dropped, never sent
        outputs = {name: local.get_blob(d) for name, d in (digests or {}).items()}
        if not outputs or None in outputs.values():
            return "damaged", 0
        sent = remote.store(key, outputs, digests)
        return ("stopped", 0) if remote.broken else ("pushed", sent)

    with ThreadPoolExecutor(max_workers=max(threads, 1)) as pool:
        for outcome, sent in pool.map(one, action_keys(local)):
            if outcome == "stopped":
                result.stopped = True
            elif outcome == "present":
                result.present += 1
            elif outcome == "damaged":
                result.damaged += 1
            else:
                result.pushed += 1
                result.bytes += sent
    return result
