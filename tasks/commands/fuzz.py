"""Shape fuzzing's policy: which sizes `kiln test --fuzz N` draws for a kernel's dims.

Pure functions, no I/O: the same seed gives the same bindings on any
machine and under any hash seed. A dim's size comes from its range
(pipeline.yaml's ``fuzz:``, else 1 to ``DEFAULT_HIGH``), biased toward the
sizes where tiled code breaks: the smallest size, primes, and each tile
size of the machine and the stage options, one below, at and one above.
tasks/commands/fuzzing.py builds and checks what is drawn here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_LOW = 1
DEFAULT_HIGH = 300
# an argument of more elements is drawn again (a few times): the simulator and the
# oracle hold every argument, and fuzzing many bindings must stay quick
MAX_ELEMENTS = 1 << 22
TRIES_PER_BINDING = 50
PRIME_LIMIT = 1000  # primes drawn come from below this (and the range)
SHAPE_SET_PREFIX = "fuzz_"
# how a dim's size is drawn: (share of draws, kind)
KINDS = (
    (0.2, "smallest"),
    (0.2, "prime"),
    (0.3, "tile"),
    (0.3, "uniform"),
)

Binding = dict[str, int]


def symbolic_dims(params: Iterable[tuple[str, Sequence | None]]) -> list[str]:
    """The kernel's symbolic dims (``Tensor["M", "K"]``), in the order its arguments name them."""
    found: dict[str, None] = {}
    for _, dims in params:
        for dim in dims or ():
            if isinstance(dim, str):
                found.setdefault(dim)
    return list(found)


def tile_sizes(machine: Mapping | None, stage_options: Iterable[Mapping]) -> list[int]:
    """Sizes a tiled lowering cuts at: the machine's tensor tile (and 2x, 4x, which the
    visa stage picks when they fit), its vector lanes, and every ``*tile*`` stage option."""
    found: set[int] = set()
    machine = machine or {}
    tile = (machine.get("tensor") or {}).get("tile") or ()
    for size in tile if isinstance(tile, (list, tuple)) else ():
        if isinstance(size, int) and size > 0:
            found.update((size, 2 * size, 4 * size))
    lanes = (machine.get("vector") or {}).get("lanes")
    if isinstance(lanes, int) and lanes > 0:
        found.add(lanes)
    for options in stage_options:
        for key, value in options.items():
            if "tile" in key and isinstance(value, int) and not isinstance(value, bool):
                if value > 0:
                    found.add(value)
    return sorted(found)


def primes_between(low: int, high: int) -> list[int]:
    """The primes in [low, min(high, PRIME_LIMIT)]."""
    top = min(high, PRIME_LIMIT)
    if top < 2:
        return []
    sieve = bytearray([1]) * (top + 1)
    sieve[0] = sieve[1] = 0
    for n in range(2, math.isqrt(top) + 1):
        if sieve[n]:
            sieve[n * n :: n] = bytearray(len(sieve[n * n :: n]))
    return [n for n in range(max(low, 2), top + 1) if sieve[n]]


def draw_size(rng: random.Random, low: int, high: int, tiles: Sequence[int]) -> int:
    """One size in [low, high]: the smallest, a prime, a tile size +-1, or uniform."""
    if low == high:
        return low
    roll, kind = rng.random(), "uniform"
    for share, name in KINDS:
        if roll < share:
            kind = name
            break
        roll -= share
    if kind == "smallest":
        return low
    if kind == "prime":
        primes = primes_between(low, high)
        if primes:
            return primes[rng.randrange(len(primes))]
    if kind == "tile":
        near = sorted({t + d for t in tiles for d in (-1, 0, 1) if low <= t + d <= high})
        if near:
            return near[rng.randrange(len(near))]
    return rng.randint(low, high)


def largest_argument(params: Iterable[tuple[str, Sequence | None]], binding: Binding) -> int:
    """The element count of the kernel's largest argument at ``binding``."""
    largest = 0
    for _, dims in params:
        largest = max(
            largest, math.prod(binding.get(d, 1) if isinstance(d, str) else d for d in dims or ())
        )
    return largest


def draw_bindings(
    dims: Sequence[str],
    ranges: Mapping[str, tuple[int, int]],
    count: int,
    seed: int,
    tiles: Sequence[int] = (),
    params: Iterable[tuple[str, Sequence | None]] = (),
) -> list[Binding]:
    """Up to ``count`` distinct bindings of ``dims``, the same for the same arguments.

    A dim without a range gets [DEFAULT_LOW, DEFAULT_HIGH]. A binding whose
    largest argument (``params``: the kernel's (argument, dims)) passes
    MAX_ELEMENTS is drawn again, up to TRIES_PER_BINDING times; fewer than
    ``count`` come back when the ranges hold fewer distinct bindings.
    """
    params = list(params)
    rng = random.Random(seed)  # an int seed: no hash randomization in it
    bounds = [ranges.get(d, (DEFAULT_LOW, DEFAULT_HIGH)) for d in dims]
    drawn: list[Binding] = []
    seen: set[tuple[int, ...]] = set()
    tries = 0
    while len(drawn) < count and tries < count * TRIES_PER_BINDING:
        for _ in range(TRIES_PER_BINDING):  # the last one stands if none is small enough
            tries += 1
            binding = {
                d: draw_size(rng, lo, hi, tiles) for d, (lo, hi) in zip(dims, bounds, strict=True)
            }
            if not params or largest_argument(params, binding) <= MAX_ELEMENTS:
                break
        key = tuple(binding.values())
        if key not in seen:
            seen.add(key)
            drawn.append(binding)
    return drawn


def distinct_bindings(ranges: Sequence[tuple[int, int]]) -> int:
    """How many distinct bindings the ranges hold."""
    return math.prod(hi - lo + 1 for lo, hi in ranges)


def shape_set_name(binding: Binding) -> str:
    """The shape set a binding is built as, named after its sizes: ``fuzz_M17_N1``.

    The name seeds the inputs, so declaring the binding under this name in
    pipeline.yaml gives `kiln test` the very arrays the fuzzer checked.
    """
    return SHAPE_SET_PREFIX + "_".join(f"{d}{v}" for d, v in binding.items())


def snippet(binding: Binding, keep: Mapping[str, Binding] | None = None) -> str:
    """One line of pipeline.yaml, under the kernel's entry, that declares ``binding``.

    ``keep``: shape sets the line must name too (a kernel whose one set is
    written flat, ``shapes: {N: 64}``, takes a named set only beside it).
    """
    sets = {**(keep or {}), shape_set_name(binding): binding}
    inner = ", ".join(
        f"{name}: {{{', '.join(f'{d}: {v}' for d, v in sizes.items())}}}"
        for name, sizes in sets.items()
    )
    return f"shapes: {{{inner}}}"


def describe(binding: Binding) -> str:
    """``M=17, N=1``."""
    return ", ".join(f"{d}={v}" for d, v in binding.items())
