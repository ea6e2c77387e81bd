"""doit's process runner, with jobs queued ahead so an `-n` worker never waits on the parent.

doit's own runner hands a worker its next task only after the parent has
read the worker's last result, saved its dependencies and picked the next
task. Kiln's stage tasks are a few milliseconds each, so a worker spends a
large share of an `-n 2` build idle in that round trip, the more so on a
machine whose cores the workers themselves keep busy. This runner keeps a
few ready tasks queued per worker: a worker that finishes one takes the
next at once while the parent catches up. Every task of a kernel
instance's stage chain goes to the worker that ran its first one
(tasks/affinity.py says why).

Only tasks whose dependencies have all finished are ever queued (doit's
dispatcher decides, as before), so the order constraints, up-to-date
checks, dependency records and reports are doit's. doit has no hook to
choose its runner, so ``use_queue_ahead_runner`` installs this class in
place of doit's process runner for the doit run of this process.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

from doit import cmd_run
from doit.runner import JobHold, MRunner
from kiln.tasks.affinity import chain_of, keep_whole_chains

JOBS_AHEAD_PER_WORKER = 2


class QueueAheadRunner(MRunner):
    """A multiprocessing runner that keeps up to workers x (1 + ahead) jobs queued."""

    def run_tasks(self, task_dispatcher):
        """Dispatch ready tasks to the workers, keeping their queues filled; collect results."""
        # Each worker has its own job pipe, written by the parent itself: doit's queue
        # hands every put to a feeder thread, which fights the parent's main thread for
        # the GIL on every task, and one pipe per worker lets a chain's tasks go to the
        # worker that ran its first one (tasks/affinity.py). A full pipe can block that
        # write only while its worker is busy, and workers never block in turn: results
        # keep doit's queue, whose feeder thread takes them whether or not the parent
        # is reading.
        job_qs = [multiprocessing.SimpleQueue() for _ in range(self.num_process)]
        result_q = self.Queue()
        self.task_dispatcher = task_dispatcher
        self.tasks = task_dispatcher.tasks
        feeder = JobFeeder(self, job_qs, self.num_process * (1 + JOBS_AHEAD_PER_WORKER), chain_of)
        feeder.fill(None)
        # every worker, unless all there is to do is queued already: more tasks get
        # ready as these finish (none at all when everything is up to date)
        workers = [
            (
                self.Child(
                    target=self.execute_task_subprocess,
                    args=(job_q, result_q, self.reporter.__class__),
                ),
                job_q,
            )
            for job_q, waiting in zip(job_qs, feeder.outstanding, strict=True)
            if waiting or not feeder.exhausted
        ]
        try:
            for worker, _ in workers:
                worker.start()
            while feeder.queued:
                result = result_q.get()
                if "exit" in result:
                    raise result["exit"](result["exception"])
                node = task_dispatcher.nodes[result["name"]]
                if "reporter" in result:
                    getattr(self.reporter, result["reporter"])(node.task)
                    continue
                self._take_result(node, result)
                feeder.done(result["name"])
                # after a failure without --continue doit hands out nothing more: the
                # few jobs already queued (two per worker on average) still run
                feeder.fill(node)
            for _, job_q in workers:
                job_q.put(None)
        except (SystemExit, KeyboardInterrupt, Exception):
            for worker, _ in workers:
                if worker.is_alive():
                    worker.terminate()
            raise
        for worker, _ in workers:
            worker.join()
        while not result_q.empty():  # teardown reports; safe once the workers are joined
            result = result_q.get()
            getattr(self.reporter, result["reporter"])(task_dispatcher.tasks[result["name"]])

    def execute_task_subprocess(self, job_q, result_q, reporter_class):
        keep_whole_chains()  # this worker is sent the later tasks of every chain it starts
        return super().execute_task_subprocess(job_q, result_q, reporter_class)

    def _take_result(self, node, result: dict) -> None:
        """A worker's result into the parent's task, then doit's bookkeeping for it."""
        task = node.task
        task.update_from_pickle(result["task"])
        for action, out, err in zip(task.actions, result["out"], result["err"], strict=True):
            action.out, action.err = out, err
        self.process_task_result(node, result.get("failure"))


class JobFeeder:
    """Puts ready jobs on the workers' queues until ``limit`` jobs are not yet answered.

    A job of a chain some worker has started goes to that worker; any other
    job to the worker with the fewest jobs waiting.
    """

    def __init__(
        self,
        runner: MRunner,
        job_qs: list,
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
            worker = min(range(len(self.job_qs)), key=self.outstanding.__getitem__)
            if chain is not None:
                self.owner[chain] = worker
        self.job_qs[worker].put(job)
        self.placed[job.name] = worker
        self.outstanding[worker] += 1
        self.queued += 1


def use_queue_ahead_runner() -> None:
    """Make doit's `-n` (process) runs in this process use QueueAheadRunner."""
    cmd_run.MRunner = QueueAheadRunner
