"""doit's in-process runner, with work that runs elsewhere started ahead of its tasks.

With the dask executor a stage chain is built on a worker, and its tasks
here only write what comes back. Under doit's thread runner every chain
held a thread blocked on its result: keeping two workers fed took 32
threads, and handing the interpreter lock between them (tens of thousands
of times a build) cost the build process more CPU than the writing it did,
on the cores the workers needed. This runner is one thread. As doit's
dispatcher hands out ready tasks, ``begin(task)`` (tasks/chains_ahead.py)
may start the task's remote work and return a Future; the task runs here
once that Future is done, and every other task runs here at once, exactly
as under doit's plain runner. doit still decides what is ready, saves the
dependency records and reports.

doit has no hook to choose its runner: ``use_ahead_runner`` installs this
class as its plain (no ``-n``) runner for the doit runs of this process.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from doit import cmd_run
from doit.runner import Runner


def _run_now(task) -> Future | None:
    return None


def _nothing() -> None:
    pass


class AheadRunner(Runner):
    """doit's sequential runner, letting ``begin`` start a task's remote work first."""

    begin: Callable[[object], Future | None] = staticmethod(_run_now)
    end: Callable[[], None] = staticmethod(_nothing)  # the run is over: stop what begin started

    def run_tasks(self, task_dispatcher):
        """Run every task doit hands out; a task begun elsewhere runs when that is done."""
        try:
            self._run_all_ready(task_dispatcher)
        finally:
            type(self).end()

    def _run_all_ready(self, task_dispatcher) -> None:
        generator = task_dispatcher.generator
        finished: queue.SimpleQueue = queue.SimpleQueue()  # nodes whose remote work is done
        to_report: deque = deque()  # run here, not yet told to the dispatcher
        waiting = 0  # nodes begun elsewhere, not run yet
        exhausted = holding = False
        while True:
            if self._stop_running:  # a failure without --continue: nothing more starts
                self._run_finished(finished)
                break
            if to_report or not (holding or exhausted):
                try:
                    step = generator.send(to_report.popleft() if to_report else None)
                except StopIteration:
                    exhausted, holding = True, False
                    continue
                holding = step == "hold on"  # nothing ready until a running task ends
                if holding or not self.select_task(step, task_dispatcher.tasks):
                    if not holding:
                        to_report.append(step)  # skipped, up to date or failed: processed
                    continue
                ready = self._begin(step.task)
                if ready is None:
                    self._run(step)
                    to_report.append(step)
                else:
                    waiting += 1
                    ready.add_done_callback(lambda _, node=step: finished.put(node))
                continue
            if not waiting:
                break  # exhausted, and nothing begun is left
            node = finished.get()  # the only wait: a Ctrl-C lands here
            waiting -= 1
            self._run(node)
            holding = False
            if not exhausted:
                to_report.append(node)

    def _run_finished(self, finished: queue.SimpleQueue) -> None:
        """Run the tasks whose remote work is already back (they are under way, as a
        process runner's running tasks are, and their results would be lost)."""
        while True:
            try:
                node = finished.get_nowait()
            except queue.Empty:
                return
            self._run(node)

    def _begin(self, task) -> Future | None:
        try:
            return type(self).begin(task)
        except Exception:  # starting ahead only saves time: the task runs here instead
            return None

    def _run(self, node) -> None:
        self.process_task_result(node, self.execute_task(node.task))


def use_ahead_runner(
    begin: Callable[[object], Future | None], end: Callable[[], None] = _nothing
) -> None:
    """Make doit's plain runs in this process use AheadRunner, beginning tasks with
    ``begin`` and calling ``end`` when a run is over (however it ends)."""
    AheadRunner.begin = staticmethod(begin)
    AheadRunner.end = staticmethod(end)
    cmd_run.Runner = AheadRunner
