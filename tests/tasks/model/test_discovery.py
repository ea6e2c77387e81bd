"""Kernel discovery reads source with ast: no kernel module is imported."""

from __future__ import annotations

import sys
from pathlib import Path

from kiln.tasks.model.discovery import Discovery, package_files, scan_module


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


KERNELS = """
import kiln
from kiln import Tensor, device
from . import helpers
from .helpers import scale as sc

@device
def gemm(a: Tensor["M", "K"], b: Tensor["K", "N"]):
    return a @ b

@kiln.device
def fixed(x: Tensor[4, "N"], y):
    return x

def not_a_kernel(a):
    return a
"""


def test_scan_finds_device_functions_dims_and_imports(tmp_path):
    f = write(tmp_path / "pkg" / "ops.py", KERNELS)
    info = scan_module("pkg.ops", f)
    assert [k.name for k in info.kernels] == ["gemm", "fixed"]
    gemm, fixed = info.kernels
    assert gemm.params == (("a", ("M", "K")), ("b", ("K", "N")))
    assert gemm.path == "pkg.ops.gemm" and gemm.line == 8
    assert fixed.params == (("x", (4, "N")), ("y", None))
    assert "pkg.helpers" in info.imports and "pkg.helpers.scale" in info.imports
    assert "kiln" in info.imports


def test_scan_does_not_import_the_module(tmp_path):
    f = write(tmp_path / "boom" / "k.py", "raise SystemExit('imported!')\n" + KERNELS)
    info = scan_module("boom.k", f)
    assert len(info.kernels) == 2
    assert "boom.k" not in sys.modules


def test_syntax_error_is_reported_not_raised(tmp_path):
    f = write(tmp_path / "bad.py", "def broken(:\n")
    info = scan_module("bad", f)
    assert info.kernels == () and "line 1" in info.syntax_error


def test_package_files_walks_subpackages_in_order(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "b.py", "")
    write(tmp_path / "pkg" / "a.py", "")
    write(tmp_path / "pkg" / "sub" / "__init__.py", "")
    write(tmp_path / "pkg" / "sub" / "c.py", "")
    names = [m for m, _ in package_files(tmp_path, "pkg")]
    assert names == ["pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"]
    assert [m for m, _ in package_files(tmp_path, "pkg.a")] == ["pkg.a"]
    assert package_files(tmp_path, "missing") == []


def test_source_files_follow_project_imports_transitively(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "ops.py", KERNELS)
    write(tmp_path / "pkg" / "helpers.py", "from pkg import consts\n")
    write(tmp_path / "pkg" / "consts.py", "import numpy\n")
    d = Discovery(tmp_path)
    files = [Path(f).name for f in d.source_files("pkg.ops")]
    assert files == ["__init__.py", "consts.py", "helpers.py", "ops.py"]


def test_source_files_include_every_package_init_on_the_way(tmp_path):
    """Importing pkg.sub.ops runs pkg/__init__.py and pkg/sub/__init__.py: both are inputs."""
    write(tmp_path / "pkg" / "__init__.py", "import sys\n")
    write(tmp_path / "pkg" / "sub" / "__init__.py", "")
    write(tmp_path / "pkg" / "sub" / "ops.py", KERNELS)
    d = Discovery(tmp_path)
    files = [str(Path(f).relative_to(tmp_path)) for f in d.source_files("pkg.sub.ops")]
    assert files == ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/ops.py"]


def test_cache_is_reused_until_the_file_changes(tmp_path):
    f = write(tmp_path / "pkg" / "ops.py", KERNELS)
    write(tmp_path / "pkg" / "__init__.py", "")
    cache = tmp_path / "state" / "discovery.json"
    first = Discovery(tmp_path, cache)
    first.scan_packages(("pkg",))
    first.save()
    assert cache.is_file()
    second = Discovery(tmp_path, cache)
    infos = second.scan_packages(("pkg",))
    assert not second._dirty  # every file came from the cache
    assert [k.name for i in infos for k in i.kernels] == ["gemm", "fixed"]
    f.write_text(KERNELS + "\n@device\ndef extra(a: Tensor['N']):\n    return a\n")
    third = Discovery(tmp_path, cache)
    names = [k.name for i in third.scan_packages(("pkg",)) for k in i.kernels]
    assert names == ["gemm", "fixed", "extra"] and third._dirty


def test_a_file_replaced_by_one_of_the_same_size_and_mtime_is_scanned_again(tmp_path):
    import os

    f = write(tmp_path / "pkg" / "ops.py", KERNELS)
    write(tmp_path / "pkg" / "__init__.py", "")
    cache = tmp_path / "state" / "discovery.json"
    first = Discovery(tmp_path, cache)
    assert [k.name for i in first.scan_packages(("pkg",)) for k in i.kernels] == ["gemm", "fixed"]
    first.save()
    st = f.stat()
    renamed = KERNELS.replace("def fixed(", "def fixxd(")
    assert len(renamed) == len(KERNELS)
    other = tmp_path / "ops.py.new"
    other.write_text(renamed)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, f)  # same size, same mtime: only inode and ctime differ
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = Discovery(tmp_path, cache)
    assert [k.name for i in second.scan_packages(("pkg",)) for k in i.kernels] == ["gemm", "fixxd"]


HEADER = "# ruff: noqa: F821\nfrom kiln import Tensor, device\n\n\n"
BLANK_DIM = (
    HEADER
    + """\
@device
def blank(x: Tensor["N", ""], y: Tensor["n m", 0, 4]):
    return x
"""
)
STAR_ARGS = (
    HEADER
    + """\
@device
def addall(*xs: Tensor["N"], scale: Tensor[()], **kw: Tensor["M"]):
    return xs[0]
"""
)


def test_bad_dims_are_left_out_and_star_parameters_are_kept(tmp_path):
    """A dim Tensor[...] refuses is not asked of pipeline.yaml (the import names it at the
    annotation), and the dims of *args or keyword-only parameters count as used."""
    (blank,) = scan_module("blank", write(tmp_path / "blank.py", BLANK_DIM)).kernels
    (addall,) = scan_module("star", write(tmp_path / "star.py", STAR_ARGS)).kernels
    assert blank.params == (("x", ("N",)), ("y", (4,)))
    assert addall.params == (("xs", ("N",)), ("scale", ()), ("kw", ("M",)))


def test_compile_names_the_annotation_and_the_star_argument(tmp_path):
    from tests.conftest import run_kiln

    write(tmp_path / "kernels" / "__init__.py", "")
    write(tmp_path / "kernels" / "blank.py", BLANK_DIM)
    write(tmp_path / "kernels" / "star.py", STAR_ARGS)
    write(
        tmp_path / "pipeline.yaml",
        "project: p\npackages: [kernels]\nkernels:\n"
        "  blank: {shapes: {s: {N: 4}}}\n  addall: {shapes: {s: {N: 4, M: 2}}}\n"
        "targets:\n  cpu: {runner: cpu}\n",
    )
    proc = run_kiln(tmp_path, "compile")
    err = proc.stderr
    assert proc.returncode == 1, err
    assert "warning" not in err and "pipeline.yaml" not in err and "Traceback" not in err, err
    assert (
        "kernels/blank.py:6:14: error: importing kernel module 'kernels.blank' failed: "
        "TypeError: Tensor[...] dims must be names like 'N' or positive ints, got ''" in err
    )
    assert (
        "kernels/star.py:6: error: argument 'xs' of kernel 'addall' is *args/**kwargs: "
        "kernels take named tensors" in err
    )
    assert "found: *xs" in err
