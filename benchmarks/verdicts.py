"""Targets met or missed: one vocabulary and one exit status for every benchmark script.

A script judges each figure with ``Targets.judge`` (which prints nothing and
returns the word to print: ``met``, ``MISSED`` or ``not judged``), ends its
output with ``Targets.summary()`` (``targets: N met, M missed``) and exits
with ``Targets.exit_code()``: 1 when any target was missed, so that CI sees a
miss, 0 otherwise. A benchmark that cannot measure at all exits 2
(``abort``), so "slow" and "broken" never look the same.
"""

from __future__ import annotations

import sys


class Targets:
    """The verdicts of one benchmark run."""

    def __init__(self, judged: bool = True):
        self.judged = judged  # False: print the figures, judge nothing (--quick smoke runs)
        self.met: list[str] = []
        self.missed: list[str] = []
        self.not_judged: list[str] = []

    def judge(self, label: str, ok: bool | None) -> str:
        """Record one target; ``ok`` None means the figure could not be judged."""
        if ok is None or not self.judged:
            self.not_judged.append(label)
            return "not judged"
        (self.met if ok else self.missed).append(label)
        return "met" if ok else "MISSED"

    def summary(self) -> str:
        line = f"targets: {len(self.met)} met, {len(self.missed)} missed"
        if self.not_judged:
            line += f", {len(self.not_judged)} not judged"
        if self.missed:
            line += " (missed: " + "; ".join(self.missed) + ")"
        return line

    def exit_code(self) -> int:
        return 1 if self.missed else 0

    def finish(self) -> int:
        """Print the summary line and return the exit status."""
        print(self.summary(), flush=True)
        return self.exit_code()


def abort(message: str) -> None:
    """Stop a benchmark that could not measure (exit 2, not 1: nothing was judged)."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(2)
