"""Chains sent to Dask a batch at a time: many doit actions, few Dask tasks.

A stage chain is about 20 ms of work on a worker, and every Dask task costs
the client a few milliseconds of scheduling and messages, paid on the same
two cores the workers use. The build hands its chains to one batcher per
client (as their tasks become ready, tasks/chains_ahead.py), and a sender
thread ships them as ``run_chains`` Dask tasks of up to ``BATCH_SIZE``
chains; each chain's Future settles with its own result. The instances of
one kernel file send its bytes once per batch.

When to send a batch that is not full: while the cluster has fewer than
``AHEAD_PER_WORKER`` batches per worker to work on, at most ``LINGER``
seconds after its first chain arrived (a hungry worker gets what there
is); otherwise only once it is full, or when a batch comes back. Sending
on a timer alone settled into batches of one or two chains: doit hands
out new chains as earlier ones return, a few at a time.

A watchdog thread asks the scheduler for its worker count once a second.
A cluster that has had no worker for ``LOST_AFTER`` seconds while chains
wait (none ever joined, or the last one died), or a client that has not
been connected for as long, is given up: every waiting chain, and every
later one, gets ``ClusterLost`` and is built locally. A worker that is
merely slow keeps its chains: only an empty or unreachable cluster counts.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

BATCH_SIZE = 16
LINGER = 0.004  # seconds the first chain of a partial batch waits for company
AHEAD_PER_WORKER = 1  # batches on the cluster per worker before a partial one waits to fill
# (a partial batch only: once a build has sent its chains ahead, batches fill and go at once)
WORKERS_REFRESH = 1.0  # seconds between asking the scheduler how many workers it has
LOST_AFTER = 10.0  # seconds with no worker (or no scheduler) while chains wait: give up

_batchers: dict[int, ChainBatcher] = {}
_batchers_lock = threading.Lock()


class ChainBatcher:
    """Gathers chain payloads and submits them to ``client`` as ``run_chains`` tasks."""

    def __init__(
        self,
        client,
        batch_size: int = BATCH_SIZE,
        linger: float = LINGER,
        ahead: int | None = None,
        lost_after: float = LOST_AFTER,
    ):
        self.client = client
        self.lost_after = lost_after
        self.lost: ClusterLost | None = None  # why the cluster was given up
        self.batch_size = batch_size
        self.linger = linger
        self.ahead = ahead  # None: AHEAD_PER_WORKER per worker the scheduler knows
        self._open: list[tuple[dict, Future]] = []
        self._first_at = 0.0  # when the oldest chain of ``_open`` arrived
        self._sent: set[Future] = set()  # slots of batches on the cluster, not back yet
        self._batches_out = 0
        self._workers = 1  # the cluster's, as the watchdog last asked
        self._closed = False
        self._cond = threading.Condition()
        self._stopped = threading.Event()  # set by close(): the watchdog stops
        threading.Thread(target=self._send_loop, name="kiln-dask-batches", daemon=True).start()
        threading.Thread(target=self._watch_loop, name="kiln-dask-watch", daemon=True).start()

    def submit(self, payload: dict) -> Future:
        """A Future of this chain's result (``run_chain``'s), settled once its batch is
        back (with its error, if it failed); raises at once when the batcher is closed."""
        slot: Future = Future()
        with self._cond:
            if self._closed:
                raise self.lost or BatcherClosed("the Dask client of this build is closed")
            if not self._open:
                self._first_at = time.monotonic()
            self._open.append((payload, slot))
            self._cond.notify()
        return slot

    def close(self, error: BaseException | None = None) -> None:
        """Stop sending; every action still waiting gets ``error`` (default BatcherClosed)."""
        with self._cond:
            self._closed = True
            if isinstance(error, ClusterLost) and self.lost is None:
                self.lost = error
            waiting = [slot for _, slot in self._open] + list(self._sent)
            self._open.clear()
            self._sent.clear()
            self._cond.notify_all()
        self._stopped.set()
        error = error or BatcherClosed("the Dask client of this build was closed")
        self._settle(waiting, [None] * len(waiting), error)

    def _watch_loop(self) -> None:
        """Once a second: count the workers; give the cluster up when it cannot build."""
        empty_since = down_since = time.monotonic()
        while True:
            if self._stopped.wait(WORKERS_REFRESH):  # not the condition: its notify() is
                return  # the sender's
            with self._cond:
                waiting = bool(self._open or self._sent)
            now = time.monotonic()
            status = getattr(self.client, "status", "running")
            if status in ("closing", "closed"):
                self.close(ClusterLost("the Dask client was closed"))
                return
            if status != "running":  # reconnecting to a scheduler that went away
                if waiting and now - down_since >= self.lost_after:
                    self.close(ClusterLost(f"no answer from it for {self.lost_after:.0f} s"))
                    return
                continue
            down_since = now
            workers = self._count_workers()
            if workers is None:
                continue
            self._workers = max(workers, 1)
            if workers or not waiting:
                empty_since = now
            elif now - empty_since >= self.lost_after:
                self.close(ClusterLost(f"no workers for {self.lost_after:.0f} s", True))
                return

    def _count_workers(self) -> int | None:
        """The scheduler's worker count; None when it did not answer."""
        try:
            info = self.client.scheduler_info(n_workers=0)  # totals only: a small answer
        except Exception:  # no answer this time: the next second asks again
            return None
        count = info.get("n_workers")
        return count if isinstance(count, int) else len(info.get("workers", {}))

    def _send_loop(self) -> None:
        while True:
            ahead = self._ahead()  # outside the lock: it may ask the scheduler
            with self._cond:
                while not self._closed:
                    wait = self._wait_before_sending(ahead)
                    if wait == 0.0:
                        break
                    self._cond.wait(wait)
                if self._closed:  # close() has failed whatever was gathered
                    return
                batch = self._open[: self.batch_size]
                del self._open[: self.batch_size]
                self._first_at = time.monotonic()
                self._sent.update(slot for _, slot in batch)
                self._batches_out += 1
            self._submit(batch)

    def queued(self) -> int:
        """Chains gathered and not sent yet."""
        with self._cond:
            return len(self._open)

    def _wait_before_sending(self, ahead: int) -> float | None:
        """0.0: send a batch now; else seconds to wait (None: until notified). Under the lock."""
        if len(self._open) >= self.batch_size:
            return 0.0
        if not self._open or self._batches_out >= ahead:
            return None  # a new chain or a returning batch wakes the loop
        return max(self._first_at + self.linger - time.monotonic(), 0.0)

    def _ahead(self) -> int:
        """How many batches may be out before a partial one waits to fill."""
        if self.ahead is not None:
            return self.ahead
        return AHEAD_PER_WORKER * self._workers  # the watchdog asks the scheduler

    def _submit(self, batch: list[tuple[dict, Future]]) -> None:
        from kiln.tasks.chain_worker import run_chains

        slots = [slot for _, slot in batch]
        try:
            future = self.client.submit(
                run_chains, pack([p for p, _ in batch]), pure=False, retries=1
            )
        except Exception as exc:  # a closed client: every action builds locally
            self._settle(slots, [None] * len(slots), exc, batch_done=True)
            return

        # Dask calls this on a thread of its own and only logs what it raises:
        # it must settle every slot of the batch, whatever the result looks like
        def deliver(done) -> None:
            try:
                results = list(done.result())
                if len(results) != len(slots):
                    raise RuntimeError(f"{len(results)} results for {len(slots)} chains")
            except BaseException as exc:  # handed to each waiting action
                if not isinstance(exc, Exception):  # an action must get an Exception
                    exc = ClusterLost(f"{type(exc).__name__}: {exc}")
                self._settle(slots, [None] * len(slots), exc, batch_done=True)
            else:
                self._settle(slots, results, None, batch_done=True)

        future.add_done_callback(deliver)

    def _settle(
        self,
        slots: list[Future],
        results: list,
        error: BaseException | None,
        batch_done: bool = False,
    ) -> None:
        """Give each slot its result (or ``error``) once: close() and a batch may race.

        ``batch_done``: one sent batch is back (or lost); the sender may send again.
        """
        with self._cond:
            self._sent.difference_update(slots)
            if batch_done:
                self._batches_out -= 1
                self._cond.notify()
            for slot, result in zip(slots, results, strict=True):
                if slot.done():
                    continue
                if error is not None:
                    slot.set_exception(error)
                else:
                    slot.set_result(result)


class BatcherClosed(RuntimeError):
    """The build's Dask client closed while a chain waited for its batch."""


class ClusterLost(RuntimeError):
    """The cluster cannot build: no workers, or no scheduler, for too long."""

    def __init__(self, reason: str, no_workers: bool = False):
        super().__init__(reason)
        self.no_workers = no_workers


def pack(payloads: list[dict]) -> dict:
    """The batch for ``run_chains``: each distinct source tree once, chains pointing at it."""
    trees: list[dict[str, bytes]] = []
    index_of: dict[tuple, int] = {}
    chains = []
    for payload in payloads:
        sources = payload.get("sources")
        if sources is None:
            chains.append(payload)
            continue
        # the payloads hold their bytes objects alive, so ids name them within the batch
        key = tuple(sorted((rel, len(data), id(data)) for rel, data in sources.items()))
        if key not in index_of:
            index_of[key] = len(trees)
            trees.append(sources)
        chain = {k: v for k, v in payload.items() if k != "sources"}
        chain["sources_index"] = index_of[key]
        chains.append(chain)
    return {"sources": trees, "chains": chains}


def batcher_for(client) -> ChainBatcher:
    """The batcher of ``client``, made on first use (one sender thread per client)."""
    with _batchers_lock:
        found = _batchers.get(id(client))
        if found is None or found.client is not client:
            found = _batchers[id(client)] = ChainBatcher(client)
        return found


def close_batchers() -> None:
    """Close every batcher (the build's clients are closing): no action waits forever."""
    with _batchers_lock:
        batchers = list(_batchers.values())
        _batchers.clear()
    for batcher in batchers:
        batcher.close()
