"""vISA: a tiled program over virtual tile buffers (the visa stage's IR).

A program names the kernel's DRAM tensors (arguments, results, scratch
intermediates), declares tile buffers (virtual SRAM regions with a dtype and
a capacity shape) and lists instructions in execution order, loops unrolled.
Operands: a tile (a buffer seen with a shape: a row-major prefix of the
buffer), a view (a strided window of a DRAM tensor, in elements) or an
immediate scalar. The text form (``print_program``/``parse``) round-trips
exactly and is meant to be read and hand-edited.
"""

# The records, the text form and the verifier live in their own modules;
# this module is their one public face.
from kiln.ir.visa_records import (  # noqa: F401
    DTYPES,
    FLOAT_DTYPES,
    ITEMSIZE,
    OPS,
    ROLES,
    VISA_VERSION,
    Buffer,
    DramTensor,
    Imm,
    Instr,
    Operand,
    OpSpec,
    Program,
    Tile,
    View,
    acc_dtype,
)
from kiln.ir.visa_text import (  # noqa: F401
    VisaParseError,
    format_imm,
    format_instr,
    format_operand,
    instr_lines,
    parse,
    print_program,
)
from kiln.ir.visa_verify import VisaError, verify  # noqa: F401
