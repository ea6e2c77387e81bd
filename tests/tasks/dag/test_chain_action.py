"""tasks/dag/chain_action.py and tasks/execution/ahead.py: one task per instance, early cutoff
inside it."""

from __future__ import annotations

import json
import os

from tests.conftest import run_kiln
from tests.tasks.artifacts import clean_build, snapshot

NO_CACHE = {"KILN_CACHE": "0"}
INSTANCE = "build/kiln/kernel/softmax/small"


def mtimes(project) -> dict[str, int]:
    base = project / INSTANCE
    # the record itself changes (the trace's key has the source's digest): not an artifact
    return {p.name: p.stat().st_mtime_ns for p in base.iterdir() if p.name != ".kiln-chain.json"}


def test_a_comment_edit_stops_after_the_trace_and_touches_no_file(project):
    run_kiln(project, "compile", env=NO_CACHE, check=True)
    before = mtimes(project)
    src = project / "kernels" / "normalization.py"
    src.write_text(src.read_text() + "\n# a comment\n")
    proc = run_kiln(project, "compile", "-v", env=NO_CACHE, check=True)
    assert ". compile:softmax.small" in proc.stdout
    assert mtimes(project) == before  # the graph came out the same: nothing rewritten


def test_an_artifact_the_record_does_not_vouch_for_is_rebuilt(project):
    """A build killed between writing an artifact and the record leaves exactly this."""
    expected = clean_build(project)
    run_kiln(project, "compile", env=NO_CACHE, check=True)
    visa = project / INSTANCE / "kernel.visa"
    visa.write_bytes(b"written by a build killed before its record\n")
    (project / INSTANCE / "kernel.edf").unlink()  # the task is stale: doit runs it
    record = json.loads((project / INSTANCE / ".kiln-chain.json").read_bytes())
    proc = run_kiln(project, "compile", env=NO_CACHE, check=True)
    assert "compile:softmax.small" in proc.stdout
    assert snapshot(project) == expected
    after = json.loads((project / INSTANCE / ".kiln-chain.json").read_bytes())
    assert after == record


def test_a_whole_chain_is_one_cache_entry_fetched_by_a_clean_clone(project, tmp_path):
    env = {"KILN_CACHE_DIR": str(tmp_path / "shared")}
    run_kiln(project, "compile", env=env, check=True)
    built = snapshot(project)
    for made in ("build", ".kiln"):
        import shutil

        shutil.rmtree(project / made)
    proc = run_kiln(project, "compile", env=env, check=True)
    assert "(4 fetched, 0 compiled)" in proc.stdout
    assert snapshot(project) == built


def test_an_entry_filed_under_another_chains_key_is_never_used(project, tmp_path):
    """Two entries swapped in the store: each is found by a key that is not its own
    chain's; both are reported, built here, and the build's bytes are a clean build's."""
    import shutil

    env = {"KILN_CACHE_DIR": str(tmp_path / "shared")}
    run_kiln(project, "compile", env=env, check=True)
    built = snapshot(project)
    first, second = sorted((tmp_path / "shared" / "store" / "ac").glob("*/*.json"))[:2]
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    for made in ("build", ".kiln"):
        shutil.rmtree(project / made)
    proc = run_kiln(project, "compile", env=env, check=True)
    assert "(2 fetched, 2 compiled)" in proc.stdout, proc.stdout
    assert proc.stderr.count("is not this chain's build") == 2, proc.stderr
    assert first.stem in proc.stderr and second.stem in proc.stderr
    assert snapshot(project) == built


def test_dumps_are_outputs_a_clean_clone_fetches(project, tmp_path):
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(
        pipeline.read_text() + "dumps:\n  - {kernels: [softmax], kinds: [summary, visa]}\n"
    )
    env = {"KILN_CACHE_DIR": str(tmp_path / "shared")}
    run_kiln(project, "compile", env=env, check=True)
    summary = project / INSTANCE / "dumps" / "summary" / "summary.json"
    built = summary.read_bytes()
    import shutil

    shutil.rmtree(project / "build")
    shutil.rmtree(project / ".kiln")
    proc = run_kiln(project, "compile", env=env, check=True)
    assert "(4 fetched, 0 compiled)" in proc.stdout
    assert summary.read_bytes() == built
    assert (project / INSTANCE / "dumps" / "kernel.visa").is_file()


DYING_STAGE = """
import multiprocessing
import os

from kiln.stages.edf import *  # noqa: F403
from kiln.stages.edf import CAPABILITIES, run as _run

ARTIFACT = "kernel.edf"


def run(sp, options, machine):
    if multiprocessing.parent_process() is not None:
        try:  # the first worker to get here dies mid-chain (out of memory, say)
            os.close(os.open("worker-died", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            os._exit(3)
    return _run(sp, options, machine)
"""


def test_a_pool_worker_that_dies_once_is_one_warning_and_every_chain_builds(project):
    expected = clean_build(project)
    (project / "dying_edf.py").write_text(DYING_STAGE)
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("kiln.stages.edf", "dying_edf"))
    proc = run_kiln(project, "compile", "-n", "2", env=NO_CACHE, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (project / "worker-died").exists()
    assert proc.stderr.count("warning: a worker of the process pool died") == 1, proc.stderr
    assert proc.stderr.count("warning") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert set(snapshot(project)) == set(expected)


def test_n_2_builds_the_bytes_of_n_1(project):
    expected = clean_build(project)
    proc = run_kiln(project, "compile", "-n", "2", env=NO_CACHE, check=True)
    assert "4 ran" in proc.stdout
    assert snapshot(project) == expected
    assert os.listdir(project / INSTANCE)
