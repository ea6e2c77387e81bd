"""The static reachability scan: which kernels an app can call, and why."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kiln.errors import KilnError
from kiln.tasks.model.reach import Reachability, has_main
from tests.conftest import ran_tasks, run_kiln

KERNELS = {
    "kernels/__init__.py": "from .linalg import gemm as reexported_gemm\n",
    "kernels/linalg.py": """
        from kiln import Tensor, device

        @device
        def gemm(a: Tensor["M", "K"], b: Tensor["K", "N"]):
            return a @ b

        @device
        def gemm_bias_relu(a: Tensor["M", "K"], b: Tensor["K", "N"], bias: Tensor["N"]):
            return (a @ b + bias).relu()
        """,
    "kernels/normalization.py": """
        from kiln import Tensor, device

        @device
        def softmax(x: Tensor["R", "C"]):
            e = (x - x.max(axis=-1, keepdims=True)).exp()
            return e / e.sum(axis=-1, keepdims=True)

        @device
        def layernorm(x: Tensor["R", "C"]):
            return x - x.mean(axis=-1, keepdims=True)
        """,
    "kernels/elementwise.py": """
        from kiln import Tensor, device

        @device
        def vector_add(a: Tensor["N"], b: Tensor["N"]):
            return a + b
        """,
}


def tree(root: Path, files: dict[str, str]) -> Reachability:
    for rel, text in {**KERNELS, "apps/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return Reachability(root)


def reached(root: Path, files: dict[str, str], app: str = "apps.app") -> dict[str, str]:
    """kernel path -> reason, for the app in ``files``."""
    scan = tree(root, files)
    return {r.kernel.path: r.reason(scan.root) for r in scan.reach(app)}


def test_direct_from_import_call(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/app.py": """
                from kernels.linalg import gemm

                def main():
                    return gemm(1, 2)
                """
        },
    )
    assert found == {"kernels.linalg.gemm": "called at apps/app.py:4"}


def test_from_import_as_alias(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/app.py": """
                from kernels.normalization import softmax as row_softmax

                def main():
                    return row_softmax(x)
                """
        },
    )
    assert list(found) == ["kernels.normalization.softmax"]


def test_module_alias_and_module_attributes(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/app.py": """
                import kernels.linalg as la
                import kernels.normalization
                from kernels import elementwise

                def main():
                    a = la.gemm(x, y)
                    b = kernels.normalization.softmax(a)
                    return elementwise.vector_add(a, b)
                """
        },
    )
    assert set(found) == {
        "kernels.linalg.gemm",
        "kernels.normalization.softmax",
        "kernels.elementwise.vector_add",
    }
    assert found["kernels.linalg.gemm"] == "called at apps/app.py:6"


def test_unused_kernels_of_imported_modules_are_not_reached(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/app.py": """
                from kernels import linalg, normalization

                def unused():
                    return normalization.layernorm(x)

                def main():
                    return linalg.gemm(x, y)
                """
        },
    )
    assert list(found) == ["kernels.linalg.gemm"]


def test_kernels_passed_as_values(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/app.py": """
                from kernels.linalg import gemm
                from kernels.normalization import softmax, layernorm
                from kernels.elementwise import vector_add

                def apply(fn, *args):
                    return fn(*args)

                def main():
                    ops = [gemm, softmax]
                    table = {"norm": layernorm}
                    return apply(fn=vector_add), ops, table
                """
        },
    )
    assert set(found) == {
        "kernels.linalg.gemm",
        "kernels.normalization.softmax",
        "kernels.normalization.layernorm",
        "kernels.elementwise.vector_add",
    }
    assert found["kernels.linalg.gemm"] == "used as a value at apps/app.py:9"


def test_helper_in_another_project_module_names_the_path(tmp_path):
    found = reached(
        tmp_path,
        {
            "models/__init__.py": "",
            "models/layers.py": """
                from kernels.linalg import gemm_bias_relu
                from kernels.normalization import layernorm

                def dense(x, w, b):
                    return gemm_bias_relu(x, w, b)

                def norm(x):  # never called by the app
                    return layernorm(x)
                """,
            "apps/app.py": """
                import numpy as np
                from models import layers

                def main():
                    x = np.ones((2, 2))
                    return layers.dense(x, x, x[0])
                """,
        },
    )
    assert found == {
        "kernels.linalg.gemm_bias_relu": (
            "reached from apps/app.py:6 via models.layers.dense (models/layers.py:5)"
        )
    }


def test_module_level_values_reach_only_when_named(tmp_path):
    found = reached(
        tmp_path,
        {
            "models/__init__.py": "",
            "models/registry.py": """
                from kernels.linalg import gemm
                from kernels.normalization import softmax

                OPS = [gemm]
                UNUSED = [softmax]
                """,
            "apps/app.py": """
                from models.registry import OPS

                def main():
                    return [op for op in OPS]
                """,
        },
    )
    assert list(found) == ["kernels.linalg.gemm"]
    assert "via models.registry.OPS" in found["kernels.linalg.gemm"]


def test_reexport_relative_import_and_local_helper(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/common.py": """
                from kernels import reexported_gemm

                def project(x, w):
                    return reexported_gemm(x, w)
                """,
            "apps/app.py": """
                from .common import project as proj

                def layer(x):
                    return proj(x, x)

                def main():
                    return layer(1)
                """,
        },
    )
    assert found == {
        "kernels.linalg.gemm": (
            "reached from apps/app.py:7 via apps.app.layer -> apps.common.project "
            "(apps/common.py:4)"
        )
    }


def test_main_imported_from_another_module_is_an_entry(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/impl.py": """
                from kernels.normalization import softmax

                def main():
                    return softmax(1)
                """,
            "apps/app.py": "from .impl import main\n",
        },
    )
    assert found == {"kernels.normalization.softmax": "called at apps/impl.py:4"}


def test_import_time_code_and_function_local_imports(tmp_path):
    found = reached(
        tmp_path,
        {
            "models/__init__.py": "",
            "models/warm.py": """
                from kernels.elementwise import vector_add

                WARM = vector_add(1.0, 2.0)  # runs when the module is imported
                """,
            "apps/app.py": """
                import models.warm

                def main():
                    from kernels.normalization import softmax as sm
                    return sm(1)
                """,
        },
    )
    assert set(found) == {"kernels.elementwise.vector_add", "kernels.normalization.softmax"}
    assert found["kernels.elementwise.vector_add"].startswith("reached from apps/app.py:1 via")


def test_dynamic_lookup_is_invisible_to_the_scan(tmp_path):
    found = reached(
        tmp_path,
        {
            "apps/app.py": """
                import importlib
                import kernels.linalg as la

                def main():
                    fn = getattr(la, "gemm")
                    return importlib.import_module("kernels.normalization").softmax(fn(1, 2))
                """
        },
    )
    assert found == {}


def test_outside_modules_and_kiln_itself_are_not_followed(tmp_path):
    scan = tree(tmp_path, {"apps/app.py": "import numpy\nfrom kiln import device\n"})
    assert scan.module_file("numpy") is None and scan.module_file("kiln") is None
    assert scan.reach("apps.app") == []
    # Kiln's own checkout as a project root: its packages are not app code
    repo = Reachability(Path(__file__).resolve().parents[3])
    assert repo.module_file("kiln.lang") is None and repo.module_file("kernels") is not None


def test_main_and_syntax_errors(tmp_path):
    scan = tree(
        tmp_path,
        {"apps/app.py": "def run(): pass\n", "apps/other.py": "from .impl import main\n"},
    )
    assert not has_main(scan, "apps.app") and has_main(scan, "apps.other")
    (tmp_path / "apps" / "bad.py").write_text("def main(:\n")
    with pytest.raises(KilnError) as info:
        Reachability(tmp_path).reach("apps.bad")
    assert "bad.py" in info.value.location.file and info.value.location.line == 1


DYN_PIPELINE_APPS = """
apps:
  dyn:
    module: apps.dyn
"""


def test_a_dynamic_call_is_compiled_on_first_use_with_a_warning(project):
    """Only the JIT path sees `getattr(module, name)(...)`: it compiles and names the call site."""
    (project / "apps").mkdir()
    (project / "apps" / "__init__.py").write_text("")
    (project / "apps" / "dyn.py").write_text(
        textwrap.dedent(
            """
            import importlib

            import numpy as np

            from kernels.normalization import softmax


            def main():
                fn = getattr(importlib.import_module("kernels.linalg"), "gemm")
                a = np.ones((8, 32), np.float32)
                p = softmax(np.ones((4, 10)))
                return fn(a, np.ones((32, 4), np.float32)), p, softmax(p)
            """
        ).lstrip()
    )
    pipe = project / "pipeline.yaml"
    pipe.write_text(pipe.read_text() + DYN_PIPELINE_APPS)
    proc = run_kiln(project, "run", "dyn", "--target", "sim", check=True)
    assert "reaches 1 kernel:" in proc.stdout and "softmax -> softmax.small" in proc.stdout
    assert (
        "warning: apps/dyn.py:12: this call of gemm (M=8, K=32, N=4) was not seen by the "
        "static scan of app 'dyn'; compiled on first use as gemm.jit_M8_K32_N4"
    ) in proc.stderr
    for line in (11, 12):  # an unseen shape: one warning per call site, one compile
        assert (
            f"warning: apps/dyn.py:{line}: softmax is called at R=4, C=10, which no shape set "
            "of pipeline.yaml declares; compiled on first use as softmax.jit_R4_C10"
        ) in proc.stderr
    assert sorted(ran_tasks(proc)) == [  # one compile task per instance, each run once
        "compile:gemm.jit_M8_K32_N4",
        "compile:softmax.jit_R4_C10",
        "compile:softmax.small",
    ]
    assert (project / "build/kiln/kernel/gemm/jit_M8_K32_N4/kernel.edf").is_file()
    assert "out 0: f32[8, 4]  min 32  max 32" in proc.stdout
    assert "call softmax.jit_R4_C10: 2x" in proc.stdout
    again = run_kiln(project, "run", "dyn", "--target", "sim", check=True)
    assert ran_tasks(again) == [] and again.stderr.count("compiled on first use") == 3
