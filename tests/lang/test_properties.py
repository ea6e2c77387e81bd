"""Property: for random elementwise programs, eager == interpreted graph, bit for bit."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln import Tensor, device, trace
from kiln.ir.interp import NUMPY_DTYPES, run_graph

# ruff: noqa: F821  (Tensor["A"] names a dim)

BINARY = [
    lambda a, b: a + b,
    lambda a, b: a - b,
    lambda a, b: a * b,
    lambda a, b: a / (abs(b) + 1),
    kiln.maximum,
    kiln.minimum,
    lambda a, b: kiln.where(a > b, a, b * 0.5),
    lambda a, b: a + 2,
    lambda a, b: 1.5 - b,
]
UNARY = [
    lambda x: x,
    lambda x: -x,
    lambda x: (abs(x) + 1).log(),
    lambda x: x.tanh(),
    lambda x: x.relu(),
    lambda x: x.sum(axis=-1, keepdims=True),
    lambda x: x.max(axis=0, keepdims=True),
    lambda x: x.mean(axis=-1, keepdims=True),
    lambda x: x.astype("f32"),
]


def make_kernel(steps):
    @device
    def program(x: Tensor["A", "B"], y: Tensor["B"], z: Tensor["A", 1]):
        values = [x, y, z]
        for binary, unary, i, j in steps:
            values.append(
                UNARY[unary](BINARY[binary](values[i % len(values)], values[j % len(values)]))
            )
        return values[-1], values[-2]

    return program


steps_strategy = st.lists(
    st.tuples(
        st.integers(0, len(BINARY) - 1),
        st.integers(0, len(UNARY) - 1),
        st.integers(0, 20),
        st.integers(0, 20),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(
    steps=steps_strategy,
    dtypes=st.tuples(*[st.sampled_from(["f32", "f16", "bf16", "i32"])] * 3),
    a=st.integers(1, 4),
    b=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_eager_equals_interpreted_graph(steps, dtypes, a, b, seed):
    program = make_kernel(steps)
    rng = np.random.default_rng(seed)
    shapes = [(a, b), (b,), (a, 1)]
    args = [
        (rng.standard_normal(s) * 4).astype(NUMPY_DTYPES[d])
        for s, d in zip(shapes, dtypes, strict=True)
    ]
    arg_dtypes = dict(zip("xyz", dtypes, strict=True))
    graph = trace(program, {"A": a, "B": b}, arg_dtypes)
    eager = program(*args)
    for e, g in zip(eager, run_graph(graph, args), strict=True):
        assert e.dtype == g.dtype and e.shape == g.shape
        np.testing.assert_array_equal(e, g)
    assert graph.to_json() == trace(program, {"A": a, "B": b}, arg_dtypes).to_json()
