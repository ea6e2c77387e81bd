"""The `kiln` package itself: lazy re-exports keep tool start-up light."""

import os
import subprocess
import sys

import kiln
import kiln.lang


def test_lazy_names_match_the_language():
    assert kiln.LANG_NAMES == frozenset(kiln.lang.__all__)


def test_importing_cli_and_tasks_does_not_import_numpy():
    code = (
        "import sys, kiln, kiln.cli.command, kiln.cli.commands, kiln.tasks.dag.loader, "
        "kiln.tasks.dag.build; print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_language_names_resolve_on_first_use():
    assert kiln.device is kiln.lang.device
    assert kiln.Tensor is kiln.lang.Tensor


def test_help_status_and_noop_builds_import_neither_numpy_nor_ml_dtypes(project):
    from tests.conftest import run_kiln

    run_kiln(project, "compile", check=True)
    code = (
        "import contextlib, io, sys\n"
        "from kiln.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(sys.argv[1:])\n"
        "print(rc, 'numpy' in sys.modules, 'ml_dtypes' in sys.modules)\n"
    )
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    for args in (["--help"], ["status"], ["compile"], ["compile", "-n", "2"], ["list"]):
        out = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == ["0", "False", "False"], (args, out.stdout, out.stderr)


def test_python_m_kiln_is_the_kiln_command():
    out = subprocess.run(
        [sys.executable, "-m", "kiln", "compile", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert "--no-wait" in out.stdout and "--fail-fast" in out.stdout
