"""End to end: `kiln run/test/status APP` in a temporary project with the example apps."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from kiln.outputs import load_outputs
from tests.conftest import REPO, machines_yaml, ran_tasks, run_kiln
from tests.support.ctrl_c import answer_ctrl_c
from tests.support.pipelines import STAGES

APP_PIPELINE = (
    """\
project: apps-e2e
packages: [kernels]
machine: npu-v1
kernels:
  vector_add:
    shapes: {N: 256}
  layernorm:
    shapes: {R: 8, C: 64}
  gemm:
    shapes:
      mlp: {M: 8, K: 128, N: 16}
      attention: {M: 16, K: 24, N: 32}
  gemm_bias_relu:
    shapes: {M: 8, K: 64, N: 128}
  softmax:
    shapes:
      mlp: {R: 8, C: 16}
      attention: {R: 16, C: 24}
  attention_scores:
    shapes: {S: 16, T: 24, D: 32}
"""
    + STAGES
    + """\
targets:
  cpu: {runner: cpu}
  sim: {runner: sim, machine: npu-v1}
  iree-cpu: {runner: iree, options: {device: llvm-cpu}}
apps:
  mlp:
    module: apps.mlp
    tests: [apps/tests/test_mlp.py]
  attention:
    module: apps.attention
    tests: [apps/tests/test_attention.py]
  ghost:
    module: apps.ghost
  nomain:
    module: apps.nomain
  boom:
    module: apps.boom
machines:
"""
)
MLP_INSTANCES = {"gemm.mlp", "gemm.attention", "gemm_bias_relu.default"}
MLP_INSTANCES |= {"softmax.mlp", "softmax.attention"}
HAS_IREE = importlib.util.find_spec("iree") is not None and (
    importlib.util.find_spec("iree.compiler") is not None
)


def make_project(root: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "kernels", root / "kernels", ignore=ignore)
    shutil.copytree(REPO / "apps", root / "apps", ignore=ignore)
    (root / "pipeline.yaml").write_text(APP_PIPELINE + machines_yaml())
    (root / "apps" / "nomain.py").write_text("from kernels.linalg import gemm\n\nrun = gemm\n")
    (root / "apps" / "boom.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            from kernels.normalization import softmax


            def normalize(x):
                return softmax(x)[0, 99]


            def main():
                return normalize(np.ones((8, 16), np.float32))
            """
        ).lstrip()
    )
    return root


@pytest.fixture(scope="module")
def apps_project(tmp_path_factory) -> Path:
    """Shared by the tests that only read it: builds are reused between them."""
    return make_project(tmp_path_factory.mktemp("apps"))


@pytest.fixture(scope="module")
def cpu_outputs(apps_project):
    """app -> the outputs of `kiln run APP --target cpu` (the oracle), run once per app."""
    cache: dict[str, dict[str, np.ndarray]] = {}

    def get(app: str) -> dict[str, np.ndarray]:
        if app not in cache:
            proc = run_app(apps_project, app, "cpu", f"out/{app}-cpu")
            assert "warning" not in proc.stderr
            cache[app] = outputs(apps_project / f"out/{app}-cpu")
        return cache[app]

    return get


def instances(proc) -> set[str]:
    return {t.split(":", 1)[1] for t in ran_tasks(proc)}  # compile:<kernel>.<shapes>


def outputs(directory: Path) -> dict[str, np.ndarray]:
    return {p.stem: np.load(p) for p in sorted(directory.glob("*.npy"))}


def assert_same(a: dict, b: dict, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)


def run_app(root: Path, app: str, target: str, save: str):
    return run_kiln(root, "run", app, "--target", target, "--save-outputs", save, check=True)


def test_mlp_on_sim_builds_only_its_kernels_and_matches_cpu(apps_project, cpu_outputs):
    sim = run_app(apps_project, "mlp", "sim", "out/mlp-sim")
    assert instances(sim) == MLP_INSTANCES  # not vector_add, layernorm, attention_scores
    assert "app 'mlp' (apps/mlp.py) reaches 3 kernels" in sim.stdout
    assert "kernels.linalg.gemm_bias_relu -> gemm_bias_relu.default" in sim.stdout
    assert "reached from apps/mlp.py:" in sim.stdout and "via apps.mlp.forward" in sim.stdout
    assert "out probs: f32[8, 16]" in sim.stdout and "cycles" in sim.stdout
    assert "warning" not in sim.stderr
    assert_same(outputs(apps_project / "out/mlp-sim"), cpu_outputs("mlp"))
    assert set(cpu_outputs("mlp")) == {"hidden", "logits", "probs"}


def test_attention_on_sim_matches_cpu(apps_project, cpu_outputs):
    sim = run_app(apps_project, "attention", "sim", "out/att-sim")
    assert "kernels.attention.attention_scores -> attention_scores.default" in sim.stdout
    assert "attention_scores.default" in instances(sim)
    assert not instances(sim) & {"vector_add.default", "layernorm.default"}
    assert_same(outputs(apps_project / "out/att-sim"), cpu_outputs("attention"))
    assert set(cpu_outputs("attention")) == {"weights", "context"}


@pytest.mark.skipif(not HAS_IREE, reason="iree is not installed")
@pytest.mark.parametrize("app", ["mlp", "attention"])
def test_iree_cpu_matches_cpu(apps_project, cpu_outputs, app):
    run_app(apps_project, app, "iree-cpu", f"out/{app}-iree")
    assert_same(outputs(apps_project / f"out/{app}-iree"), cpu_outputs(app))


def test_kiln_test_app_runs_its_tests_on_the_target(apps_project):
    proc = run_kiln(apps_project, "test", "mlp", "--target", "sim", check=True)
    assert "2 passed" in proc.stdout and "kiln test mlp: sim pass" in proc.stdout
    assert "call softmax.mlp: 2x" in proc.stdout  # the tests' kernel calls ran on sim
    failing = apps_project / "apps" / "tests" / "test_attention.py"
    original = failing.read_text()
    try:
        failing.write_text(original + "\n\ndef test_wrong():\n    assert main_out() == 1\n")
        proc = run_kiln(apps_project, "test", "attention", "--target", "sim")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "1 failed" in proc.stdout and "kiln test attention: sim fail" in proc.stdout
    finally:
        failing.write_text(original)


def test_status_app_lists_its_kernels_and_why_they_rebuild(apps_project, cpu_outputs):
    cpu_outputs("mlp")  # built
    status = run_kiln(apps_project, "status", "mlp", check=True)
    assert "reached from apps/mlp.py" in status.stdout
    assert "kiln: 0 of 5 tasks of app 'mlp' would run" in status.stdout


def test_editing_an_unreached_kernel_triggers_no_compile(tmp_path):
    root = make_project(tmp_path)
    run_kiln(root, "run", "mlp", "--target", "sim", check=True)
    for name, old, new in [
        ("elementwise.py", "return a + b", "return b + a"),
        ("attention.py", "(1.0 / math.sqrt", "(2.0 / 2.0 / math.sqrt"),
    ]:
        src = root / "kernels" / name
        src.write_text(src.read_text().replace(old, new))
        st = src.stat()
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    again = run_kiln(root, "run", "mlp", "--target", "sim", check=True)
    assert ran_tasks(again) == []
    assert "kiln: 5 tasks: 0 ran, 5 up to date" in again.stdout
    # an edit mlp does reach: status says why, and the next run rebuilds it
    src = root / "kernels" / "normalization.py"
    src.write_text(src.read_text().replace("return e / e.sum", "return e * 1.0 / e.sum"))
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    status = run_kiln(root, "status", "mlp", check=True)
    assert "compile:softmax.mlp: would run" in status.stdout
    assert "starts at stage trace" in status.stdout
    assert "file changed:" in status.stdout and "normalization.py" in status.stdout
    rebuilt = run_kiln(root, "run", "mlp", "--target", "sim", check=True)
    assert {"softmax.mlp", "softmax.attention"} <= instances(rebuilt)
    assert not instances(rebuilt) & {"gemm.mlp", "vector_add.default"}


def test_app_module_that_does_not_exist(apps_project):
    proc = run_kiln(apps_project, "run", "ghost", "--target", "sim")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "pipeline.yaml:" in proc.stderr
    assert "app 'ghost': module 'apps.ghost' does not exist" in proc.stderr
    assert "apps/ghost.py" in proc.stderr


def test_app_without_main(apps_project):
    proc = run_kiln(apps_project, "run", "nomain", "--target", "sim")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "apps/nomain.py: error: app 'nomain' has no main() function" in proc.stderr
    assert ran_tasks(proc) == []  # checked before building anything


def test_app_that_raises_shows_its_own_traceback(apps_project):
    proc = run_kiln(apps_project, "run", "boom", "--target", "sim")
    assert proc.returncode == 1
    err = proc.stderr
    assert "error: app 'boom' raised IndexError:" in err
    assert 'apps/boom.py", line 11, in main' in err and "line 7, in normalize" in err
    assert (
        "tasks/apps/plan.py" not in err and "kiln/cli/command.py" not in err
    )  # only the app's frames
    assert instances(proc) <= {"softmax.mlp", "softmax.attention"}


def test_unknown_target_and_shapes_flag_are_clear_errors(apps_project):
    proc = run_kiln(apps_project, "run", "mlp", "--target", "tpu")
    assert proc.returncode == 2 and "unknown target 'tpu'" in proc.stderr
    proc = run_kiln(apps_project, "run", "mlp", "--shapes", "small")
    assert proc.returncode == 2 and "is an app" in proc.stderr
    proc = run_kiln(apps_project, "run", "nosuch")
    assert proc.returncode == 2 and "apps: attention, boom, ghost, mlp, nomain" in proc.stderr


PLAIN_APP = """\
import numpy as np


def main():
    return {"pred": np.arange(3), "mean": np.ones(2), "count": 42, "ok": np.bool_(True)}
"""
PLAIN_TEST = """\
from apps.plain import main


def test_main():
    assert main()["count"] == 42
"""


@pytest.fixture
def plain_project(tmp_path) -> Path:
    """The example apps, plus `plain` (numpy outputs, no kernel) and a target that cannot run."""
    root = make_project(tmp_path)
    (root / "apps" / "plain.py").write_text(PLAIN_APP)
    (root / "apps" / "tests" / "test_plain.py").write_text(PLAIN_TEST)
    text = (root / "pipeline.yaml").read_text()
    text = text.replace(
        "  boom:\n",
        "  plain:\n    module: apps.plain\n    tests: [apps/tests/test_plain.py]\n  boom:\n",
    )
    text = text.replace("targets:\n", "targets:\n  board: {runner: npu}\n")
    (root / "pipeline.yaml").write_text(text)
    return root


def test_outputs_of_any_numpy_dtype_are_described_and_saved(plain_project):
    proc = run_kiln(plain_project, "run", "plain", "--target", "cpu", "--save-outputs", "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "out pred: int64[3]  min 0  max 2  mean 1" in proc.stdout
    assert "out mean: float64[2]  min 1  max 1" in proc.stdout
    assert "out count: int64[]  min 42  max 42" in proc.stdout
    assert "out ok: bool[]  min 1  max 1" in proc.stdout
    saved = outputs(plain_project / "out")
    assert saved["pred"].tolist() == [0, 1, 2] and saved["count"] == 42
    # the one writer of saved outputs (kiln.outputs): each dtype recorded beside the files
    loaded = load_outputs(plain_project / "out")
    assert loaded.keys() == {"pred", "mean", "count", "ok"}
    assert loaded["ok"].dtype == np.bool_ and loaded["mean"].tolist() == [1.0, 1.0]
    assert "outputs.json" in proc.stdout


def test_an_app_tested_on_a_target_asked_for_that_cannot_run_fails(plain_project):
    proc = run_kiln(plain_project, "test", "plain", "--target", "board")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: --target board was asked for, but it cannot run here: no hardware runner" in (
        proc.stderr
    )
    both = run_kiln(plain_project, "test", "plain", "--target", "cpu", "--target", "board")
    assert both.returncode == 2 and "cpu pass" not in both.stdout  # refused before any work
    from_file = run_kiln(plain_project, "test", "plain")  # pipeline.yaml's targets: skipped
    assert from_file.returncode == 0, from_file.stdout + from_file.stderr
    assert "board skipped" in from_file.stdout


def test_app_shapes_that_no_reached_kernel_declares_is_an_error(plain_project):
    text = (plain_project / "pipeline.yaml").read_text()
    text = text.replace("    module: apps.mlp\n", "    module: apps.mlp\n    shapes: atention\n")
    (plain_project / "pipeline.yaml").write_text(text)
    line = text.splitlines().index("    shapes: atention") + 1
    proc = run_kiln(plain_project, "run", "mlp", "--target", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        f"pipeline.yaml:{line}:13: error: app 'mlp': shapes 'atention' is not a shape set "
        "of any kernel it reaches" in proc.stderr
    )
    assert "expected: one of: attention, default, mlp" in proc.stderr
    assert "hint: did you mean 'attention'?" in proc.stderr
    assert ran_tasks(proc) == []  # checked before building anything


def test_a_missing_test_file_points_at_its_list_item(tmp_path):
    root = make_project(tmp_path)
    text = (root / "pipeline.yaml").read_text()
    text = text.replace(
        "  ghost:\n",
        "  x3:\n    module: apps.mlp\n"
        "    tests: [apps/tests/test_mlp.py, apps/tests/nope.py]\n  ghost:\n",
    )
    (root / "pipeline.yaml").write_text(text)
    line = text.splitlines().index("    tests: [apps/tests/test_mlp.py, apps/tests/nope.py]") + 1
    proc = run_kiln(root, "test", "x3", "--target", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[:2] == [
        f"pipeline.yaml:{line}:37: error: app 'x3': test file 'apps/tests/nope.py' does not exist",
        "  at key: apps.x3.tests[1]",
    ]
    assert "  found: apps/tests/nope.py" in proc.stderr
    assert ran_tasks(proc) == []  # before building anything


def test_an_app_calling_sys_exit_is_reported_not_swallowed(plain_project):
    text = (plain_project / "pipeline.yaml").read_text()
    (plain_project / "pipeline.yaml").write_text(
        text.replace("  boom:\n", "  quit:\n    module: apps.quit\n  boom:\n")
    )
    app = plain_project / "apps" / "quit.py"
    app.write_text("import sys\n\n\ndef main():\n    sys.exit('no input file')\n")
    proc = run_kiln(plain_project, "run", "quit")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # was 2, and no message
    assert (
        "error: app 'quit' called sys.exit('no input file') in main() at apps/quit.py:5"
        in proc.stderr
    )
    app.write_text("import sys\n\n\ndef main():\n    sys.exit(0)\n")
    proc = run_kiln(plain_project, "run", "quit")
    assert proc.returncode == 0 and "app 'quit' called sys.exit(0) in main()" in proc.stdout
    assert "app quit on cpu: main() returned 0 output(s)" in proc.stdout


def test_an_app_whose_main_needs_arguments_is_a_clear_error(plain_project):
    (plain_project / "apps" / "plain.py").write_text("def main(n, scale=2):\n    return n\n")
    proc = run_kiln(plain_project, "run", "plain")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[:3] == [
        "apps/plain.py:1: error: app 'plain': main() takes arguments (n), "
        "but Kiln calls main() with none",
        "  expected: def main(): (or parameters that all have defaults)",
        "  found: def main(n, scale=2)",
    ]


def test_a_call_at_declared_sizes_but_another_dtype_says_the_dtype_differs(plain_project):
    (plain_project / "apps" / "plain.py").write_text(
        "import numpy as np\n\nfrom kernels.elementwise import vector_add\n\n\n"
        "def main():\n    x = np.arange(256, dtype=np.int32)\n    return vector_add(x, x)\n"
    )
    proc = run_kiln(plain_project, "run", "plain", "--target", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (  # it said the sizes N=256, which vector_add.default declares, were not declared
        "kiln: warning: apps/plain.py:8: vector_add is called with a: i32, b: i32, but "
        "pipeline.yaml builds it at N=256 for a: f32, b: f32 (vector_add.default); "
        "the cpu target runs it eagerly" in proc.stderr
    )


def test_each_target_runs_the_kernel_calls_an_app_makes_on_import(plain_project):
    (plain_project / "apps" / "plain.py").write_text(
        "import numpy as np\n\nfrom kernels.elementwise import vector_add\n\n"
        "X = np.ones(256, np.float32)\nWARM = vector_add(X, X)  # at import time\n\n\n"
        "def main():\n    return {'count': 42, 'warm': WARM}\n"
    )
    proc = run_kiln(plain_project, "test", "plain", "--target", "sim", "--target", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the second target reused the module the first imported: it ran nothing, and its
    # tests checked the first target's numbers
    assert proc.stdout.count("call vector_add.default: 1x") == 2, proc.stdout
    assert "nothing ran on cpu" not in proc.stdout


def test_jit_warnings_of_an_apps_tests_are_shown_not_captured_by_pytest(plain_project):
    (plain_project / "apps" / "tests" / "test_plain.py").write_text(
        "import numpy as np\n\nfrom kernels.elementwise import vector_add\n\n\n"
        "def test_small():\n    assert vector_add(np.ones(8, np.float32), np.ones(8, np.float32))"
        ".tolist() == [2.0] * 8\n"
    )
    proc = run_kiln(plain_project, "test", "plain", "--target", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 warning(s) above" in proc.stdout
    assert (  # the summary pointed at a warning pytest had swallowed
        "kiln: warning: apps/tests/test_plain.py:7: this call of vector_add (N=8) was not seen"
        in proc.stderr
    )


def test_the_junit_report_of_an_apps_tests_names_the_app_and_target(plain_project):
    import xml.etree.ElementTree as ET

    proc = run_kiln(plain_project, "test", "plain", "--target", "cpu", "--junit", "r.xml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    suite = next(ET.parse(plain_project / "r.xml").iter("testsuite"))
    assert suite.get("name") == "kiln.app.plain@cpu"  # was pytest's default, "pytest"
    assert suite.get("tests") == "1" and suite.get("failures") == "0"


@pytest.mark.parametrize(
    ("source", "kind", "found"),
    [
        ("async def main():\n    return 1\n", "a coroutine function", "async def main()"),
        ("def main():\n    yield 1\n", "a generator function", "def main(): ... yield ..."),
    ],
)
def test_an_app_whose_main_would_run_nothing_is_a_clear_error(plain_project, source, kind, found):
    """Called bare, it returned a coroutine or a generator: exit 0 and no kernel ran."""
    (plain_project / "apps" / "plain.py").write_text(source)
    proc = run_kiln(plain_project, "run", "plain")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[:3] == [
        f"apps/plain.py:1: error: app 'plain': main() is {kind}; "
        "Kiln calls main() and uses what it returns",
        "  expected: def main(): that runs the app and returns its outputs",
        f"  found: {found}",
    ]
    assert "RuntimeWarning" not in proc.stderr


def test_ctrl_c_during_an_apps_tests_stops_the_command(plain_project):
    """pytest caught the interrupt: it was a failed test, and the next target ran."""
    (plain_project / "apps" / "tests" / "test_plain.py").write_text(
        "import time\n\n\ndef test_slow():\n    time.sleep(60)\n"
    )
    env = dict(os.environ, KILN_CACHE_DIR=str(plain_project / ".cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "test", "plain", "--target", "sim", "--target", "cpu"],
        cwd=plain_project,
        env=env,
        preexec_fn=answer_ctrl_c,
        start_new_session=True,  # its own process group, as a terminal's job is
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = ""
    deadline = time.monotonic() + 120
    while "pytest apps/tests/test_plain.py" not in out and time.monotonic() < deadline:
        out += proc.stdout.readline()
    time.sleep(1.0)  # inside the test's sleep
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30
    assert proc.returncode == 130, out + rest + err
    assert "kiln: interrupted" in err and "fail (pytest exit code" not in out + rest
    assert "@ cpu" not in out + rest  # no further target ran


def test_an_app_named_beside_another_filter_is_refused(apps_project):
    """With a second FILTER, `mlp` matched kernels by substring: the app's tests never ran
    and the run passed."""
    for filters in (("mlp", "attention"), ("mlp", "softmax.small")):
        proc = run_kiln(apps_project, "test", *filters, "--target", "sim")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "error: an app is selected alone" in proc.stderr
        assert f"found: {' '.join(filters)}" in proc.stderr
        assert "PASS" not in proc.stdout
