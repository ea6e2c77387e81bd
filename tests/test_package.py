"""The `kiln` package itself: lazy re-exports keep tool start-up light."""

import subprocess
import sys

import kiln
import kiln.lang


def test_lazy_names_match_the_language():
    assert kiln.LANG_NAMES == frozenset(kiln.lang.__all__)


def test_importing_cli_and_tasks_does_not_import_numpy():
    code = (
        "import sys, kiln, kiln.cli, kiln.commands, kiln.tasks.loader, kiln.tasks.build; "
        "from kiln import commands; print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_language_names_resolve_on_first_use():
    assert kiln.device is kiln.lang.device
    assert kiln.Tensor is kiln.lang.Tensor
