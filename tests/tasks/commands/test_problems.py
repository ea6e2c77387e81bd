"""`kiln bench problem:NAME`: built-in problems timed without a pipeline.yaml entry."""

from __future__ import annotations

import csv
import io

import pytest

from kiln.errors import KilnError
from kiln.lang import trace
from kiln.tasks.commands.problems import PROBLEMS, bench_problem, make_kernel, parse
from tests.conftest import run_kiln


@pytest.mark.parametrize(
    "argv",
    [
        ["problem:gemm", "-M", "8", "-N", "4", "-K", "6"],
        ["problem:layernorm", "-M", "4", "-N", "8"],
        ["problem:softmax", "-M", "4", "-N", "8"],
        ["problem:attention", "-B", "2", "-S", "4", "-D", "8"],
        ["problem:conv", "--dims", "1", "-C", "3", "-W", "9", "-K", "4", "-S", "3"],
        ["problem:conv", "--layout", "nchw", "-C", "4", "-H", "6", "-W", "5", "-K", "4",
         "--groups", "2", "--stride", "2", "--pad", "same", "--mode", "dgrad"],
        ["problem:conv", "--dims", "3", "--layout", "ndhwc", "-C", "2", "-D", "3", "-H", "4",
         "-W", "4", "-K", "2", "-T", "2", "-R", "2", "-S", "2", "--mode", "wgrad"],
    ],
)  # fmt: skip
def test_every_problem_times_on_cpu_with_nominal_flops(argv):
    name, args = parse([*argv, "--iter", "1", "--warmup", "0"])
    (row,) = bench_problem(name, args)
    assert row["target"] == "cpu" and row["median_ms"] > 0 and row["gflops"] > 0


def test_conv_problem_shapes_follow_the_layout():
    _, args = parse(["problem:conv", "--layout", "nchw", "-N", "2", "-C", "4", "-H", "6",
                     "-W", "6", "-K", "8", "--mode", "wgrad"])  # fmt: skip
    problem = PROBLEMS["conv"](args)
    kernel = make_kernel("conv", problem.body, problem.shapes)
    graph = trace(kernel, {}, "f32")
    assert [a.shape for a in graph.args] == [(2, 4, 6, 6), (2, 8, 4, 4)]
    assert graph.output_nodes[0].shape == (8, 4, 3, 3)  # K, C, R, S
    assert problem.flops == 2.0 * 2 * 8 * 4 * 16 * 9


def test_unknown_problem_lists_the_known_ones():
    with pytest.raises(KilnError, match="problem:conv, problem:gemm"):
        parse(["problem:fft"])


def test_cli_bench_problem_end_to_end(tmp_path):
    proc = run_kiln(
        tmp_path, "bench", "problem:gemm", "-M", "16", "-N", "8", "-K", "4",
        "--iter", "2", "--output-format", "csv",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert row["problem"] == "gemm 16x8x4" and float(row["gflops"]) > 0
    bad = run_kiln(tmp_path, "bench", "problem:conv", "--mode", "sideways")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    sim = run_kiln(tmp_path, "bench", "problem:softmax", "--target", "sim")
    assert sim.returncode == 2 and "sim (inside a project)" in sim.stderr
    assert "Traceback" not in bad.stderr + sim.stderr


def test_a_problem_times_one_target_and_says_so_when_given_two():
    assert parse(["problem:gemm", "--target", "sim", "--target", "sim"])[1].target == "sim"
    assert parse(["problem:gemm"])[1].target == "cpu"
    with pytest.raises(KilnError) as info:
        parse(["problem:gemm", "--target", "cpu", "--target", "iree-cpu"])
    text = info.value.render()
    assert "times one target at a time" in text and "--target cpu --target iree-cpu" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["problem:gemm", "-M", "0"], "kiln bench problem:gemm: -M must be at least 1"),
        (["problem:gemm", "-K", "-5"], "kiln bench problem:gemm: -K must be at least 1"),
        (["problem:softmax", "-N", "0"], "problem:softmax: -N must be at least 1"),
        (["problem:attention", "-S", "0"], "problem:attention: -S must be at least 1"),
        (["problem:conv", "--groups", "0"], "problem:conv: --groups must be at least 1"),
        (["problem:conv", "--stride", "0"], "problem:conv: --stride must be at least 1"),
        (["problem:conv", "--pad", "abc"], "problem:conv: --pad: cannot read 'abc'"),
        (["problem:gemm", "--iter", "0"], "--iter must be at least 1"),
        (["problem:gemm", "--warmup", "-1"], "--warmup must be at least 0"),
        (["problem:gemm", "--device", "-1"], "--device must be at least 0"),
    ],
)
def test_problem_flags_out_of_range_are_refused_before_timing(argv, message):
    with pytest.raises(KilnError) as info:
        parse(argv)
    assert message in info.value.render()


def test_cli_problem_sizes_zero_or_too_large_exit_2_without_a_traceback(tmp_path):
    zero = run_kiln(tmp_path, "bench", "problem:conv", "-N", "0")
    assert zero.returncode == 2 and "error: kiln bench problem:conv: -N must be at least 1" in (
        zero.stderr
    )
    huge = run_kiln(tmp_path, "bench", "problem:gemm", "-M", "100000", "-N", "100000")
    assert huge.returncode == 2
    assert huge.stderr.startswith(
        "error: kiln bench problem:gemm: a tensor of shape (100000, 100000) (f32) would take "
        "37 GiB\n  expected: at most 4 GiB per tensor"
    ), huge.stderr  # no line of Kiln's own problem bodies: the sizes are the user's
    assert "problems.py" not in huge.stderr
    warm = run_kiln(tmp_path, "bench", "problem:gemm", "--warmup", "-1")
    assert warm.returncode == 2 and "error: --warmup must be at least 0" in warm.stderr
    for proc in (zero, huge, warm):
        assert "Traceback" not in proc.stderr


def test_stride_pad_and_dilation_take_one_value_per_spatial_dim():
    _, args = parse(["problem:conv", "--dims", "3", "--layout", "ndhwc", "-N", "1", "-C", "2",
                     "-D", "8", "-H", "6", "-W", "6", "-K", "4", "--stride", "2,1,1",
                     "--pad", "1,0,0", "--dilation", "1,2,1"])  # fmt: skip
    assert (args.stride, args.pad, args.dilation) == ((2, 1, 1), (1, 0, 0), (1, 2, 1))
    problem = PROBLEMS["conv"](args)
    graph = trace(make_kernel("conv", problem.body, problem.shapes), {}, "f32")
    # depth (8 + 2 - 3) // 2 + 1 = 4; height 6 - 2*2 = 2; width 6 - 2 = 4
    assert graph.output_nodes[0].shape == (1, 4, 2, 4, 4)
    assert problem.label == "conv3d-fwd ndhwc N1 C2 8x6x6 K4 f3x3x3 s2,1,1 p1,0,0 d1,2,1"
    assert parse(["problem:conv", "--stride", "2"])[1].stride == (2,)  # every dim


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stride", "2,1,1"], "--stride has 3 values for a 2-D convolution"),
        (["--dilation", "1,0"], "--dilation must be at least 1"),
        (["--pad", "1,-1"], "--pad must be at least 0"),
        (["--stride", "same"], "--stride: cannot read 'same'"),
    ],
)
def test_per_dim_values_that_do_not_fit_are_refused_naming_the_flag(argv, message):
    with pytest.raises(KilnError, match=message):
        parse(["problem:conv", *argv])


def test_cli_3d_conv_with_depth_stride_2_and_height_width_stride_1(tmp_path):
    proc = run_kiln(tmp_path, "bench", "problem:conv", "--dims", "3", "-C", "2", "-D", "5",
                    "-H", "4", "-W", "4", "-K", "2", "--stride", "2,1,1", "--pad", "1",
                    "--iter", "1", "--output-format", "csv")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert row["problem"] == "conv3d-fwd nhwc N1 C2 5x4x4 K2 f3x3x3 s2,1,1 p1,1,1"
    # out 3x4x4, 2 filters of 2x27 taps, 2 flops per multiply-add
    flops = 2.0 * 1 * 2 * 2 * (3 * 4 * 4) * 27
    assert float(row["gflops"]) == pytest.approx(flops / float(row["median_ms"]) / 1e6)
