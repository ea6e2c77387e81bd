"""`kiln run KERNEL`: build one instance, run it on seeded inputs, print its outputs."""

from tests.conftest import run_kiln

NAN_KERNEL = """\
from kiln import Tensor, device


@device
def broken_log(x: Tensor["N"]):  # noqa: F821
    return (x - 5.0).log()  # every seeded input is below 5: all NaN
"""


def test_an_output_with_no_finite_value_is_described_not_a_traceback(project):
    (project / "kernels" / "broken.py").write_text(NAN_KERNEL)
    pipe = project / "pipeline.yaml"
    pipe.write_text(
        pipe.read_text().replace("kernels:\n", "kernels:\n  broken_log:\n    shapes: {N: 64}\n", 1)
    )
    proc = run_kiln(project, "run", "broken_log", "--target", "cpu")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "  out 0: f32[64]  (no finite values)" in proc.stdout


def test_save_outputs_onto_a_file_is_refused_before_anything_builds(project):
    (project / "afile").write_text("a file, not a directory")
    proc = run_kiln(project, "run", "vector_add", "--target", "cpu", "--save-outputs", "afile")
    assert proc.returncode == 2 and "--save-outputs: afile is a file" in proc.stderr
    assert "expected: a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert "tasks:" not in proc.stdout and not (project / "build").exists()
