"""Damaged state and a hostile environment, end to end through the real entry points.

A one-kernel project (five tasks) keeps each run short: damaged artifacts
and state files are rebuilt with one warning, `kiln clean` deletes exactly
what Kiln wrote, closed pipes and full disks give one message, and
`python -m kiln` and `doit` answer like `kiln`.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from kiln.tasks.model.discovery import CACHE_FORMAT
from tests.conftest import REPO, machines_yaml, ran_tasks, run_kiln
from tests.support.pipelines import STAGES

PIPELINE = (
    """\
project: small
packages: [kernels]
machine: npu-v1
kernels:
  vector_add:
    shapes:
      small: {N: 256}
"""
    + STAGES
    + """\
targets:
  cpu: {runner: cpu}
  sim: {runner: sim, machine: npu-v1}
machines:
"""
)
DODO = "from kiln.tasks.dag.loader import dodo_namespace\n\nglobals().update(dodo_namespace())\n"
INSTANCE = "build/kiln/kernel/vector_add/small"


@pytest.fixture(scope="module")
def built_small(tmp_path_factory) -> tuple[Path, Path]:
    """The project built once, and a pristine copy of it to restore from."""
    base = tmp_path_factory.mktemp("damaged")
    root = base / "small"
    shutil.copytree(
        REPO / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "pipeline.yaml").write_text(PIPELINE + machines_yaml())
    (root / "dodo.py").write_text(DODO)
    run_kiln(root, "compile", check=True)
    pristine = base / "pristine"
    shutil.copytree(root, pristine, symlinks=True)
    return root, pristine


@pytest.fixture
def small(built_small) -> Path:
    """The built project, restored in place: doit's records name its paths, so it stays put."""
    root, pristine = built_small
    shutil.rmtree(root)
    shutil.copytree(pristine, root, symlinks=True)  # copy2 keeps the mtimes doit recorded
    return root


def kiln(root: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    """`kiln ARGS` in ``root``, in this process (a fresh interpreter costs seconds each time)."""
    from doit import cmd_run

    from kiln import cli

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    saved = {k: os.environ.get(k) for k in ("KILN_CACHE_DIR", "KILN_OUT_DIR", "KILN_PIPELINE")}
    os.environ["KILN_CACHE_DIR"] = str(root / ".cache")
    os.environ.pop("KILN_OUT_DIR", None)
    os.environ.pop("KILN_PIPELINE", None)
    os.chdir(root)
    for name in [m for m in sys.modules if m == "kernels" or m.startswith("kernels.")]:
        del sys.modules[name]  # another test's project may have imported its own `kernels`
    try:
        with redirect_stdout(out), redirect_stderr(err):
            # doit binds its output stream to sys.stdout when first imported: rebind it
            default = cmd_run.opt_outfile["default"]
            cmd_run.opt_outfile["default"] = sys.stdout
            try:
                rc = cli.main(list(args))
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
            finally:
                cmd_run.opt_outfile["default"] = default
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    proc = subprocess.CompletedProcess(["kiln", *args], rc, out.getvalue(), err.getvalue())
    if check and rc != 0:
        raise AssertionError(f"kiln {' '.join(args)} failed ({rc}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_doit(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KILN_CACHE_DIR=str(root / ".cache"))
    return subprocess.run(
        [sys.executable, "-m", "doit", *args], cwd=root, env=env, capture_output=True, text=True
    )


def no_traceback(proc: subprocess.CompletedProcess) -> str:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    return text


# -- damaged artifacts ---------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["bit_flip", "truncate"])
def test_damaged_edf_is_rebuilt_by_compile(small, damage):
    edf = small / INSTANCE / "kernel.edf"
    good = edf.read_bytes()
    others = [small / INSTANCE / n for n in ("graph.json", "kernel.visa", "kernel.lir")]
    before = {p: p.stat().st_mtime_ns for p in others}
    data = bytearray(good)
    if damage == "bit_flip":
        data[len(data) // 2] ^= 0x10
    else:
        data = data[: len(data) // 3]
    edf.write_bytes(bytes(data))
    proc = kiln(small, "compile", check=True)
    text = no_traceback(proc)
    assert ran_tasks(proc) == ["compile:vector_add.small"], (proc.stdout, proc.stderr)
    assert "kernel.edf changed since Kiln wrote it" in text
    assert edf.read_bytes() == good
    assert {p: p.stat().st_mtime_ns for p in others} == before  # only the edf was written
    assert ran_tasks(kiln(small, "compile", check=True)) == []


def test_a_directory_in_place_of_an_artifact_is_kept_aside_and_the_artifact_rebuilt(small):
    graph = small / INSTANCE / "graph.json"
    good = graph.read_bytes()
    graph.unlink()
    graph.mkdir()
    (graph / "mine.txt").write_text("made by hand\n")
    proc = kiln(small, "compile", check=True)
    text = no_traceback(proc)
    assert "graph.json is damaged (a directory where Kiln wrote a file)" in text
    assert ran_tasks(proc) == ["compile:vector_add.small"]
    assert graph.read_bytes() == good
    (aside,) = (small / INSTANCE).glob("graph.json.corrupt-*")
    assert (aside / "mine.txt").read_text() == "made by hand\n"  # never deleted
    shutil.rmtree(aside)


def test_touched_artifact_is_not_rebuilt(small):
    lir = small / INSTANCE / "kernel.lir"
    st = lir.stat()
    os.utime(lir, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    proc = kiln(small, "compile", check=True)
    assert "changed since" not in proc.stderr


# -- damaged state files -------------------------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:5000])


def _garbage_inside(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[4096 + 200 : -200] = b"\xab" * (len(data) - 4096 - 400)  # past the first page
    path.write_bytes(bytes(data))


def _text(path: Path) -> None:
    path.write_text("this is not a database\n")


@pytest.mark.parametrize(
    "damage, entry",
    [
        (_truncate, "kiln compile"),
        (_text, "kiln compile"),
        (_garbage_inside, "kiln compile"),
        (_text, "kiln status"),
        (_garbage_inside, "doit compile"),
    ],
    ids=["truncated", "text", "garbage_inside", "status", "doit"],
)
def test_damaged_doit_database_is_moved_aside_and_rebuilt(small, damage, entry):
    db = small / ".kiln" / "doit.sqlite3"
    damage(db)
    tool, command = entry.split()
    proc = kiln(small, command) if tool == "kiln" else run_doit(small, command)
    text = no_traceback(proc)
    assert proc.returncode == 0, text
    assert text.count(".kiln/doit.sqlite3 is damaged") == 1, text
    assert list((small / ".kiln").glob("doit.sqlite3.corrupt-*"))
    if command == "compile":
        assert ran_tasks(kiln(small, "compile", check=True)) == []


@pytest.mark.parametrize(
    "content", ["[1, 2, 3]", f'{{"format": {CACHE_FORMAT}, "files": {{"x": 1}}}}']
)
def test_discovery_cache_of_the_wrong_shape_is_not_used(small, content):
    (small / ".kiln" / "discovery.json").write_text(content)
    proc = kiln(small, "compile", check=True)
    no_traceback(proc)
    assert ran_tasks(proc) == []


@pytest.mark.parametrize("entry", ["kiln status", "kiln compile", "doit list"])
def test_undecodable_database_stamp_is_only_a_reason_to_check_again(small, entry):
    stamp = small / ".kiln" / "doit.sqlite3.checked"
    stamp.write_bytes(b"garbage{\x00\xff")
    tool, command = entry.split()
    proc = kiln(small, command) if tool == "kiln" else run_doit(small, command)
    text = no_traceback(proc)
    assert proc.returncode == 0, text
    assert "warning" not in text  # the database itself is sound: nothing was lost
    if command == "compile":
        assert ran_tasks(proc) == []
        assert stamp.read_bytes().isascii()  # stamped again after the check


def test_directory_in_place_of_the_database_stamp_is_moved_aside(small):
    stamp = small / ".kiln" / "doit.sqlite3.checked"
    stamp.unlink()
    stamp.mkdir()
    proc = kiln(small, "compile", check=True)
    text = no_traceback(proc)
    assert text.count(".kiln/doit.sqlite3.checked is damaged (a directory, not a file)") == 1
    assert ran_tasks(proc) == [] and stamp.is_file()
    assert kiln(small, "compile", check=True).stderr == ""


@pytest.mark.parametrize("entry", ["kiln status", "kiln compile", "doit list"])
def test_directory_in_place_of_the_discovery_cache_is_moved_aside(small, entry):
    cache = small / ".kiln" / "discovery.json"
    cache.unlink()
    (cache / "inner").mkdir(parents=True)
    tool, command = entry.split()
    proc = kiln(small, command) if tool == "kiln" else run_doit(small, command)
    text = no_traceback(proc)
    assert proc.returncode == 0, text
    assert text.count(".kiln/discovery.json is damaged (a directory, not a file)") == 1, text
    assert "tmp" not in text
    assert cache.is_file() and list((small / ".kiln").glob("discovery.json.corrupt-*"))
    assert "warning" not in kiln(small, "compile", check=True).stderr


def test_stale_temp_files_of_a_killed_build_are_removed(small):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True).stdout.strip()  # fmt: skip
    stale = small / INSTANCE / f".kernel.edf.{dead}.0badc0de.tmp"
    stale.write_bytes(b"half a binary")
    (small / INSTANCE / "kernel.edf").unlink()
    kiln(small, "compile", check=True)
    assert not stale.exists()


# -- clean and symlinks --------------------------------------------------------------------


def test_clean_deletes_exactly_what_kiln_wrote(small, tmp_path):
    (small / "pipeline.yaml").write_text(
        (small / "pipeline.yaml").read_text()
        + "dumps:\n  - kernels: [vector_add]\n    kinds: [summary, visa]\n"
    )
    kiln(small, "compile", check=True)
    inst = small / INSTANCE
    assert (inst / "dumps" / "summary" / "summary.json").is_file()
    mine = inst / "notes.txt"
    mine.write_text("the user's own file\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    (inst / "dumps" / "link").symlink_to(outside)
    proc = kiln(small, "clean")
    no_traceback(proc)
    assert proc.returncode == 0
    left = sorted(p.relative_to(small).as_posix() for p in (small / "build").rglob("*"))
    assert left == [
        "build/kiln",
        "build/kiln/kernel",
        "build/kiln/kernel/vector_add",
        f"{INSTANCE}",
        f"{INSTANCE}/dumps",
        f"{INSTANCE}/dumps/link",
        f"{INSTANCE}/notes.txt",
    ]
    assert (outside / "keep.txt").read_text() == "keep\n"


def test_clean_keeps_the_out_dir_the_user_named(small):
    kiln(small, "clean", check=True)
    assert (small / "build" / "kiln" / "kernel").is_dir()
    assert not (small / INSTANCE).exists()


def test_dump_dir_replaced_by_a_symlink_is_not_written_through(small, tmp_path):
    (small / "pipeline.yaml").write_text(
        (small / "pipeline.yaml").read_text()
        + "dumps:\n  - kernels: [vector_add]\n    kinds: [summary]\n"
    )
    kiln(small, "compile", check=True)
    summary = small / INSTANCE / "dumps" / "summary"
    shutil.rmtree(summary)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    summary.symlink_to(elsewhere)
    proc = kiln(small, "compile", check=True)
    no_traceback(proc)
    assert list(elsewhere.iterdir()) == []
    assert not summary.is_symlink() and (summary / "summary.json").is_file()


@pytest.mark.parametrize("how", ["edited", "deleted"])
def test_a_file_lost_from_a_dump_directory_is_written_again(small, how):
    """The directory is the task's target: while it stood, the task looked built and the
    lost file never came back."""
    (small / "pipeline.yaml").write_text(
        (small / "pipeline.yaml").read_text()
        + "dumps:\n  - kernels: [vector_add]\n    kinds: [summary]\n"
    )
    kiln(small, "compile", check=True)
    summary = small / INSTANCE / "dumps" / "summary"
    kept = {p.name: p.read_bytes() for p in summary.iterdir()}
    assert set(kept) == {"summary.json", "summary.txt"}
    if how == "edited":
        (summary / "summary.txt").write_text("edited by hand\n")
    else:
        (summary / "summary.json").unlink()
    status = kiln(small, "status")
    assert "compile:vector_add.small: would run" in status.stdout
    proc = kiln(small, "compile", check=True)
    no_traceback(proc)
    assert {p.name: p.read_bytes() for p in summary.iterdir()} == kept
    assert "0 ran" in kiln(small, "compile", check=True).stdout


# -- pipes, disks and entry points -----------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "compile"])
def test_closed_stdout_neither_tracebacks_nor_stops_the_build(small, command):
    shutil.rmtree(small / "build")
    shutil.rmtree(small / ".kiln")
    env = dict(os.environ, KILN_CACHE_DIR=str(small / ".cache"))
    kiln = subprocess.Popen(
        [sys.executable, "-m", "kiln", command],
        cwd=small,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    kiln.stdout.readline()  # `| head -1`
    kiln.stdout.close()
    err = kiln.stderr.read().decode()
    kiln.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert kiln.returncode == 0
    if command == "compile":
        assert (small / INSTANCE / "kernel.edf").is_file()


def test_full_disk_is_one_message(small, monkeypatch, capsys):
    import errno

    from kiln import cli
    from kiln.tasks.chain import chain_record
    from kiln.tasks.dag import chain_action

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(small / INSTANCE / "x.tmp"))

    (small / INSTANCE / "kernel.visa").unlink()
    monkeypatch.chdir(small)
    monkeypatch.setenv("KILN_CACHE_DIR", str(small / ".cache"))
    monkeypatch.setattr("kiln.fsutil.write_bytes_atomic", no_space)
    monkeypatch.setattr("kiln.cache.store.write_bytes_atomic", no_space)
    # the compile action and the chain record write through their own imported names
    monkeypatch.setattr(chain_action, "write_with_identity", no_space)
    monkeypatch.setattr(chain_record, "write_bytes_atomic", no_space)
    rc = cli.main(["compile"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 1, text
    assert "Traceback" not in text
    assert "No space left on device" in text and "the disk is full" in text
    assert (small / INSTANCE / "kernel.edf").is_file()  # nothing built was lost


@pytest.mark.parametrize(
    "argv",
    [["kiln", "compile"], [sys.executable, "-m", "kiln", "compile"], ["doit", "compile"]],
    ids=["kiln", "python -m kiln", "doit"],
)
def test_every_entry_point_gives_the_same_message(small, argv):
    (small / "pipeline.yaml").write_text(
        (small / "pipeline.yaml").read_text().replace("N: 256", "N: -1")
    )
    env = dict(os.environ, KILN_CACHE_DIR=str(small / ".cache"))
    if argv[0] == "kiln":
        argv = [sys.executable, "-m", "kiln", *argv[1:]]
    elif argv[0] == "doit":
        argv = [sys.executable, "-m", "doit", *argv[1:]]
    proc = subprocess.run(argv, cwd=small, env=env, capture_output=True, text=True)
    text = no_traceback(proc)
    assert proc.returncode == 2, text
    assert text.startswith("pipeline.yaml:7:"), text
    assert "at key: kernels.vector_add.shapes.small.N" in text


def test_unusable_cache_dir_is_one_warning_and_the_run_goes_on(small, capfd):
    pytest.importorskip("iree.compiler", reason="the iree target needs the [iree] extra")
    shutil.rmtree(small / ".cache", ignore_errors=True)
    (small / ".cache").write_text("a file where the cache dir goes\n")
    proc = kiln(small, "run", "vector_add", "--target", "iree")
    no_traceback(proc)
    assert proc.returncode == 0
    warnings = capfd.readouterr().err  # written to the real stderr, past doit's capture
    assert warnings.count("kiln: warning: the iree cache") == 1, warnings
    assert "KILN_CACHE_DIR" in warnings


# -- bugs --------------------------------------------------------------------------------------

SCALAR = """\
from kiln import Tensor, device


@device
def scale_by(x: Tensor["N"], scale: Tensor[()]):
    return x * scale
"""


def test_scalar_argument_runs_on_sim(small):
    (small / "kernels" / "scalar.py").write_text(SCALAR)
    (small / "pipeline.yaml").write_text(
        (small / "pipeline.yaml")
        .read_text()
        .replace("kernels:\n", "kernels:\n  scale_by: {shapes: {small: {N: 16}}}\n", 1)
    )
    proc = kiln(small, "test", "scale_by", "--target", "sim")
    text = no_traceback(proc)
    assert proc.returncode == 0, text
    assert "PASS    scale_by.small @ sim" in text


@pytest.mark.parametrize("flag, value", [("--iter", "0"), ("--iter", "-3"), ("--warmup", "-1")])
def test_bench_rejects_counts_below_their_minimum(small, monkeypatch, capsys, flag, value):
    from kiln import cli

    monkeypatch.chdir(small)
    rc = cli.main(["bench", "--target", "sim", flag, value])
    out = capsys.readouterr()
    assert rc == 2, out
    assert f"{flag} must be at least" in out.err
    assert out.out == ""  # refused before anything was timed


def test_unwritable_out_dir_is_an_error_at_out_dir(small, monkeypatch, capsys):
    from kiln import cli

    shutil.rmtree(small / "build" / "kiln" / "kernel")
    monkeypatch.chdir(small)
    monkeypatch.setenv("KILN_CACHE_DIR", str(small / ".cache"))
    # tests may run as root, which may write anywhere: stand in for a read-only dir
    monkeypatch.setattr("kiln.tasks.model.project.os.access", lambda path, mode: False)
    rc = cli.main(["compile"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the out dir build/kiln/kernel cannot be created: build/kiln is not writable" in err
    assert "at key: out_dir" in err and "Traceback" not in err


@pytest.mark.parametrize("content", [b"\x80\x05garbage", b"", b"\x80\x04K\x05."])
def test_damaged_pipeline_cache_is_moved_aside_and_rebuilt(small, content):
    (cache,) = (small / ".kiln").glob("pipeline-*.pickle")
    cache.write_bytes(content)
    proc = kiln(small, "compile", check=True)
    assert proc.stderr.count("is damaged") == 1, proc.stderr
    assert ran_tasks(proc) == []
    assert cache.stat().st_size > 100  # rebuilt
    assert kiln(small, "compile", check=True).stderr == ""


def test_damaged_iree_module_cache_is_moved_aside_and_rebuilt(small):
    pytest.importorskip("iree.compiler", reason="the iree target needs the [iree] extra")
    kiln(small, "run", "vector_add", "--target", "iree", check=True)
    (vmfb,) = (small / ".cache" / "iree").glob("*.vmfb")
    vmfb.write_bytes(vmfb.read_bytes()[:100])
    proc = kiln(small, "run", "vector_add", "--target", "iree", check=True)
    assert proc.stderr.count("is damaged") == 1, proc.stderr
    assert vmfb.stat().st_size > 100 and list(vmfb.parent.glob("*.corrupt-*"))
