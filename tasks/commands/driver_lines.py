"""Benchmark driver lines (MIOpen's and Fusilli's) as Kiln's benchmark problems.

A user arriving from those drivers has conv and matmul configurations as
their command lines, often kept in a file with ``#`` comments and ``[SKIP]``
lines::

    conv --bf16 -F 1 -n 16 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1
         -l 1 -j 1 -g 1 --in_layout NHWC --out_layout NHWC --fil_layout NHWC --spatial_dim 2
    matmul -M 64 -N 32 -K 16 --transA --bf16

Each line is read with argparse (the drivers' own flag names and aliases)
and mapped onto Kiln's ``conv`` problem (``-F``, MIOpen's bit mask: 1
forward, 2 backward data, 4 backward weights, their sums for several, 0
for all three: one problem each) or a matmul; a flag Kiln cannot map is refused with
one message that names it (and the file:line in a command file).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from kiln.errors import KilnError

CONV_COMMANDS = {"conv": "f32", "convfp16": "f16", "convbfp16": "bf16"}
COMMANDS = (*CONV_COMMANDS, "matmul")
MODES = {1: "fwd", 2: "dgrad", 4: "wgrad"}
LAYOUTS = {2: ("NCHW", "NHWC"), 3: ("NCDHW", "NDHWC")}
DTYPES = ("f32", "f16", "bf16")
# flags only a driver line has: `problem:conv` with one of them is a driver line
DRIVER_ONLY = {
    "-F", "--forw", "-n", "--batchsize", "-c", "--in_channels", "-k", "--out_channels",
    "-y", "--fil_h", "-x", "--fil_w", "-u", "--conv_stride_h", "-v", "--conv_stride_w",
    "-p", "--pad_h", "-q", "--pad_w", "-l", "--dilation_h", "-j", "--dilation_w",
    "-g", "--group_count", "--in_layout", "--fil_layout", "--out_layout", "--spatial_dim",
    "--in_d", "--fil_d", "--pad_d", "--conv_stride_d", "--dilation_d", "--bf16", "--fp16",
}  # fmt: skip
THREE_D = ("in_d", "fil_d", "pad_d", "conv_stride_d", "dilation_d")


@dataclass
class DriverLine:
    """One driver line, mapped: the problems to time (one, or one per pass of a
    convolution's ``-F``) and Kiln's run options for them."""

    name: str  # conv or matmul: the kernel's name
    problems: tuple  # kiln.tasks.commands.problems.Problem, each
    options: argparse.Namespace  # target, iter, warmup, device, output_format
    text: str
    where: str = ""  # FILE:LINE of a command file's line


class _Parser(argparse.ArgumentParser):
    """argparse that raises KilnError: the flag it names, no usage text, no exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise KilnError(f"{self.prog}: {message}")


def _least(least: int):
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, found {value}")
        return value

    check.__name__ = f"a whole number >= {least}"
    return check


def _run_flags(p: argparse.ArgumentParser, defaults: argparse.Namespace | None) -> None:
    """Kiln's own options of a benchmark run, and the drivers' that mean the same."""
    d = defaults or argparse.Namespace()
    p.add_argument("--target", action="append", metavar="T")
    p.add_argument("-i", "--iter", type=_least(1), default=getattr(d, "iter", 10))
    p.add_argument("--warmup", type=_least(0), default=getattr(d, "warmup", 2))
    p.add_argument("--device", type=_least(0), default=getattr(d, "device", 0))
    p.add_argument("--output-format", choices=["table", "csv", "json"], default="table")
    p.add_argument("-t", "--time", type=int, help="accepted: Kiln always times")
    p.set_defaults(default_target=getattr(d, "target", None) or "cpu")


def _conv_parser(prog: str, defaults) -> _Parser:
    p = _Parser(prog=prog, allow_abbrev=False)
    add = p.add_argument
    size, zero = _least(1), _least(0)
    add(
        "-F",
        "--forw",
        type=int,
        default=1,
        help="1 forward, 2 backward data, 4 backward weights; a sum for several, 0 for all",
    )
    add("-m", "--mode", default="conv", help="conv (trans: refused)")
    for flags, dest, kind in (
        (("-n", "--batchsize"), "n", size), (("-c", "--in_channels"), "c", size),
        (("-H", "--in_h"), "h", size), (("-W", "--in_w"), "w", size),
        (("-k", "--out_channels"), "k", size), (("-y", "--fil_h"), "y", size),
        (("-x", "--fil_w"), "x", size),
    ):  # fmt: skip
        add(*flags, dest=dest, type=kind, required=True)
    for flags, dest, kind, default in (
        (("-g", "--group_count"), "g", size, 1),
        (("-u", "--conv_stride_h"), "u", size, 1), (("-v", "--conv_stride_w"), "v", size, 1),
        (("-p", "--pad_h"), "p", zero, 0), (("-q", "--pad_w"), "q", zero, 0),
        (("-l", "--dilation_h"), "l", size, 1), (("-j", "--dilation_w"), "j", size, 1),
        (("-!", "--in_d"), "in_d", size, None), (("-@", "--fil_d"), "fil_d", size, None),
        (("-#", "--conv_stride_d"), "conv_stride_d", size, None),
        (("-$", "--pad_d"), "pad_d", zero, None),
        (("-^", "--dilation_d"), "dilation_d", size, None),
    ):  # fmt: skip
        add(*flags, dest=dest, type=kind, default=default)
    add("-_", "--spatial_dim", type=int, default=2)
    for short, long in (("-I", "--in_layout"), ("-f", "--fil_layout"), ("-O", "--out_layout")):
        add(short, long, default="NCHW")
    add("--fp16", action="store_true")
    add("--bf16", action="store_true")
    add("-b", "--bias", action="store_true")
    _run_flags(p, defaults)
    return p


def _matmul_parser(prog: str, defaults) -> _Parser:
    p = _Parser(prog=prog, allow_abbrev=False)
    size = _least(1)
    for short, long in (("-M", "--m"), ("-N", "--n"), ("-K", "--k")):
        p.add_argument(short, long, dest=short[1].lower(), type=size, required=True)
    p.add_argument("-B", "--b", dest="batch", type=size, default=1)
    for flag in ("--a_type", "--b_type", "--out_type", "--bias_type"):
        p.add_argument(flag, choices=DTYPES)
    for flag in ("--transA", "--transB", "--bias", "--fp16", "--bf16"):
        p.add_argument(flag, action="store_true")
    _run_flags(p, defaults)
    return p


def split_line(text: str) -> list[str]:
    """A driver line's words, its ``#`` comment dropped; KilnError for unbalanced quotes."""
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise KilnError(f"cannot read the line: {exc}", found=text) from None


def parse_line(words: list[str], defaults: argparse.Namespace | None = None) -> DriverLine:
    """A driver line (``[PROGRAM] [MAIN OPTIONS] conv|convfp16|convbfp16|matmul FLAGS``)."""
    text = shlex.join(words)
    command = next((i for i, w in enumerate(words) if w in COMMANDS), None)
    if command is None:
        raise KilnError(
            "no benchmark driver command in the line",
            expected="conv, convfp16, convbfp16 or matmul, then its flags",
            found=text or "(an empty line)",
        )
    before = words[:command]  # the driver's own options (--iter 10), and Kiln's
    if before and not before[0].startswith("-"):  # the driver program itself
        before = before[1:]
    name = words[command]
    argv = [*before, *words[command + 1 :]]
    prog = f"kiln bench problem: {name}"
    maker = _matmul_parser if name == "matmul" else _conv_parser
    parser = maker(prog, defaults)
    args, extra = parser.parse_known_args(argv)
    if extra:
        flag = next((w for w in extra if w.startswith("-")), extra[0])
        raise KilnError(
            f"{prog}: {flag} cannot be mapped to a Kiln benchmark problem",
            expected="the flags Kiln maps: " + ", ".join(_known(parser)),
            found=flag,
            hint="drop it, or time the configuration with its own driver",
        )
    problems = (_matmul(args),) if name == "matmul" else _convs(prog, name, args)
    options = argparse.Namespace(
        target=(args.target or [args.default_target])[-1],
        iter=args.iter,
        warmup=args.warmup,
        device=args.device,
        output_format=args.output_format,
        targets=args.target or [],
    )
    return DriverLine("matmul" if name == "matmul" else "conv", problems, options, text)


def _known(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in parser._actions if a.option_strings]


def _refuse(prog: str, flag: str, why: str, expected: str, found: object) -> KilnError:
    return KilnError(f"{prog}: {flag} {why}", expected=expected, found=str(found))


def passes(forw: int) -> list[str]:
    """Kiln's modes for MIOpen's ``-F`` bit mask, in MIOpen's order; 0 is all three."""
    return [mode for bit, mode in MODES.items() if forw == 0 or forw & bit]


def _convs(prog: str, command: str, a: argparse.Namespace) -> tuple:
    """One problem per pass that ``-F`` asks for."""
    if not 0 <= a.forw <= sum(MODES):
        raise _refuse(
            prog,
            "-F",
            "cannot be mapped",
            "1 (forward), 2 (backward data), 4 (weights), a sum of them, or 0 (all three)",
            a.forw,
        )
    if a.bias and passes(a.forw) != ["fwd"]:
        raise _refuse(prog, "--bias", "is for the forward pass only", "-F 1 with --bias", a.forw)
    return tuple(_conv(prog, command, a, mode) for mode in passes(a.forw))


def _conv(prog: str, command: str, a: argparse.Namespace, mode: str):
    from kiln.tasks.commands.problems import Problem, conv_problem

    dims = a.spatial_dim
    if dims not in LAYOUTS:
        raise _refuse(prog, "--spatial_dim", "cannot be mapped", "2 or 3", dims)
    if a.mode not in ("conv", str(a.forw)):  # Fusilli spells -F as --mode
        raise _refuse(prog, "-m", "cannot be mapped", "conv (a plain convolution)", a.mode)
    if dims == 2:
        given = next((f for f in THREE_D if getattr(a, f) is not None), None)
        if given:
            raise _refuse(prog, f"--{given}", "needs --spatial_dim 3", "--spatial_dim 3", dims)
    else:
        missing = next((f for f in ("in_d", "fil_d") if getattr(a, f) is None), None)
        if missing:
            raise _refuse(prog, f"--{missing}", "is needed by a 3-D convolution", "a size", "none")
    layout = _layout(prog, dims, a)
    dtype = _dtype(prog, CONV_COMMANDS[command], a.fp16, a.bf16, ())
    if a.c % a.g or a.k % a.g:
        raise _refuse(
            prog, "-g", "does not divide the channels", f"a divisor of -c {a.c} and -k {a.k}", a.g
        )
    depth = dims == 3
    three = (lambda d3, h, w: (d3, h, w)) if depth else (lambda d3, h, w: (h, w))
    kiln_args = argparse.Namespace(
        dims=dims, layout=layout, N=a.n, C=a.c, D=a.in_d or 1, H=a.h, W=a.w, K=a.k,
        T=a.fil_d or 1, R=a.y, S=a.x, groups=a.g, mode=mode, dtype=dtype,
        stride=three(a.conv_stride_d or 1, a.u, a.v),
        pad=three(a.pad_d or 0, a.p, a.q),
        dilation=three(a.dilation_d or 1, a.l, a.j),
    )  # fmt: skip
    problem = conv_problem(kiln_args)
    if not a.bias:
        return problem
    body, channels_last = problem.body, layout.endswith("c")
    bias = (a.k,) if channels_last else (a.k, *(1,) * dims)
    out_elements = problem.flops / (2.0 * (a.c // a.g) * a.y * a.x * (a.fil_d or 1))
    return Problem(
        problem.label + " +bias",
        lambda p, q, b: body(p, q) + b,
        [*problem.shapes, bias],
        problem.dtype,
        problem.flops + out_elements,
    )


def _layout(prog: str, dims: int, a: argparse.Namespace) -> str:
    """Kiln's layout name; the filter and output must be in the input's layout."""
    first, last = LAYOUTS[dims]
    in_layout = a.in_layout.upper()
    if in_layout not in (first, last):
        raise _refuse(prog, "--in_layout", "cannot be mapped", f"{first} or {last}", a.in_layout)
    for flag, value in (("--fil_layout", a.fil_layout), ("--out_layout", a.out_layout)):
        if value.upper() != in_layout:
            raise _refuse(
                prog,
                flag,
                f"differs from --in_layout {in_layout}: Kiln's conv keeps all three alike",
                in_layout,
                value,
            )
    return in_layout.lower()


def _dtype(prog: str, default: str, fp16: bool, bf16: bool, types: tuple) -> str:
    """The one dtype of the problem: the command's, --fp16/--bf16, or the --*_type flags."""
    if fp16 and bf16:
        raise _refuse(prog, "--fp16", "contradicts --bf16", "at most one of them", "both")
    chosen = "f16" if fp16 else "bf16" if bf16 else None
    for flag, value in types:
        if value is None:
            continue
        if chosen is not None and value != chosen:
            raise _refuse(
                prog, flag, "differs from the other types", f"{chosen}, as the others", value
            )
        chosen = value
    return chosen or default


def _matmul(a: argparse.Namespace):
    from kiln.tasks.commands.problems import Problem

    prog = "kiln bench problem: matmul"
    types = (("--a_type", a.a_type), ("--b_type", a.b_type), ("--out_type", a.out_type))
    types += (("--bias_type", a.bias_type),) if a.bias else ()
    dtype = _dtype(prog, "f32", a.fp16, a.bf16, types)
    batch = (a.batch,) if a.batch > 1 else ()
    lhs = (*batch, a.k, a.m) if a.transA else (*batch, a.m, a.k)
    rhs = (*batch, a.n, a.k) if a.transB else (*batch, a.k, a.n)
    trans_a, trans_b = a.transA, a.transB

    def product(p, q):
        return (p.mT if trans_a else p) @ (q.mT if trans_b else q)

    label = f"matmul {a.m}x{a.n}x{a.k}" + (f" B{a.batch}" if batch else "")
    label += " transA" * trans_a + " transB" * trans_b
    work = 2.0 * a.batch * a.m * a.n * a.k
    if a.bias:
        return Problem(
            label + " +bias",
            lambda p, q, b: product(p, q) + b,
            [lhs, rhs, (a.n,)],
            dtype,
            work + a.batch * a.m * a.n,
        )
    return Problem(label, product, [lhs, rhs], dtype, work)


def is_driver_line(name: str, rest: list[str]) -> bool:
    """``problem:NAME REST`` is a driver line: a bare ``problem:``, a quoted whole line,
    a driver's own command (matmul, convbfp16, ...) or ``conv`` with a driver's flags."""
    if name == "" or " " in name or name in COMMANDS and name != "conv":
        return True
    return name == "conv" and any(w.split("=", 1)[0] in DRIVER_ONLY for w in rest)


def line_from_argv(name: str, rest: list[str]) -> DriverLine:
    """The driver line of ``kiln bench problem:NAME REST`` (see ``is_driver_line``)."""
    words = split_line(name) if " " in name else [name] if name else []
    return parse_line([*words, *rest])
