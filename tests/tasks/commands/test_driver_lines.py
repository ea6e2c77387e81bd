"""MIOpen's and Fusilli's benchmark driver lines, mapped onto Kiln's benchmark problems."""

from __future__ import annotations

import csv
import io
import json
import shlex

import numpy as np
import pytest

from kiln.errors import KilnError
from kiln.lang import trace
from kiln.tasks.commands.driver_lines import MODES, is_driver_line, parse_line
from kiln.tasks.commands.problems import make_kernel
from tests.conftest import run_kiln

LINE_2D = (
    "conv --bf16 -F 1 -n 2 -c 8 -H 8 -W 8 -k 8 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1 "
    "--in_layout NHWC --out_layout NHWC --fil_layout NHWC --spatial_dim 2"
)
LINE_3D = (
    "conv -F {F} -n 1 -c 2 --in_d 5 -H 4 -W 4 -k 2 --fil_d 3 -y 3 -x 3 --pad_d 1 -p 1 -q 1 "
    "--conv_stride_d 2 -u 1 -v 1 --dilation_d 1 -l 1 -j 1 --spatial_dim 3 "
    "--in_layout NDHWC --fil_layout NDHWC --out_layout NDHWC"
)


def mapped(text: str):
    line = parse_line(shlex.split(text))
    graph = trace(make_kernel(line.name, line.problems[0].body, line.problems[0].shapes), {}, "f32")
    return line, [a.shape for a in graph.args], graph.output_nodes[0].shape


def test_a_2d_forward_line_is_kilns_conv_in_its_layout_and_dtype():
    line, args, out = mapped(LINE_2D)
    assert line.name == "conv" and line.problems[0].dtype == "bf16"
    assert args == [(2, 8, 8, 8), (8, 3, 3, 8)] and out == (2, 8, 8, 8)  # NHWC, KYXC
    assert line.problems[0].label == "conv2d-fwd nhwc N2 C8 8x8 K8 f3x3 p1,1"
    assert line.problems[0].flops == 2.0 * 2 * 8 * 8 * 64 * 9
    assert line.options.target == "cpu" and line.options.iter == 10


@pytest.mark.parametrize(
    ("forw", "mode", "args", "out"),
    [
        (1, "fwd", [(1, 5, 4, 4, 2), (2, 3, 3, 3, 2)], (1, 3, 4, 4, 2)),
        (2, "dgrad", [(1, 3, 4, 4, 2), (2, 3, 3, 3, 2)], (1, 5, 4, 4, 2)),
        (4, "wgrad", [(1, 5, 4, 4, 2), (1, 3, 4, 4, 2)], (2, 3, 3, 3, 2)),
    ],
)
def test_a_3d_line_maps_f_to_forward_backward_data_and_weights(forw, mode, args, out):
    line, shapes, result = mapped(LINE_3D.format(F=forw))
    assert line.problems[0].label.startswith(f"conv3d-{mode} ndhwc N1 C2 5x4x4 K2 f3x3x3 s2,1,1")
    assert (shapes, result) == (args, out)  # depth stride 2, height and width stride 1


def test_backward_lines_compute_the_adjoints_of_the_forward_one():
    rng = np.random.default_rng(0)
    fwd, dgrad, wgrad = (
        parse_line(shlex.split(LINE_3D.format(F=f))).problems[0] for f in (1, 2, 4)
    )
    forward, data, weights = (make_kernel("conv", p.body, p.shapes) for p in (fwd, dgrad, wgrad))
    x, w = (rng.standard_normal(s).astype(np.float32) for s in fwd.shapes)
    y = forward(x, w)  # eagerly, on numpy
    dy = rng.standard_normal(np.shape(y)).astype(np.float32)
    dx, dw = np.asarray(data(dy, w)), np.asarray(weights(x, dy))
    # <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>
    forward = float(np.sum(np.asarray(y) * dy))
    assert float(np.sum(x * dx)) == pytest.approx(forward, rel=1e-4)
    assert float(np.sum(w * dw)) == pytest.approx(forward, rel=1e-4)


def test_matmul_lines_transpose_batch_and_take_one_dtype():
    line, args, out = mapped("matmul -M 8 -N 4 -K 6 --transA --bf16")
    assert (args, out, line.problems[0].dtype) == ([(6, 8), (6, 4)], (8, 4), "bf16")
    assert (
        line.problems[0].label == "matmul 8x4x6 transA"
        and line.problems[0].flops == 2.0 * 8 * 4 * 6
    )
    line, args, out = mapped("matmul -M 8 -N 4 -K 6 -B 3 --transB --a_type f16 --b_type f16")
    assert (args, out, line.problems[0].dtype) == ([(3, 8, 6), (3, 4, 6)], (3, 8, 4), "f16")


def test_a_driver_program_and_its_main_options_lead_the_line():
    line = parse_line(shlex.split("./bin/MIOpenDriver convbfp16 -n 1 -c 4 -H 6 -W 6 -k 4 "
                                  "-y 3 -x 3 -t 1 -i 3"))  # fmt: skip
    assert line.problems[0].dtype == "bf16" and line.problems[0].label.startswith("conv2d-fwd nchw")
    assert line.options.iter == 3
    fusilli = parse_line(shlex.split("fusilli_benchmark_driver --iter 4 matmul -M 2 -N 2 -K 2"))
    assert fusilli.options.iter == 4 and fusilli.problems[0].label == "matmul 2x2x2"
    kilns = parse_line(["--target", "sim", "matmul", "-M", "2", "-N", "2", "-K", "2"])
    assert kilns.options.target == "sim"  # `kiln bench --target sim problem: matmul ...`


BASE = "conv -n 1 -c 4 -H 6 -W 6 -k 4 -y 3 -x 3"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE + " -F 8", r"-F cannot be mapped"),
        (BASE + " -F -1", r"-F cannot be mapped"),
        (BASE + " -F 3 --bias", r"--bias is for the forward pass only"),
        (BASE + " -m trans", r"-m cannot be mapped"),
        (BASE + " -g 3", r"-g does not divide the channels"),
        (BASE + " --in_d 4", r"--in_d needs --spatial_dim 3"),
        (BASE + " --spatial_dim 3", r"--in_d is needed by a 3-D convolution"),
        (BASE + " --in_layout NHWC", r"--fil_layout differs from --in_layout NHWC"),
        (BASE + " --in_layout CHWN", r"--in_layout cannot be mapped"),
        (BASE + " --fp16 --bf16", r"--fp16 contradicts --bf16"),
        (BASE + " -F 2 --bias", r"--bias is for the forward pass only"),
        (BASE + " --dump", r"--dump cannot be mapped to a Kiln benchmark problem"),
        (BASE + " -s 1", r"-s cannot be mapped to a Kiln benchmark problem"),
        (BASE.replace("-n 1", "-n 0"), r"argument -n/--batchsize: must be at least 1, found 0"),
        (BASE.replace(" -k 4", ""), r"required: -k/--out_channels"),
        ("matmul -M 2 -N 2 -K 2 --a_type f16 --b_type bf16", r"--b_type differs"),
        ("gemm -M 2 -N 2 -K 2", r"no benchmark driver command"),
    ],
)
def test_what_cannot_be_mapped_is_refused_naming_the_flag(text, message):
    with pytest.raises(KilnError, match=message):
        parse_line(shlex.split(text))


@pytest.mark.parametrize(
    ("forw", "modes"),
    [(1, ["fwd"]), (3, ["fwd", "dgrad"]), (5, ["fwd", "wgrad"]), (6, ["dgrad", "wgrad"])]
    + [(7, ["fwd", "dgrad", "wgrad"]), (0, ["fwd", "dgrad", "wgrad"])],
)
def test_a_combined_f_is_one_problem_per_pass_as_miopen_times_them(forw, modes):
    line = parse_line(shlex.split(LINE_3D.format(F=forw)))
    assert [p.label.split()[0] for p in line.problems] == [f"conv3d-{m}" for m in modes]
    alone = {m: parse_line(shlex.split(LINE_3D.format(F=f))).problems[0] for f, m in MODES.items()}
    for problem, mode in zip(line.problems, modes, strict=True):  # each as its -F alone gives it
        assert (problem.label, problem.shapes, problem.flops) == (
            alone[mode].label,
            alone[mode].shapes,
            alone[mode].flops,
        )


def test_cli_times_each_pass_of_a_combined_f_one_row_each(tmp_path):
    proc = run_kiln(
        tmp_path, "bench", "problem:", *shlex.split(BASE), "-F", "3", "--iter", "1",
        "--output-format", "csv",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.strip().splitlines()[1:]
    assert [r.split(",")[0].split()[0].strip('"') for r in rows] == ["conv2d-fwd", "conv2d-dgrad"]


def test_problem_conv_is_a_driver_line_only_with_a_drivers_flags():
    assert is_driver_line("", ["conv", "-n", "1"]) and is_driver_line("matmul", [])
    assert is_driver_line("conv -n 1", []) and is_driver_line("conv", ["-F", "2"])
    assert not is_driver_line("conv", ["-N", "2", "--stride", "2,1"])
    assert not is_driver_line("gemm", ["-M", "8"])


def test_cli_driver_lines_after_problem_print_kilns_table_csv_and_json(tmp_path):
    table = run_kiln(tmp_path, "bench", "problem:", *shlex.split(LINE_2D), "--iter", "1")
    assert table.returncode == 0, table.stderr
    assert "conv2d-fwd nhwc N2 C8 8x8 K8 f3x3 p1,1" in table.stdout and "bf16" in table.stdout
    # -v and -q of the line are its strides and paddings, not Kiln's verbosity
    quoted = run_kiln(tmp_path, "bench", f"problem:{LINE_3D.format(F=2)}", "--iter", "1",
                      "--output-format", "csv")  # fmt: skip
    assert quoted.returncode == 0, quoted.stderr
    (row,) = list(csv.DictReader(io.StringIO(quoted.stdout)))
    assert row["problem"].startswith("conv3d-dgrad ndhwc N1 C2 5x4x4 K2 f3x3x3 s2,1,1")
    assert row["dtype"] == "f32" and float(row["gflops"]) > 0
    matmul = run_kiln(tmp_path, "bench", "problem:matmul", "-M", "8", "-N", "4", "-K", "6",
                      "--transA", "--iter", "1", "--output-format", "json")  # fmt: skip
    assert matmul.returncode == 0, matmul.stderr
    (row,) = json.loads(matmul.stdout)
    assert row["problem"] == "matmul 8x4x6 transA" and row["target"] == "cpu"


def test_cli_a_line_that_cannot_be_mapped_is_one_message_naming_the_flag(tmp_path):
    issue = LINE_2D.replace("-g 1", "-g 3")  # 8 channels in 3 groups
    for argv in (
        ["problem:", *shlex.split(issue)],
        ["problem:conv", *shlex.split(BASE)[1:], "-F", "9"],
    ):
        proc = run_kiln(tmp_path, "bench", *argv)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("error:") == 1 and proc.stdout == ""
    assert "error: kiln bench problem: conv: -F cannot be mapped" in proc.stderr
    assert (
        "expected: 1 (forward), 2 (backward data), 4 (weights), a sum of them, or 0 (all three)"
        "\n  found: 9"
    ) in proc.stderr


def test_bench_help_shows_driver_lines_and_the_commands_file(tmp_path):
    proc = run_kiln(tmp_path, "bench", "--help")
    assert proc.returncode == 0
    assert "--commands FILE" in proc.stdout and "a MIOpen/Fusilli driver line" in proc.stdout
    assert "--stride 2,1,1" in proc.stdout
    line = run_kiln(tmp_path, "bench", "problem:", "matmul", "--help")
    assert line.returncode == 0 and "--transA" in line.stdout and "-M M, --m M" in line.stdout
