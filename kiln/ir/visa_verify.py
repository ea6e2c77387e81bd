"""vISA verification: declarations and every instruction against its op spec.

Re-exported by kiln.ir.visa; a failure names the instruction and the rule.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.visa_records import (
    DTYPES,
    OPS,
    ROLES,
    Imm,
    Instr,
    Operand,
    Program,
    Tile,
    View,
    acc_dtype,
)
from kiln.ir.visa_text import format_instr

# -- verifier ------------------------------------------------------------------


class VisaError(ValueError):
    """A broken vISA invariant: ``index`` is the instruction (None: a declaration)."""

    def __init__(self, index: int | None, rule: str, instr: Instr | None = None):
        where = f"instruction {index} ({format_instr(instr)})" if instr else "declarations"
        super().__init__(f"{where}: {rule}")
        self.index = index
        self.rule = rule


class _Ctx:
    """What the per-kind checks need: declarations and the dtype of each operand."""

    def __init__(self, program: Program):
        self.tensors = program.tensor_map()
        self.buffers = program.buffer_map()

    def dtype(self, operand: Operand) -> str:
        if isinstance(operand, Tile):
            return self.buffers[operand.buf].dtype
        if isinstance(operand, View):
            return self.tensors[operand.tensor].dtype
        return operand.dtype


def _need(cond: bool, rule: str) -> None:
    if not cond:
        raise ValueError(rule)


def _kinds(instr: Instr, dst: type, *srcs: tuple[type, ...] | type) -> None:
    _need(isinstance(instr.dst, dst), f"destination must be a {dst.__name__.lower()}")
    for i, (src, allowed) in enumerate(zip(instr.srcs, srcs, strict=True)):
        if not isinstance(src, allowed):  # the message only when it is needed
            kinds = allowed if isinstance(allowed, tuple) else (allowed,)
            raise ValueError(
                f"source {i} must be a {' or '.join(t.__name__.lower() for t in kinds)}"
            )


def _same_shape(instr: Instr) -> None:
    """Tile operands match the result, or repeat along its dims where they have size 1."""
    out = instr.dst.shape
    for src in instr.srcs:
        if not isinstance(src, Imm):
            _need(
                len(src.shape) == len(out)
                and all(s in (d, 1) for s, d in zip(src.shape, out, strict=True)),
                f"operand shape {src.shape} does not broadcast to {out}",
            )


def _check_load(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, View)
    (src,) = instr.srcs
    _need(src.size == instr.dst.size, f"tile has {instr.dst.size} elements, view {src.size}")
    _need(c.dtype(src) == c.dtype(instr.dst), "tile and tensor dtypes differ")


def _check_store(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, View, Tile)
    (src,) = instr.srcs
    dst = instr.dst
    _need(src.size == dst.size, f"tile has {src.size} elements, view {dst.size}")
    _need(c.dtype(src) == c.dtype(dst), "tile and tensor dtypes differ")
    _need(c.tensors[dst.tensor].role != "input", "stores must not write an input tensor")
    _need(
        all(s > 0 or d == 1 for d, s in zip(dst.shape, dst.strides, strict=True)),
        "a store view must not repeat elements (stride 0 on a dim > 1)",
    )


def _check_mma(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Tile, Tile)
    a, b = instr.srcs
    d = instr.dst
    _need(len(a.shape) == len(b.shape) == len(d.shape) == 2, "mma operands must be 2-D")
    _need(a.shape[1] == b.shape[0], f"contraction dims differ: {a.shape} @ {b.shape}")
    _need(d.shape == (a.shape[0], b.shape[1]), f"result {d.shape} != {a.shape} @ {b.shape}")
    _need(c.dtype(a) == c.dtype(b), "mma operand dtypes differ")
    _need(c.dtype(d) == acc_dtype(c.dtype(a)), f"mma accumulates in {acc_dtype(c.dtype(a))}")


def _check_unary(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, (Tile, Imm))
    _same_shape(instr)
    _need(c.dtype(instr.srcs[0]) == c.dtype(instr.dst), "operand and result dtypes differ")


def _check_binary(c: _Ctx, instr: Instr, result: str | None = None) -> None:
    _kinds(instr, Tile, (Tile, Imm), (Tile, Imm))
    _same_shape(instr)
    a, b = (c.dtype(s) for s in instr.srcs)
    _need(a == b, f"operand dtypes differ ({a} vs {b})")
    _need(c.dtype(instr.dst) == (result or a), "result dtype is wrong")


def _check_select(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, (Tile, Imm), (Tile, Imm), (Tile, Imm))
    _same_shape(instr)
    cond, a, b = (c.dtype(s) for s in instr.srcs)
    _need(cond == "bool", "the condition must be bool")
    _need(a == b == c.dtype(instr.dst), "the selected values and the result must share a dtype")


def _check_cast(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, (Tile, Imm))
    _same_shape(instr)


def _check_reduce(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Tile)
    (src,) = instr.srcs
    axes = instr.attr("axes", ())
    _need(isinstance(axes, tuple) and list(axes) == sorted(set(axes)), "axes must be sorted")
    _need(all(0 <= a < len(src.shape) for a in axes), f"axes {axes} out of range")
    kept = tuple(1 if i in axes else d for i, d in enumerate(src.shape))
    _need(instr.dst.shape == kept, f"result shape {instr.dst.shape} != {kept}")
    s, d = c.dtype(src), c.dtype(instr.dst)
    _need(
        d == s or (instr.op in ("sum", "prod") and d == acc_dtype(s)), f"cannot reduce {s} into {d}"
    )


def _check_transpose(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Tile)
    (src,) = instr.srcs
    perm = instr.attr("perm", ())
    _need(sorted(perm) == list(range(len(src.shape))), f"perm {perm} is not a permutation")
    _need(instr.dst.shape == tuple(src.shape[p] for p in perm), "result shape is not permuted")
    _need(c.dtype(src) == c.dtype(instr.dst), "operand and result dtypes differ")


def _check_fill(c: _Ctx, instr: Instr) -> None:
    _kinds(instr, Tile, Imm)
    _need(c.dtype(instr.srcs[0]) == c.dtype(instr.dst), "immediate and tile dtypes differ")


_CHECKS: dict[str, Callable[[_Ctx, Instr], None]] = {
    "load": _check_load,
    "store": _check_store,
    "mma": _check_mma,
    "unary": _check_unary,
    "binary": _check_binary,
    "compare": lambda c, i: _check_binary(c, i, "bool"),
    "select": _check_select,
    "cast": _check_cast,
    "reduce": _check_reduce,
    "transpose": _check_transpose,
    "fill": _check_fill,
}


def _check_declarations(program: Program) -> None:
    for kind, items in (("tensor", program.tensors), ("buffer", program.buffers)):
        names = [x.name for x in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise VisaError(None, f"{kind} {dup[0]!r} is declared twice")
        for x in items:
            if x.dtype not in DTYPES or any(d < 0 for d in x.shape):
                raise VisaError(None, f"{kind} {x.name!r} has a bad type {x.dtype}{x.shape}")
    for t in program.tensors:
        if t.role not in ROLES:
            raise VisaError(None, f"tensor {t.name!r} has unknown role {t.role!r}")


def _check_operands(c: _Ctx, instr: Instr, written: set[str]) -> None:
    read = list(instr.srcs) + ([instr.dst] if instr.accumulates else [])
    for operand in (instr.dst, *instr.srcs):
        if isinstance(operand, Tile):
            buf = c.buffers.get(operand.buf)
            _need(buf is not None, f"buffer %{operand.buf} is not declared")
            _need(
                operand.size <= buf.size,
                f"tile %{operand.buf}{list(operand.shape)} exceeds the buffer's "
                f"{buf.size} elements",
            )
        elif isinstance(operand, View):
            t = c.tensors.get(operand.tensor)
            _need(t is not None, f"tensor {operand.tensor} is not declared")
            _need(len(operand.shape) == len(operand.strides), "view shape and strides differ")
            _need(all(s >= 0 for s in operand.strides), "view strides must be >= 0")
            lo, hi = operand.span()
            _need(hi <= t.size, f"view reaches element {hi - 1} of {operand.tensor} ({t.size})")
        elif operand.dtype not in DTYPES:
            raise ValueError(f"immediate has unknown dtype {operand.dtype}")
    for operand in read:
        if isinstance(operand, Tile):
            _need(operand.buf in written, f"buffer %{operand.buf} is read before it is written")


def _check_one(ctx: _Ctx, index: int, instr: Instr, written: set[str]) -> None:
    """Every rule for one instruction, in order; VisaError naming the first one broken."""
    spec = OPS.get(instr.op)
    try:
        _need(spec is not None, f"unknown opcode {instr.op!r}")
        _need(len(instr.srcs) == spec.arity, f"{instr.op} takes {spec.arity} sources")
        _need(
            set(k for k, _ in instr.attrs) <= set(spec.attrs),
            f"{instr.op} takes attributes {spec.attrs}",
        )
        _check_operands(ctx, instr, written)
        _CHECKS[spec.kind](ctx, instr)
    except VisaError:
        raise
    except ValueError as exc:
        raise VisaError(index, str(exc), instr) from None


def _shape_of(operand: Operand) -> object:
    """What the rules read of an operand, but a view's offset (checked on its own)."""
    if type(operand) is View:
        return (operand.tensor, operand.shape, operand.strides)
    return operand


class _Seen:
    """Instructions already checked, up to their views' offsets.

    A large program repeats a few instruction shapes with different DRAM
    offsets, and every rule but a view's bounds is a function of the shape:
    an instruction whose shape passed once needs only its views' bounds
    and its reads-after-writes checked.
    """

    def __init__(self, ctx: _Ctx) -> None:
        self.ctx = ctx
        self.shapes: set = set()
        self.room: dict[tuple, int] = {}  # (tensor, shape, strides) -> highest valid offset

    def passes(self, instr: Instr, written: set[str]) -> bool:
        key = (instr.op, instr.attrs, _shape_of(instr.dst), *map(_shape_of, instr.srcs))
        if key not in self.shapes:
            return False
        for operand in (instr.dst, *instr.srcs):
            if type(operand) is View:
                room = self.room.get((operand.tensor, operand.shape, operand.strides))
                if room is None:
                    lo, hi = operand.span()
                    room = self.ctx.tensors[operand.tensor].size - (hi - lo)
                    self.room[(operand.tensor, operand.shape, operand.strides)] = room
                if operand.offset > room:
                    return False
        for operand in instr.srcs:
            if type(operand) is Tile and operand.buf not in written:
                return False
        dst = instr.dst
        return not (type(dst) is Tile and instr.accumulates and dst.buf not in written)

    def add(self, instr: Instr) -> None:
        self.shapes.add((instr.op, instr.attrs, _shape_of(instr.dst), *map(_shape_of, instr.srcs)))


def verify(program: Program) -> None:
    """Check declarations and every instruction; raise VisaError naming it and the rule."""
    _check_declarations(program)
    ctx = _Ctx(program)
    seen = _Seen(ctx)
    written: set[str] = set()
    for index, instr in enumerate(program.instrs):
        if not seen.passes(instr, written):
            _check_one(ctx, index, instr, written)
            seen.add(instr)
        if isinstance(instr.dst, Tile):
            written.add(instr.dst.buf)
