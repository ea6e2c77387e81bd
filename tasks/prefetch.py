"""A clean clone's actions, fetched from the remote cache ahead of the tasks that need them.

One process fetches one action at a time and waits for each answer: from a
shared directory that is a fraction of a millisecond, from S3 tens of
milliseconds, so a clone of thousands of artifacts would be bound by the
remote's latency. Once a build fetches its first action from the remote,
``KILN_PREFETCH_THREADS`` threads (8 by default) walk the chains of the other instances whose
binaries are missing, in build order. A walk fetches its chain's actions one
stage after the other (a stage's key needs the digest of the output before
it) into the local store. A task then finds its action there; a task whose
chain a thread is walking waits for that walk instead of asking the remote
again; a task whose chain no thread has started takes it back and fetches
as before. Nothing is held in memory but the chains' states.

Only a remote slower than ``PREFETCH_MIN_LATENCY`` is worth it (S3, a far
NFS server), and only the main process prefetches: the workers of ``-n N``
already fetch N actions at a time, each for its own task.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from kiln.logconfig import get_logger

# Below this time for one round trip (a run's first entry read) a fetch costs
# less than the work of writing what it brings, and threads fetching ahead
# only compete with the build for the interpreter: a shared directory on this
# machine answers in about 0.05 ms, and prefetching from it made a clone
# twice as slow; S3 answers in milliseconds.
PREFETCH_MIN_LATENCY = 0.001
PREFETCH_MIN_READS = 3  # judged on the quickest of a few answers, not the first alone
STOP_WAIT = 2.0  # seconds the end of a build waits for walks under way
log = get_logger("cache")

QUEUED, RUNNING, DONE, TAKEN = "queued", "running", "done", "taken"


def worth_prefetching(session) -> bool:
    """Whether ``session`` may fetch ahead and its remote is slow enough that it pays."""
    remote = session.remote
    return (
        session.config.prefetch_threads > 0
        and remote is not None
        and not remote.broken
        and remote.reads >= PREFETCH_MIN_READS
        and remote.fastest_read >= PREFETCH_MIN_LATENCY
    )


class ChainPlan:
    """The kernel instances' stage chains of one task load, in build order.

    Every first stage's spec carries the same plan, so whichever is fetched
    first can start the walks of the others.
    """

    def __init__(self):
        self.chains: list[list[dict]] = []


class Prefetcher:
    """Threads walking ``chains`` into ``session``'s local store from its remote.

    ``key_of(spec, input_digest=..., graph_digest=...)`` is the stage's action
    key, exactly as the task computes it (tasks/cached.py ``stage_key``).
    """

    def __init__(
        self,
        session,
        chains: list[list[dict]],
        key_of: Callable[..., str],
        threads: int,
        taken: set[str] = frozenset(),
    ):
        self.session = session
        self._key_of = key_of
        self._chains = chains
        self._state = {chain_id(chain[0]): QUEUED for chain in chains}
        for name in taken:  # their tasks fetch them
            self._state[name] = TAKEN
        self._next = 0
        self._stopped = False
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._work, name=f"kiln-prefetch-{i}", daemon=True)
            for i in range(min(threads, len(chains)))
        ]
        log.info(
            "fetching up to %d chains ahead on %d threads (remote answers in %.1f ms)",
            len(chains),
            len(self._threads),
            1000 * getattr(session.remote, "fastest_read", 0.0),
        )
        for thread in self._threads:
            thread.start()

    def claim(self, chain: str) -> None:
        """Before a task looks up a stage of ``chain``: wait for its walk, or take it back."""
        with self._cond:
            state = self._state.get(chain)
            if state == QUEUED:
                self._state[chain] = TAKEN
            while state == RUNNING:
                self._cond.wait()
                state = self._state.get(chain)

    def idle(self) -> bool:
        """Whether every walk has ended (or will never start)."""
        return not any(thread.is_alive() for thread in self._threads)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Start no further walk; give those under way ``wait`` seconds to end.

        A walk ends after its current read; one stuck on a dead remote (up to
        the remote's timeout) is left behind: its threads are daemons, and
        everything it writes is written atomically.
        """
        with self._cond:
            self._stopped = True
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))

    def _work(self) -> None:
        while True:
            with self._cond:
                chain = self._take_next()
                if chain is None:
                    return
            try:
                self._walk(chain)
            except Exception as exc:  # a walk only saves time: the chain's tasks do the work
                log.warning("could not fetch ahead for %s: %s", chain[0]["instance"], exc)
            finally:
                with self._cond:
                    self._state[chain_id(chain[0])] = DONE
                    self._cond.notify_all()

    def _take_next(self) -> list[dict] | None:
        while not self._stopped and self._next < len(self._chains):
            chain = self._chains[self._next]
            self._next += 1
            name = chain_id(chain[0])
            if self._state[name] != QUEUED:
                continue
            if os.path.exists(chain[-1]["artifact"]):
                self._state[name] = DONE  # built before: doit decides whether it reruns
                continue
            self._state[name] = RUNNING
            return chain
        return None

    def _walk(self, chain: list[dict]) -> None:
        """Fetch the chain's actions in order, until one is missing everywhere or dumps.

        From the first stage the local store lacks, the rest comes from the
        remote in one trip (``CacheSession.fetch_run``), as far as it goes.
        """
        session = self.session
        before: dict[str, str] | None = None  # output digests of the stage before ``index``
        graph_digest = None
        for index, spec in enumerate(chain):
            if self._stopped or not walkable(spec) or session.remote.broken:
                return
            input_digest = None if before is None else before.get("artifact")
            if index > 0 and input_digest is None:
                return
            # both None for the first stage: its key hashes its own inputs
            key = self._key_of(spec, input_digest=input_digest, graph_digest=graph_digest)
            before = session.local.get_action(key)
            if before is None:
                session.fetch_run(
                    key, keys_after(chain, index, graph_digest, self._key_of), ahead=True
                )
                return
            if index == 0 and "trace" in spec:
                graph_digest = before.get("artifact")  # the traced graph: what the binary records


def keys_after(chain: list[dict], start: int, graph_digest: str | None, key_of):
    """``next_key`` for a remote run from ``chain[start]`` (RemoteStore.lookup_run).

    The keys a walk computes, in order, with ``key_of`` (tasks/cached.py
    ``stage_key``). ``graph_digest``: the traced graph's, when known; a run
    from the trace stage learns it from its first entry.
    """
    graph = graph_digest

    def next_key(count: int, digests: dict[str, str]) -> str | None:
        nonlocal graph
        if start == 0 and count == 1 and "trace" in chain[0]:
            graph = digests.get("artifact")
        index = start + count
        if index >= len(chain) or not walkable(chain[index]) or "artifact" not in digests:
            return None
        return key_of(chain[index], input_digest=digests["artifact"], graph_digest=graph)

    return next_key


def walkable(spec: dict) -> bool:
    """Whether a chain's walk may fetch or write this stage ahead of its own task.

    Not a stage that dumps or is tuned: its own task decides.
    """
    return not spec["dumps"] and "tuning" not in spec


def chain_id(spec: dict) -> str | None:
    """The name of the chain ``spec`` belongs to (its first stage's artifact), if any."""
    chain = spec.get("chain")
    return chain[0]["artifact"] if chain else None
