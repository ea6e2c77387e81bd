"""kiln.lang.device.dispatching: route kernel calls to a target while active."""

import numpy as np

from kiln import Tensor, device, dispatching

# ruff: noqa: F821  (Tensor["N"] names a dim)


@device
def double(x: Tensor["N"]):
    return x * 2.0


@device
def quadruple(x: Tensor["N"]):
    return double(double(x))


def test_handler_receives_calls_with_arrays():
    calls = []

    def handler(fn, args, kwargs):
        calls.append((fn, args, kwargs))
        return "from target"

    x = np.ones(2, np.float32)
    with dispatching(handler):
        assert double(x, extra=1) == "from target"
    assert calls == [(double, (x,), {"extra": 1})]
    assert double(x).tolist() == [2, 2]  # inactive again


def test_handler_can_fall_back_to_eager_and_nested_calls_inline():
    seen = []

    def handler(fn, args, kwargs):
        seen.append(fn.__name__)
        return fn(*args, **kwargs)  # dispatch is off inside the handler: eager

    with dispatching(handler):
        assert quadruple(np.ones(2, np.float32)).tolist() == [4, 4]
    assert seen == ["quadruple"]  # double() got tensors, so it was inlined


def test_eager_method_ignores_the_handler():
    with dispatching(lambda *a: "nope"):
        assert double.eager(np.ones(1, np.float32)).tolist() == [2]


def test_dispatching_none_switches_it_off():
    with dispatching(lambda *a: "outer"):
        with dispatching(None):
            assert double(np.ones(1, np.float32)).tolist() == [2]
        assert double(np.ones(1, np.float32)) == "outer"


def test_reachable_as_kiln_lang_device_dispatching():
    import kiln.lang

    assert kiln.lang.device.dispatching is dispatching


def test_kiln_reexports_exactly_the_language_names():
    import kiln
    import kiln.lang

    assert kiln.LANG_NAMES == set(kiln.lang.__all__)
    for name in kiln.lang.__all__:
        assert getattr(kiln, name) is getattr(kiln.lang, name)


def test_importing_kiln_submodules_does_not_import_numpy():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    code = "import sys; from kiln import errors, options; print('numpy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"
