"""kiln status is exact, and every incremental build equals a clean build byte for byte.

A shuffled sequence of edits of every kind (comment, real change, pipeline
option, machine, deleted artifact, corrupted artifact, a new tuning record); after each,
`kiln status` names the instances the next build runs and the stage each
starts at, the build runs exactly those, and its files equal a clean build
of the same project made in another directory.
"""

from __future__ import annotations

import random
import re
import shutil

from tests.conftest import run_kiln
from tests.tasks.artifacts import snapshot

ENV = {"KILN_CACHE": "0"}


def predicted(project) -> dict[str, str]:
    out = run_kiln(project, "status", env=ENV, check=True).stdout
    found, current = {}, None
    for line in out.splitlines():
        m = re.match(r"(compile:\S+): would run$", line)
        if m:
            current = m.group(1)
        m = re.match(r"\s+starts at stage (\w+)", line)
        if m and current:
            found[current] = m.group(1)
    return found


def ran(project) -> set[str]:
    proc = run_kiln(project, "compile", env=ENV, check=True)
    return {line[2:] for line in proc.stdout.splitlines() if line.startswith(". compile:")}


def clean_copy_build(project, tmp_path, step) -> dict[str, bytes]:
    # built in the same directory name: source maps name the project's files
    other = tmp_path / f"clean{step}" / project.name
    shutil.copytree(project, other, ignore=shutil.ignore_patterns("build", ".kiln", ".cache"))
    run_kiln(other, "compile", env=ENV, check=True)
    return {k: v for k, v in snapshot(other).items() if not k.endswith("srcmap.json")}


def edit(kind: str, project, rng: random.Random) -> None:
    src = project / "kernels" / "normalization.py"
    pipeline = project / "pipeline.yaml"
    inst = project / "build/kiln/kernel/gemm/small"
    if kind == "comment":
        src.write_text(src.read_text() + f"\n# note {rng.random()}\n")
    elif kind == "real":
        ew = project / "kernels" / "elementwise.py"
        ew.write_text(ew.read_text().replace("    return a + b\n", "    return b + a\n", 1))
    elif kind == "option":
        text = pipeline.read_text()
        pipeline.write_text(
            text.replace(
                "  gemm:\n    shapes:",
                "  gemm:\n    options: {schedule: {policy: in-order}}\n    shapes:",
                1,
            )
        )
    elif kind == "machine":
        text = pipeline.read_text()
        pipeline.write_text(
            text.replace("machine: npu-v1\nkernels:", "machine: npu-tiny\nkernels:", 1)
        )
    elif kind == "tuning":
        run_kiln(project, "tune", "softmax", "--budget", "4", env=ENV, check=True)
    elif kind == "deleted":
        (inst / "kernel.sched").unlink()
    elif kind == "corrupted":
        (inst / "kernel.lir").write_bytes(b"garbage")


def test_random_edit_sequences_build_what_status_predicts_and_equal_clean_builds(project, tmp_path):
    rng = random.Random(7)
    run_kiln(project, "compile", env=ENV, check=True)
    kinds = ["comment", "real", "option", "deleted", "corrupted", "machine", "tuning"]
    rng.shuffle(kinds)
    for step, kind in enumerate(kinds):
        edit(kind, project, rng)
        expected_starts = predicted(project)
        built = ran(project)
        assert built == set(expected_starts), (kind, built, expected_starts)
        mine = {k: v for k, v in snapshot(project).items() if not k.endswith("srcmap.json")}
        assert mine == clean_copy_build(project, tmp_path, step), kind
        if kind == "deleted":
            assert expected_starts == {"compile:gemm.small": "schedule"}
        if kind == "option":
            assert set(expected_starts.values()) == {"schedule"}
        if kind == "tuning":  # the record of softmax.small alone; its trace is kept
            assert expected_starts == {"compile:softmax.small": "visa"}
        if kind in ("real", "comment"):
            assert set(expected_starts.values()) == {"trace"}
