"""The INSTRUCTIONS section read with numpy: every instruction's fields at once, no objects.

msgpack's decoder makes about sixty Python objects per instruction, and
making, walking and freeing them was most of a first prepare. Here one
cheap pass (``Unpacker.skip``, no objects) finds where each instruction
starts; then all instructions are read *in lockstep*: one numpy step reads
the next token of every instruction (its type byte, size and value from
lookup tables), so the cost is a few dozen numpy calls per field, not a
Python call per value.

An instruction is ``[id, unit, opcode, reads, writes, nbytes, latency,
deps, args, text]`` (kiln.ir.lir's ``instr_to_obj``). The ``args`` value is
walked token by token; two instructions whose args tokens agree except for
operand addresses share a template (a hash per row, each group checked
token by token against its first row, so a collision cannot merge two).
One row per template is decoded with msgpack to learn what the template
does. Any token this reader does not expect raises ``NotColumnar``.
"""

from __future__ import annotations

import msgpack
import numpy as np

from kiln.runners.sim_templates import SPACE_CODES, need, row_keys

# token classes
END, INT, STR, ARR, FLOAT, BAD = range(6)
_CLS = np.full(256, BAD, np.int8)
_WIDTH = np.zeros(256, np.int64)  # bytes after the type byte holding a value, length or count
_SIGNED = np.zeros(256, bool)
_CLS[0x00:0x80] = INT
_CLS[0xE0:0x100] = INT
_CLS[0xA0:0xC0] = STR
_CLS[0x90:0xA0] = ARR
for _b, _cls, _w, _s in (
    (0xCC, INT, 1, False), (0xCD, INT, 2, False), (0xCE, INT, 4, False), (0xCF, INT, 8, False),
    (0xD0, INT, 1, True), (0xD1, INT, 2, True), (0xD2, INT, 4, True), (0xD3, INT, 8, True),
    (0xD9, STR, 1, False), (0xDA, STR, 2, False), (0xDB, STR, 4, False),
    (0xDC, ARR, 2, False), (0xDD, ARR, 4, False), (0xCA, FLOAT, 4, False), (0xCB, FLOAT, 8, False),
):  # fmt: skip
    _CLS[_b], _WIDTH[_b], _SIGNED[_b] = _cls, _w, _s
_FIXED = np.zeros(256, np.int64)  # the value held in the type byte itself
_FIXED[0x00:0x80] = np.arange(0x80)
_FIXED[0xE0:0x100] = np.arange(-32, 0)
_FIXED[0xA0:0xC0] = np.arange(32)
_FIXED[0x90:0xA0] = np.arange(16)
MAX_STR = 16  # strings are compared by their first 16 bytes and length; longer: NotColumnar


_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], np.uint64)
_SHIFT = (np.uint64(64) - (_WIDTH * 8).astype(np.uint64)).astype(np.uint64)  # to the value
_HEADER = 1 + _WIDTH
_RARE = (_CLS == BAD) | _SIGNED | np.isin(np.arange(256), (0xCF, 0xCA))  # checked apart


class Tokens:
    """The next token at each cursor: class, size, value (int, length, count or float bits)."""

    def __init__(self, d: np.ndarray, words: np.ndarray, p: np.ndarray):
        b = d[p]
        self.cls = _CLS[b]
        # the 8 bytes after the type byte, big-endian, shifted down to the value's width
        # (by 64 for a value held in the type byte: numpy gives 0, _FIXED the value)
        value = (words[p + 1].byteswap() >> _SHIFT[b]).view(np.int64) + _FIXED[b]
        if _RARE[b].any():
            self._rare(b, value)
        self.value = value
        self.header = _HEADER[b]
        self.size = self.header + np.where(self.cls == STR, value, 0)

    def _rare(self, b: np.ndarray, value: np.ndarray) -> None:
        """Unknown types, signed ints, uint64 and float32: what most tokens are not."""
        need(not (self.cls == BAD).any(), "msgpack types the simulator reads")
        width = _WIDTH[b]
        signed = _SIGNED[b] & (width < 8)
        if signed.any():
            half = np.left_shift(1, 8 * width[signed] - 1)
            value[signed] = np.where(value[signed] >= half, value[signed] - 2 * half, value[signed])
        need(not ((b == 0xCF) & (value < 0)).any(), "ints within int64")
        four = b == 0xCA
        if four.any():  # a float32's bits, widened to a float64's
            wide = value[four].astype(np.uint32).view(np.float32).astype(np.float64)
            value[four] = wide.view(np.int64)


def text_keys(words: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """(m, 2) uint64: the first 16 bytes of each string, zero padded (its identity with length)."""
    need(not (length > MAX_STR).any(), f"strings of at most {MAX_STR} bytes")
    out = np.empty((len(start), 2), np.uint64)
    out[:, 0] = words[start] & _MASK[np.minimum(length, 8)]
    out[:, 1] = words[start + 8] & _MASK[np.clip(length - 8, 0, 8)]
    return out


class Reader:
    """Cursors into one instruction each, advanced a field at a time."""

    def __init__(self, data: bytes, starts: np.ndarray):
        self.data = data
        self.d = np.concatenate([np.frombuffer(data, np.uint8), np.zeros(MAX_STR + 9, np.uint8)])
        # words[i]: the 8 bytes from byte i as one little-endian uint64 (unaligned reads)
        self.words = np.ndarray((len(self.d) - 7,), "<u8", self.d, 0, (1,))
        self.p = starts[:-1].astype(np.int64)
        self.ends = starts[1:]
        self.strings: dict[tuple[int, int, int], str] = {}

    def token(self, rows: np.ndarray | None = None, cls: int | None = None) -> Tokens:
        p = self.p if rows is None else self.p[rows]
        t = Tokens(self.d, self.words, p)
        if cls is not None:
            need(bool((t.cls == cls).all()), "the fields of an instruction")
        t.at = p  # where each token starts
        if rows is None:
            self.p = p + t.size
        else:
            self.p[rows] = p + t.size
        return t

    def fixarray(self, rows: np.ndarray | None, size: int) -> None:
        """Step over the header of an array of ``size`` (< 16) elements at every cursor: one
        byte, as msgpack writes it (another form is for the object readers)."""
        p = self.p if rows is None else self.p[rows]
        need(bool((self.d[p] == 0x90 + size).all()), f"arrays of {size}")
        if rows is None:
            self.p += 1
        else:
            self.p[rows] += 1

    def ints(self, rows=None) -> np.ndarray:
        return self.token(rows, INT).value

    def array(self, rows=None) -> np.ndarray:
        return self.token(rows, ARR).value

    def strs(self, rows=None) -> tuple[np.ndarray, list[str]]:
        """Each string as a code, and the strings the codes stand for."""
        t = self.token(rows, STR)
        return self.codes(t.at + t.header, t.value)

    def codes(self, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, list[str]]:
        keys = text_keys(self.words, start, length)
        h = _hash_text(keys, length)
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        for column in (keys[:, 0], keys[:, 1], length):  # equal hashes, equal strings
            need(bool((column == column[first[inverse]]).all()), "no hash collision")
        names = [self.text(int(start[k]), int(length[k])) for k in first.tolist()]
        return inverse, names

    def spaces(self, rows: np.ndarray) -> np.ndarray:
        """Strings as memory spaces: SPACE_CODES, -1 for any other string."""
        t = self.token(rows, STR)
        keys = text_keys(self.words, t.at + t.header, t.value)
        code = np.full(len(rows), -1, np.int64)
        for name, number in SPACE_CODES.items():
            lo, hi = _pack(name)
            code[(keys[:, 0] == lo) & (keys[:, 1] == hi) & (t.value == len(name))] = number
        return code

    def text(self, start: int, length: int) -> str:
        return self.data[start : start + length].decode("utf-8")  # UnicodeDecodeError: rejected


def boundaries(data: bytes) -> np.ndarray:
    """Byte offsets of each instruction and of the end (n + 1), by skipping, not decoding."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    n = unpacker.read_array_header()
    skip, tell = unpacker.skip, unpacker.tell
    starts = [tell()]
    for _ in range(n):
        skip()
        starts.append(tell())
    need(starts[-1] == len(data), "nothing after the instruction list")
    return np.array(starts, dtype=np.int64)


TAIL = 32  # rows left in a lockstep read below which the rest is read row by row


SPACE, SKIP = 10, 11  # record fields besides INT: a memory space's code, a string unread


def sequence(r: Reader, count: np.ndarray, fields: tuple[int, ...]) -> list[list]:
    """Read ``count[k]`` arrays of ``fields`` per row, in lockstep: INT (values), SPACE
    (SPACE_CODES, -1 for another string) or SKIP (a string, not kept).

    Returns, per field, a list of (rows, values) in reading order. The few
    rows with many records (an instruction waiting on hundreds) are read
    with msgpack once too few rows are left for lockstep to pay.
    """
    out: list[list] = [[] for _ in fields]
    j = 0
    while (rows := np.flatnonzero(count > j)).size:
        if rows.size < TAIL:
            _tail(r, rows, count - j, fields, out)
            break
        r.fixarray(rows, len(fields))
        for f, cls in enumerate(fields):
            if cls == INT:
                out[f].append((rows, r.ints(rows)))
            elif cls == SPACE:
                out[f].append((rows, r.spaces(rows)))
            else:
                r.token(rows, STR)
        j += 1
    return out


def _tail(r: Reader, rows: np.ndarray, left: np.ndarray, fields: tuple[int, ...], out) -> None:
    """The records left in ``rows``, read with msgpack: one (rows, values) per field, a
    row repeated once per record."""
    got: list[list[int]] = [[] for _ in fields]
    owner: list[int] = []
    for k in rows.tolist():
        unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=False)
        at = int(r.p[k])
        unpacker.feed(r.data[at : int(r.ends[k])])
        for _ in range(int(left[k])):
            record = unpacker.unpack()
            need(type(record) is tuple and len(record) == len(fields), "records of fixed length")
            owner.append(k)
            for f, (cls, value) in enumerate(zip(fields, record, strict=True)):
                if cls == INT:
                    need(type(value) is int and -(1 << 63) <= value < 1 << 63, "an int64")
                    got[f].append(value)
                else:
                    need(type(value) is str, "a string")
                    got[f].append(SPACE_CODES.get(value, -1))
        r.p[k] = at + unpacker.tell()
    repeated = np.array(owner, np.int64)
    for f in range(len(fields)):
        out[f].append((repeated, np.array(got[f], np.int64)))


def _same_long_strings(long: list, same: np.ndarray, shape: tuple[int, int]) -> None:
    """Rows of one template have the same long strings (8 bytes or more) at the same steps."""
    if not long:
        return
    step, rows, lo, hi, length = (np.concatenate(x) for x in zip(*long, strict=True))
    words = np.zeros((3, *shape), np.uint64)  # first word, second word, length; 0: none
    words[:, step, rows] = lo, hi, length.astype(np.uint64)
    for w in words:  # every row against its template's first row, both ways
        need(bool((w == w[:, same]).all()), "no hash collision")


def _hash_text(keys: np.ndarray, length: np.ndarray) -> np.ndarray:
    return (keys[:, 0] * np.uint64(0x9E3779B97F4A7C15)) ^ keys[:, 1] ^ length.astype(np.uint64)


def _pack(text: str) -> tuple[int, int]:
    raw = text.encode().ljust(MAX_STR, b"\0")
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


def read_instructions(data: bytes, templates) -> dict:
    """The columns of ``Columns`` that come from the INSTRUCTIONS section; templates are
    placed into ``templates`` (a ``sim_templates.Templates``)."""
    starts = boundaries(data)
    n = len(starts) - 1
    need(n > 0, "instructions")
    r = Reader(data, starts)
    r.fixarray(None, 10)  # ten fields per instruction
    need(bool((r.ints() == np.arange(n)).all()), "dense instruction ids")
    unit, unit_names = r.strs()
    opcode, opcode_names = r.strs()
    acc = _accesses(r, n)
    r.ints()  # nbytes: an int, as instr_from_obj needs
    latency = r.ints()
    deps = sequence(r, r.array(), (INT, SKIP))
    dep_ptr, order = _runs(n, [rows for rows, _ in deps[0]])
    dep_src = np.concatenate([v for _, v in deps[0]] or [np.zeros(0, np.int64)])[order]
    args_at = r.p.copy()
    walk = _walk(r, n)
    args_end = r.p.copy()
    r.token(None, STR)  # text: a string (of any length), read by no one here
    need(bool((r.p == r.ends).all()), "ten fields per instruction, nothing after")
    _group(templates, data, starts, (args_at, args_end), opcode, opcode_names, *walk)
    return {
        "unit_names": tuple(unit_names),
        "unit": unit,
        "latency": latency,
        **acc,
        "dep_ptr": dep_ptr,
        "dep_src": dep_src,
    }


def _runs(n: int, rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, order) of values read in reading order, ``rows`` naming each one's row:
    ``values[order]`` holds each row's values, in reading order, from ``offsets[row]``."""
    owner = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    return ptr, np.argsort(owner, kind="stable")


def _accesses(r: Reader, n: int) -> dict[str, np.ndarray]:
    """Reads then writes of each instruction, as the columns of ``Columns``."""
    parts = []  # (rows, space code, addr, nbytes, is write), in reading order
    for write in (0, 1):
        spaces, addrs, sizes = sequence(r, r.array(), (SPACE, INT, INT))
        for (rows, space), (_, addr), (_, size) in zip(spaces, addrs, sizes, strict=True):
            parts.append((rows, space, addr, size, np.full(len(rows), write)))
    ptr, order = _runs(n, [p[0] for p in parts])
    out = {"acc_ptr": ptr}
    for k, name in enumerate(("acc_space", "acc_addr", "acc_end", "acc_write"), start=1):
        out[name] = np.concatenate([p[k] for p in parts] or [np.zeros(0, np.int64)])[order]
    out["acc_end"] = out["acc_addr"] + out["acc_end"]  # the sizes, until here
    out["acc_write"] = out["acc_write"].astype(bool)
    return out


def _walk(r: Reader, n: int):
    """Every token of every row's ``args`` value, step by step (END once a row is done).

    Returns (cls, value) with one row per step and one column per
    instruction, and the strings of 8 bytes or more as (step, row, first
    word, second word, length). A shorter string's value is its bytes and
    length packed in one int64 (compared like an int).
    """
    remaining = np.ones(n, np.int64)  # values still to read in each row's args
    cls, value, long = [], [], []
    while (rows := np.flatnonzero(remaining)).size:
        need(len(cls) < 512, "args of at most 512 tokens")
        every = rows.size == n  # no gather or scatter while every row still has tokens
        t = r.token(None if every else rows)
        strings = np.flatnonzero(t.cls == STR)
        if strings.size:
            length = t.value[strings]
            keys = text_keys(r.words, t.at[strings] + t.header[strings], length)
            short = length < 8
            packed = keys[:, 0] | (length.astype(np.uint64) << np.uint64(56))
            t.value[strings] = np.where(short, packed.view(np.int64), 0)
            if not short.all():
                at = np.flatnonzero(~short)
                step = np.full(len(at), len(cls))
                long.append((step, rows[strings[at]], keys[at, 0], keys[at, 1], length[at]))
        # one value read; an array adds its elements
        opened = np.where(t.cls == ARR, t.value - 1, -1)
        if every:
            remaining += opened
        else:
            remaining[rows] += opened
        if every:
            cls.append(t.cls)
            value.append(t.value)
        else:
            step_cls = np.zeros(n, np.int8)
            step_value = np.zeros(n, np.int64)
            step_cls[rows] = t.cls
            step_value[rows] = t.value
            cls.append(step_cls)
            value.append(step_value)
    return np.array(cls), np.array(value), long


_MEMORY = [_pack("sram")[0] | 4 << 56, _pack("dram")[0] | 4 << 56]  # as _walk packs them


def _group(templates, data, starts, span, opcode, opcode_names, cls, value, long) -> None:
    """Rows whose args tokens agree but for operand addresses share a template."""
    args_at, args_end = span
    # an address: an int right after the string "sram"/"dram" opening an array of 4 or 5
    address = np.zeros(cls.shape, dtype=bool)
    if len(cls) > 2:
        memory = np.array(_MEMORY, np.uint64)
        kind = (cls[1:-1] == STR) & np.isin(value[1:-1].view(np.uint64), memory)
        opens = (cls[:-2] == ARR) & ((value[:-2] == 4) | (value[:-2] == 5))
        address[2:] = kind & opens & (cls[2:] == INT)
    key_value = np.where(address, 0, value)
    h = opcode.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for t in range(len(cls)):
        mix = (cls[t].astype(np.uint64) << np.uint64(56)) ^ key_value[t].view(np.uint64)
        h = (h ^ mix) * np.uint64(0x100000001B3) + np.uint64(t + 1)
    for step, rows, lo, hi, _ in long:  # strings of 8 bytes or more
        h[rows] ^= (lo * np.uint64(0xC2B2AE3D27D4EB4F) ^ hi) + step.astype(np.uint64)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    same = first[inverse]  # every row equals its group's first row but for addresses
    for matrix in (cls, key_value):
        need(bool((matrix == matrix[:, same]).all()), "no hash collision")
    need(bool((opcode == opcode[same]).all()), "no hash collision")
    _same_long_strings(long, same, cls.shape)
    for g, row in enumerate(first.tolist()):
        args = msgpack.unpackb(data[args_at[row] : args_end[row]], raw=False, use_list=False)
        (key,), columns = row_keys(opcode_names[opcode[row]], (args,))
        at = np.flatnonzero(address[:, row])
        rows = np.flatnonzero(inverse == g)
        first_addrs = [column[0] for column in columns]
        templates.place(key, first_addrs, value[at][:, rows].T, rows, data, starts)
