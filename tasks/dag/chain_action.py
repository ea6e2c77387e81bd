"""What a compile task does: its instance's chain, from the cache, a worker, or here.

One action per kernel instance. The whole chain's outputs are one cache
entry (one lookup per instance); on a miss the chain runs through the
compiler driver, which keeps every stage whose key the instance's record
still vouches for (early cutoff). Only files whose bytes changed are
written, each atomically, then the record: an unchanged artifact is never
touched, so nothing downstream reruns for it.

Errors come back to doit as ``TaskFailed`` carrying the diagnostic as JSON,
so the reporter prints it in the user's chosen format with no traceback.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from kiln.cache.session import COMPILED, session_for
from kiln.cache.store import sha256
from kiln.driver import ChainResult, StageFailed, StageRecord, records_match, run_chain
from kiln.errors import KilnError, Location, StageError, environment_error
from kiln.fsutil import remove_stale_tmp, stat_identity, write_with_identity
from kiln.logconfig import get_logger
from kiln.tasks.chain import chain_record, manifest
from kiln.tasks.chain.cached_outputs import ROOT_PLACEHOLDER, portable
from kiln.tasks.chain.instance_spec import InstanceSpec, source_digests
from kiln.tasks.chain.task_failure import failure
from kiln.tasks.execution import ahead
from kiln.tasks.execution.chain_worker import file_reader
from kiln.tasks.model.file_digests import file_stat
from kiln.tasks.model.importpath import add_project_root

RECORD_OUTPUT = "record"  # the chain entry's own output: its stages' records
FILE_PREFIX = "file/"  # the chain entry's files, by path inside the instance's out dir
SOURCE_TRIES = 3
log = get_logger("stage")


def build_instance(spec: InstanceSpec):
    """The compile action: build (or fetch) one instance; a failure comes back as TaskFailed.

    On success the task's values say where the outputs came from
    (``cache``: hit, fetched or compiled), which stages ran, their spans and
    the process that ran them: the reporter's counts and the build profile.
    """
    where = f"{spec.instance}{_bindings(spec)}"
    try:
        how, result, pid = _build(spec)
    except StageFailed as failed:
        err = failed.error
        if err.location is None:
            kernel = spec.instance.split(".")[0]
            if failed.options:
                keys = _options_key_paths(spec, failed.stage.name)
            elif failed.crash is not None:  # the stage's code, at its row
                keys = [f"stages[{_row(spec, failed.stage.name)}].module"]
            else:
                keys = [f"kernels.{kernel}"]
            if failed.options or failed.crash is not None or isinstance(err, StageError):
                err.location = _pipeline_location(spec, keys)
        if failed.crash is not None and os.environ.get("KILN_DEBUG"):
            err.hint = None
            err.notes.append("".join(traceback.format_exception(failed.crash)))
        err.notes.append(f"while running stage {failed.stage.name!r} of {where}")
        return failure(err)
    except KilnError as err:
        err.notes.append(f"while building {where}")
        return failure(err)
    except OSError as exc:  # full disk, permissions, a file where a directory belongs
        err = environment_error(exc)
        err.notes.append(f"while building {spec.instance}")
        return failure(err)
    except Exception as exc:  # a bug in a stage: say where, keep the trace out of the way
        detail = traceback.format_exc() if os.environ.get("KILN_DEBUG") else None
        return failure(
            KilnError(
                f"internal error building {spec.instance}: {type(exc).__name__}: {exc}",
                hint="set KILN_DEBUG=1 for the full traceback" if detail is None else None,
                notes=[detail] if detail else [],
            )
        )
    values = {"cache": how, "pid": pid}
    if result is not None:
        values["ran"] = list(result.ran)
        values["spans"] = [[name, start, end] for name, start, end in result.spans]
    return values


def build_chain(spec: InstanceSpec) -> str:
    """Build (or fetch) one instance outside doit; how its outputs were found.

    Raises what the chain raised (StageFailed, KilnError): a caller such as
    `kiln test --fuzz` tells a size the kernel refuses from a failure.
    """
    how, _, _ = _build(spec)
    return how


def _build(spec: InstanceSpec) -> tuple[str, ChainResult | None, int]:
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(out)  # left by a build killed mid-write
    for _ in range(SOURCE_TRIES):
        before = [file_stat(p) for p in spec.sources]
        built = _build_once(spec, out)
        if [file_stat(p) for p in spec.sources] == before:
            return built
    # still changing: a graph of no saved version must not pass as built
    raise KilnError(
        f"the kernel sources of {spec.instance} changed during each of {SOURCE_TRIES} builds",
        Location(spec.sources[0]) if spec.sources else None,
        hint="save the file, then run the build again",
    )


def _build_once(spec: InstanceSpec, out: Path) -> tuple[str, ChainResult | None, int]:
    sources = source_digests(spec)
    known = chain_record.read(str(out))
    session = session_for(spec.cache) if spec.cache is not None else None
    key = spec.chain.key(sources) if session is not None else None
    if session is not None:
        found, how = session.lookup(key)
        if found is not None and _written_from_cache(spec, out, found, sources, key):
            return how, None, os.getpid()
    result, pid = ahead.result_for(spec, sources, known)
    if result is None:
        add_project_root(spec.root)
        result = run_chain(spec.chain, sources, known=known, load=file_reader(out))
        pid = os.getpid()
    _write(spec, out, result.files, result.records)
    if session is not None and key is not None:
        _store(spec, out, session, key, result)
    return COMPILED, result, pid


def _write(
    spec: InstanceSpec,
    out: Path,
    files: dict[str, bytes],
    records: list[StageRecord],
) -> None:
    """Write the files whose bytes changed, then the record, then the manifest.

    Each is a file of its own (never a link to the store's blob): an edit
    made in place in one out dir changes nothing else.
    """
    root = spec.root.encode()
    sides = {f for r in records for f in r.files if not f.startswith("dumps/")}
    doc = manifest.read_doc(str(out))
    entries = doc.get("files", {})
    _drop_unrequested_dumps(spec, out, entries)
    made = set()
    prefix = str(out) + os.sep  # plain strings: this loop runs for every file of a build
    for rel, data in sorted(files.items()):
        target = prefix + rel
        head = os.path.dirname(target)
        if head not in made:
            manifest.real_dir(Path(head), out)  # never write through a symlink in out
            made.add(head)
        local = data.replace(ROOT_PLACEHOLDER, root)
        digest = sha256(local)
        identity = write_with_identity(target, local)  # (size, mtime, inode); None: unchanged
        changed = identity is not None
        log.info("%s: %s %s", spec.instance, "wrote" if changed else "unchanged", rel)
        if rel not in sides:  # artifacts and dumps: checked for damage at every load
            if identity is None:
                identity = stat_identity(os.stat(target))
            entries[rel] = [identity[0], identity[1], digest]
    chain_record.write(str(out), records)
    kept = [
        str(out / rel)
        for rel in spec.chain.files()
        if rel not in entries and not any(f.startswith(rel + "/") for f in entries)
    ]
    first = spec.chain.stages[0].artifact
    manifest.forget_index(spec.state_dir)
    manifest.write(str(out), entries, {first: sorted(sides)})
    if kept:  # files of kept stages that the manifest lost: hashed from disk
        manifest.record(str(out), kept)


def _written_from_cache(
    spec: InstanceSpec,
    out: Path,
    found: dict[str, bytes],
    sources: dict[str, str],
    key: str,
) -> bool:
    """Write a cached chain's files; False (nothing written) for an entry that is not one:
    not a chain's, or another chain's, or one whose files are not what its records say."""
    raw = found.get(RECORD_OUTPUT)
    records = chain_record.decode(raw) if raw is not None else {}
    names = [s.name for s in spec.chain.stages]
    if list(records) != names:
        return False
    files = {n[len(FILE_PREFIX) :]: d for n, d in found.items() if n.startswith(FILE_PREFIX)}
    wanted = {*spec.chain.files(), *(f for r in records.values() for f in r.files)}
    if not all(f in files or f in _dump_dirs(spec) for f in wanted):
        return False
    in_order = [records[n] for n in names]
    if not records_match(spec.chain, sources, in_order, files):
        _foreign(key)
        return False
    _write(spec, out, files, in_order)
    return True


def _foreign(key: str) -> None:
    """Say once per entry that the cache holds what is not this chain's build."""
    if key in _warned:
        return
    _warned.add(key)
    from kiln.logconfig import warn

    warn(
        f"cache entry for action {key} is not this chain's build (its records name other "
        "stage keys or other files); ignored, rebuilding locally"
    )


_warned: set[str] = set()


def _drop_unrequested_dumps(spec: InstanceSpec, out: Path, entries: dict) -> None:
    """Remove the dumps an earlier build wrote that pipeline.yaml no longer asks for: left
    in place (and in the manifest) they described an older kernel beside fresh dumps."""
    wanted = _dump_dirs(spec)
    for rel in [r for r in entries if r.startswith("dumps/")]:
        if rel in wanted or any(rel.startswith(d + "/") for d in wanted):
            continue
        path = out / rel
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            continue
        del entries[rel]
        manifest.prune(str(path.parent), str(out))


def _dump_dirs(spec: InstanceSpec) -> set[str]:
    return {path for s in spec.chain.stages for _, path in s.dumps}


def _store(spec: InstanceSpec, out: Path, session, key: str, result: ChainResult) -> None:
    """Put the whole chain's outputs in the cache as one entry (kept stages read back)."""
    try:
        outputs = {RECORD_OUTPUT: chain_record.encode(result.records)}
        for record, stage in zip(result.records, spec.chain.stages, strict=True):
            for rel in (stage.artifact, *record.files):
                path = out / rel
                data = result.files.get(rel)
                if data is None:
                    data = path.read_bytes()
                stored = data if rel == stage.artifact else portable(data, spec.root)
                outputs[FILE_PREFIX + rel] = stored
        session.store(key, outputs)
    except OSError as exc:  # a full or read-only cache disk costs speed, not the build
        session.store_failed(exc)


def _bindings(spec: InstanceSpec) -> str:
    """' (M=4, N=5)': the shape set's sizes, beside an error they may have caused."""
    bindings = spec.chain.trace.bindings
    return " (" + ", ".join(f"{k}={v}" for k, v in bindings) + ")" if bindings else ""


def _options_key_paths(spec: InstanceSpec, stage: str) -> list[str]:
    """Where the failing stage's options are written: the kernel's override, then the row."""
    kernel = spec.instance.split(".")[0]
    return [f"kernels.{kernel}.options.{stage}", f"stages[{_row(spec, stage)}].options"]


def _row(spec: InstanceSpec, stage: str) -> int:
    """The index in pipeline.yaml's ``stages:`` of the chain's stage named ``stage``."""
    names = [s.name for s in spec.chain.stages]
    return spec.stage_rows[names.index(stage)] if stage in names and spec.stage_rows else 0


def _pipeline_location(spec: InstanceSpec, key_paths: list[str]) -> Location | None:
    """The first of ``key_paths`` written in pipeline.yaml (the last one as a fallback)."""
    try:
        from kiln.pipeline import load_pipeline

        pipeline = load_pipeline(Path(spec.pipeline))
        for key in key_paths:
            loc = pipeline.locate(key)
            if loc.key_path == key and _written(pipeline, key):
                return loc
        return pipeline.locate(key_paths[-1])
    except Exception:
        return Location(spec.pipeline, key_path=key_paths[-1])


def _written(pipeline, key: str) -> bool:
    """Whether ``key`` itself (not only a parent) appears in the file."""
    try:
        exact = pipeline.locate(key)
        parent = pipeline.locate(key.rsplit(".", 1)[0])
        return (exact.line, exact.column) != (parent.line, parent.column)
    except Exception:
        return False
