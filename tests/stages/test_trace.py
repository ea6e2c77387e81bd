"""The trace stage: run from a TraceRequest, artifact round trip, errors that name files."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kiln.errors import ArtifactError, TraceError, VerifyError
from kiln.fsutil import write_bytes_atomic
from kiln.ir.graph import Graph, Node, TensorType
from kiln.ir.interp import run_graph
from kiln.stages import trace as stage

GEMM = stage.TraceRequest(
    module="kernels.linalg", function="gemm", bindings=(("M", 4), ("K", 3), ("N", 2))
)


def test_stage_protocol_constants():
    assert stage.NAME == "trace"
    assert stage.ARTIFACT == "graph.json"
    assert stage.Options() == stage.Options()
    assert set(stage.DUMPS) == {"dfg"}


def test_run_traces_the_named_kernel():
    g = stage.run(GEMM, stage.Options(), None)
    assert g.name == "gemm"
    assert [a.shape for a in g.args] == [(4, 3), (3, 2)]
    assert g.bindings == (("K", 3), ("M", 4), ("N", 2))
    stage.verify(g, None)


def test_per_argument_dtypes_and_default():
    request = stage.TraceRequest(
        module="kernels.linalg",
        function="gemm_bias_relu",
        bindings=(("M", 2), ("K", 2), ("N", 2)),
        dtypes=(("bias", "f16"),),
        default_dtype="bf16",
    )
    g = stage.run(request, stage.Options(), None)
    assert [a.dtype for a in g.args] == ["bf16", "bf16", "f16"]
    assert g.output_nodes[0].dtype == "f32"  # bf16 + f16 -> f32


def test_serialize_read_round_trip(tmp_path):
    g = stage.run(GEMM, stage.Options(), None)
    path = tmp_path / stage.ARTIFACT
    path.write_bytes(stage.serialize(g))
    assert stage.read(path) == g
    assert stage.serialize(stage.read(path)) == path.read_bytes()


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b"[1, 2]", b'{"format": "kiln.graph/1"}', b'{"format": "other"}'],
)
def test_corrupt_artifact_is_an_artifact_error_naming_the_file(tmp_path, content):
    path = tmp_path / "graph.json"
    path.write_bytes(content)
    with pytest.raises(ArtifactError) as info:
        stage.read(path)
    assert info.value.location.file == str(path)
    assert str(path) in info.value.render()


def test_truncated_artifact_is_an_artifact_error(tmp_path):
    data = stage.serialize(stage.run(GEMM, stage.Options(), None))
    path = tmp_path / "graph.json"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="corrupt graph artifact"):
        stage.read(path)


def test_missing_artifact_is_an_artifact_error(tmp_path):
    with pytest.raises(ArtifactError, match="cannot read"):
        stage.read(tmp_path / "nope.json")


def test_verify_names_the_stage():
    t = TensorType((2,), "f32")
    bad = Graph(
        "bad",
        (
            Node(0, "arg", (), t, (("index", 0), ("name", "x"))),
            Node(1, "exp", (0,), TensorType((3,), "f32")),
        ),
        (1,),
    )
    with pytest.raises(VerifyError, match="stage 'trace'"):
        stage.verify(bad, None)


def test_dfg_dump_writes_graph_json(tmp_path):
    g = stage.run(GEMM, stage.Options(), None)
    path = tmp_path / "dumps" / "dfg.json"
    stage.DUMPS["dfg"](g, path, None)
    assert path.read_bytes() == g.to_json()


# -- kernels in a temporary project -------------------------------------------------------
@pytest.fixture
def project(tmp_path, monkeypatch):
    """A package ``tk_<test>`` on sys.path; write modules into it with ``write``."""
    package = f"tk_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> tuple[str, Path]:
        path = tmp_path / package / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        return f"{package}.{name}", path

    yield write
    for mod in [m for m in sys.modules if m.startswith(package)]:
        del sys.modules[mod]


def request(module: str, function: str = "k") -> stage.TraceRequest:
    return stage.TraceRequest(module=module, function=function, bindings=(("N", 4),))


GOOD = """\
from kiln import Tensor, device


@device
def k(x: Tensor["N"]):
    return x + 1.0


def helper(x):
    return x
"""


def test_missing_function_is_a_trace_error_listing_kernels(project):
    module, path = project("good", GOOD)
    with pytest.raises(TraceError) as info:
        stage.run(request(module, "nope"), stage.Options(), None)
    assert "has no kernel 'nope'" in info.value.message
    assert "k" in info.value.expected
    assert info.value.location.file == str(path)


def test_plain_function_is_a_trace_error_at_its_def(project):
    module, path = project("good", GOOD)
    with pytest.raises(TraceError, match="not a @device function") as info:
        stage.run(request(module, "helper"), stage.Options(), None)
    assert (info.value.location.file, info.value.location.line) == (str(path), 9)


def test_syntax_error_points_at_the_module_line(project):
    module, path = project("broken_syntax", "from kiln import device\n\nx = (1,\ny = 2 +\n")
    with pytest.raises(TraceError, match="syntax error") as info:
        stage.run(request(module), stage.Options(), None)
    assert info.value.location.file == str(path)
    assert info.value.location.line in (3, 4)


def test_import_error_points_at_the_import_line(project):
    module, path = project("bad_import", "import kiln\nimport no_such_module_kiln_test\n")
    with pytest.raises(TraceError, match="no_such_module_kiln_test") as info:
        stage.run(request(module), stage.Options(), None)
    assert info.value.location.file == str(path)
    assert info.value.location.line == 2
    assert info.value.location.source == "import no_such_module_kiln_test"


def test_an_import_error_is_one_cause_whichever_kernel_meets_it(project):
    """Its source line may name one of the module's kernels (`def bad(a: Tensor["N", 0])`):
    the failures of every kernel of the module still group as one error."""
    from kiln.tasks.chain.failure_groups import cause_key

    text = (
        'from kiln import Tensor, device\n\n\n@device\ndef bad(a: Tensor["N", 0]):\n    return a\n'
    )
    module, _ = project("names_a_kernel", text)
    with pytest.raises(TraceError) as info:
        stage.run(request(module, "bad"), stage.Options(), None)
    diag = info.value.to_dict()
    assert info.value.cause == info.value.message
    assert cause_key("compile:good.s", diag) == cause_key("compile:bad.s", diag)


def test_missing_module_is_a_trace_error(project):
    with pytest.raises(TraceError, match="not found"):
        stage.run(request("no_such_pkg_kiln.kernels"), stage.Options(), None)


def test_edited_module_is_reimported(project):
    module, path = project("edited", GOOD)
    first = stage.run(request(module), stage.Options(), None)
    path.write_text(GOOD.replace("x + 1.0", "x * 3.0"))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = stage.run(request(module), stage.Options(), None)
    assert [n.op for n in first.nodes][-1] == "add"
    assert [n.op for n in second.nodes][-1] == "mul"


def test_a_save_during_the_import_is_seen_by_the_next_trace(project):
    # the module's body saves a new version of its file while it runs, as an editor
    # saving mid-build would: the next trace must import that version
    saves = """\
import os
from pathlib import Path

_path = Path(__file__)
_text = _path.read_text()
if "EDIT" + "-ME" in _text:
    _path.write_text(_text.replace("x + 1.0  # EDIT" + "-ME", "x * 3.0"))
    _st = _path.stat()
    os.utime(_path, ns=(_st.st_atime_ns, _st.st_mtime_ns + 1_000_000_000))
"""
    module, _ = project("saved_mid_import", saves + GOOD.replace("x + 1.0", "x + 1.0  # EDIT-ME"))
    first = stage.run(request(module), stage.Options(), None)
    second = stage.run(request(module), stage.Options(), None)
    assert [n.op for n in first.nodes][-1] == "add"
    assert [n.op for n in second.nodes][-1] == "mul"


def test_threads_tracing_one_module_wait_for_its_import(project):
    # the module sits in sys.modules before its body has run; a second thread
    # must not read it half-run (a Dask build taking chains back to run locally)
    slow = "import time\ntime.sleep(0.3)\n" + GOOD
    module, _ = project("slow_import", slow)
    graphs, errors = [], []

    def trace() -> None:
        try:
            graphs.append(stage.run(request(module), stage.Options(), None))
        except TraceError as exc:
            errors.append(exc.message)

    threads = [threading.Thread(target=trace) for _ in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(graphs) == 4 and all(g == graphs[0] for g in graphs)


def test_traced_graph_runs_like_the_kernel(project):
    module, _ = project("good", GOOD)
    g = stage.run(request(module), stage.Options(), None)
    x = np.arange(4, dtype=np.float32)
    assert run_graph(g, [x])[0].tolist() == [1, 2, 3, 4]


# -- atomic writes ----------------------------------------------------------------------------
def test_write_bytes_atomic_skips_identical_content(tmp_path):
    path = tmp_path / "sub" / "a.json"
    assert write_bytes_atomic(path, b"one") is True
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 5_000_000_000))
    old = path.stat().st_mtime_ns
    assert write_bytes_atomic(path, b"one") is False
    assert path.stat().st_mtime_ns == old  # untouched: later stages stay up to date
    assert write_bytes_atomic(path, b"two") is True
    assert path.read_bytes() == b"two"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temp files left


def test_write_bytes_atomic_respects_umask(tmp_path):
    path = tmp_path / "b.json"
    old = os.umask(0o022)
    try:
        write_bytes_atomic(path, b"x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
