"""A misbehaving runner plugin, installed for one test as a package would be.

Its target runs the kernel's own Python (as right as the oracle), then, by
its ``mode`` option, adds 1 to the last output, drops the last output or
raises. The dist-info on PYTHONPATH registers it in the `kiln.runners` group.
"""

from __future__ import annotations

from pathlib import Path

PLUGIN = """
import numpy as np

from kiln.runners.base import Runner, RunResult


class Board(Runner):
    kind = "board"

    def prepare(self, artifacts):
        return artifacts.function

    def run(self, prepared, inputs):
        out = prepared.eager(*inputs)
        outs = [np.array(o) for o in (out if isinstance(out, tuple) else (out,))]
        mode = self.options.get("mode")
        if mode == "off_by_one":
            outs[-1] = outs[-1] + 1
        elif mode == "drop_output":
            outs = outs[:-1]
        elif mode == "crash":
            raise RuntimeError("device fell over")
        return RunResult(outs, {})
"""

# a target per mode; `board` is right
TARGETS = (
    "  board: {runner: bad.board}\n"
    "  off: {runner: bad.board, options: {mode: off_by_one}}\n"
    "  drop: {runner: bad.board, options: {mode: drop_output}}\n"
    "  crash: {runner: bad.board, options: {mode: crash}}\n"
)

TOP1 = (
    "# ruff: noqa: F821\n"
    "import kiln\n"
    "from kiln import Tensor, device\n\n\n"
    "@device\n"
    'def top1(x: Tensor["B", "C"]):\n'
    "    return x.max(axis=-1), kiln.argmax(x, axis=-1)\n"
)


def install_plugin(site: Path, name: str = "bad.board") -> dict:
    """The plugin in ``site``, registered as ``name`` in the `kiln.runners` group, as a
    package installs one (a dist-info with its entry point); the env to run in."""
    dist = site / "badrunner-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: badrunner\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[kiln.runners]\n{name} = bad_board:Board\n")
    (site / "bad_board.py").write_text(PLUGIN)
    return {"PYTHONPATH": str(site)}


def install_board(project: Path, site: Path) -> dict:
    """The plugin in ``site``, its targets in the project's pipeline.yaml; the env to run in."""
    env = install_plugin(site)
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("targets:\n", "targets:\n" + TARGETS, 1))
    return env


def add_top1(project: Path, entry: str) -> None:
    """The kernel ``top1`` (a max and an argmax of each row), declared by ``entry``'s lines."""
    (project / "kernels" / "top1.py").write_text(TOP1)
    pipeline = project / "pipeline.yaml"
    text = pipeline.read_text().replace("kernels:\n", f"kernels:\n  top1:\n{entry}", 1)
    pipeline.write_text(text)
