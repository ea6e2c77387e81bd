"""Test-only stage: the visa stage with one deliberate mistake in its output.

Named in a temporary project's ``stages:`` table in place of
``kiln.stages.visa``, it proves that ``kiln test`` catches a wrong lowering
without any test switch in product code::

    - {name: visa, module: tests.support.bad_stage, options: {corrupt: add-to-sub}}

``corrupt`` says what goes wrong: ``add-to-sub`` turns the first ``add``
into a ``sub``; ``perturb-const`` adds ``delta`` to the first float
immediate. A program with nothing to corrupt is returned unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kiln.errors import StageError
from kiln.ir import visa
from kiln.ir.visa import Imm
from kiln.stages import visa as good

NAME = "visa"
ARTIFACT = "kernel.visa"  # a literal: the task layer reads it without importing
MODES = ("add-to-sub", "perturb-const")


@dataclass(frozen=True)
class Options:
    fusion: bool = True
    corrupt: str = "add-to-sub"
    delta: float = 1e-3


def run(graph, options: Options, machine: dict) -> visa.Program:
    if options.corrupt not in MODES:
        raise StageError(f"corrupt must be one of {', '.join(MODES)}, not {options.corrupt!r}")
    program = good.run(graph, good.Options(fusion=options.fusion), machine)
    instrs = list(program.instrs)
    for k, ins in enumerate(instrs):
        wrong = _corrupt(ins, options)
        if wrong is not None:
            instrs[k] = wrong
            break
    return dataclasses.replace(program, instrs=tuple(instrs))


def _corrupt(ins: visa.Instr, options: Options) -> visa.Instr | None:
    if options.corrupt == "add-to-sub":
        return dataclasses.replace(ins, op="sub") if ins.op == "add" else None
    for j, src in enumerate(ins.srcs):
        if isinstance(src, Imm) and src.dtype in visa.FLOAT_DTYPES:
            srcs = list(ins.srcs)
            srcs[j] = Imm(float(src.value) + options.delta, src.dtype)
            return dataclasses.replace(ins, srcs=tuple(srcs))
    return None


serialize = good.serialize
read = good.read
verify = good.verify
DUMPS = good.DUMPS
