"""One cause, one message: failures that share a cause, grouped with what they hit.

A machine whose SRAM holds no tile fails every instance built for it; an
import error in a kernel module fails every kernel of the module. Printed
per instance, one cause reads as a hundred errors. Here a failure's *cause
key* is its diagnostic with what names the instance taken out (the instance
and kernel names, the "while running stage ... of INSTANCE" note, the line of
the kernel's own pipeline.yaml entry), or the error's own ``cause`` where it
declared one; failures with one key are one error, printed once, with the
count of instances it hit and a few of their names (all with ``-v``).

Pure functions over names and diagnostics: the reporter, `kiln test` and
`kiln bench` do the printing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

SHOWN = 4  # names listed before "and N more" (all of them with -v)
STAGE_NOTE = re.compile(r"^(while (?:running stage '[^']*'|building))(?= |$).*$", re.S)


def instance_of(task: str) -> str:
    """``compile:gemm.small`` -> ``gemm.small``; ``test:gemm.small@sim`` -> ``gemm.small``."""
    _, colon, rest = task.partition(":")
    return (rest if colon else task).split("@", 1)[0]


def cause_key(task: str, diag: dict | str | None) -> str:
    """What failures of different instances compare equal on when they share one cause."""
    if isinstance(diag, dict) and diag.get("cause"):
        return "cause:" + str(diag["cause"])
    inst = instance_of(task)
    kernel = inst.split(".", 1)[0]
    names = [n for n in dict.fromkeys((inst, kernel)) if n]

    def plain(text):
        if not isinstance(text, str):
            return text
        for name, mark in zip(names, ("<instance>", "<kernel>"), strict=False):
            text = re.sub(rf"(?<!\w){re.escape(name)}(?![\w])", mark, text)
        return text

    if not isinstance(diag, dict):
        return "text:" + plain(str(diag or ""))
    key = {k: plain(v) for k, v in diag.items() if k not in ("notes", "task")}
    key["notes"] = [STAGE_NOTE.sub(r"\1", plain(str(n))) for n in diag.get("notes") or ()]
    path = key.get("key_path") or ""
    if path == "kernels.<kernel>" or path.startswith("kernels.<kernel>."):
        for field in ("line", "column", "source"):  # each kernel's own entry: its own line
            key.pop(field, None)
    return json.dumps(key, sort_keys=True, default=str)


def group_failures(
    failures: Iterable[tuple[str, dict | str | None]],
) -> list[tuple[dict | str | None, list[str]]]:
    """(first diagnostic, every task with its cause) per cause, in the order first met."""
    groups: dict[str, tuple[dict | str | None, list[str]]] = {}
    for task, diag in failures:
        groups.setdefault(cause_key(task, diag), (diag, []))[1].append(task)
    return list(groups.values())


def affected(names: list[str], verbose: bool = False, noun: str = "instances") -> str:
    """``5 instances: a, b, c, d and 1 more (-v lists them all)``; every name with -v."""
    names = list(dict.fromkeys(names))
    head = f"{len(names)} {noun if len(names) != 1 else noun.removesuffix('s')}: "
    if verbose or len(names) <= SHOWN + 1:
        return head + ", ".join(names)
    shown = ", ".join(names[:SHOWN])
    return head + f"{shown} and {len(names) - SHOWN} more (-v lists them all)"
