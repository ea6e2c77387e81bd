"""JUnit XML for CI systems: one testcase per kernel instance and target.

A vacuous-check warning (kiln.compare.vacuity) is a ``kiln.warning``
property of its testcase and a line of its ``system-err``; under
``--strict`` the testcase is a ``failure`` saying so. A check of
`kiln test --fuzz` carries its binding, seed and pipeline.yaml line as
``kiln.fuzz.*`` properties.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path


def write_junit(path: Path, reports: list[dict]) -> None:
    from kiln.fsutil import write_bytes_atomic
    from kiln.outpaths import write_output

    suite = ET.Element("testsuite", name="kiln", tests=str(len(reports)))
    counts = {"fail": 0, "error": 0, "skipped": 0}
    for r in reports:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"kiln.{r['target']}",
            name=r["kernel"],
            time=f"{r.get('seconds', 0.0):.6f}",
        )
        status = r["status"]
        warnings = list(r.get("warnings", ()))
        fuzz = r.get("fuzz") or {}
        if warnings or fuzz:  # first in a testcase, as JUnit's schema orders it
            properties = ET.SubElement(case, "properties")
            for warning in warnings:
                ET.SubElement(properties, "property", name="kiln.warning", value=warning)
            for key in ("binding", "seed", "snippet"):  # `kiln test --fuzz`: how to reproduce
                if key in fuzz:
                    value = fuzz[key]
                    text = (
                        ", ".join(f"{d}={v}" for d, v in value.items())
                        if key == "binding"
                        else str(value)
                    )
                    ET.SubElement(properties, "property", name=f"kiln.fuzz.{key}", value=text)
        if status == "fail" and r.get("strict"):  # --strict: the check was vacuous
            counts["fail"] += 1
            message = "vacuous check (--strict): the oracle's output checks little"
            ET.SubElement(case, "failure", message=message).text = "\n".join(warnings)
        elif status == "fail":
            counts["fail"] += 1
            wrong = [c for c in r["outputs"] if not c["ok"]]
            text = "\n".join(c.get("text") or c.get("problem") or "" for c in wrong)
            # a wrong number of outputs is what failed, whatever the outputs there hold
            count = [c["problem"] for c in wrong if c.get("output") == -1 and c.get("problem")]
            message = (
                f"the target returned {count[0]}" if count else "output differs from the cpu oracle"
            )
            ET.SubElement(case, "failure", message=message).text = text
        elif status == "error":
            counts["error"] += 1
            message = (
                "kernel failed to build" if r.get("stage") == "compile" else "target failed to run"
            )
            ET.SubElement(case, "error", message=message).text = r["message"]
        elif status == "skipped":
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=r["reason"])
        if warnings:  # CI systems show a case's stderr beside the verdict
            ET.SubElement(case, "system-err").text = "\n".join(f"warning: {w}" for w in warnings)
    suite.set("failures", str(counts["fail"]))
    suite.set("errors", str(counts["error"]))
    suite.set("skipped", str(counts["skipped"]))
    data = ET.tostring(suite, encoding="utf-8", xml_declaration=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, lambda p: write_bytes_atomic(p, data))
