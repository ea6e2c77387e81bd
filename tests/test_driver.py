"""kiln/driver.py: whatever a stage's own code does, it fails that stage, by name.

A stage module is the user's code: a ``sys.exit()`` in it must not end the
build (with status 0, "0 tasks"), and a bug in it must say which stage and
module broke. These run a two-stage chain of test stages through
``run_chain`` directly; tests/tasks/dag/test_custom_stages_e2e.py runs the
same through the CLI.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from kiln.driver import BuildInfo, ChainSpec, StageFailed, StageSpec, TraceSpec, lower, run_chain
from kiln.errors import KilnError, StageError

FIRST = """
from dataclasses import dataclass
from pathlib import Path

ARTIFACT = "first.txt"


@dataclass(frozen=True)
class Options:
    pass


def run(request, options, machine):
    return "first"


def serialize(text):
    return text.encode()


def read(path):
    return Path(path).read_text()


def verify(text, machine):
    pass
"""

# ``mode`` says what its code does; "read" breaks the next stage's read of its artifact
SECOND = """
import sys
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import StageError

ARTIFACT = "second.txt"


@dataclass(frozen=True)
class Options:
    mode: str = "ok"


def run(text, options, machine):
    if options.mode == "exit0":
        sys.exit(0)
    if options.mode == "exit3":
        raise SystemExit(3)
    if options.mode == "bug":
        raise RuntimeError("boom")
    if options.mode == "stage-error":
        raise StageError("tile too big")
    if options.mode == "ctrl-c":
        raise KeyboardInterrupt
    if options.mode == "none":
        return None
    return text + options.mode


def serialize(text):
    if text.endswith("exit-in-serialize"):
        sys.exit(0)
    return text.encode()


def read(path):
    return Path(path).read_text()


def verify(text, machine):
    if text.endswith("bad-verify"):
        return text.program  # a bug of the verifier: AttributeError
"""


@pytest.fixture
def stages(tmp_path, monkeypatch):
    """A package ``drvstages`` with the two test stages, importable."""
    package = tmp_path / "drvstages"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text(textwrap.dedent(FIRST))
    (package / "second.py").write_text(textwrap.dedent(SECOND))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m.split(".")[0] == "drvstages"]:
        del sys.modules[name]


def chain(mode: str, *, second: str = "drvstages.second") -> ChainSpec:
    rows = [
        StageSpec("first", "drvstages.first", "{}", "c1", "first.txt"),
        StageSpec("second", second, json.dumps({"mode": mode}), "c2", "second.txt"),
    ]
    return ChainSpec(
        instance="k.small",
        trace=TraceSpec(module="kernels.k", function="k", bindings=(("N", 4),)),
        stages=tuple(rows),
        machine="{}",
        build=BuildInfo(kernel="kernels/k.py", shapes="small", compiler="c"),
    )


def failure(mode: str) -> StageFailed:
    with pytest.raises(StageFailed) as info:
        run_chain(chain(mode), {})
    return info.value


def test_a_good_chain_runs_every_stage(stages):
    result = run_chain(chain("ok"), {})
    assert result.ran == ["first", "second"]
    assert result.files["second.txt"] == b"firstok"


@pytest.mark.parametrize("mode, code", [("exit0", 0), ("exit3", 3)])
def test_sys_exit_in_a_stage_fails_that_stage_naming_it_and_its_module(stages, mode, code):
    failed = failure(mode)
    assert failed.stage.name == "second"
    err = failed.error
    assert err.message == f"stage 'second' (drvstages.second) called sys.exit({code}) in run()"
    assert err.location is not None and err.location.file.endswith("second.py")
    assert "sys.exit(0)" in err.location.source or "SystemExit(3)" in err.location.source
    assert err.hint.startswith("a stage must not exit")


def test_sys_exit_in_serialize_is_a_failure_of_the_stage_too(stages):
    failed = failure("exit-in-serialize")
    assert failed.error.message == (
        "stage 'second' (drvstages.second) called sys.exit(0) in serialize()"
    )


def test_a_bug_in_a_stage_names_the_stage_its_module_and_what_it_raised(stages):
    failed = failure("bug")
    assert failed.error.message == (
        "stage 'second' (drvstages.second) failed in run(): RuntimeError: boom"
    )
    assert isinstance(failed.crash, RuntimeError)
    assert failed.error.location.line is not None
    assert failed.error.location.source.strip() == 'raise RuntimeError("boom")'


def test_a_bug_in_verify_is_reported_as_the_stages_verify(stages):
    failed = failure("bad-verify")
    assert failed.error.message == (
        "stage 'second' (drvstages.second) failed in verify(): AttributeError: "
        "'str' object has no attribute 'program'"
    )


def test_a_run_that_returns_none_says_so_at_its_def_line(stages):
    failed = failure("none")
    assert failed.error.message == "stage 'second' (drvstages.second) returned None from run()"
    assert failed.error.location.source.startswith("def run(")
    assert failed.crash is None


def test_a_stage_error_is_the_stages_own_message(stages):
    failed = failure("stage-error")
    assert isinstance(failed.error, StageError) and failed.error.message == "tile too big"
    assert failed.crash is None


def test_ctrl_c_in_a_stage_stops_the_build(stages):
    with pytest.raises(KeyboardInterrupt):
        run_chain(chain("ctrl-c"), {})


def test_a_stage_module_without_options_or_that_does_not_import_names_the_stage(stages, tmp_path):
    (tmp_path / "drvstages" / "noopts.py").write_text("ARTIFACT = 'x'\ndef run(*a): pass\n")
    (tmp_path / "drvstages" / "broken.py").write_text("def run(:\n")
    with pytest.raises(StageFailed) as info:
        run_chain(chain("ok", second="drvstages.noopts"), {})
    assert info.value.error.message == (
        "stage 'second' (drvstages.noopts) failed building its Options: AttributeError: "
        "module 'drvstages.noopts' has no attribute 'Options'"
    )
    with pytest.raises(StageFailed) as info:
        run_chain(chain("ok", second="drvstages.broken"), {})
    assert info.value.error.message.startswith(
        "stage 'second' (drvstages.broken) failed when imported: SyntaxError:"
    )


def test_sys_exit_while_lowering_is_a_kiln_error_naming_the_stage(stages):
    with pytest.raises(KilnError) as info:
        lower("text", [("drvstages.second", {"mode": "exit0"})], {})
    assert info.value.message == (
        "stage 'second' (drvstages.second) called sys.exit(0) while lowering"
    )
