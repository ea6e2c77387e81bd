"""`kiln test`: every selected instance built, then checked on every target against the
oracle."""

from __future__ import annotations

import json
import sys

from kiln.errors import KilnError
from kiln.tasks.chain.failure_groups import affected
from kiln.tasks.checks.verdicts import (
    build_error_report,
    check_instance,
    default_targets,
    format_report,
    is_oracle,
    skipped_report,
    strict_verdict,
)
from kiln.tasks.model.project import Project


def run_tests(project: Project, instances: list, args) -> int:
    from kiln.fsutil import write_bytes_atomic
    from kiln.tasks.checks.results import save_test_report
    from kiln.tasks.commands.running import build_each
    from kiln.tasks.dag.loader import fail_fast_requested

    targets = list(dict.fromkeys(args.target or default_targets(project)))  # each once, in order
    # the targets that cannot run here, found before the build (kiln/cli/target_check.py)
    # and said once there: each of their checks is a skip, recorded but not printed
    unavailable = getattr(args, "unavailable", None) or {}
    if not unavailable:
        for t in targets:
            from kiln.tasks.checks.targets import make_runner

            make_runner(project, t)  # unknown target: error before building anything
    runnable = [t for t in targets if t not in unavailable]
    # every instance that builds is tested; one that does not is an error of each target
    fail_fast = getattr(args, "fail_fast", False) or fail_fast_requested()
    unbuilt = build_each(project, instances, fail_fast=fail_fast)
    from kiln.logconfig import verbosity

    quiet = verbosity() == 0  # -q: only failures (fail, error) and the summary
    causes = build_error_groups(unbuilt)  # one build error, printed once with what it hit
    errors = ErrorsOnce()  # so is one error of many checks
    reports = []
    stopped = False  # -x: at the first check that failed or erred
    for inst in instances:
        if inst.name in unbuilt:
            found = [build_error_report(inst, t, args.seed, unbuilt[inst.name]) for t in runnable]
            same = causes.get(inst.name)
            if same is not None and found:  # the first instance of its error speaks for all
                print(format_report(found[0]), flush=True)
                for report in found[1:]:
                    print(f"ERROR   {inst.name} @ {report['target']}: the same build error")
                if len(same) > 1:
                    print(f"    the same build error: {affected(same, verbosity() >= 2)}")
            for report in found:
                reports.append(report)
                save_test_report(inst.out_dir, report)
            found = []
        else:
            found, stopped = check_targets(project, inst, runnable, args, fail_fast)
        found += [skipped_report(inst, t, args.seed, why) for t, why in unavailable.items()]
        for report in found:
            said = report["status"] == "skipped" and report["target"] in unavailable
            said = said or report["status"] == "error" and errors.seen(report)
            if not said and not (quiet and report["status"] in ("pass", "skipped")):
                print(format_report(report), flush=True)
            reports.append(report)
            save_test_report(inst.out_dir, report)  # the last result, for `kiln view`
        if stopped:
            break
    counts = {
        s: sum(r["status"] == s for r in reports) for s in ("pass", "fail", "error", "skipped")
    }
    for line in errors.summary(verbosity() >= 2):
        print(line)
    print("kiln test: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if stopped:
        print("kiln test: stopped at the first failure (--fail-fast); the other checks did not run")
    print_notes(reports, strict=getattr(args, "strict", False))
    report_file = project.out_dir / "test-report.json"
    report_file.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(
        report_file, json.dumps({"reports": reports}, indent=1, sort_keys=True).encode()
    )
    if args.junit:
        from kiln.tasks.checks.junit import write_junit

        write_junit(args.junit, reports)
    if counts["fail"] or counts["error"]:
        return 1
    by_target: dict[str, list[dict]] = {}
    for r in reports:
        by_target.setdefault(r["target"], []).append(r)
    skipped = {  # the oracle's skip is no target missing here: it says why, and ran nothing
        t: mine[0]["reason"]
        for t, mine in by_target.items()
        if all(r["status"] == "skipped" for r in mine) and not is_oracle(project, t)
    }
    return asked_for_and_unavailable(args.target or [], skipped)


def check_targets(project: Project, inst, targets: list[str], args, fail_fast: bool):
    """The reports of ``inst`` on ``targets``, and whether -x stops the run here.

    With ``fail_fast`` each target is checked alone, so that none runs after the
    first check that fails or errs (the oracle runs again for each).
    """
    strict = getattr(args, "strict", False)
    groups = [[t] for t in targets] if fail_fast else [targets]
    found: list[dict] = []
    for group in groups:
        reports = check_instance(project, inst, group, args.seed)
        found += [strict_verdict(r) for r in reports] if strict else reports
        if fail_fast and any(r["status"] in ("fail", "error") for r in found):
            return found, True
    return found, False


class ErrorsOnce:
    """Check errors with one cause (a kernel the oracle cannot run, at every shape set):
    the first is printed in full, the others counted and named once at the end."""

    def __init__(self) -> None:
        self.checks: dict[str, list[str]] = {}  # cause key -> the checks it hit, first first

    def seen(self, report: dict) -> bool:
        """Record an error report; True when one with its cause was printed already."""
        from kiln.tasks.chain.failure_groups import cause_key

        key = cause_key(f"test:{report['kernel']}", report.get("message", ""))
        hit = self.checks.setdefault(key, [])
        hit.append(f"{report['kernel']} @ {report['target']}")
        return len(hit) > 1

    def summary(self, verbose: bool) -> list[str]:
        return [
            f"ERROR   the same error as {hit[0]} above: {affected(hit, verbose, 'checks')}"
            for hit in self.checks.values()
            if len(hit) > 1
        ]


def build_error_groups(unbuilt: dict[str, str]) -> dict[str, list[str]]:
    """The first unbuilt instance of each build error -> every instance with that error."""
    from kiln.tasks.chain.failure_groups import cause_key
    from kiln.tasks.dag.reporter import last_run_failures

    failed, _ = last_run_failures()
    groups: dict[str, list[str]] = {}
    for name, why in unbuilt.items():
        task = f"compile:{name}"
        groups.setdefault(cause_key(task, failed.get(task, why)), []).append(name)
    return {names[0]: names for names in groups.values()}


def print_notes(reports: list[dict], strict: bool) -> None:
    """What the summary does not say: vacuous checks, and verdicts taken from the cache."""
    warned = sum(bool(r.get("warnings")) for r in reports)
    if warned and not strict:
        print(
            f"kiln test: {warned} check(s) with a vacuous-check warning (see above); "
            "--strict makes them failures"
        )
    checked = [r for r in reports if r["status"] in ("pass", "fail")]
    cached = sum(bool(r.get("cache")) for r in checked)
    if cached:
        everything = "all " if cached == len(checked) else ""
        print(
            f"kiln test: {everything}{cached} of {len(checked)} result(s) taken from the cache: "
            "nothing they depend on changed (graph, binary, kernel code, inputs, tolerance)"
        )


def asked_for_and_unavailable(asked: list[str], skipped: dict[str, str]) -> int:
    """2 when a target named with --target ran nowhere: a CI job asking for it tested nothing.

    ``skipped``: each target that could run nothing here, and why. Targets
    taken from pipeline.yaml are only skipped where they cannot run (a GPU
    target on a laptop); one asked for by name is an error, as it is for
    ``kiln run`` and ``kiln bench``, and for an app's tests (tasks/apps/plan.py).
    """
    for target in dict.fromkeys(asked):
        if target in skipped:
            err = KilnError(
                f"--target {target} was asked for, but it cannot run here: {skipped[target]}",
                hint=f"drop --target {target} to test only the targets that can run here",
            )
            print(err.render(), file=sys.stderr, flush=True)
            return 2
    return 0
