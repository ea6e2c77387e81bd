"""The function a Dask worker runs: a kernel instance's stage chain, from bytes to bytes.

Kernel sources arrive by content and are imported fresh for every task, so
a long-lived worker never traces a kernel as it was before an edit. A
worker whose stage code differs from the client's refuses the task.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import tempfile
from pathlib import Path


def run_chain(payload: dict) -> dict:
    """{"outputs": [outputs per stage]} up to the first failure, or {"refused": reason}."""
    from kiln.tasks.digest import stage_module_info

    for stage in payload["stages"]:
        mine = stage_module_info(stage["module"])[0]
        if mine != stage["code"]:
            theirs = stage["code"]
            return {"refused": f"stage {stage['module']}: digest {mine}, the client {theirs}"}
    with tempfile.TemporaryDirectory(prefix="kiln-chain-") as tmp:
        work = Path(tmp)
        if "sources" in payload:
            _materialize(payload["sources"], work / "src")
        try:
            return {"outputs": _run_stages(payload, work)}
        finally:
            if "sources" in payload:
                _forget(payload["sources"], work / "src")


def _run_stages(payload: dict, work: Path) -> list[dict[str, bytes]]:
    from kiln.tasks.cached import SIDE, portable

    from kiln.options import build_options

    machine = payload["machine"]
    outputs: list[bytes] = []
    previous_module = payload.get("input_module")
    data = payload.get("input")
    graph_sha = payload.get("graph_sha256")
    for index, stage in enumerate(payload["stages"]):
        module = importlib.import_module(stage["module"])
        try:
            options = build_options(module.Options, stage["options"], stage["stage"])
            if index == 0 and "trace" in payload:
                from kiln.stages.trace import TraceRequest

                t = payload["trace"]
                ir_in = TraceRequest(
                    module=t["module"],
                    function=t["function"],
                    bindings=tuple((k, int(v)) for k, v in t["bindings"]),
                    dtypes=tuple((k, v) for k, v in t["dtypes"]),
                    default_dtype=t["default_dtype"],
                )
            else:
                path = work / f"input-{index}"
                path.write_bytes(data)
                ir_in = importlib.import_module(previous_module).read(path)
            if hasattr(module, "run_with_side_artifacts"):
                ir_out, side = module.run_with_side_artifacts(ir_in, options, machine)
            else:
                ir_out, side = module.run(ir_in, options, machine), {}
            if stage["build"] is not None and hasattr(ir_out, "with_metadata"):
                build = stage["build"]
                ir_out = ir_out.with_metadata(
                    {
                        "source": {"kernel": build["kernel"], "shapes": build["shapes"]},
                        "hashes": {
                            "source_graph_sha256": graph_sha,
                            "compiler_sha256": build["compiler"],
                        },
                    }
                )
            module.verify(ir_out, machine)
            data = module.serialize(ir_out)
        except Exception:
            # the failing stage reruns on the client and reports exactly as a local build does
            break
        if index == 0 and "trace" in payload:
            graph_sha = hashlib.sha256(data).hexdigest()
        found = {"artifact": data}
        for name, side_data in side.items():
            found[SIDE + name] = portable(side_data, str(work / "src"))
        outputs.append(found)
        previous_module = stage["module"]
    return outputs


def _materialize(sources: dict[str, bytes], root: Path) -> None:
    for rel, content in sources.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    _drop_modules(sources)


def _forget(sources: dict[str, bytes], root: Path) -> None:
    _drop_modules(sources)
    try:
        sys.path.remove(str(root))
    except ValueError:
        pass


def _drop_modules(sources: dict[str, bytes]) -> None:
    """Forget the project's modules, so the next import reads this task's sources."""
    tops = {Path(rel).parts[0].removesuffix(".py") for rel in sources}
    for name in list(sys.modules):
        if name.split(".")[0] in tops:
            del sys.modules[name]
