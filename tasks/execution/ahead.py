"""Chains sent ahead of their tasks: doit walks the DAG, an executor runs the chains.

doit's plain in-process runner runs the compile actions one after the
other. The first of them that finds a chain to build asks doit
(``doit.Globals.dep_manager.get_status``, its public API) which instance
tasks are stale, in doit's order, and submits their chains to the build's
executor: a ``ProcessPoolExecutor`` for ``kiln compile -n N``, a Dask
client for a cluster. Each action then takes its chain's result from its
future and writes it; doit still decides what is stale, and no action
returns before its files are written. A lost cluster costs one warning: the
rest builds here. A dead pool worker costs one warning too: the pool builds
the chains it may have been running again, each alone in a fresh process
(pool.py), and a chain that kills that one as well fails as its instance.

Plain ``doit -n N`` never gets here: ``start`` is only called by Kiln's own
build command, so doit's process runner children build their chains inline.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import doit

from kiln.cache.session import session_for
from kiln.driver import ChainResult, StageRecord
from kiln.errors import KilnError
from kiln.logconfig import get_logger, warn
from kiln.tasks.chain.chain_payload import source_bytes
from kiln.tasks.chain.chain_record import read
from kiln.tasks.chain.instance_spec import (
    ChainJob,
    ExecutorSettings,
    InstanceSpec,
    batch_to_wire,
    source_digests,
)
from kiln.tasks.execution.chain_worker import WorkerDied, decode_result

log = get_logger("tasks")
CLOSE_WAIT = 30  # seconds the build waits for a Dask client (and LocalCluster) starting


class AheadPlan:
    """One build's executor and the chains sent to it, by instance name."""

    def __init__(self, settings: ExecutorSettings, root: str):
        self.settings = settings
        self.root = root
        self.tasks: dict = {}  # doit's Task objects by name, set by the loader
        self.specs: dict[str, InstanceSpec] = {}  # compile task name -> its spec
        # instance -> (its batch, its place in the batch)
        self.futures: dict[str, tuple[Batch, int]] = {}
        # while a LocalCluster starts: the stale instances waiting for it, in doit's order
        self.waiting: dict[str, InstanceSpec] | None = None
        self.submitted = False
        self.lost = False
        self.closed = False
        self.starting: threading.Thread | None = None  # the Dask client starting (start_early)
        self.start_error: str | None = None
        self.executor = None
        self._lock = threading.Lock()

    def take(self, spec: InstanceSpec, sources: dict[str, str], known) -> tuple[Batch, int] | None:
        if self.starting is not None and not self.local_cluster and not self.submitted:
            # a scheduler of the user's, reached while doit loaded the tasks: every
            # chain goes to it, so the first one waits the moment it may still take
            self.starting.join(CLOSE_WAIT)
        with self._lock:
            if not self.submitted:
                self.submitted = True
                stale = self._stale(spec)
                if self.starting is None and self.local_cluster:
                    self.start_early()
                if self.starting is None:  # a pool, or a scheduler of the user's: start now
                    self._start_now()
                elif self.start_error is not None:
                    self._give_up(self.start_error, lost=True)
                    return None
                elif self.executor is None:  # the cluster is still starting
                    self.waiting = {s.instance: s for s in stale}
                    return None  # this chain builds here meanwhile
                self._submit([(spec, sources, known), *((s, None, None) for s in stale)])
            elif self.waiting is not None:
                self.waiting.pop(spec.instance, None)  # its turn came first: it builds here
                return None
            return self.futures.pop(spec.instance, None)

    @property
    def local_cluster(self) -> bool:
        return self.settings.kind == "dask" and not self.settings.address

    def start_early(self) -> None:
        """Start the LocalCluster on a thread: the build goes on meanwhile.

        Starting one costs about a second of CPU (Dask's imports, the workers'
        processes). Chains whose turn comes before it is up build here. A
        first build starts it before doit loads the tasks: loading keeps one
        core busy, and the cluster starts on the other. (A scheduler of the
        user's is reached in a moment: started early, the first chain waits
        for it, and every chain goes to it.)
        """
        self.starting = threading.Thread(target=self._start_in_background, daemon=True)
        self.starting.start()

    def _start_in_background(self) -> None:
        try:
            executor = self._start()
        except Exception as exc:  # unreachable, refused: the build goes on here, one warning
            with self._lock:
                self.start_error = (
                    exc.message
                    if isinstance(exc, KilnError)  # says what failed
                    else f"the Dask client could not start: {_reason(exc)}"
                )
                if self.submitted:
                    self.waiting = None
                    self._give_up(self.start_error, lost=True)
            return
        with self._lock:
            if self.closed:  # the build ended (or was interrupted) meanwhile
                executor.close()
                return
            self.executor = executor
            if self.waiting is not None:
                waiting, self.waiting = self.waiting, None
                self._submit([(spec, None, None) for spec in waiting.values()])

    def _stale(self, first: InstanceSpec) -> list[InstanceSpec]:
        """Every other stale compile task's spec, in doit's order: what the executor builds."""
        dep = doit.Globals.dep_manager
        stale = []
        for name, spec in self.specs.items() if dep is not None else ():
            task = self.tasks.get(name)
            if spec is first or task is None:
                continue
            try:
                status = dep.get_status(task, self.tasks).status
            except Exception:  # doit will say what is wrong when it reaches the task
                continue
            if status != "run":
                continue
            if spec.cache is not None and _stored(spec):
                continue  # the action writes it from the cache: nothing to build
            stale.append(spec)
        return stale

    def _start_now(self) -> None:
        try:
            self.executor = self._start()
        except KilnError as err:  # a scheduler that cannot be reached: it says which
            self._give_up(err.message, lost=True)
        except Exception as exc:
            self._give_up(f"could not start: {_reason(exc)}")

    def _submit(self, chains: list) -> None:
        """Send ``chains`` ((spec, sources, known); None: read them now) in batches."""
        if self.executor is None:
            return
        jobs = [self._job(spec, sources, known) for spec, sources, known in chains]
        start = 0
        for size in batch_sizes(len(jobs), self.settings.workers):
            batch, start = jobs[start : start + size], start + size
            try:
                submitted = Batch(self.executor.submit(batch_to_wire([job for _, job in batch])))
            except Exception as exc:
                self._give_up(str(exc))
                return
            for place, (instance, _) in enumerate(batch):
                self.futures[instance] = (submitted, place)

    def _job(self, spec: InstanceSpec, sources, known) -> tuple[str, ChainJob]:
        """(instance, job); ``sources`` None: its digests and records are read now."""
        if sources is None:
            sources, known = source_digests(spec), read(spec.out_dir)
        return spec.instance, _job(spec, sources, known, remote=self.settings.kind == "dask")

    def _start(self):
        # the executors import here: a no-op build loads this module and starts neither
        # (concurrent.futures.process and multiprocessing cost it about 4 ms)
        if self.settings.kind == "pool":
            from kiln.tasks.execution.pool import PoolExecutor

            return PoolExecutor(self.settings.workers, self.root)
        from kiln.tasks.execution.remote_exec import DaskExecutor

        return DaskExecutor(self.settings)

    def _give_up(self, reason: str, lost: bool = False) -> None:
        """One warning; every chain not yet written builds here. ``lost``: ``reason`` is
        a whole sentence (a cluster lost, or one that could not start)."""
        if not self.lost:
            self.lost = True
            if self.settings.kind == "pool":
                warn(f"the process pool failed ({reason}); building the rest locally")
            else:
                where = self.settings.address or "LocalCluster"
                text = reason if lost else f"the Dask scheduler {where} failed ({reason})"
                warn(f"{text}; building the rest locally")
        for batch, _ in self.futures.values():
            batch.future.cancel()
        self.futures.clear()

    def result(self, taken: tuple[Batch, int]) -> tuple[ChainResult | None, int]:
        batch, place = taken
        from kiln.tasks.execution.remote_exec import ClusterLost  # imported by _start already

        try:
            data = batch.take(place, self.executor.wait)
        except ClusterLost as exc:
            where = self.settings.address or "LocalCluster"
            with self._lock:
                self._give_up(f"the Dask scheduler {where} {exc}", lost=True)
            return None, 0
        except Exception as exc:
            with self._lock:
                self._give_up(_reason(exc))
            return None, 0
        result, pid, refused = decode_result(data)
        if refused is not None:
            with self._lock:
                self._give_up(f"a worker runs different Kiln code: {refused}")
        return result, pid

    def close(self) -> None:
        starting = self.starting
        if starting is not None and self.local_cluster:
            # let it finish starting (it closes what it started): its processes are ours.
            # A scheduler of the user's is not waited for: one that does not answer
            # would hold a build with nothing to send it for the whole connect timeout
            starting.join(CLOSE_WAIT)
        with self._lock:
            self.closed = True
            for batch, _ in self.futures.values():
                batch.future.cancel()
            self.futures.clear()
            executor, self.executor = self.executor, None
        if executor is not None:
            executor.close()


class Batch:
    """Chains sent as one executor task: their results are fetched once, for all of them.

    A Dask future's ``result()`` fetches the task's whole result from the
    worker on every call: asked once per chain, a batch of 16 crossed the
    wire 16 times, and the build spent longer reading results than the
    workers spent making them.
    """

    __slots__ = ("future", "results")

    def __init__(self, future: Future):
        self.future = future
        self.results: list[bytes | None] | None = None

    def take(self, place: int, wait) -> bytes:
        """The result of the chain at ``place``; ``wait(future)`` fetches the batch's."""
        if self.results is None:
            self.results = list(wait(self.future))
        data, self.results[place] = self.results[place], None  # each is taken once
        return data


MAX_BATCH = 64  # chains per executor task at most


def batch_sizes(chains: int, workers: int) -> list[int]:
    """How many chains each executor task takes, in order: large while many are left
    (each task costs a round trip through the scheduler), smaller towards the end,
    each at most a quarter of what is left per worker, so the workers finish together."""
    sizes, left = [], chains
    while left > 0:
        size = max(1, min(MAX_BATCH, left // (max(workers, 1) * 4)))
        sizes.append(size)
        left -= size
    return sizes


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _stored(spec: InstanceSpec) -> bool:
    session = session_for(spec.cache)
    return session.local.get_action(spec.chain.key(source_digests(spec))) is not None


def _job(spec: InstanceSpec, sources: dict[str, str], known, *, remote: bool) -> ChainJob:
    digests = tuple(sorted(sources.items()))
    if remote:  # another machine: the sources travel, and the whole chain runs
        root = spec.root.rstrip("/") + "/"
        files = tuple(
            (p[len(root) :] if p.startswith(root) else p, source_bytes(p)) for p in spec.sources
        )
        return ChainJob(chain=spec.chain, digests=digests, sources=files)
    records: tuple[StageRecord, ...] = tuple(known.values())
    return ChainJob(
        chain=spec.chain, digests=digests, root=spec.root, out_dir=spec.out_dir, known=records
    )


_plan: AheadPlan | None = None


def start(settings: ExecutorSettings, root: str, *, first_build: bool = False) -> AheadPlan:
    """Send chains ahead for this build (Kiln's build command only).

    ``first_build``: nothing was built in this state yet, so every chain is
    stale: a LocalCluster starts (or the scheduler is reached) at once, while
    doit loads the tasks, rather than at the first stale chain. (Started on
    every build, a LocalCluster cost a no-op build most of a second.)
    """
    global _plan
    _plan = AheadPlan(settings, root)
    if first_build and settings.kind == "dask":
        _plan.start_early()
    return _plan


def plan() -> AheadPlan | None:
    return _plan


def register(specs: dict[str, InstanceSpec]) -> None:
    """The compile tasks' specs, by task name (from the task generator)."""
    if _plan is not None:
        _plan.specs.update(specs)


def register_tasks(tasks: list) -> None:
    """doit's Task objects of this build (from the loader)."""
    if _plan is not None:
        _plan.tasks = {t.name: t for t in tasks}


def result_for(
    spec: InstanceSpec, sources: dict[str, str], known
) -> tuple[ChainResult | None, int]:
    """The chain's result from the build's executor; (None, 0): build it here.

    KilnError for a chain that killed the process building it, alone: built
    here, it would kill the build.
    """
    current = _plan
    if current is None or current.lost:
        return None, 0
    taken = current.take(spec, sources, known)
    if taken is None:
        return None, 0
    try:
        return current.result(taken)
    except WorkerDied as died:
        raise KilnError(f"the worker building {spec.instance} {died}", hint=died.hint) from None


def finish() -> None:
    """Close the executor (cancel what never ran): the build is over."""
    global _plan
    current, _plan = _plan, None
    if current is not None:
        current.close()
