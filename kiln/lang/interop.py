"""NumPy calls on kiln tensors: the ones with a kiln op map to it, the rest are clear errors.

``np.exp(t)`` arrives through ``Tensor.__array_ufunc__`` and ``np.sum(t)``
through ``Tensor.__array_function__``; both tables below name what works.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import TraceError
from kiln.lang import contractions as C
from kiln.lang import elementwise as E
from kiln.lang import functions as F
from kiln.lang import reductions as R
from kiln.lang import shapes as S

UFUNCS = {
    np.add: F.add,
    np.subtract: F.subtract,
    np.multiply: F.multiply,
    np.true_divide: F.divide,
    np.power: F.power,
    np.maximum: F.maximum,
    np.minimum: F.minimum,
    np.negative: F.negative,
    np.absolute: F.absolute,
    np.exp: F.exp,
    np.log: F.log,
    np.sqrt: F.sqrt,
    np.tanh: F.tanh,
    np.less: F.less,
    np.less_equal: F.less_equal,
    np.greater: F.greater,
    np.greater_equal: F.greater_equal,
    np.equal: F.equal,
    np.not_equal: F.not_equal,
    np.logical_not: F.logical_not,
    np.matmul: F.matmul,
    np.logical_and: E.logical_and,
    np.logical_or: E.logical_or,
    np.logical_xor: E.logical_xor,
    np.square: E.square,
    np.reciprocal: E.reciprocal,
    np.log1p: E.log1p,
    np.expm1: E.expm1,
    np.floor: E.floor,
    np.ceil: E.ceil,
    np.rint: E.round,
    np.sign: E.sign,
}

FUNCTIONS = {
    np.sum: F.sum,
    np.max: F.max,
    np.amax: F.max,
    np.min: F.min,
    np.amin: F.min,
    np.mean: F.mean,
    np.transpose: F.transpose,
    np.reshape: F.reshape,
    np.where: F.where,
    np.broadcast_to: F.broadcast_to,
    np.matmul: F.matmul,
    np.clip: E.clip,
    np.round: E.round,
    np.prod: R.prod,
    np.var: R.var,
    np.std: R.std,
    np.argmax: R.argmax,
    np.argmin: R.argmin,
    np.concatenate: S.concatenate,
    np.stack: S.stack,
    np.expand_dims: S.expand_dims,
    np.squeeze: S.squeeze,
    np.swapaxes: S.swapaxes,
    np.moveaxis: S.moveaxis,
    np.flip: S.flip,
    np.dot: C.dot,
    np.einsum: C.einsum,
    np.zeros_like: E.zeros_like,
    np.ones_like: E.ones_like,
    np.full_like: E.full_like,
}


def _supported(table: dict) -> str:
    return ", ".join(sorted({f"np.{f.__name__}" for f in table}))


def numpy_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    fn = UFUNCS.get(ufunc)
    if fn is None or method != "__call__" or kwargs:
        what = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        if kwargs:
            what += " with " + ", ".join(f"{k}=" for k in sorted(kwargs))
        raise TraceError(
            f"{what} is not supported on kiln tensors",
            hint="use the kiln op (kiln.exp, kiln.maximum, x.sum(), ...)",
            notes=["numpy ufuncs that work on kiln tensors: " + _supported(UFUNCS)],
        )
    return fn(*inputs)


def numpy_function(func: Any, args: tuple, kwargs: dict) -> Any:
    fn = FUNCTIONS.get(func)
    if fn is None:
        raise TraceError(
            f"np.{getattr(func, '__name__', func)} is not supported on kiln tensors",
            notes=["numpy functions that work on kiln tensors: " + _supported(FUNCTIONS)],
        )
    return fn(*args, **kwargs)
