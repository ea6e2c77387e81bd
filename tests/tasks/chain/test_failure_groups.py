"""One cause, one message: a failure shared by many instances is printed once, with them.

A machine whose SRAM holds no tile and an import error in a kernel module
fail every instance they reach; `kiln compile`, `python -m kiln compile`,
plain `doit compile`, `kiln test` and `kiln bench` print the error once with
the count and names of the instances it hit (all of them with -v).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.tasks.chain.failure_groups import affected, cause_key, group_failures, instance_of
from tests.conftest import REPO, run_kiln

KERNELS = """\
from kiln import Tensor, device


@device
def scale_add(x: Tensor["N"], y: Tensor["N"]):  # noqa: F821
    return 2.0 * x + y


@device
def twice(x: Tensor["N"]):  # noqa: F821
    return x + x


@device
def square(x: Tensor["N"]):  # noqa: F821
    return x * x
"""
PIPELINE = """\
project: groups
packages: [kernels]
machine: {machine}
kernels:
  scale_add:
    shapes:
      a: {{N: 64}}
      b: {{N: 128}}
      c: {{N: 256}}
  twice:
    shapes:
      a: {{N: 64}}
      b: {{N: 128}}
  square:
    shapes:
      a: {{N: 64}}
machines:
  roomy:
    clock_mhz: 500
    sram_bytes: 1048576
    units: {{dma: 1, tensor: 1, vector: 1}}
    dma: {{bytes_per_cycle: 16, latency: 200}}
    tensor: {{tile: [16, 16, 16], cycles_per_tile: 16}}
    vector: {{lanes: 16, latency: {{default: 4}}}}
  crumb:
    clock_mhz: 500
    sram_bytes: 16
    units: {{dma: 1, tensor: 1, vector: 1}}
    dma: {{bytes_per_cycle: 16, latency: 200}}
    tensor: {{tile: [16, 16, 16], cycles_per_tile: 16}}
    vector: {{lanes: 16, latency: {{default: 4}}}}
targets:
  cpu: {{runner: cpu}}
  sim: {{runner: sim}}
"""
INSTANCES = ["scale_add.a", "scale_add.b", "scale_add.c", "twice.a", "twice.b", "square.a"]


def make_project(root: Path, machine: str, first_line: str = "") -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "__init__.py").write_text("")
    (root / "kernels" / "k.py").write_text(first_line + KERNELS)
    (root / "pipeline.yaml").write_text(PIPELINE.format(machine=machine))
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    return root


def entry_points(root: Path, *argv: str) -> dict[str, subprocess.CompletedProcess]:
    """``argv`` through `kiln`, `python -m kiln` and (for a doit command) plain `doit`."""
    env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"))
    script = Path(sys.executable).parent / "kiln"
    commands = {"python -m kiln": [sys.executable, "-m", "kiln", *argv]}
    if script.exists():
        commands["kiln"] = [str(script), *argv]
    if argv[0] == "compile" and len(argv) == 1:
        commands["doit"] = [sys.executable, "-m", "doit", "compile"]
    return {
        name: subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=300
        )
        for name, command in commands.items()
    }


def test_a_machine_whose_sram_holds_no_tile_is_one_error_with_its_instances(tmp_path):
    root = make_project(tmp_path, "crumb")
    for how, proc in entry_points(root, "compile").items():
        err = proc.stderr
        assert proc.returncode != 0 and "Traceback" not in err, (how, err)
        assert err.count("bytes of SRAM, only 16 available (machine crumb)") == 1, (how, err)
        assert err.count("FAILED ") == 1, (how, err)
        assert (
            "kiln: 6 failed (one error):\n  machine crumb: 16 bytes of SRAM hold no tile\n" in err
        )
        assert "    6 instances: scale_add.a, scale_add.b, scale_add.c, twice.a and 2 more " in err
        assert "0 ran, 0 up to date, 6 failed" in proc.stdout, (how, proc.stdout)

    five = run_kiln(root, "compile", "scale_add", "twice")
    assert five.stderr.count("needs 64 bytes of SRAM") == 1, five.stderr
    assert "5 instances: scale_add.a, scale_add.b, scale_add.c, twice.a, twice.b\n" in five.stderr

    verbose = run_kiln(root, "compile", "-v")  # -v: each repeat as one line, and every name
    assert "FAILED compile:twice.b: the same error as compile:scale_add.a\n" in verbose.stderr
    assert f"6 instances: {', '.join(INSTANCES)}\n" in verbose.stderr

    tested = run_kiln(root, "test", "--target", "sim", "--target", "cpu")
    assert tested.returncode == 1 and "Traceback" not in tested.stderr
    assert tested.stdout.count("needs 64 bytes of SRAM") == 1, tested.stdout
    assert "ERROR   scale_add.a @ sim\n" in tested.stdout
    assert "ERROR   scale_add.a @ cpu: the same build error\n" in tested.stdout
    assert "    the same build error: 6 instances: scale_add.a, scale_add.b, scale_add.c, " in (
        tested.stdout
    )
    assert "ERROR   twice.a" not in tested.stdout
    assert "kiln test: 0 pass, 0 fail, 12 error, 0 skipped" in tested.stdout

    status = run_kiln(root, "status")  # what the last build recorded, said once too
    assert status.stdout.count("needs 64 bytes of SRAM") == 1, status.stdout
    assert "compile:twice.b: would run\n    failed at the last build: the same error as " in (
        status.stdout
    )

    bench = run_kiln(root, "bench", "--target", "sim")
    assert bench.returncode == 1 and bench.stderr.count("needs 64 bytes of SRAM") == 1
    assert "kiln bench: not timed, as they did not build: 6 instances: scale_add.a, " in (
        bench.stderr
    )


def test_an_import_error_in_a_module_of_three_kernels_is_printed_once(tmp_path):
    root = make_project(tmp_path, "roomy", first_line="import no_such_module_here\n")
    for how, proc in entry_points(root, "compile").items():
        err = proc.stderr
        assert proc.returncode != 0 and "Traceback" not in err, (how, err)
        assert err.count("No module named 'no_such_module_here'") == 2, (how, err)  # + summary
        assert "kernels/k.py:1:1: error: importing kernel module 'kernels.k' failed" in err
        assert "kiln: 6 failed (one error):\n  kernels/k.py:1: importing kernel module" in err
        assert "    6 instances: scale_add.a, scale_add.b, scale_add.c, twice.a and 2 more " in err
        assert "(-v lists them all)" in err

    tested = run_kiln(root, "test", "--target", "cpu")
    assert tested.stdout.count("No module named 'no_such_module_here'") == 1, tested.stdout
    assert "kiln test: 0 pass, 0 fail, 6 error, 0 skipped" in tested.stdout


def test_distinct_errors_stay_apart_and_one_instance_keeps_its_own_line(tmp_path):
    root = make_project(tmp_path, "roomy")
    text = (root / "kernels" / "k.py").read_text()
    text = text.replace("return x + x", "return x + undefined_name  # noqa: F821")
    (root / "kernels" / "k.py").write_text(text.replace("return x * x", "return x.reshape(7)"))
    proc = run_kiln(root, "compile")
    assert proc.returncode == 1 and proc.stderr.count("FAILED ") == 2, proc.stderr
    assert "FAILED compile:twice.a\n" in proc.stderr and "FAILED compile:square.a\n" in proc.stderr
    assert "kiln: 3 failed (2 distinct errors):\n  kernels/k.py:11: " in proc.stderr
    assert "    2 instances: twice.a, twice.b\n  compile:square.a (kernels/k.py:16)\n" in (
        proc.stderr
    )
    assert "3 ran, 0 up to date, 3 failed" in proc.stdout


def diag(message: str, inst: str, **more) -> dict:
    kernel = inst.split(".")[0]
    return {
        "kind": "error",
        "message": message.format(kernel=kernel),
        "file": "pipeline.yaml",
        "line": {"gemm": 4, "softmax": 9}.get(kernel, 12),
        "column": 3,
        "key_path": f"kernels.{kernel}",
        "source": f"  {kernel}:",
        "notes": [f"while running stage 'lir' of {inst} (N=64)"],
        **more,
    }


def test_the_cause_key_leaves_out_what_names_the_instance():
    one = diag("kernel {kernel}: tile too big", "gemm.small")
    two = diag("kernel {kernel}: tile too big", "softmax.large")
    assert cause_key("compile:gemm.small", one) == cause_key("compile:softmax.large", two)
    other = diag("kernel {kernel}: tile much too big", "softmax.large")
    assert cause_key("compile:gemm.small", one) != cause_key("compile:softmax.large", other)
    # another stage is another error, though the message reads the same
    later = dict(two, notes=["while running stage 'edf' of softmax.large (N=64)"])
    assert cause_key("compile:gemm.small", one) != cause_key("compile:softmax.large", later)
    # a declared cause joins messages that differ in their figures
    a = diag("kernel {kernel}: 256 bytes", "gemm.small", cause="machine m: no tile fits")
    b = diag("kernel {kernel}: 4096 bytes", "softmax.small", cause="machine m: no tile fits")
    assert cause_key("compile:gemm.small", a) == cause_key("compile:softmax.small", b)
    assert instance_of("test:gemm.small@sim") == "gemm.small"
    assert instance_of("compile:gemm.small") == "gemm.small"


def test_groups_keep_the_order_first_met_and_every_task():
    failures = [
        ("compile:gemm.small", diag("kernel {kernel}: x", "gemm.small")),
        ("compile:gemm.wide", "plain text failure"),
        ("compile:softmax.small", diag("kernel {kernel}: x", "softmax.small")),
    ]
    groups = group_failures(failures)
    assert [names for _, names in groups] == [
        ["compile:gemm.small", "compile:softmax.small"],
        ["compile:gemm.wide"],
    ]
    assert groups[0][0]["message"] == "kernel gemm: x"


@pytest.mark.parametrize(
    ("count", "verbose", "shown"),
    [
        (1, False, "1 instance: k0"),
        (5, False, "5 instances: k0, k1, k2, k3, k4"),
        (7, False, "7 instances: k0, k1, k2, k3 and 3 more (-v lists them all)"),
        (7, True, "7 instances: k0, k1, k2, k3, k4, k5, k6"),
    ],
)
def test_affected_names_a_few_and_counts_the_rest(count, verbose, shown):
    assert affected([f"k{i}" for i in range(count)], verbose) == shown


def test_project_load_warnings_come_once_per_cause_not_per_kernel_or_shape_set(tmp_path):
    root = make_project(tmp_path, "roomy")
    shutil.copy(root / "kernels" / "k.py", root / "kernels" / "k_copy.py")
    pipe = root / "pipeline.yaml"
    pipe.write_text(
        pipe.read_text().replace("{N: 128}", "{N: 128, Z: 3}").replace("{N: 256}", "{N: 256, Z: 3}")
    )
    for proc in (run_kiln(root, "status"), entry_points(root, "compile")["python -m kiln"]):
        err = proc.stderr
        assert proc.returncode == 0, err
        assert err.count("defined in several modules") == 1, err
        assert (
            "pipeline.yaml:5:3: warning: kernels 'scale_add', 'twice', 'square' are each defined "
            "in several modules (kernels.k, kernels.k_copy); building kernels.k's" in err
        )
        assert err.count("warning: shape set") == 2, err
        assert "warning: shape sets 'b', 'c' of kernel 'scale_add' bind Z, which no argument" in err
        assert "warning: shape set 'b' of kernel 'twice' binds Z, which no argument" in err


def test_one_check_error_of_every_shape_set_is_printed_once_by_kiln_test(tmp_path):
    root = make_project(tmp_path, "roomy")
    text = (root / "kernels" / "k.py").read_text()
    picky = "    if not x.is_traced:\n        raise ValueError('only traced')\n    return x + x"
    (root / "kernels" / "k.py").write_text(text.replace("    return x + x", picky))
    proc = run_kiln(root, "test", "twice", "--target", "sim")
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.count("raised ValueError when run on the host") == 1, proc.stdout
    assert "ERROR   twice.a @ sim\n" in proc.stdout and "ERROR   twice.b" not in proc.stdout
    assert (
        "ERROR   the same error as twice.a @ sim above: 2 checks: twice.a @ sim, twice.b @ sim\n"
        in proc.stdout
    )
    assert "kiln test: 0 pass, 0 fail, 2 error, 0 skipped" in proc.stdout
