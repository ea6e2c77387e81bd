"""`kiln tune` end to end: records written, applied, current on a rerun, stale on edit."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import ran_tasks, run_kiln
from tests.support.ctrl_c import answer_ctrl_c


def makespan(project, instance: str) -> int:
    kernel, shapes = instance.split(".")
    proc = run_kiln(project, "inspect", f"build/kiln/kernel/{kernel}/{shapes}/kernel.edf")
    line = next(x for x in proc.stdout.splitlines() if '"makespan_cycles"' in x)
    return int(line.split(":")[1].strip().rstrip(","))


def records(project) -> dict:
    lines = (project / "tuning.jsonl").read_text().splitlines()
    return {r["instance"]: r for r in map(json.loads, lines)}


def test_tune_compile_rerun_and_stale(project):
    run_kiln(project, "compile", "vector_add", check=True)
    before = makespan(project, "vector_add.small")
    tuned = run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert "kiln tune: 1 tuned, 0 current, 24 trials" in tuned.stdout
    record = records(project)["vector_add.small"]
    assert record["default_cycles"] == before
    assert record["tuned_cycles"] <= before and record["trials"] == 24
    first_bytes = (project / "tuning.jsonl").read_bytes()

    # compile applies the record: the binary's makespan is the tuned one
    build = run_kiln(project, "compile", "vector_add", check=True)
    assert "compile:vector_add.small.trace" not in ran_tasks(build)
    assert makespan(project, "vector_add.small") == record["tuned_cycles"]

    # a second tune with the record present performs no trial
    again = run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert "0 tuned, 1 current, 0 trials" in again.stdout
    assert (project / "tuning.jsonl").read_bytes() == first_bytes

    # the same budget and seed give the same record from scratch
    (project / "tuning.jsonl").unlink()
    run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert (project / "tuning.jsonl").read_bytes() == first_bytes

    # an edit that changes the graph makes the record stale: ignored, and status says so
    src = project / "kernels" / "elementwise.py"
    src.write_text(src.read_text().replace("return a + b", "return a + b * 1.0", 1))
    run_kiln(project, "compile", "vector_add", check=True)
    with_stale_record = (project / "build/kiln/kernel/vector_add/small/kernel.edf").read_bytes()
    (project / "tuning.jsonl").rename(project / "away.jsonl")
    run_kiln(project, "compile", "vector_add", check=True)
    untuned = (project / "build/kiln/kernel/vector_add/small/kernel.edf").read_bytes()
    assert with_stale_record == untuned
    (project / "away.jsonl").rename(project / "tuning.jsonl")
    status = run_kiln(project, "status", "vector_add")
    assert "vector_add.small: tuning record ignored (stale: graph changed)" in status.stdout
    show = run_kiln(project, "tune", "--show", "vector_add", check=True)
    assert "stale" in show.stdout


def test_bad_tune_input_is_one_message(project):
    proc = run_kiln(project, "tune", "vector_add", "--budget", "0")
    assert proc.returncode == 2 and "--budget must be at least 1" in proc.stderr
    for command in ("tune", "compile"):
        for n in ("-2", "two"):  # a usage error, nothing tuned or built
            proc = run_kiln(project, command, "vector_add", "-n", n)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr
            assert (
                f"kiln {command}: error: argument -n/--process: expected a whole number of "
                f"parallel jobs, 0 or more (0 or 1: in this process), found '{n}'" in proc.stderr
            )
            assert not (project / "tuning.jsonl").exists()
            assert not (project / "build").exists()
    (project / "tuning.jsonl").write_text('{"instance": 3\n')
    proc = run_kiln(project, "tune", "vector_add")
    assert proc.returncode == 2
    assert "tuning.jsonl:1" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_kiln(project, "compile", "vector_add")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout


def test_quiet_tune_prints_the_summary_not_a_line_per_instance(project):
    quiet = run_kiln(project, "-q", "tune", "vector_add", "gemm", "--budget", "2", check=True)
    assert quiet.stdout.splitlines() == [
        "kiln tune: 3 tuned, 0 current, 6 trials; records in tuning.jsonl"
    ]
    assert sorted(records(project)) == ["gemm.small", "gemm.wide", "vector_add.small"]
    again = run_kiln(project, "tune", "vector_add", "gemm", "--budget", "2", check=True)
    lines = again.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == [
        "vector_add.small",
        "gemm.small",
        "gemm.wide",
    ]
    assert all("record is current" in line for line in lines[:3])
    quiet = run_kiln(project, "tune", "vector_add", "gemm", "--budget", "2", "--quiet")
    assert quiet.stdout.splitlines() == [
        "kiln tune: 0 tuned, 3 current, 0 trials; records in tuning.jsonl"
    ]


def test_ctrl_c_keeps_the_records_found_so_far(project):
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "tune", "vector_add", "gemm", "--budget", "5000"],
        cwd=project,
        preexec_fn=answer_ctrl_c,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (project / "tuning.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    # at once: on a quiet machine the rest of the search (about 1,500 trials) takes
    # barely a second, and a run that ended already could not show Ctrl-C
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    kept = records(project)
    assert "vector_add.small" in kept
    assert all(r["tuned_cycles"] <= r["default_cycles"] for r in kept.values())


def test_trials_priced_on_a_dask_cluster_give_the_same_record(project, tmp_path_factory):
    import shutil

    import pytest

    pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")
    other = tmp_path_factory.mktemp("tune") / "on-dask"
    shutil.copytree(project, other)
    args = ("tune", "gemm", "--shapes", "small", "--budget", "40", "--seed", "3", "-n", "2")
    run_kiln(project, *args, check=True)
    priced = run_kiln(other, *args, "--executor", "dask", check=True)
    assert "40 trials" in priced.stdout
    assert (other / "tuning.jsonl").read_text() == (project / "tuning.jsonl").read_text()


def interrupted_tune(project, monkeypatch, *flags: str) -> int:
    """`kiln tune vector_add FLAGS`, in process, with Ctrl-C arriving after 3 trials."""
    from kiln import cli
    from kiln.tune.search import Search

    priced = Search.run

    def stopped(search):
        search.budget = 3
        priced(search)
        raise KeyboardInterrupt

    monkeypatch.setattr(Search, "run", stopped)
    monkeypatch.chdir(project)
    monkeypatch.setenv("KILN_CACHE_DIR", str(project / ".cache"))
    return cli.main(["tune", "vector_add", "--budget", "24", "--seed", "1", *flags])


def test_an_interrupted_tune_never_replaces_a_finished_record(project, monkeypatch, capsys):
    run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    finished = (project / "tuning.jsonl").read_bytes()
    assert interrupted_tune(project, monkeypatch, "--force") == 130
    out = capsys.readouterr().out
    assert "vector_add.small: interrupted after 3 trials; the finished record is kept" in out
    assert (project / "tuning.jsonl").read_bytes() == finished


def test_an_interrupted_record_is_applied_but_tuned_again(project, monkeypatch, capsys):
    assert interrupted_tune(project, monkeypatch) == 130
    partial = records(project)["vector_add.small"]
    assert partial["complete"] is False and partial["trials"] == 3
    assert "interrupted: best so far, tuned again by the next `kiln tune`" in (
        capsys.readouterr().out
    )
    monkeypatch.undo()
    run_kiln(project, "compile", "vector_add", check=True)
    show = run_kiln(project, "tune", "--show", "vector_add", check=True)
    assert "applied (interrupted: tuned again by kiln tune)" in show.stdout  # piped: whole
    again = run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1", check=True)
    assert "the record is from an interrupted run; tuning again" in again.stdout
    assert "kiln tune: 1 tuned, 0 current, 24 trials" in again.stdout
    done = records(project)["vector_add.small"]
    assert "complete" not in done and done["trials"] == 24
    current = run_kiln(project, "tune", "vector_add", "--budget", "24", "--seed", "1")
    assert "0 tuned, 1 current, 0 trials" in current.stdout


def test_a_forced_tune_that_finds_less_says_what_it_replaced(project):
    run_kiln(project, "tune", "vector_add", "--budget", "4", "--seed", "1", check=True)
    line = json.loads((project / "tuning.jsonl").read_text())
    # as if a long search had found more
    line.update(tuned_cycles=1, budget=500, speedup=line["default_cycles"])
    (project / "tuning.jsonl").write_text(json.dumps(line) + "\n")
    again = run_kiln(project, "tune", "vector_add", "--budget", "1", "--force", check=True)
    assert "warning: vector_add.small: the new record (" in again.stderr
    assert "budget 1) replaces a faster one (1 cycles, budget 500)" in again.stderr


def made_record(name: str, knobs: dict):
    """A record as `kiln tune` writes one (its key matches nothing: stale)."""
    from kiln.tune.records import TuningRecord

    key = dict(graph="g", shape_set="small", dtype="f32", machine="m", options="o", compiler="c")
    counts = dict(default_cycles=900, tuned_cycles=300, trials=64, rejected=2, budget=64)
    return TuningRecord(instance=name, knobs=knobs, strategy="grid", **key, **counts)


def test_show_piped_never_cuts_instance_names_or_knobs(project):
    from kiln.tune.records import write_records

    knobs = {
        "lir": {"double_buffer": True},
        "schedule": {"policy": "in-order"},
        "visa": {"fusion": False, "reduce_split": 4, "vector_tile": 65536},
    }
    names = ["vector_add.small", "softmax.small", "gemm.small", "gemm.wide"]
    write_records(project / "tuning.jsonl", {n: made_record(n, knobs) for n in names})
    show = run_kiln(project, "tune", "--show", check=True)
    assert "…" not in show.stdout
    for name in names:
        assert f"│ {name} " in show.stdout
    assert (
        "lir.double_buffer=True schedule.policy=in-order visa.fusion=False "
        "visa.reduce_split=4 visa.vector_tile=65536" in show.stdout
    )


def test_show_on_a_narrow_terminal_folds_and_never_cuts(project, monkeypatch, capsys):
    import re

    from kiln import cli
    from kiln.tune.records import write_records

    knobs = {"lir": {"double_buffer": True}, "visa": {"reduce_split": 4, "vector_tile": 65536}}
    names = ["vector_add.small", "softmax.small", "gemm.small", "gemm.wide"]
    write_records(project / "tuning.jsonl", {n: made_record(n, knobs) for n in names})
    monkeypatch.chdir(project)
    monkeypatch.setenv("KILN_CACHE_DIR", str(project / ".cache"))
    for columns in (80, 40):
        monkeypatch.setenv("COLUMNS", str(columns))
        capsys.readouterr()
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a terminal, as rich sees it
        assert cli.main(["tune", "--show"]) == 0
        out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
        rows = [line for line in out.splitlines() if line.startswith("│")]
        assert "…" not in out
        assert [r.split("│")[1].strip() for r in rows if r.split("│")[1].strip()] == names
        # the knobs column, read down, holds every knob of every record: folded, not cut
        knob_text = "".join(r.split("│")[6].strip() for r in rows)
        assert knob_text == "lir.double_buffer=Truevisa.reduce_split=4visa.vector_tile=65536" * 4
        assert all(line.endswith(("┓", "┃", "┩", "│", "┘")) for line in out.splitlines()[1:])
        if columns == 80:  # wide enough for the one-word columns: the terminal's width
            assert max(len(line) for line in out.splitlines()) == 80


def test_a_bad_knob_in_tuning_jsonl_is_reported_at_its_line_not_pipeline_yaml(project):
    run_kiln(project, "tune", "vector_add", "--budget", "4", "--seed", "1", check=True)
    line = json.loads((project / "tuning.jsonl").read_text())
    line["knobs"] = {"visa": {"vector_tile": "zz"}}
    (project / "tuning.jsonl").write_text(json.dumps(line) + "\n")
    for command in ("compile", "status"):
        proc = run_kiln(project, command, "vector_add")
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in text
        assert "tuning.jsonl:1:1: error: a tuning record cannot be read" in text
        assert 'found: knob visa.vector_tile is "zz", not a whole number from 0 to 16777216' in text
        assert "pipeline.yaml" not in text


def test_a_directory_where_the_records_go_stops_a_build_too(project):
    (project / "tuning.jsonl").mkdir()
    proc = run_kiln(project, "compile", "vector_add")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tuning.jsonl: error: cannot read the tuning records" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_record_of_the_wrong_shape_is_an_error_for_every_command_that_reads_it(project):
    run_kiln(project, "tune", "vector_add", "--budget", "4", "--seed", "1", check=True)
    good = json.loads((project / "tuning.jsonl").read_text())
    damages = [
        # without its knobs the record claimed a speed-up the build never applied
        ("knobs", None, "found: no 'knobs'"),
        ("default_cycles", None, "found: no 'default_cycles'"),
        ("trials", -1, "found: 'trials' is -1, not a whole number, 1 or more"),
        ("speedup", "fast", "found: 'speedup' is 'fast', not default_cycles / tuned_cycles"),
    ]
    for key, value, found in damages:
        line = {k: v for k, v in good.items() if k != key or value is not None}
        if value is not None:
            line[key] = value
        (project / "tuning.jsonl").write_text(json.dumps(line) + "\n")
        for command in (["compile"], ["status"], ["tune"], ["tune", "--show"]):
            proc = run_kiln(project, *command, "vector_add")
            text = proc.stdout + proc.stderr
            assert proc.returncode == 2, (command, text)
            assert "tuning.jsonl:1:1: error: a tuning record cannot be read" in proc.stderr
            assert f"  at key: {key}\n" in proc.stderr and found in proc.stderr, proc.stderr
            assert "Traceback" not in text and "applied" not in text and "current" not in text
    (project / "tuning.jsonl").write_text(json.dumps(good) + "\n")  # as kiln tune wrote it
    assert "current" in run_kiln(project, "tune", "vector_add", check=True).stdout


HALVES = """\
from kiln import Tensor, device


@device
def halves(x: Tensor["N"]):
    return x.reshape(2, -1).sum(axis=0)
"""


def test_an_instance_that_fails_to_build_does_not_stop_the_tuning(project):
    (project / "kernels" / "halves.py").write_text(HALVES)
    pipeline = project / "pipeline.yaml"
    entry = "kernels:\n  halves:\n    shapes:\n      odd: {N: 63}\n      even: {N: 64}\n"
    pipeline.write_text(pipeline.read_text().replace("kernels:\n", entry, 1))
    proc = run_kiln(project, "tune", "halves", "vector_add", "--budget", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # said once, naming the instance as a build does
    assert proc.stderr.count("error: reshape: cannot reshape a tensor of shape (63,)") == 1
    assert "  note: while running stage 'trace' of halves.odd (N=63)\n" in proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["halves.even", "vector_add.small"]
    assert lines[-1] == "kiln tune: 2 tuned, 0 current, 1 failed, 4 trials; records in tuning.jsonl"
    assert sorted(records(project)) == ["halves.even", "vector_add.small"]
    quiet = run_kiln(project, "-q", "tune", "halves", "vector_add", "--budget", "2")
    assert quiet.returncode == 1
    assert quiet.stdout.splitlines() == [
        "kiln tune: 0 tuned, 2 current, 1 failed, 0 trials; records in tuning.jsonl"
    ]
    assert "while running stage 'trace' of halves.odd (N=63)" in quiet.stderr


def test_an_instance_whose_defaults_do_not_compile_fails_alone(project, monkeypatch, capsys):
    from kiln import cli
    from kiln.tune.evaluate import Trial
    from kiln.tune.search import Search

    priced = Search.run

    def refused(search):
        if any(node.op == "matmul" for node in search.context.graph.nodes):  # gemm
            return priced(search)
        search.trials = [Trial((0,) * len(search.knobs), None, "no tile fits SRAM")]
        return search.trials

    monkeypatch.setattr(Search, "run", refused)
    monkeypatch.chdir(project)
    monkeypatch.setenv("KILN_CACHE_DIR", str(project / ".cache"))
    assert cli.main(["tune", "gemm", "vector_add", "--budget", "2"]) == 1
    out, err = capsys.readouterr()
    assert err.count("error: vector_add.small: the default options do not compile: no tile") == 1
    assert "  note: while tuning vector_add.small (N=256)\n" in err
    assert out.splitlines()[-1] == (
        "kiln tune: 2 tuned, 0 current, 1 failed, 4 trials; records in tuning.jsonl"
    )
    assert sorted(records(project)) == ["gemm.small", "gemm.wide"]
