"""End to end through the CLI: a team cache in a shared directory.

One warm build fills the remote; clean clones then compile nothing, get
the same bytes, survive a damaged remote object and an unusable remote.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_kiln
from tests.support.outdir import build_bytes

pytest.importorskip("fsspec", reason="the remote cache needs kiln[distributed]")

INSTANCES = 4  # vector_add, softmax, gemm.small, gemm.wide
TASKS = INSTANCES  # one compile task (and one cache entry) per instance: its whole chain


def artifacts(project: Path) -> dict[str, bytes]:
    return build_bytes(project, project / "build")


def clone(project: Path, name: str) -> Path:
    target = project.parent / name
    shutil.copytree(project / "kernels", target / "kernels")
    shutil.copy(project / "pipeline.yaml", target / "pipeline.yaml")
    return target


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A project built once with a shared-directory remote: (project, remote dir, its bytes)."""
    from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml

    base = tmp_path_factory.mktemp("team")
    project = base / "origin"
    shutil.copytree(REPO / "kernels", project / "kernels", ignore=shutil.ignore_patterns("__py*"))
    (project / "pipeline.yaml").write_text(SMALL_PIPELINE + machines_yaml())
    remote = base / "remote"
    env = {"KILN_REMOTE_CACHE": f"file://{remote}"}
    proc = run_kiln(project, "compile", env=env, check=True)
    assert f"(0 fetched, {TASKS} compiled)" in proc.stdout
    return project, remote, artifacts(project)


def test_clean_clone_with_warm_remote_compiles_nothing(warm):
    project, remote, local_bytes = warm
    fresh = clone(project, "clone-clean")
    proc = run_kiln(fresh, "compile", env={"KILN_REMOTE_CACHE": f"file://{remote}"}, check=True)
    assert f"({TASKS} fetched, 0 compiled)" in proc.stdout
    assert "warning" not in proc.stderr
    assert artifacts(fresh) == local_bytes
    stats = run_kiln(fresh, "cache", "stats", check=True).stdout
    # the remote is a directory on this machine's disk: read in place, never copied
    assert "0 actions, 0 blobs" in stats
    assert f"0 local hits, {TASKS} fetched from the remote, 0 compiled" in stats


def test_two_checkouts_sharing_a_store_share_no_file(warm, tmp_path):
    """An artifact edited in place in one checkout changes neither the store nor the other
    checkout, and each checkout's next build restores only its own file."""
    project, remote, local_bytes = warm
    shared = {"KILN_REMOTE_CACHE": f"file://{remote}", "KILN_CACHE_DIR": str(tmp_path / "cache")}
    first, second = clone(project, "clone-own-a"), clone(project, "clone-own-b")
    run_kiln(first, "compile", env=shared, check=True)
    run_kiln(second, "compile", env=shared, check=True)
    stats = run_kiln(second, "cache", "stats", env=shared, check=True).stdout
    assert f"0 local hits, {TASKS} fetched from the remote, 0 compiled" in stats
    edf = next(p for p in (first / "build").rglob("kernel.edf"))
    assert edf.stat().st_nlink == 1
    other = second / edf.relative_to(first)
    before = other.read_bytes()
    with open(edf, "r+b") as f:  # as an editor saving in place, or dd conv=notrunc
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    assert artifacts(second) == local_bytes
    assert f"0 ran, {TASKS} up to date" in run_kiln(second, "compile", env=shared).stdout
    assert other.read_bytes() == before
    proc = run_kiln(first, "compile", env=shared, check=True)
    assert "1 ran" in proc.stdout and "(0 fetched, 0 compiled)" not in proc.stdout
    assert artifacts(first) == artifacts(second) == local_bytes


def test_damaged_remote_blob_is_rebuilt_and_overwritten(warm):
    project, remote, local_bytes = warm
    from kiln.cache.store import sha256

    name = next(k for k in local_bytes if k.startswith("kiln/kernel/gemm/small/") and "edf" in k)

    digest = sha256(local_bytes[name])
    blob = remote / "cas" / digest[:2] / digest
    blob.write_bytes(local_bytes[name][:-7])  # truncated
    fresh = clone(project, "clone-damaged")
    proc = run_kiln(fresh, "compile", env={"KILN_REMOTE_CACHE": f"file://{remote}"}, check=True)
    assert f"({TASKS - 1} fetched, 1 compiled)" in proc.stdout
    assert proc.stderr.count("warning") == 1 and "corrupt" in proc.stderr
    assert artifacts(fresh) == local_bytes
    assert blob.read_bytes() == local_bytes[name]  # uploads on: the bad object was replaced


def test_unusable_remote_warns_once_across_processes_and_builds_locally(warm, tmp_path):
    project, _, local_bytes = warm
    (tmp_path / "not-a-dir").write_text("a file where the cache should be")
    fresh = clone(project, "clone-unreachable")
    env = {"KILN_REMOTE_CACHE": f"file://{tmp_path}/not-a-dir/cache"}
    # two worker processes, one warning: they share the build's breaker
    proc = run_kiln(fresh, "compile", "-n", "2", env=env, check=True)
    assert f"(0 fetched, {TASKS} compiled)" in proc.stdout
    assert proc.stderr.count("warning") == 1 and "unavailable" in proc.stderr
    assert artifacts(fresh) == local_bytes


def test_read_only_build_leaves_the_remote_alone(warm, tmp_path):
    project, _, _ = warm
    remote = tmp_path / "pr-remote"
    fresh = clone(project, "clone-readonly")
    env = {"KILN_REMOTE_CACHE": f"file://{remote}", "KILN_REMOTE_UPLOAD": "0"}
    run_kiln(fresh, "compile", "vector_add", env=env, check=True)
    assert not remote.exists()


def test_cache_verify_and_gc_on_the_local_store(warm):
    project, _, _ = warm
    store = project / ".cache" / "store"
    assert "actions" in run_kiln(project, "cache", "stats", check=True).stdout
    blob = next(p for p in (store / "cas").rglob("*") if p.is_file())
    blob.write_bytes(b"damaged")
    proc = run_kiln(project, "cache", "verify", check=True)
    assert "dropped 1" in proc.stdout and blob.name in proc.stdout
    assert not blob.exists()
    proc = run_kiln(project, "cache", "gc", "--max-size", "0", check=True)
    assert "now 0 B" in proc.stdout
    bad = run_kiln(project, "cache", "gc", "--max-size", "lots")
    assert bad.returncode == 2 and "--max-size" in bad.stderr and "Traceback" not in bad.stderr


def iree_project(warm, name: str) -> Path:
    """A clone whose pipeline has an iree-cpu target."""
    project, _, _ = warm
    fresh = clone(project, name)
    pipe = fresh / "pipeline.yaml"
    sim = "  sim: {runner: sim, machine: npu-v1}\n"
    pipe.write_text(pipe.read_text().replace(sim, sim + "  iree-cpu: {runner: iree}\n"))
    return fresh


def test_a_vmfb_compiled_once_is_fetched_by_a_clean_clone(warm):
    pytest.importorskip("iree.compiler", reason="the iree target needs kiln[iree]")
    _, remote, _ = warm
    env = {"KILN_REMOTE_CACHE": f"file://{remote}"}
    first = run_kiln(iree_project(warm, "iree-a"), "run", "vector_add", "--target", "iree-cpu",
                     env=env, check=True)  # fmt: skip
    assert "cache: miss" in first.stdout
    second = run_kiln(iree_project(warm, "iree-b"), "run", "vector_add", "--target", "iree-cpu",
                      env=env, check=True)  # fmt: skip
    # kiln run rounds its figures: a fetched vmfb took no compiling at all
    assert "cache: fetched" in second.stdout and "\n  compile_s: 0\n" in second.stdout
    assert "warning" not in second.stderr


def test_a_test_report_checked_once_is_fetched_by_a_clean_clone(warm):
    project, remote, _ = warm
    env = {"KILN_REMOTE_CACHE": f"file://{remote}"}
    first = run_kiln(project, "test", "vector_add", "--target", "sim", env=env, check=True)
    assert "PASS    vector_add.small @ sim  (max abs err 0)" in first.stdout
    fresh = clone(project, "clone-tested")
    again = run_kiln(fresh, "test", "vector_add", "--target", "sim", env=env, check=True)
    assert "PASS    vector_add.small @ sim  (max abs err 0, cached)" in again.stdout
    report = (fresh / "build" / "kiln" / "kernel" / "test-report.json").read_text()
    assert '"cache": "fetched"' in report


@pytest.mark.parametrize("damage", ["no-artifact", "a-report", "climbing-side-name"])
def test_foreign_remote_entries_are_never_used_nor_kept(warm, tmp_path, damage):
    import json

    project, remote, local_bytes = warm
    copy = tmp_path / "remote"
    shutil.copytree(remote, copy)
    damaged = 0
    for entry in copy.glob("ac/*/*"):
        outputs = json.loads(entry.read_text())["outputs"]
        if "record" not in outputs:
            continue
        damaged += 1
        digest = outputs["record"]  # a chain's entry: its stages' records and its files
        if damage == "no-artifact":
            outputs = {"notrecord": digest}
        elif damage == "a-report":
            outputs = {"report": digest}  # an entry Kiln writes, but not a chain's
        else:
            outputs["file/../../../../../../ESCAPED"] = digest
        entry.write_text(json.dumps({"outputs": outputs}))
    assert damaged == TASKS  # every chain's entry, so nothing may be fetched
    fresh = clone(project, f"clone-foreign-{damage}")
    proc = run_kiln(fresh, "compile", env={"KILN_REMOTE_CACHE": f"file://{copy}"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"(0 fetched, {TASKS} compiled)" in proc.stdout
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stdout
    assert not list(fresh.parent.rglob("ESCAPED")) and not list(tmp_path.rglob("ESCAPED"))
    assert artifacts(fresh) == local_bytes
    shutil.rmtree(fresh / "build")
    shutil.rmtree(fresh / ".kiln")
    again = run_kiln(fresh, "compile", check=True)  # the local store kept nothing foreign
    assert f"({TASKS} fetched, 0 compiled)" in again.stdout
    assert artifacts(fresh) == local_bytes
