"""Which stages of each instance's chain the last build ran: the build profile's spans.

A compile task runs its instance's whole chain; early cutoff inside the
chain keeps a stage whose key is unchanged. The profile (``.kiln/profile.json``)
records, for every compile task that ran, the spans of the stages that ran.
"""

from __future__ import annotations

import json
from pathlib import Path


def stages_ran(project: Path) -> dict[str, list[str]]:
    """Compile task name -> the stages its chain ran in the last build, in order."""
    doc = json.loads((project / ".kiln" / "profile.json").read_text())
    return {
        r["task"]: [span[0] for span in r.get("stages", [])]
        for r in doc["tasks"]
        if r["outcome"] == "ran" and r["task"].startswith("compile:")
    }
