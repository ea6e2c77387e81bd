"""doit's process runner for `-n N`: the build process and N - 1 workers, fed ahead.

doit's own runner hands a worker its next task only after the parent has
read the worker's last result, saved its dependencies and picked the next
task. Kiln's stage tasks are a few milliseconds each, so a worker spends a
large share of an `-n 2` build idle in that round trip, the more so on a
machine whose cores the workers themselves keep busy. This runner keeps a
few ready tasks queued per worker: a worker that finishes one takes the
next at once while the parent catches up. Every task of a kernel
instance's stage chain goes to the process that ran its first one
(tasks/affinity.py says why).

The build process runs tasks too, between dispatching: with doit's
layout, `-n 2` was three busy processes on two cores, the parent spending
about 1.8 s of CPU on dispatch in a 7,680-task build while its two
workers wanted both cores. It takes a task only when every worker has one
queued behind the task it is on (a worker waiting on a result the build
process has not read yet would sit idle), and a new chain only when the
workers have more queued than it has.

A worker sends one message per task, its result with the times it started
and ended (doit's sends a report at the start as well), over pipes of its
own (tasks/worker_pipes.py). A worker process that dies under a task
(killed, out of memory) fails that task with a message saying so; its
queued jobs go to a new worker and the build goes on, where doit's runner
would wait for the dead worker forever.

Only tasks whose dependencies have all finished are ever queued (doit's
dispatcher decides, as before), so the order constraints, up-to-date
checks, dependency records and reports are doit's. doit has no hook to
choose its runner, so ``use_queue_ahead_runner`` installs this class in
place of doit's process runner for the doit run of this process."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from doit import cmd_run
from doit.runner import JobHold, MRunner
from kiln.tasks.affinity import chain_of, keep_whole_chains
from kiln.tasks.worker_pipes import WorkerEnd, WorkerPool

from kiln.errors import KilnError

JOBS_AHEAD_PER_WORKER = 8
# a new chain goes to the build process only when a worker has this many more queued
# (enough that the worker keeps busy while the build process runs a task of its own)
BUILD_PROCESS_HANDICAP = 2


class QueueAheadRunner(MRunner):
    """A multiprocessing runner that keeps up to workers x (1 + ahead) jobs queued."""

    def run_tasks(self, task_dispatcher):
        """Dispatch ready tasks to the workers and to this process; collect results."""
        self.task_dispatcher = task_dispatcher
        self.tasks = task_dispatcher.tasks
        # -n N: N - 1 worker processes, each with a pair of pipes of its own
        # (tasks/worker_pipes.py), and this process, which runs tasks between
        # dispatching (the last slot: a tie for a new chain goes to a worker)
        workers = self.num_process - 1
        pool = WorkerPool(workers, self._start_process)
        local = LocalJobs()
        feeder = JobFeeder(self, {**pool.channels, workers: local}, self._limit(), chain_of)
        # a new chain goes here only when the workers have more queued: the build
        # process also dispatches, and a worker with nothing queued waits on it
        feeder.handicap[workers] = BUILD_PROCESS_HANDICAP
        feeder.fill(None)
        try:
            # every worker, unless all there is to do is queued already: more tasks get
            # ready as these finish (none at all when everything is up to date)
            for slot in range(workers):
                if feeder.outstanding[slot] or not feeder.exhausted:
                    pool.start(slot)
            while feeder.queued:
                # what the workers have sent, then a task here if they have enough to do
                if (got := pool.next_message(wait=False)) is not None:
                    self._take_message(feeder, pool, *got)
                elif local and self._fed(feeder, pool):
                    self._run_here(feeder, local.take(), workers)
                else:
                    self._take_message(feeder, pool, *pool.next_message())
            pool.stop(self._teardown_message)
        except (SystemExit, KeyboardInterrupt, Exception):
            pool.terminate()
            raise
        finally:
            pool.close()

    def _limit(self) -> int:
        return self.num_process * (1 + JOBS_AHEAD_PER_WORKER)

    def _fed(self, feeder: JobFeeder, pool: WorkerPool) -> bool:
        """Whether a task run here now starves no worker: each has a job queued behind
        the one it is on, or none has anything to do (waiting would be for nothing).
        Otherwise the build process waits for the next result, which may make the
        next task of a worker's chain ready."""
        waiting = [feeder.outstanding[slot] for slot in pool.processes]
        return all(n > 1 for n in waiting) or not any(waiting)

    def _run_here(self, feeder: JobFeeder, job, slot: int) -> None:
        node = self.task_dispatcher.nodes[job.name]
        started = time.time()
        failure = self.execute_task(node.task)  # doit's own in-process run: reports the start
        self._report_times(node.task, (started, time.time()), slot, start_reported=True)
        self._finish(feeder, node, failure)

    def _take_message(self, feeder: JobFeeder, pool: WorkerPool, slot: int, message) -> None:
        if message is None:  # killed, out of memory, a crash in native code
            name, exitcode = pool.replace(slot, restart=not feeder.exhausted)
            feeder.job_qs[slot] = pool.channels[slot]
            if name is not None:  # the task it was on fails, saying why
                self._finish(feeder, self.task_dispatcher.nodes[name], worker_died(exitcode))
            return
        node = self._node_of(message)
        if "reporter" in message:
            getattr(self.reporter, message["reporter"])(node.task)
            return
        pool.channels[slot].answered(node.task.name)
        self._report_times(node.task, message["times"], slot)
        self._take_result(node, message)
        self._finish(feeder, node, message.get("failure"))

    def _start_process(self, worker_end: WorkerEnd):
        process = self.Child(
            target=self.execute_task_subprocess,
            args=(worker_end, None, self.reporter.__class__),
        )
        process.start()
        return process

    def _finish(self, feeder: JobFeeder, node, failure) -> None:
        """doit's bookkeeping for a task's outcome, then the jobs it makes ready."""
        self.process_task_result(node, failure)
        feeder.done(node.task.name)
        # after a failure without --continue doit hands out nothing more: the few
        # jobs already queued (up to JOBS_AHEAD_PER_WORKER per worker) still run
        feeder.fill(node)

    def _node_of(self, message: dict):
        if "exit" in message:  # the worker itself failed, outside any task
            raise message["exit"](message["exception"])
        return self.task_dispatcher.nodes[message["name"]]

    def _teardown_message(self, message: dict) -> None:
        node = self._node_of(message)
        if "reporter" in message:
            getattr(self.reporter, message["reporter"])(node.task)

    def _report_times(
        self, task, times: tuple[float, float], worker: int, *, start_reported: bool = False
    ) -> None:
        # the reporter hears of a worker's task when its result comes back, with the
        # times it began and ended there (one message per task instead of two); a
        # reporter with no use for them gets doit's plain start report, if not had yet
        task_ran = getattr(self.reporter, "task_ran", None)
        if task_ran is not None:
            task_ran(task, *times, worker)
        elif not start_reported:
            self.reporter.execute_task(task)

    def execute_task_subprocess(self, worker_end, result_q, reporter_class):
        """A worker's loop: run each job it is sent, send one message back per job."""
        worker_end.listen_as_worker()
        keep_whole_chains()  # this worker is sent the later tasks of every chain it starts
        self.result_q = worker_end  # doit's teardown reports go through ``result_q.put``
        self.reporter = WorkerReports(worker_end, reporter_class)
        try:
            while (job := worker_end.next_job()) is not None:
                task = self.tasks[job.name]
                task.update_from_pickle(job.task_dict)
                failure = self.execute_task(task)
                result = {
                    "name": task.name,
                    "times": (self.reporter.started, time.time()),
                    "task": task.pickle_safe_dict(),
                    "out": [action.out for action in task.actions],
                    "err": [action.err for action in task.actions],
                }
                if failure:
                    result["failure"] = failure
                worker_end.put(result)
            self.teardown()
            worker_end.put({"bye": True})
        except (SystemExit, KeyboardInterrupt, Exception) as exception:
            # error, blow-up everything: the parent raises it (as doit's runner does)
            worker_end.put({"exit": exception.__class__, "exception": str(exception)})

    def _take_result(self, node, result: dict) -> None:
        """A worker's result into the parent's task."""
        task = node.task
        task.update_from_pickle(result["task"])
        for action, out, err in zip(task.actions, result["out"], result["err"], strict=True):
            action.out, action.err = out, err


class WorkerReports:
    """The reporter inside a worker: keeps its task's start time (sent with the result),
    passes any other report to the parent."""

    def __init__(self, worker_end: WorkerEnd, reporter_class):
        self.worker_end = worker_end
        self.reporter_class = reporter_class
        self.started = 0.0

    def execute_task(self, task) -> None:
        self.started = time.time()

    def complete_run(self) -> None:
        pass  # the parent completes the run

    def __getattr__(self, method: str):
        if not hasattr(self.reporter_class, method):
            raise AttributeError(method)
        return lambda task: self.worker_end.put({"name": task.name, "reporter": method})


def worker_died(exitcode: int | None):
    """The failure of a task whose worker process ended under it."""
    from kiln.tasks.actions import failure

    how = f"killed by signal {-exitcode}" if exitcode and exitcode < 0 else f"exit {exitcode}"
    return failure(
        KilnError(
            f"the worker process running this task died ({how})",
            hint="nothing it was writing was kept; build again to retry it "
            "(a signal 9 is often the system running out of memory)",
        )
    )


class JobFeeder:
    """Puts ready jobs on the workers' queues until ``limit`` jobs are not yet answered.

    A job of a chain some worker has started goes to that worker; any other
    job to the worker with the fewest jobs waiting.
    """

    def __init__(
        self,
        runner: MRunner,
        job_qs: dict | list,  # per slot 0..n-1: anything with put(job)
        limit: int,
        group_of: Callable[[str], str | None] = lambda name: None,
    ):
        self.runner = runner
        self.job_qs = job_qs
        self.limit = limit
        self.group_of = group_of
        self.outstanding = [0] * len(job_qs)  # per worker: jobs sent, not yet answered
        self.owner: dict[str, int] = {}  # chain -> the worker that runs it
        self.placed: dict[str, int] = {}  # task name -> the worker it was sent to
        self.handicap: dict[int, int] = {}  # worker -> jobs counted on top of its own
        self.queued = 0
        self.exhausted = False

    def fill(self, completed) -> None:
        """``completed``: the node whose result was just processed (None at the start)."""
        while not self.exhausted and self.queued < self.limit:
            job = self.runner.get_next_job(completed)
            completed = None  # the dispatcher hears of a finished node once
            if job is None:  # nothing left, or a failure stopped the build
                self.exhausted = True
            elif isinstance(job, JobHold):  # every ready task is queued: wait for a result
                self.runner.free_proc = 0
                break
            else:
                self._send(job)
        if not self.queued and not self.exhausted:
            raise RuntimeError("doit dispatcher holds tasks while none runs (a dependency cycle?)")

    def done(self, name: str) -> None:
        """The result of job ``name`` came back."""
        self.outstanding[self.placed.pop(name)] -= 1
        self.queued -= 1

    def _send(self, job) -> None:
        chain = self.group_of(job.name)
        worker = self.owner.get(chain) if chain is not None else None
        if worker is None:
            worker = min(
                range(len(self.job_qs)),
                key=lambda slot: self.outstanding[slot] + self.handicap.get(slot, 0),
            )
            if chain is not None:
                self.owner[chain] = worker
        self.job_qs[worker].put(job)
        self.placed[job.name] = worker
        self.outstanding[worker] += 1
        self.queued += 1


class LocalJobs:
    """The jobs the build process runs itself, in the order given."""

    def __init__(self):
        self.jobs: deque = deque()

    def put(self, job) -> None:
        self.jobs.append(job)

    def take(self):
        return self.jobs.popleft()

    def __bool__(self) -> bool:
        return bool(self.jobs)


def use_queue_ahead_runner() -> None:
    """Make doit's `-n` (process) runs in this process use QueueAheadRunner."""
    cmd_run.MRunner = QueueAheadRunner
