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
import signal
import sys
import tempfile
import threading
from pathlib import Path

import msgpack

from kiln.driver import ChainResult, StageRecord, run_chain

# a worker with several threads runs one chain at a time: sys.path and
# sys.modules are the process's, and stages are pure Python (the GIL serializes them anyway)
_chain_lock = threading.Lock()
WORKER_NICENESS = 10  # a LocalCluster's workers below the build process (see dask_setup)
_sources_root: Path | None = None  # where the imported project modules' files are
_sources_digest: str | None = None
_sources_names: set[str] = set()
_sources_sent: tuple[tuple[str, bytes], ...] = ()  # the files (their very objects) last used


def run_jobs(wire: bytes) -> list[bytes]:
    """Run a batch of chains (``batch_to_wire``'s bytes), one after the other: one
    executor task for several chains of a few milliseconds each, whose scheduling
    would otherwise cost as much as they do. Their results, in order."""
    from kiln.tasks.chain.instance_spec import batch_from_wire

    return [run_chain_job(job) for job in batch_from_wire(wire)]


def run_chain_job(job) -> bytes:
    """Run one ``ChainJob``; its result as bytes (``encode_result``).

    A worker whose stage code differs from the client's refuses the chain;
    a chain that fails is answered ``failed``: its client builds it again
    locally and reports exactly as a local build does.
    """
    from kiln.tasks.model.digest import stage_module_info

    if job.sources:
        for stage in job.chain.stages:
            mine = stage_module_info(stage.module)[0]
            if mine != stage.code:
                return msgpack.packb(
                    {"refused": f"stage {stage.module}: digest {mine}, the client {stage.code}"}
                )
    with _chain_lock:
        try:
            if job.sources:
                _use_sources(job.sources)
                result = run_chain(job.chain, dict(job.digests))
            else:
                from kiln.tasks.model.importpath import add_project_root

                add_project_root(job.root)
                out = Path(job.out_dir)
                known = {r.name: r for r in job.known}
                result = run_chain(job.chain, dict(job.digests), known=known, load=file_reader(out))
        except Exception:
            return msgpack.packb({"failed": True})
    return encode_result(result)


def file_reader(out: Path):
    """load(path inside ``out``) for run_chain: the bytes the last run left, or None."""

    def load(rel: str) -> bytes | None:
        try:
            return (out / rel).read_bytes()
        except OSError:
            return None

    return load


def encode_result(result: ChainResult) -> bytes:
    return msgpack.packb(
        {
            "records": [[r.name, r.key, r.digest, list(r.files)] for r in result.records],
            "files": result.files,
            "artifacts": sorted(result.artifacts),
            "ran": result.ran,
            "spans": [list(s) for s in result.spans],
            "graph": result.graph_digest,
            "pid": os.getpid(),
        },
        use_bin_type=True,
    )


# what a process dies of when its own code crashes (the rest come from outside)
CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT}


class WorkerDied(Exception):
    """The process building a chain ended before it answered (a signal, an exit).

    Only a chain already built again alone, in a fresh process of its own
    (tasks/execution/pool.py), answers so: it fails as its instance, never
    to be built in the build process, which it would kill too.
    """

    def __init__(self, exitcode: int):
        self.exitcode = exitcode
        super().__init__(how_it_ended(exitcode))

    @property
    def hint(self) -> str:
        if self.exitcode == -signal.SIGKILL:
            return "SIGKILL comes from outside the process, most often the out-of-memory killer"
        if -self.exitcode in CRASH_SIGNALS:
            return (
                "a stage crashed the process (native code?): "
                "PYTHONFAULTHANDLER=1 prints the Python stack where it died"
            )
        if self.exitcode < 0:
            return "the signal came from outside the process, or a stage sent it"
        return "a stage ended the process (os._exit?)"


def how_it_ended(exitcode: int) -> str:
    """'died of SIGSEGV (signal 11)' or 'exited with code 7' (multiprocessing's exitcode)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"died of signal {-exitcode}"
        return f"died of {name} (signal {-exitcode})"
    return f"exited with code {exitcode} before it answered"


def encode_death(exitcode: int) -> bytes:
    """The answer for a chain whose own process died: decode_result raises WorkerDied."""
    return msgpack.packb({"died": exitcode})


def decode_result(data: bytes) -> tuple[ChainResult | None, int, str | None]:
    """(result, worker pid, refusal): result None when the chain failed or was refused.

    Raises WorkerDied for a chain that killed a process of its own (encode_death).
    """
    d = msgpack.unpackb(data, raw=False)
    if "died" in d:
        raise WorkerDied(int(d["died"]))
    if "refused" in d:
        return None, 0, d["refused"]
    if "failed" in d:
        return None, 0, None
    result = ChainResult(
        records=[StageRecord(n, k, g, tuple(f)) for n, k, g, f in d["records"]],
        files=dict(d["files"]),
        artifacts=set(d["artifacts"]),
        ran=list(d["ran"]),
        spans=[(n, a, b) for n, a, b in d["spans"]],
        graph_digest=d["graph"],
    )
    return result, int(d["pid"]), None


def pool_worker_setup() -> None:
    """A pool worker ignores Ctrl-C: the build handles it and shuts the pool down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the pool's parent


def dask_setup(worker) -> None:
    """Dask's preload hook, in the worker processes of a LocalCluster Kiln starts.

    Ctrl-C reaches every process of the terminal's group: the build handles
    it (cancels, closes the cluster, says `kiln: interrupted`) and a worker
    must neither print a KeyboardInterrupt traceback nor die mid-task.

    The workers yield the CPU to the build process: it feeds them and writes
    everything they return, so when the three share too few cores it is
    the one the build waits on, and a worker ahead of it only adds to its backlog.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(WORKER_NICENESS)
    except OSError:  # not allowed here: the workers run at the build's priority
        pass


def _use_sources(files: tuple[tuple[str, bytes], ...]) -> Path:
    """The directory holding exactly ``files``, first on sys.path, its modules importable."""
    global _sources_root, _sources_digest, _sources_names, _sources_sent
    if _sources_root is not None and _same_objects(files, _sources_sent):
        return _sources_root  # the jobs of one batch share the bytes: no need to hash them
    sources = dict(files)
    digest = hashlib.sha256()
    for rel in sorted(sources):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(sources[rel]).digest())
    wanted = digest.hexdigest()
    _sources_sent = files
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


def _same_objects(files, sent) -> bool:
    return len(files) == len(sent) and all(
        a[0] == b[0] and a[1] is b[1] for a, b in zip(files, sent, strict=True)
    )


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


def _drop_modules(tops: set[str]) -> None:
    """Forget the project's modules, so the next import reads the current sources."""
    for name in list(sys.modules):
        if name.split(".")[0] in tops:
            del sys.modules[name]
