"""Integer `**`: NumPy raises for a negative integer exponent; a kernel is refused at its line."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kiln import trace
from kiln.errors import TraceError

KERNELS = """\
import kiln
from kiln import Tensor, device


@device
def reciprocal(a: Tensor["N"]):
    return a ** -1  # <- reciprocal


@device
def scalar_base(a: Tensor["N"]):
    return (-1) ** -a  # <- scalar_base


@device
def tensor_exponent(a: Tensor["N"], b: Tensor["N"]):
    return kiln.power(a, b)  # <- tensor_exponent


@device
def mask_power(a: Tensor["N"]):
    return (a > 0) ** (a > 1)  # <- mask_power


@device
def cube(a: Tensor["N"]):
    return a ** 3


@device
def float_exponent(a: Tensor["N"]):
    return a ** -1.0


@device
def cast_first(a: Tensor["N"], b: Tensor["N"]):
    return a.astype("f32") ** b
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernels") / "int_power.py"
    path.write_text(KERNELS)
    spec = importlib.util.spec_from_file_location("int_power", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def _line(tag: str) -> int:
    return next(n for n, t in enumerate(KERNELS.splitlines(), 1) if t.endswith(f"# <- {tag}"))


@pytest.mark.parametrize(
    "kernel, words",
    [
        ("reciprocal", "integers to negative integer powers are not allowed (exponent -1)"),
        ("scalar_base", "an integer base to an integer exponent tensor (i32 [4])"),
        ("tensor_exponent", "an integer base to an integer exponent tensor (i32 [4])"),
        ("mask_power", "an integer base to an integer exponent tensor (bool [4])"),
    ],
)
def test_integer_power_that_numpy_may_refuse_is_a_trace_error_at_the_line(kernels, kernel, words):
    module, path = kernels
    with pytest.raises(TraceError) as info:
        trace(getattr(module, kernel), {"N": 4}, "i32")
    assert info.value.message.startswith(f"'**' (pow): {words}")
    assert "astype('f32')" in info.value.hint
    assert (Path(info.value.location.file), info.value.location.line) == (path, _line(kernel))
    x = np.arange(-2, 2, dtype=np.int32)
    args = (x, x) if kernel == "tensor_exponent" else (x,)
    with pytest.raises(TraceError, match=r"'\*\*' \(pow\)"):  # eagerly, as the cpu oracle runs
        getattr(module, kernel)(*args)


def test_integer_power_by_a_constant_and_float_powers_still_compute(kernels):
    module, _ = kernels
    a = np.array([-3, -1, 2, 5], np.int32)
    cubed = module.cube(a)
    assert cubed.dtype == np.int32 and cubed.tolist() == [-27, -1, 8, 125]
    assert module.float_exponent(a).tolist() == pytest.approx([-1 / 3, -1.0, 0.5, 0.2])
    assert module.cast_first(a, np.array([2, -1, -2, 0], np.int32)).tolist() == pytest.approx(
        [9.0, -1.0, 0.25, 1.0]
    )
