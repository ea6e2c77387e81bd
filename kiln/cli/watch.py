"""`kiln watch`: rebuild (and test) what changed on every save, until Ctrl-C.

Each round runs `kiln compile [FILTER...]` (or `kiln test [FILTER...] --target
T`) in a fresh process: exactly what the user would type, so an edited kernel,
stage module or pipeline.yaml is read anew, and doit's up-to-date checks
rebuild only what the change touched. A round that fails prints its
diagnostics and the watch goes on.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import KilnError

# directories whose files never start a round (build outputs, state, tools' caches)
IGNORED_DIRS = frozenset({"build", "__pycache__", "node_modules", "site-packages", "venv"})
WATCHED_SUFFIXES = (".py",)


@dataclass(frozen=True)
class Round:
    number: int
    changed: tuple[str, ...]  # paths relative to the project root
    action: str  # "compile" or "test on sim"
    rc: int
    seconds: float

    def line(self) -> str:
        """The round's one summary line."""
        if not self.changed:
            what = "start"
        elif len(self.changed) <= 3:
            what = ", ".join(self.changed) + " changed"
        else:
            what = f"{self.changed[0]} and {len(self.changed) - 1} more changed"
        outcome = "ok" if self.rc == 0 else f"FAILED (exit {self.rc})"
        took = f"in {self.seconds:.1f} s"
        return f"kiln watch: round {self.number}: {what}: {self.action} {outcome} {took}"


class Watcher:
    """Runs rounds for a project; ``run`` drives them from file-system events."""

    def __init__(
        self,
        pipeline: Path,
        filters: Iterable[str] = (),
        target: str | None = None,
        debounce_ms: int = 200,
        poll: bool = False,
        out=None,
    ):
        self.pipeline = pipeline.absolute()
        self.root = self.pipeline.parent
        self.filters = list(filters)
        self.target = target
        self.debounce_ms = debounce_ms
        self.poll = poll
        self.out = out or sys.stdout
        self.rounds = 0
        self.ignored = [self.root / ".kiln", *self._out_dirs()]

    # -- one round -------------------------------------------------------------
    def command(self) -> list[str]:
        """The kiln command line of a round."""
        if self.target:
            words = ["test", *self.filters, "--target", self.target]
        else:
            words = ["compile", *self.filters]
        return [sys.executable, "-m", "kiln", *words]

    def run_round(self, changed: Iterable[Path] = ()) -> Round:
        """Build (and test) once, as `kiln compile`/`kiln test` would; print the summary line."""
        env = dict(os.environ, KILN_PIPELINE_FILE=str(self.pipeline))
        env.setdefault("KILN_VERBOSITY", "0")  # failures and the summary; -v shows every task
        started = time.monotonic()
        build = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL)
        try:
            rc = build.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the build too (the terminal's whole group); a SIGTERM came
            # to this process alone: pass it on, so the build stops as it would itself.
            # A SIGINT sent to this process alone (kill -INT, an IDE's stop) did not
            # reach the build: one still running a moment later gets it passed on
            if _terminated.is_set():
                build.terminate()
            else:
                try:
                    build.wait(timeout=INTERRUPT_GRACE_S)
                except subprocess.TimeoutExpired:
                    build.send_signal(signal.SIGINT)
            build.wait()
            raise
        result = Round(
            self.rounds,
            tuple(sorted(self._shown(p) for p in changed)),
            f"test on {self.target}" if self.target else "compile",
            rc,
            time.monotonic() - started,
        )
        self.rounds += 1
        self._say(result.line())
        return result

    # -- the loop ----------------------------------------------------------------
    def run(
        self,
        changes: Iterable[Iterable[Path]] | None = None,
        max_rounds: int | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """A first round, then one per batch of relevant changes; 0 when stopped.

        ``changes`` replaces the file-system events (for tests); ``max_rounds``
        counts the rounds after the first; ``stop`` ends the watch when set.
        """
        self.run_round()
        self._say(f"kiln watch: watching {self._shown(self.root) or '.'} (Ctrl-C to stop)")
        for batch in changes if changes is not None else self.events(stop):
            paths = {Path(p) for p in batch if self.relevant(Path(p))}
            if not paths:
                continue
            self.run_round(paths)
            if max_rounds is not None and self.rounds > max_rounds:
                break
            if stop is not None and stop.is_set():
                break
        return 0

    def events(self, stop: threading.Event | None = None) -> Iterator[set[Path]]:
        """Batches of changed paths, each after ``debounce_ms`` without a further save."""
        import watchfiles

        for batch in watchfiles.watch(
            *self.watched_paths(),
            watch_filter=lambda _change, path: self.relevant(Path(path)),
            step=max(self.debounce_ms, 1),
            debounce=max(1600, 4 * self.debounce_ms),
            stop_event=stop,
            force_polling=self.poll or None,
        ):
            yield {Path(path) for _, path in batch}

    # -- what is watched -------------------------------------------------------------
    def watched_paths(self) -> list[Path]:
        """The project root, and the directories of stage modules that live elsewhere."""
        paths = [self.root]
        for module_file in self._stage_files():
            if module_file.is_relative_to(self.root) or "site-packages" in module_file.parts:
                continue
            if module_file.parent not in paths:
                paths.append(module_file.parent)
        return paths

    def relevant(self, path: Path) -> bool:
        """A save that starts a round: the pipeline file or a Python module, outside outputs."""
        path = path.absolute()
        if path == self.pipeline:
            return True
        if path.suffix not in WATCHED_SUFFIXES:
            return False
        if any(path.is_relative_to(d) for d in self.ignored):
            return False
        parts = path.relative_to(self.root).parts[:-1] if path.is_relative_to(self.root) else ()
        return not any(p in IGNORED_DIRS or p.startswith(".") for p in parts)

    def _pipeline(self):
        """The pipeline as it is now; None when broken (the first round says what is wrong)."""
        from kiln.pipeline import load_pipeline

        try:
            return load_pipeline(self.pipeline)
        except (KilnError, OSError):
            return None

    def _out_dirs(self) -> list[Path]:
        pipeline = self._pipeline()
        return [pipeline.resolve_out_dir().absolute()] if pipeline is not None else []

    def _stage_files(self) -> list[Path]:
        import importlib.util

        pipeline = self._pipeline()
        stages = pipeline.stages if pipeline is not None else ()
        found = []
        sys.path.insert(0, str(self.root))
        try:
            for stage in stages:
                try:
                    spec = importlib.util.find_spec(stage.module)
                except (ImportError, ValueError):
                    continue
                if spec is not None and spec.origin and spec.origin.endswith(".py"):
                    found.append(Path(spec.origin).absolute())
        finally:
            sys.path.remove(str(self.root))
        return found

    def _shown(self, path: Path) -> str:
        path = Path(path).absolute()
        if path.is_relative_to(self.root):
            return path.relative_to(self.root).as_posix() if path != self.root else ""
        return str(path)

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)


_terminated = threading.Event()  # the watch was stopped by SIGTERM, not Ctrl-C
INTERRUPT_GRACE_S = 1.0  # how long a build that had its own Ctrl-C takes to stop, at most


def _stop_on_sigterm(signum, frame) -> None:
    _terminated.set()
    raise KeyboardInterrupt


def _check_usage(target: str | None, filters: list[str]) -> None:
    """An unknown --target (or one that cannot run here), or a FILTER that matches nothing,
    stops the watch before round one: saving a file would never make either right."""
    from kiln.cli.target_check import ready_targets
    from kiln.tasks.model.project import Project
    from kiln.tasks.model.selection import select

    try:
        project = Project.find()
    except KilnError:  # a broken pipeline: the first round says so, and the watch goes on
        return
    if target:
        ready_targets(project, [target], asked=True, checks=None, command="watch", quiet=True)
    if filters:
        select(project, filters, command="compile" if target is None else "test")


def cmd_watch(args: argparse.Namespace) -> int:
    """`kiln watch`: Ctrl-C, or SIGTERM (a terminal closed, `kill`), ends it with exit 0."""
    from kiln.tasks.model.project import find_pipeline

    if args.debounce < 0:
        raise KilnError(
            "--debounce must not be negative",
            expected="--debounce MS with MS >= 0",
            found=str(args.debounce),
        )
    _check_usage(args.target, list(args.filters or ()))
    watcher = Watcher(
        find_pipeline(),
        args.filters,
        target=args.target,
        debounce_ms=args.debounce,
        poll=getattr(args, "poll", False),
    )
    # SIGTERM stops it as Ctrl-C does, between rounds and during one alike (a build
    # holding the lock would otherwise take it as its own Ctrl-C: exit 0 there, 143 here)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return watcher.run()
    except KeyboardInterrupt:
        print(f"\nkiln watch: stopped after {watcher.rounds} round(s)", flush=True)
        return 0
