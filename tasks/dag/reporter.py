"""Build progress: a rich live display on a terminal, one line per task otherwise.

Failures carry Kiln diagnostics (see tasks/actions.py); they are printed in
the chosen message format (``KILN_MESSAGE_FORMAT=human|json``) without a
Python traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kiln.errors import relative_path
from kiln.interrupts import interrupted
from kiln.logconfig import verbosity
from kiln.tasks.chain.failure_groups import affected, cause_key, group_failures, instance_of
from kiln.tasks.chain.task_failure import DIAGNOSTIC_MARK

# task name -> diagnostic (a dict) or plain message, of the last run in this process
_last_failures: dict[str, dict | str] = {}
_last_blocked: list[str] = []


_summaries: list[str] = []  # the summary objects this process wrote


def summary_json(
    ran: int = 0,
    up_to_date: int = 0,
    failed: int = 0,
    not_run: int = 0,
    skipped: list | None = None,
    failed_tasks: list | None = None,
    stopped: bool = False,
) -> str:
    """The build's ``{"kind": "summary", ...}`` line (--message-format json); ``stopped``:
    by a Ctrl-C (also when this process did not see the signal itself)."""
    text = json.dumps(
        {
            "kind": "summary",
            "ran": ran,
            "up_to_date": up_to_date,
            "failed": failed,
            "not_run": not_run,
            "skipped": skipped or [],
            "failed_tasks": failed_tasks or [],
            **({"interrupted": True} if stopped or interrupted() else {}),
        }
    )
    _summaries.append(text)
    return text + "\n"


def wrote_summary() -> bool:
    """Whether a build of this process has written its summary object."""
    return bool(_summaries)


def last_run_failures() -> tuple[dict[str, dict | str], list[str]]:
    """What the last build in this process could not do: (failed tasks, tasks not run).

    A failed task maps to its diagnostic (a dict) or its plain message; a
    task not run is one whose input was produced by a failed task.
    """
    return dict(_last_failures), list(_last_blocked)


def diagnostic_from_failure(fail) -> dict | None:
    message = getattr(fail, "message", "") or ""
    if message.startswith(DIAGNOSTIC_MARK):
        return json.loads(message[len(DIAGNOSTIC_MARK) :])
    return None


def render_diagnostic(diag: dict) -> str:
    from kiln.errors import KilnError, Location

    loc = None
    if diag.get("file"):
        loc = Location(
            diag["file"],
            diag.get("line"),
            diag.get("column"),
            diag.get("key_path"),
            diag.get("source"),
        )
    err = KilnError(
        diag["message"],
        loc,
        diag.get("expected"),
        diag.get("found"),
        diag.get("hint"),
        diag.get("kind", "error"),
        list(diag.get("notes") or []),
    )
    return err.render()


class KilnReporter:
    """doit reporter interface (see doit.reporter.ConsoleReporter)."""

    desc = "kiln progress reporter"
    results_dir: Path | None = None  # the project's .kiln (set by tasks/dag/loader.py)

    def __init__(self, outstream, options):
        from kiln.brokenpipe import PipeSafeStream

        # `doit compile | head -1`: a reader that went away must not stop the build
        self.out = outstream if isinstance(outstream, PipeSafeStream) else PipeSafeStream(outstream)
        self.err = sys.stderr
        self.format = os.environ.get("KILN_MESSAGE_FORMAT", "human")
        # -q: only failures and the summary; -v: every task with where its artifact came from
        self.verbosity = verbosity()  # checked before doit runs (kiln's main, dodo.py)
        self.live = (
            self.format == "human"
            and self.verbosity == 1
            and getattr(outstream, "isatty", lambda: False)()
        )
        self.t0 = time.monotonic()
        self.ran: list[str] = []
        self.uptodate = 0
        self.failures: list[tuple[str, object]] = []
        self.causes: dict[str, str] = {}  # cause key -> the first failed task with it
        self.cache_counts = {"hit": 0, "fetched": 0, "compiled": 0}
        self.blocked: list[str] = []
        self.skipped: list[tuple[str, str]] = []  # (task, reason): a target not available here
        self.progress = None
        self.bar = None
        _last_failures.clear()
        _last_blocked.clear()
        # the build profile and failures `kiln view` shows (see tasks/checks/results.py)
        self.state_dir = self.results_dir
        self.started: dict[str, float] = {}
        self.lanes: dict[int, int] = {}  # pid of a worker process -> its lane in the profile
        self.ended: dict[str, float] = {}  # task -> when it finished
        self.records: list[dict] = []

    # -- doit hooks -------------------------------------------------------
    def initialize(self, tasks, selected_tasks):
        if self.live:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            total = len(_closure(tasks, selected_tasks))
            self.progress = Progress(
                TextColumn("[bold]kiln[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                transient=False,
            )
            self.bar = self.progress.add_task("starting", total=total)
            self.progress.start()

    def get_status(self, task):
        pass

    def execute_task(self, task):
        self._started(task, time.time())

    def _started(self, task, at: float) -> None:
        if task.subtask_of is None and task.has_subtask:
            return
        self.started[task.name] = at
        if self.live:
            self.progress.update(self.bar, description=_describe(task.name))
        elif self.format == "human" and task.actions and self.verbosity == 1:
            self._write(f". {task.name}\n")

    def add_failure(self, task, fail):
        from doit.exceptions import UnmetDependency

        self._advance()
        if isinstance(fail, UnmetDependency):
            # its input failed and was reported: one diagnostic per failure, not per dependent
            if not task.actions:  # a group task (plain `doit compile`'s): not a build step
                return
            self.blocked.append(task.name)
            _last_blocked.append(task.name)
            return
        self.failures.append((task.name, fail))
        diag = diagnostic_from_failure(fail)
        _last_failures[task.name] = diag if diag is not None else fail.get_msg().strip()
        self._record(task, "failed", diag or {"kind": "error", "message": fail.get_msg().strip()})
        # one cause, one message: a failure like one printed already is in the summary's count
        first = self.causes.setdefault(cause_key(task.name, _last_failures[task.name]), task.name)
        if self.format == "json":  # one object per task; a repeat names the first of its cause
            if diag is None:
                diag = {"kind": "error", "message": fail.get_msg().strip()}
            diag["task"] = task.name
            if first != task.name:
                diag["same_as"] = first
            self._write(json.dumps(diag, sort_keys=True) + "\n")
            return
        if first != task.name:
            if self.verbosity >= 2:
                self._err(f"FAILED {task.name}: the same error as {first}\n")
            return
        text = render_diagnostic(diag) if diag else fail.get_msg().rstrip()
        self._err(f"FAILED {task.name}\n{text}\n")

    def add_success(self, task):
        values = task.values if isinstance(task.values, dict) else {}
        if task.actions and values.get("skipped"):
            self.skipped.append((task.name, str(values["skipped"])))
            if self.format == "human" and self.verbosity >= 1:
                self._write(f"skipped {task.name}: {values['skipped']}\n")
            self._advance()
            self._record(task, "skipped")
            return
        if task.actions:
            self.ran.append(task.name)
            how = values.get("cache")
            if how in self.cache_counts:
                self.cache_counts[how] += 1
            if self.format == "human" and self.verbosity >= 2:
                end = self.ended.get(task.name, time.time())
                took = end - self.started.get(task.name, end)
                self._write(f". {task.name} ({how or 'ran'}, {took:.2f} s)\n")
            self._advance()
            self._record(task, "ran")

    def skip_uptodate(self, task):
        if task.actions:
            self.uptodate += 1
            if self.format == "human" and self.verbosity >= 2:
                self._write(f"- {task.name} (up to date)\n")
            self._advance()
            self._record(task, "up-to-date")

    def skip_ignore(self, task):
        self._advance()

    def cleanup_error(self, exception):
        self._err(str(exception) + "\n")

    def runtime_error(self, msg):
        self._err(f"error: {msg}\n")

    def teardown_task(self, task):
        pass

    def complete_run(self):
        from kiln.statefiles import stamp_sound_dbs

        stamp_sound_dbs()  # doit has closed its database: remember it as sound
        self._save_results()
        if self.progress is not None:
            self.progress.update(self.bar, description="done")
            self.progress.stop()
        counts = self.cache_counts
        fetched = counts["hit"] + counts["fetched"]
        if any(counts.values()):
            record_cache_counts(counts)
        if self.format == "json":
            if any(counts.values()):
                cache = {"kind": "cache", "fetched": fetched, "compiled": counts["compiled"]}
                self._write(json.dumps(dict(cache, local_hits=counts["hit"])) + "\n")
            self._write(
                summary_json(
                    ran=len(self.ran),
                    up_to_date=self.uptodate,
                    failed=len(self.failures),
                    not_run=len(self.blocked),
                    skipped=[{"task": n, "reason": r} for n, r in self.skipped],
                    failed_tasks=[name for name, _ in self.failures],
                )
            )
            return
        if self.failures:
            self._err(self._failure_summary())
        total = (
            len(self.ran) + self.uptodate + len(self.failures) + len(self.blocked)
            + len(self.skipped)
        )  # fmt: skip
        blocked = f", {len(self.blocked)} not run (an input failed)" if self.blocked else ""
        if self.skipped:
            blocked += f", {len(self.skipped)} skipped (target unavailable)"
        cache_part = (
            f" ({fetched} fetched, {counts['compiled']} compiled)" if any(counts.values()) else ""
        )
        # after Ctrl-C the counts are of the tasks done so far, not of the build
        what = f"interrupted after {total} tasks" if interrupted() else f"{total} tasks"
        self._write(
            f"kiln: {what}: {len(self.ran)} ran, {self.uptodate} up to date, "
            f"{len(self.failures)} failed{blocked}{cache_part} "
            f"in {time.monotonic() - self.t0:.1f} s\n"
        )

    # -- helpers ----------------------------------------------------------
    def _failure_summary(self) -> str:
        """``kiln: N failed:`` and a line per distinct error, with the instances it hit."""
        found = [(name, _diagnostic_or_text(fail)) for name, fail in self.failures]
        groups = group_failures(found)
        distinct = f" ({len(groups)} distinct errors)" if len(groups) < len(found) else ""
        if len(groups) == 1 < len(found):
            distinct = " (one error)"
        lines = [f"kiln: {len(found)} failed{distinct}:"]
        for diag, names in groups:
            wheres = {_where(d) for n, d in found if n in names}
            where = _where(diag) if len(wheres) == 1 else ""
            if len(names) == 1:
                lines.append(f"  {names[0]}" + (f" ({where})" if where else ""))
                continue
            if isinstance(diag, dict):  # a declared cause says it for every instance
                message = diag.get("cause") or diag.get("message", "")
            else:  # a failure's text (a test's mismatch): its first line
                message = (str(diag or "").strip().splitlines() or [""])[0]
            head = f"{where}: {message}" if where else message
            lines.append(f"  {head}" if head else "  the same error:")
            hit = affected([instance_of(n) for n in names], self.verbosity >= 2)
            lines.append(f"    {hit}")
        return "\n".join(lines) + "\n"

    def _record(self, task, outcome: str, diagnostic: dict | None = None) -> None:
        end = self.ended.pop(task.name, None) or time.time()
        record = {
            "task": task.name,
            "start": self.started.pop(task.name, end),
            "end": end,
            "outcome": outcome,
        }
        if diagnostic is not None:
            record["diagnostic"] = diagnostic
        values = task.values if isinstance(task.values, dict) else {}
        spans = values.get("spans")
        if outcome == "ran" and spans:
            # the chain's own stage spans, from whichever process ran it (task.values is
            # the one channel that survives doit's process runner)
            record["start"], record["end"] = spans[0][1], spans[-1][2]
            record["stages"] = spans
        pid = values.get("pid")
        if pid and pid != os.getpid():
            record["worker"] = self.lanes.setdefault(pid, len(self.lanes) + 1)
        self.records.append(record)

    def _save_results(self) -> None:
        """The build profile and the failed instances, for `kiln view` and `--profile`."""
        if self.state_dir is None or not self.records:
            return
        from kiln.tasks.checks.results import save_profile, task_instance, update_failures

        assign_workers(self.records)
        failed, succeeded = {}, set()
        for r in self.records:
            owner = task_instance(r["task"])
            if r["outcome"] == "failed" and owner is not None:
                failed[owner[0]] = {"task": r["task"], "diagnostic": r.get("diagnostic")}
            elif r["outcome"] != "failed":
                succeeded.add(r["task"])
        try:
            # a run of other tasks alone (`doit report`) keeps the last build's profile
            if any(task_instance(r["task"]) for r in self.records):
                save_profile(self.state_dir, self.records)
            update_failures(self.state_dir, failed, succeeded)
        except OSError as exc:  # the build itself is done: say so, do not fail it
            self._err(f"kiln: could not record the build profile: {exc}\n")

    def _advance(self):
        if self.progress is not None:
            self.progress.advance(self.bar)

    def _write(self, text):
        if self.progress is not None:
            self.progress.console.print(text, end="", markup=False, highlight=False)
        else:
            self.out.write(text)
            self.out.flush()

    def _err(self, text):
        if self.progress is not None:
            self.progress.console.print(text, end="", markup=False, highlight=False)
        else:
            self.err.write(text)
            self.err.flush()


def _where(diag: dict | str | None) -> str:
    """file:line of a diagnostic, for the list of failures at the end."""
    if not isinstance(diag, dict) or not diag.get("file"):
        return ""
    return relative_path(diag["file"]) + (f":{diag['line']}" if diag.get("line") else "")


def assign_workers(records: list[dict]) -> None:
    """Give each record without a known worker the lowest lane free at its start.

    An `-n` build names the worker of every task it ran; the rest (a build
    without workers, tasks found up to date) get lanes by overlap: tasks that
    overlap ran on different ones.
    """
    free_at: list[float] = []
    unknown = [r for r in records if "worker" not in r]
    for r in sorted(unknown, key=lambda r: (r["start"], r["task"])):
        lane = next((i for i, t in enumerate(free_at) if t <= r["start"]), len(free_at))
        if lane == len(free_at):
            free_at.append(0.0)
        free_at[lane] = r["end"]
        r["worker"] = lane


def _describe(name: str) -> str:
    # compile:gemm.small.visa -> "gemm.small  visa"
    kind, _, rest = name.partition(":")
    inst, _, stage = rest.rpartition(".")
    return f"{inst}  {stage}" if inst else name


def _closure(tasks: dict, selected) -> set[str]:
    """Names of the action-carrying tasks a run of ``selected`` may execute."""
    producers = {t: task.name for task in tasks.values() for t in task.targets}
    todo = list(selected or [n for n, t in tasks.items() if t.subtask_of is None])
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in tasks:
            continue
        seen.add(name)
        task = tasks[name]
        todo.extend(task.task_dep)
        todo.extend(producers[f] for f in task.file_dep if f in producers)
    return {n for n in seen if tasks[n].actions}


def record_cache_counts(counts: dict) -> None:
    """Keep the last build's cache counts for ``kiln cache stats`` (best effort)."""
    from kiln.cache.config import resolve_cache_config
    from kiln.cache.session import write_last_build

    try:
        write_last_build(resolve_cache_config(None).local_dir, counts)
    except Exception:  # stats are a convenience; never fail a build over them
        pass


def _diagnostic_or_text(fail) -> dict | str:
    """A failure as the grouping compares it: its diagnostic, else its message (a test
    task's mismatch is text), as ``add_failure`` printed it."""
    diag = diagnostic_from_failure(fail)
    return diag if diag is not None else fail.get_msg().strip()
