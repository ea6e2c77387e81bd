"""Shape fuzzing's policy: seeded bindings, biased toward the sizes where tiling breaks."""

from __future__ import annotations

import os
import subprocess
import sys

from kiln.tasks.commands.fuzz import (
    DEFAULT_HIGH,
    MAX_ELEMENTS,
    draw_bindings,
    largest_argument,
    primes_between,
    shape_set_name,
    snippet,
    symbolic_dims,
    tile_sizes,
)

GEMM = [("a", ("M", "K")), ("b", ("K", "N"))]
NPU = {"tensor": {"tile": [32, 32, 32]}, "vector": {"lanes": 64}}


def test_the_same_seed_gives_the_same_bindings_and_another_seed_others():
    first = draw_bindings(["M", "K", "N"], {}, 30, seed=7, tiles=[32], params=GEMM)
    again = draw_bindings(["M", "K", "N"], {}, 30, seed=7, tiles=[32], params=GEMM)
    other = draw_bindings(["M", "K", "N"], {}, 30, seed=8, tiles=[32], params=GEMM)
    assert first == again
    assert first != other
    assert len(first) == 30
    assert len({tuple(b.values()) for b in first}) == 30  # distinct


def test_bindings_do_not_depend_on_the_hash_seed():
    code = (
        "from kiln.tasks.commands.fuzz import draw_bindings;"
        "print(draw_bindings(['M', 'N'], {'N': (1, 40)}, 12, seed=3, tiles=[32]))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hashseed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hashseed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().startswith("[{'M': ")


def test_sizes_stay_in_their_ranges_and_a_fixed_dim_keeps_its_size():
    drawn = draw_bindings(["M", "N"], {"M": (5, 9), "N": (16, 16)}, 5, seed=0)
    assert sorted(b["M"] for b in drawn) == [5, 6, 7, 8, 9]  # every size of a small range
    assert {b["N"] for b in drawn} == {16}


def test_a_range_with_fewer_bindings_than_asked_gives_each_once():
    drawn = draw_bindings(["N"], {"N": (1, 3)}, 10, seed=0)
    assert sorted(b["N"] for b in drawn) == [1, 2, 3]


def test_draws_favour_one_primes_and_tile_sizes_plus_minus_one():
    sizes = [b["N"] for b in draw_bindings(["N"], {}, 200, seed=1, tiles=[32, 64, 128])]
    assert all(1 <= s <= DEFAULT_HIGH for s in sizes)
    assert 1 in sizes
    near_tiles = {t + d for t in (32, 64, 128) for d in (-1, 0, 1)}
    assert len(near_tiles & set(sizes)) >= 6
    primes = set(primes_between(1, DEFAULT_HIGH))
    assert sum(s in primes for s in sizes) > 200 * 0.2  # well above primes' share of 1..300


def test_a_binding_too_large_to_check_quickly_is_drawn_again():
    batched = [("a", ("B", "M", "K")), ("b", ("B", "K", "N"))]
    drawn = draw_bindings(["B", "M", "K", "N"], {}, 40, seed=2, params=batched)
    assert all(largest_argument(batched, b) <= MAX_ELEMENTS for b in drawn)


def test_symbolic_dims_in_argument_order_without_fixed_sizes():
    assert symbolic_dims([("x", ("B", 8, "C")), ("w", ("C", "K")), ("s", None)]) == ["B", "C", "K"]
    assert symbolic_dims([("x", (8,))]) == []


def test_tile_sizes_come_from_the_machine_and_tile_options():
    assert tile_sizes(NPU, [{"tile_m": 48, "fusion": True, "vector_tile": 0}]) == [32, 48, 64, 128]
    assert tile_sizes(None, []) == []


def test_primes_between():
    assert primes_between(1, 20) == [2, 3, 5, 7, 11, 13, 17, 19]
    assert primes_between(14, 16) == []


def test_the_shape_set_and_snippet_name_the_sizes():
    binding = {"M": 17, "N": 1}
    assert shape_set_name(binding) == "fuzz_M17_N1"
    assert snippet(binding) == "shapes: {fuzz_M17_N1: {M: 17, N: 1}}"
    kept = snippet(binding, {"default": {"M": 64, "N": 64}})
    assert kept == "shapes: {default: {M: 64, N: 64}, fuzz_M17_N1: {M: 17, N: 1}}"
