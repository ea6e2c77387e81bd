"""The key a tuning record is matched on, minus the graph digest (known only after trace).

Shared by the compile tasks (which apply records) and `kiln tune` (which
writes them), so both always agree on what a record is for.
"""

from __future__ import annotations

from kiln.tasks.model.digest import digest_json, stage_module_info
from kiln.tasks.model.project import KernelInstance, Project
from kiln.tune.apply import TUNED_STAGES


class TuningKeys:
    """Key parts per instance, with the per-kernel and per-stage parts computed once."""

    def __init__(self, project: Project):
        self.project = project
        stages = [s for s in project.pipeline.stages if s.name in TUNED_STAGES]
        self.stage_names = [s.name for s in stages]
        self.compiler = digest_json([[s.name, stage_module_info(s.module)[0]] for s in stages])
        self._kernel: dict[str, dict[str, str]] = {}

    def parts(self, inst: KernelInstance) -> dict[str, str]:
        """instance, shape_set, dtype, machine, options and compiler of ``inst``'s record key."""
        kernel = self._kernel.get(inst.kernel)
        if kernel is None:
            pipeline = self.project.pipeline
            dtype, dtypes = self.project.trace_dtypes(inst.kernel)
            options = {s: pipeline.stage_options(inst.kernel, s) for s in self.stage_names}
            kernel = {
                "dtype": dtype if not dtypes else f"{dtype}+{digest_json(sorted(dtypes.items()))}",
                "machine": digest_json(self.project.kernel_machine(inst.kernel)),
                "options": digest_json(options),
                "compiler": self.compiler,
            }
            self._kernel[inst.kernel] = kernel
        return {"instance": inst.name, "shape_set": inst.shape_set, **kernel}
