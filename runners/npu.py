"""The npu target: real hardware, reached only through a runner plugin.

Kiln ships no driver. A vendor package registers a runner in the
``kiln.runners`` entry-point group under the name ``npu`` (or another name
a target's ``runner:`` names); without one, this runner explains what is
missing instead of failing obscurely.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from kiln.errors import TargetError
from kiln.runners.base import KernelArtifacts, Runner


def _plugin():
    for ep in entry_points(group="kiln.runners"):
        if ep.name == "npu" and not ep.value.startswith("kiln.runners.npu:"):
            return ep
    return None


class NpuRunner(Runner):
    kind = "npu"

    def unavailable(self) -> str | None:
        if _plugin() is None:
            return (
                "no hardware runner plugin is installed (entry-point group 'kiln.runners', "
                "name 'npu'); run on the simulator instead: --target sim"
            )
        return None

    def _delegate(self):
        ep = _plugin()
        if ep is None:
            raise TargetError(
                "the npu target needs a hardware runner plugin, and none is installed",
                expected="a package that registers an 'npu' runner in the 'kiln.runners' "
                "entry-point group",
                found="only Kiln's built-in runners: cpu, sim, iree",
                hint="run on the instruction-level simulator instead: --target sim",
            )
        return ep.load()(options=self.options, machine=self.machine)

    def prepare(self, artifacts: KernelArtifacts):
        runner = self._delegate()
        return runner, runner.prepare(artifacts)

    def run(self, prepared, inputs):
        runner, inner = prepared
        return runner.run(inner, inputs)
