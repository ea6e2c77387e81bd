"""Dependencies for the lir stage: byte ranges read and written -> RAW/WAR/WAW edges.

An interval map per memory space holds, for each byte segment, its last
writer and the readers since that write. ``DepTracker.add`` takes one
instruction at a time, so the lowering computes dependencies in the same
pass that binds units and addresses (there used to be a second pass over
all instructions, with every access kept alive in between).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from kiln.ir.lir import Access, Dep

Span = tuple[str, int, int]  # (space, addr, nbytes): an access as plain values


class _IntervalMap:
    """Byte segments of one memory space -> (last writer, readers since that write).

    ``read`` and ``write`` may report the instruction itself as a source; the
    caller drops it (one test per instruction instead of one per segment).
    """

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.state: list[tuple[int | None, list[int]]] = [(None, [])]

    def _split(self, x: int) -> int:
        starts = self.starts
        i = bisect_right(starts, x) - 1
        if starts[i] != x:
            writer, readers = self.state[i]
            i += 1
            starts.insert(i, x)
            self.state.insert(i, (writer, readers[:]))
        return i

    def read(self, lo_addr: int, hi_addr: int, me: int, raw: set[int]) -> None:
        lo = self._split(lo_addr)
        hi = self._split(hi_addr)
        for writer, readers in self.state[lo:hi]:
            if writer is not None:
                raw.add(writer)
            readers.append(me)

    def write(self, lo_addr: int, hi_addr: int, me: int, waw: set[int], war: set[int]) -> None:
        lo = self._split(lo_addr)
        hi = self._split(hi_addr)
        state = self.state
        for writer, readers in state[lo:hi]:
            if writer is not None:
                waw.add(writer)
            war.update(readers)
        if hi - lo > 1:
            del self.starts[lo + 1 : hi]
            del state[lo + 1 : hi]
        state[lo] = (me, [])


class Ranges:
    """Merged byte ranges per memory space, for "does anything ever write here?"."""

    def __init__(self, ranges: dict[str, list[tuple[int, int]]]):
        self.starts: dict[str, list[int]] = {}
        self.ends: dict[str, list[int]] = {}
        for space, spans in ranges.items():
            merged: list[list[int]] = []
            for lo, hi in sorted(spans):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self.starts[space] = [lo for lo, _ in merged]
            self.ends[space] = [hi for _, hi in merged]

    def overlaps(self, space: str, addr: int, end: int) -> bool:
        starts = self.starts.get(space)
        if not starts:
            return False
        i = bisect_right(starts, end - 1) - 1
        return i >= 0 and self.ends[space][i] > addr


class DepTracker:
    """Dependencies of each instruction in program order, given every write up front.

    ``written`` holds the ranges the program ever writes in the spaces where
    reads may skip the map: a read of a range nothing writes (a kernel input)
    can have no dependency, and skipping it keeps wide strided input spans
    out of the interval map. Spaces not in ``checked`` always go through the
    map (the result is the same; it only costs a lookup).
    """

    def __init__(self, written: Ranges, checked: Iterable[str]) -> None:
        self.maps: dict[str, _IntervalMap] = {}
        self.written = written
        self.checked = frozenset(checked)
        self.me = 0

    def add(self, reads: Iterable[Span], writes: Iterable[Span]) -> list[tuple[int, str]]:
        """(source, kind) per source, sorted by source; raw > waw > war for one source."""
        me = self.me
        self.me += 1
        raw: set[int] = set()
        waw: set[int] = set()
        war: set[int] = set()
        maps = self.maps
        for space, addr, nbytes in reads:
            if nbytes > 0:
                end = addr + nbytes
                if space in self.checked and not self.written.overlaps(space, addr, end):
                    continue
                m = maps.get(space)
                if m is None:
                    m = maps[space] = _IntervalMap()
                m.read(addr, end, me, raw)
        for space, addr, nbytes in writes:
            if nbytes > 0:
                m = maps.get(space)
                if m is None:
                    m = maps[space] = _IntervalMap()
                m.write(addr, addr + nbytes, me, waw, war)
        if not (waw or war):
            raw.discard(me)
            return [(src, "raw") for src in sorted(raw)]
        kinds = dict.fromkeys(war, "war")
        kinds.update(dict.fromkeys(waw, "waw"))
        kinds.update(dict.fromkeys(raw, "raw"))
        kinds.pop(me, None)
        return sorted(kinds.items())


def compute_deps(
    accesses: list[tuple[tuple[Access, ...], tuple[Access, ...]]],
) -> list[tuple[Dep, ...]]:
    """Per instruction (reads, writes): its deps, one per source (raw > waw > war), by source."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for _, writes in accesses:
        for w in writes:
            if w.nbytes > 0:
                spans.setdefault(w.space, []).append((w.addr, w.end))
    tracker = DepTracker(Ranges(spans), {a.space for r, w in accesses for a in (*r, *w)})
    return [
        tuple(
            Dep(src, kind)
            for src, kind in tracker.add(
                [(a.space, a.addr, a.nbytes) for a in reads],
                [(a.space, a.addr, a.nbytes) for a in writes],
            )
        )
        for reads, writes in accesses
    ]
