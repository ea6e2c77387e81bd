"""`kiln tune`: search each kernel instance's knobs, verify the winner, keep the record.

Candidates are priced by their makespan on the machine model (compile
through the schedule stage); the winner is compiled in full, verified and
run on the simulator against the oracle before it is accepted. A candidate
that fails is recorded as rejected with its reason, never chosen.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import tempfile
from pathlib import Path

from kiln.errors import KilnError
from kiln.logconfig import verbosity
from kiln.tasks.model.importpath import add_project_root
from kiln.tasks.model.project import KernelInstance, Project
from kiln.tasks.model.tuning_key import TuningKeys
from kiln.tune.apply import TUNED_STAGES, graph_digest
from kiln.tune.records import TuningKey, TuningRecord, read_records, write_records

VERIFY_TRIES = 5  # how many of the best candidates to try before keeping the default


def records_path(project: Project) -> Path:
    return project.root / project.pipeline.tuning_file


def run_tune(project: Project, instances: list[KernelInstance], args) -> int:
    """Tune ``instances``; returns the exit code (130 when interrupted, records kept)."""
    from kiln.tune.search import STRATEGIES

    if args.budget < 1:
        raise KilnError("--budget must be at least 1", expected="N >= 1", found=str(args.budget))
    if args.strategy not in STRATEGIES:
        raise KilnError(f"unknown strategy {args.strategy!r}", expected=", ".join(STRATEGIES))
    _check_stages(project)
    path = records_path(project)
    records = read_records(path)
    keys = TuningKeys(project)
    totals = {"trials": 0, "tuned": 0, "current": 0, "failed": 0}
    # -q, as for a build: the summary, warnings and what stopped the run; no line per instance
    quiet = verbosity() == 0
    try:
        for inst in instances:
            try:
                graph, digest = _trace(project, inst)
            except KilnError as err:  # as a build: said once, and the other instances go on
                trace = project.pipeline.stages[0].name
                _failed(totals, err, f"while running stage {trace!r} of", inst)
                continue
            key = TuningKey(graph=digest, **keys.parts(inst))
            old = records.get(inst.name)
            finished = old if old is not None and old.complete and key.matches(old) else None
            if finished is not None and not args.force:
                totals["current"] += 1
                if not quiet:
                    print(f"{inst.name}: record is current ({_describe(old)}); 0 trials")
                continue
            if old is not None and not old.complete and key.matches(old) and not quiet:
                print(f"{inst.name}: the record is from an interrupted run; tuning again")
            try:
                record, interrupted = _tune_instance(project, inst, graph, key, args)
            except _DefaultFails as err:
                _failed(totals, err, "while tuning", inst)
                continue
            if interrupted and finished is not None:  # never trade a finished record for this
                print(
                    f"{inst.name}: interrupted after {record.trials} trials; the finished "
                    f"record is kept ({_describe(finished)})",
                    flush=True,
                )
                return 130
            _warn_if_worse(inst.name, finished, record)
            records[inst.name] = record
            write_records(path, records)  # after every kernel: Ctrl-C keeps what was found
            totals["trials"] += record.trials
            totals["tuned"] += 1
            note = " (interrupted: best so far, tuned again by the next `kiln tune`)"
            if interrupted or not quiet:
                print(f"{inst.name}: {_describe(record)}{note if interrupted else ''}", flush=True)
            if interrupted:
                return 130
    except KeyboardInterrupt:
        print("kiln tune: interrupted; records found so far are kept", file=sys.stderr)
        return 130
    failed = f"{totals['failed']} failed, " if totals["failed"] else ""
    print(
        f"kiln tune: {totals['tuned']} tuned, {totals['current']} current, {failed}"
        f"{totals['trials']} trials; records in {_shown(project, path)}"
    )
    return 1 if totals["failed"] else 0


class _DefaultFails(KilnError):
    """An instance whose default options do not compile: it fails, the others are tuned."""


def _failed(totals: dict, err: KilnError, doing: str, inst: KernelInstance) -> None:
    """Print one instance's failure once, with the note a build gives it."""
    bindings = ", ".join(f"{k}={v}" for k, v in inst.bindings)
    err.notes.append(f"{doing} {inst.name}" + (f" ({bindings})" if bindings else ""))
    print(err.render(), file=sys.stderr, flush=True)
    totals["failed"] += 1


def _warn_if_worse(name: str, finished: TuningRecord | None, record: TuningRecord) -> None:
    """`--force` with a smaller budget may find less: say what the replaced record had."""
    if finished is not None and record.tuned_cycles > finished.tuned_cycles:
        print(
            f"kiln tune: warning: {name}: the new record ({record.tuned_cycles} cycles, "
            f"budget {record.budget}) replaces a faster one ({finished.tuned_cycles} cycles, "
            f"budget {finished.budget})",
            file=sys.stderr,
            flush=True,
        )


def _describe(record: TuningRecord) -> str:
    knobs = ", ".join(
        f"{stage}.{k}={v}" for stage in sorted(record.knobs) for k, v in record.knobs[stage].items()
    )
    return (
        f"{record.default_cycles} -> {record.tuned_cycles} cycles ({record.speedup:.3f}x), "
        f"{record.trials} trials, {record.rejected} rejected"
        + (f"; {knobs}" if knobs else "; defaults are best")
    )


def _shown(project: Project, path: Path) -> str:
    try:
        return str(path.relative_to(project.root))
    except ValueError:
        return str(path)


def _check_stages(project: Project) -> None:
    names = [s.name for s in project.pipeline.stages]
    if "schedule" not in names:
        raise KilnError(
            "kiln tune prices candidates by their schedule, and this pipeline has no "
            "schedule stage",
            expected="a `stages:` list with a stage named schedule",
            found=", ".join(names),
        )


def _trace(project: Project, inst: KernelInstance):
    """The traced graph of ``inst`` and the digest its graph.json artifact has."""
    from kiln.options import build_options
    from kiln.stages.trace import TraceRequest

    add_project_root(project.root)
    stage = project.pipeline.stages[0]
    module = importlib.import_module(stage.module)
    options = build_options(
        module.Options, project.pipeline.stage_options(inst.kernel, stage.name), stage.name
    )
    dtype, dtypes = project.trace_dtypes(inst.kernel)
    request = TraceRequest(
        module=inst.source.module,
        function=inst.source.name,
        bindings=inst.bindings,
        dtypes=tuple(sorted(dtypes.items())),
        default_dtype=dtype,
    )
    graph = module.run(request, options, project.kernel_machine(inst.kernel))
    return graph, hashlib.sha256(module.serialize(graph)).hexdigest()


def _context(project: Project, inst: KernelInstance, graph):
    from kiln.tune.evaluate import Context

    rows = []
    for stage in project.pipeline.stages[1:]:
        rows.append(
            (stage.name, stage.module, project.pipeline.stage_options(inst.kernel, stage.name))
        )
        if stage.name == "schedule":
            break
    return Context(graph, project.kernel_machine(inst.kernel), tuple(rows))


def _tune_instance(project, inst, graph, key: TuningKey, args):
    from kiln.tune.search import Search
    from kiln.tune.space import knobs_for, settings

    context = _context(project, inst, graph)
    knobs = tuple(k for k in knobs_for(graph, context.machine) if k.stage in TUNED_STAGES)
    progress = _Progress(inst.name, args.budget)
    search = Search(
        context,
        knobs,
        args.budget,
        strategy=args.strategy,
        seed=args.seed,
        jobs=args.process or 1,
        label=inst.name,
        on_trial=progress.update,
        client=tuning_client(project),
    )
    interrupted = False
    try:
        search.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
    default = search.default
    if interrupted and default is None:  # nothing priced yet: nothing to keep
        raise KeyboardInterrupt
    if default is None or default.makespan is None:
        reason = default.reason if default is not None else "interrupted before any trial"
        raise _DefaultFails(f"{inst.name}: the default options do not compile: {reason}")
    rejected = [t for t in search.trials if t.makespan is None]
    chosen = default
    for trial in search.ranked()[:VERIFY_TRIES]:
        if trial is default:
            break
        problem = verify_candidate(project, inst, graph, settings(knobs, trial.candidate))
        if problem is None:
            chosen = trial
            break
        rejected.append(trial)
        print(f"{inst.name}: candidate rejected by verification: {problem}", file=sys.stderr)
    record = TuningRecord(
        instance=inst.name,
        graph=key.graph,
        shape_set=key.shape_set,
        dtype=key.dtype,
        machine=key.machine,
        options=key.options,
        compiler=key.compiler,
        knobs=settings(knobs, chosen.candidate),
        default_cycles=default.makespan,
        tuned_cycles=chosen.makespan,
        trials=len(search.trials),
        rejected=len(rejected),
        strategy=args.strategy,
        seed=args.seed,
        budget=args.budget,
        complete=not interrupted,
    )
    return record, interrupted


def tuning_client(project: Project):
    """The Dask client trials are priced on (pipeline.yaml ``executor:`` or --executor),
    or None to price them here; workers running other Kiln code are refused."""
    from kiln.tasks.execution.executor import resolve_executor

    executor = resolve_executor(project.pipeline.executor, project.root)
    if executor is None:
        return None
    from kiln.tasks.execution.remote_exec import STALE_WORKERS_HINT, dask_client, kiln_code_digest

    client = dask_client(executor)
    if client is None:
        return None
    modules = [stage.module for stage in project.pipeline.stages]
    mine = kiln_code_digest(modules)
    theirs = client.run(kiln_code_digest, modules)
    stale = sorted(worker for worker, digest in theirs.items() if digest != mine)
    if stale:
        raise KilnError(
            f"Dask workers run different Kiln code: {', '.join(stale)}",
            hint=STALE_WORKERS_HINT,
        )
    return client


def verify_candidate(project: Project, inst: KernelInstance, graph, chosen: dict) -> str | None:
    """Compile ``chosen`` through every stage with verification, run it on the simulator
    against the oracle; None when it passes, else the reason."""
    from kiln.driver import lower

    machine = project.kernel_machine(inst.kernel)
    stages = project.pipeline.stages[1:]
    steps = [
        (
            s.module,
            {**project.pipeline.stage_options(inst.kernel, s.name), **chosen.get(s.name, {})},
        )
        for s in stages
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="kiln-tune-") as tmp:
            edf_path = None
            ir = lower(graph, steps, machine)
            if stages and stages[-1].name == "edf":
                edf_path = Path(tmp) / "kernel.edf"
                edf_path.write_bytes(importlib.import_module(stages[-1].module).serialize(ir))
            if edf_path is None:
                return None  # nothing to simulate: the stages' own verifiers passed
            return _simulate(project, inst, graph, edf_path, Path(tmp))
    except KilnError as err:
        return err.message


def _simulate(project, inst, graph, edf_path: Path, out_dir: Path) -> str | None:
    from kiln.compare import compare
    from kiln.runners.base import KernelArtifacts
    from kiln.runners.cpu import CpuRunner
    from kiln.runners.sim import SimRunner
    from kiln.tasks.checks.targets import instance_inputs, load_function
    from kiln.tasks.checks.verdicts import output_tolerance

    artifacts = KernelArtifacts(inst.name, graph, out_dir, edf_path, load_function(project, inst))
    inputs = instance_inputs(project, inst, graph)  # pipeline.yaml's inputs:, as kiln test draws
    oracle = CpuRunner()
    expected = oracle.run(oracle.prepare(artifacts), inputs).outputs
    sim = SimRunner(machine=project.kernel_machine(inst.kernel))
    actual = sim.run(sim.prepare(artifacts), inputs).outputs
    tolerance = project.pipeline.kernel(inst.kernel).tolerance
    for i, (e, a, node) in enumerate(zip(expected, actual, graph.output_nodes, strict=True)):
        c = compare(i, e, a, node.dtype, output_tolerance(node.dtype, tolerance))
        if not c.ok:
            return "sim disagrees with the oracle: " + c.describe()
    return None


class _Progress:
    """A progress bar with the best makespan so far on a terminal; nothing otherwise."""

    def __init__(self, name: str, budget: int):
        self.name, self.bar, self.task = name, None, None
        if sys.stderr.isatty() and verbosity() > 0:  # -q: no bar either, as for a build
            from rich.progress import Progress

            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(f"tuning {name}", total=budget)

    def update(self, trial, best) -> None:
        if self.bar is not None:
            best_text = f"best {best.makespan} cycles" if best is not None else "no candidate yet"
            self.bar.update(self.task, advance=1, description=f"tuning {self.name}: {best_text}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def show_records(project: Project, instances: list[KernelInstance]) -> int:
    """`kiln tune --show`: default vs tuned cycles per instance, and whether the record applies."""
    from rich.console import Console
    from rich.table import Table

    records = read_records(records_path(project))
    keys = TuningKeys(project)
    rows = []
    for inst in instances:
        record = records.get(inst.name)
        if record is None:
            rows.append((inst.name, "", "", "", "", "", "none"))
            continue
        knobs = " ".join(
            f"{s}.{k}={v}" for s in sorted(record.knobs) for k, v in record.knobs[s].items()
        )
        rows.append(
            (
                inst.name,
                str(record.default_cycles),
                str(record.tuned_cycles),
                f"{record.speedup:.3f}x",
                str(record.trials),
                knobs or "(defaults)",
                record_state(project, inst, record, keys),
            )
        )
    table = Table(title=f"tuning records ({_shown(project, records_path(project))})")
    widths = []
    for i, col in enumerate(
        ("instance", "default", "tuned", "speed-up", "trials", "knobs", "record")
    ):
        wraps = col in ("knobs", "record")  # lists of words; every other cell is one word
        # a cell is never cut ("…"): two cut names or knobs cannot be told apart, so the
        # one-word columns keep their width and the lists fold onto more lines
        widths.append(max(len(col), 8 if wraps else max((len(r[i]) for r in rows), default=0)))
        table.add_column(
            col,
            justify="right" if col in ("default", "tuned", "trials") else "left",
            no_wrap=not wraps,
            overflow="fold",
            min_width=widths[-1],
        )
    for row in rows:
        table.add_row(*row)
    tty = sys.stdout.isatty()
    console = Console(no_color=not tty, width=None if tty else 100_000)  # piped: rows whole
    # a terminal narrower than the one-word columns gets wider lines, never cropped ones
    console.width = max(console.width, sum(widths) + 3 * len(widths) + 1)
    console.print(table)
    return 0


def record_state(project, inst, record: TuningRecord, keys: TuningKeys) -> str:
    """'applied', 'not built yet', or 'stale: <what changed>' for one record."""
    from kiln.tasks.model.artifacts import stage_artifact

    graph = Path(stage_artifact(inst, project.pipeline.stages[0].module))
    if not graph.is_file():
        return "not built yet"
    key = TuningKey(graph=graph_digest(str(graph)), **keys.parts(inst))
    stale = key.stale_parts(record)
    if stale:
        return "stale: " + ", ".join(stale) + " changed"
    return "applied" if record.complete else "applied (interrupted: tuned again by kiln tune)"


def stale_notes(project: Project, instances: list[KernelInstance]) -> list[str]:
    """One line per tuning record that `kiln compile` ignores because its key no longer matches."""
    path = records_path(project)
    if not path.is_file():
        return []
    records = read_records(path)
    keys = TuningKeys(project)
    notes = []
    for inst in instances:
        record = records.get(inst.name)
        if record is None:
            continue
        state = record_state(project, inst, record, keys)
        if state.startswith("stale"):
            notes.append(
                f"{inst.name}: tuning record ignored ({state}); run `kiln tune {inst.name}`"
            )
    return notes
