"""`kiln bench --commands FILE`: a file of benchmark driver lines, one row each."""

from __future__ import annotations

import csv
import io

from tests.conftest import run_kiln

COMMANDS = """\
# configurations kept for the driver
./bin/MIOpenDriver convbfp16 -n 1 -c 4 -H 6 -W 6 -k 4 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -t 1
[SKIP] conv -n 64 -c 512 -H 56 -W 56 -k 512 -y 3 -x 3

matmul -M 8 -N 4 -K 6 --transA   # a trailing comment
conv -F 4 -n 1 -c 4 -H 6 -W 6 -k 4 -y 3 -x 3 -u 2 -I NHWC -f NHWC -O NHWC
"""


def test_every_line_is_timed_comments_and_skip_lines_are_not(tmp_path):
    (tmp_path / "cmds.txt").write_text(COMMANDS)
    proc = run_kiln(tmp_path, "bench", "--commands", "cmds.txt", "--iter", "1",
                    "--output-format", "csv")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["line"], r["problem"], r["dtype"]) for r in rows] == [
        ("cmds.txt:2", "conv2d-fwd nchw N1 C4 6x6 K4 f3x3 p1,1", "bf16"),
        ("cmds.txt:5", "matmul 8x4x6 transA", "f32"),
        ("cmds.txt:6", "conv2d-wgrad nhwc N1 C4 6x6 K4 f3x3 s2,1", "f32"),
    ]
    assert all(r["target"] == "cpu" and float(r["gflops"]) > 0 for r in rows)
    assert "kiln bench: 1 [SKIP] line(s) of cmds.txt not timed" in proc.stderr


def test_a_line_that_cannot_be_mapped_stops_the_file_at_its_line_and_flag(tmp_path):
    bad = "conv -F 1 -n 1 -c 4 -H 6 -W 6 -k 4 -y 3 -x 3 --dump"
    (tmp_path / "cmds.txt").write_text(COMMANDS + bad + "\n")
    proc = run_kiln(tmp_path, "bench", "--commands", "cmds.txt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # nothing timed: every line is read first
    column = bad.index("--dump") + 1
    assert proc.stderr.startswith(
        f"cmds.txt:7:{column}: error: conv: --dump cannot be mapped to a Kiln benchmark problem\n"
        f"  | {bad}\n"
    ), proc.stderr
    assert proc.stderr.count("error:") == 1


def test_a_file_that_is_missing_or_has_no_line_to_time_is_refused(tmp_path):
    missing = run_kiln(tmp_path, "bench", "--commands", "nope.txt")
    assert missing.returncode == 2 and "error: --commands: cannot read nope.txt" in missing.stderr
    (tmp_path / "empty.txt").write_text("# nothing\n[SKIP] conv -n 1\n")
    empty = run_kiln(tmp_path, "bench", "--commands", "empty.txt")
    assert empty.returncode == 2 and "empty.txt has no driver line to time" in empty.stderr
    kernels = run_kiln(tmp_path, "bench", "--commands", "empty.txt", "gemm")
    assert "kiln bench --commands takes no kernels or problems: gemm" in kernels.stderr
    for proc in (missing, empty, kernels):
        assert "Traceback" not in proc.stderr
