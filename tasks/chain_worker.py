"""The function a Dask worker runs: a kernel instance's stage chain, from bytes to bytes.

Kernel sources arrive by content. A worker keeps the project's modules
imported only while the tasks it runs carry the very same sources (one
digest over every file): a task with other bytes forgets them and imports
its own from a directory named by their digest, so a long-lived worker never
traces a kernel as it was before an edit, yet the instances of one build do
not re-import (and re-compile) the kernel modules for every task. A worker
whose stage code differs from the client's refuses the task.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

# a worker with several threads runs one chain at a time: sys.path and
# sys.modules are the process's, and stages are pure Python (the GIL serializes them anyway)
_chain_lock = threading.Lock()
WORKER_NICENESS = 10  # a LocalCluster's workers below the build process (see dask_setup)
_sources_root: Path | None = None  # where the imported project modules' files are
_sources_digest: str | None = None
_sources_names: set[str] = set()


def run_chain(payload: dict) -> dict:
    """{"outputs": [outputs per stage]} up to the first failure, or {"refused": reason}."""
    from kiln.tasks.digest import stage_module_info

    for stage in payload["stages"]:
        mine = stage_module_info(stage["module"])[0]
        if mine != stage["code"]:
            theirs = stage["code"]
            return {"refused": f"stage {stage['module']}: digest {mine}, the client {theirs}"}
    with _chain_lock:
        root = _use_sources(payload["sources"]) if "sources" in payload else None
        return {"outputs": _run_stages(payload, _work_dir(), root)}


def run_chains(batch: dict) -> list[dict]:
    """``run_chain`` for each chain of a batch, in order; one result per chain.

    A batch names each distinct source tree once (``sources``) and its
    chains point at theirs by index (``sources_index``): the instances of
    one kernel file share the bytes instead of carrying a copy each.
    """
    from kiln.tasks.workers import make_full_collections_rare

    make_full_collections_rare()  # a long-lived Dask worker: see tasks/workers.py
    results = []
    for payload in batch["chains"]:
        index = payload.get("sources_index")
        if index is not None:
            payload = {**payload, "sources": batch["sources"][index]}
        try:
            results.append(run_chain(payload))
        except Exception:
            # this chain alone is not built here: its client reruns it locally and
            # reports exactly as a local build does; the rest of the batch goes on
            results.append({"outputs": []})
    return results


def dask_setup(worker) -> None:
    """Dask's preload hook, in the worker processes of a LocalCluster Kiln starts.

    Ctrl-C reaches every process of the terminal's group: the build handles
    it (cancels, closes the cluster, says `kiln: interrupted`) and a worker
    must neither print a KeyboardInterrupt traceback nor die mid-task.

    The workers yield the CPU to the build process: it feeds them and writes
    everything they return, so when the three share too few cores it is
    the one the build waits on, and a worker ahead of it only adds to its backlog.
    """
    import signal

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # not allowed here: the workers run at the build's priority
        pass


def warm_up(modules: list[str]) -> None:
    """Import the stage modules (and numpy with them) before the first task needs them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the task that needs it reports the failure
            pass


def _run_stages(payload: dict, work: Path, root: Path | None) -> list[dict[str, bytes]]:
    from kiln.tasks.cached_outputs import SIDE, portable

    from kiln.options import build_options

    machine = payload["machine"]
    outputs: list[bytes] = []
    previous_module = payload.get("input_module")
    data = payload.get("input")
    handed_on = None  # the previous stage's IR, when it may skip its bytes (EXACT_ROUND_TRIP)
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
            elif handed_on is not None:
                # decoding what the stage before just serialized was a quarter of a chain
                ir_in = handed_on
            else:
                ir_in = _take_input(importlib.import_module(previous_module), data, work, index)
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
            handed_on = ir_out if getattr(module, "EXACT_ROUND_TRIP", False) is True else None
        except Exception:
            # the failing stage reruns on the client and reports exactly as a local build does
            break
        if index == 0 and "trace" in payload:
            graph_sha = hashlib.sha256(data).hexdigest()
        found = {"artifact": data}
        for name, side_data in side.items():
            found[SIDE + name] = portable(side_data, str(root or work))
        outputs.append(found)
        previous_module = stage["module"]
    return outputs


def _take_input(module, data: bytes, work: Path, index: int):
    """The previous stage's IR from its output bytes: ``decode`` where the stage has one.

    Written to a file and read back otherwise (``read`` is the protocol every
    stage has); on a disk that discards freed blocks that write was a third
    of a worker's time on a chain.
    """
    decode = getattr(module, "decode", None)
    if decode is not None:
        return decode(data)
    path = work / f"input-{index}"
    path.write_bytes(data)
    return module.read(path)


def _use_sources(sources: dict[str, bytes]) -> Path:
    """The directory holding exactly ``sources``, first on sys.path, its modules importable."""
    global _sources_root, _sources_digest, _sources_names
    digest = hashlib.sha256()
    for rel in sorted(sources):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(sources[rel]).digest())
    wanted = digest.hexdigest()
    if wanted == _sources_digest and _sources_root is not None:
        return _sources_root
    _forget_sources()
    root = _scratch() / wanted[:16]
    for rel, content in sources.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    _sources_names = {Path(rel).parts[0].removesuffix(".py") for rel in sources}
    _drop_modules(_sources_names)  # a project module the worker imported some other way
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    _sources_root, _sources_digest = root, wanted
    return root


def _forget_sources() -> None:
    global _sources_root, _sources_digest
    if _sources_root is None:
        return
    _drop_modules(_sources_names)
    try:
        sys.path.remove(str(_sources_root))
    except ValueError:
        pass
    shutil.rmtree(_sources_root, ignore_errors=True)
    _sources_root = _sources_digest = None


_scratch_dir: Path | None = None


def _scratch() -> Path:
    """This process's directory for source trees, removed when it exits."""
    global _scratch_dir
    if _scratch_dir is None:
        _scratch_dir = Path(tempfile.mkdtemp(prefix="kiln-sources-"))
        atexit.register(shutil.rmtree, _scratch_dir, True)
    return _scratch_dir


def _work_dir() -> Path:
    """Where a chain's stages read their inputs from: one per process, files overwritten.

    A fresh temporary directory per chain, made and deleted again, was an
    eighth of a worker's time on a chain.
    """
    work = _scratch() / "chain"
    work.mkdir(exist_ok=True)
    return work


def _drop_modules(tops: set[str]) -> None:
    """Forget the project's modules, so the next import reads the current sources."""
    for name in list(sys.modules):
        if name.split(".")[0] in tops:
            del sys.modules[name]
