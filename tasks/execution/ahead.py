"""Chains sent ahead of their tasks: doit walks the DAG, an executor runs the chains.

doit's plain in-process runner runs the compile actions one after the
other. The first of them that finds a chain to build asks doit
(``doit.Globals.dep_manager.get_status``, its public API) which instance
tasks are stale, in doit's order, and submits their chains to the build's
executor: a ``ProcessPoolExecutor`` for ``kiln compile -n N``, a Dask
client for a cluster. Each action then takes its chain's result from its
future and writes it; doit still decides what is stale, and no action
returns before its files are written. A dead worker (``BrokenProcessPool``)
or a lost cluster costs one warning: the rest builds here.

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
from kiln.tasks.execution.chain_worker import decode_result

log = get_logger("tasks")


class AheadPlan:
    """One build's executor and the chains sent to it, by instance name."""

    def __init__(self, settings: ExecutorSettings, root: str):
        self.settings = settings
        self.root = root
        self.tasks: dict = {}  # doit's Task objects by name, set by the loader
        self.specs: dict[str, InstanceSpec] = {}  # compile task name -> its spec
        # instance -> (its batch, its place in the batch)
        self.futures: dict[str, tuple[Batch, int]] = {}
        self.submitted = False
        self.lost = False
        self.executor = None
        self._lock = threading.Lock()

    def take(self, spec: InstanceSpec, sources: dict[str, str], known) -> tuple[Batch, int] | None:
        with self._lock:
            if not self.submitted:
                self.submitted = True
                self._submit_stale(spec, sources, known)
            return self.futures.pop(spec.instance, None)

    def _submit_stale(self, first: InstanceSpec, sources, known) -> None:
        """Submit the chains of every stale compile task, in doit's order, ``first`` first."""
        dep = doit.Globals.dep_manager
        try:
            self.executor = self._start()
        except KilnError as err:
            # one error, to the first action; every other chain builds here without a word
            self.lost = True
            raise err from None
        except Exception as exc:
            self._give_up(f"could not start: {exc}")
            return
        jobs = [self._job(first, sources, known)]
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
            jobs.append(self._job(spec, source_digests(spec), read(spec.out_dir)))
        size = batch_size(len(jobs), self.settings.workers)
        for start in range(0, len(jobs), size):
            batch = jobs[start : start + size]
            try:
                submitted = Batch(self.executor.submit(batch_to_wire([job for _, job in batch])))
            except Exception as exc:
                self._give_up(str(exc))
                return
            for place, (instance, _) in enumerate(batch):
                self.futures[instance] = (submitted, place)

    def _job(self, spec: InstanceSpec, sources: dict[str, str], known) -> tuple[str, ChainJob]:
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
        if not self.lost:
            self.lost = True
            if self.settings.kind == "pool":
                warn(f"the process pool failed ({reason}); building the rest locally")
            else:
                where = self.settings.address or "LocalCluster"
                text = reason if lost else f"failed ({reason})"
                warn(f"the Dask scheduler {where} {text}; building the rest locally")
        for batch, _ in self.futures.values():
            batch.future.cancel()
        self.futures.clear()

    def result(self, taken: tuple[Batch, int]) -> tuple[ChainResult | None, int]:
        batch, place = taken
        from kiln.tasks.execution.remote_exec import ClusterLost  # imported by _start already

        try:
            data = batch.take(place, self.executor.wait)
        except ClusterLost as exc:
            with self._lock:
                self._give_up(str(exc), lost=True)
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
        with self._lock:
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


def batch_size(chains: int, workers: int) -> int:
    """Chains per executor task: at least four batches per worker, so the work still
    spreads evenly, and at most 16 chains, so the first results come back early."""
    return max(1, min(16, chains // (max(workers, 1) * 4)))


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


def start(settings: ExecutorSettings, root: str) -> AheadPlan:
    """Send chains ahead for this build (Kiln's build command only)."""
    global _plan
    _plan = AheadPlan(settings, root)
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
    """The chain's result from the build's executor; (None, 0): build it here."""
    current = _plan
    if current is None or current.lost:
        return None, 0
    taken = current.take(spec, sources, known)
    if taken is None:
        return None, 0
    return current.result(taken)


def finish() -> None:
    """Close the executor (cancel what never ran): the build is over."""
    global _plan
    current, _plan = _plan, None
    if current is not None:
        current.close()
