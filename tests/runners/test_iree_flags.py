"""Which flags and lowering the iree target picks for the host (runners/iree_flags.py)."""

from __future__ import annotations

import pytest

from kiln.runners.iree_flags import LLVM_CPU_FLAGS, HostCpu, llvm_cpu_flags, widened

ZEN4 = HostCpu.parse("znver4", "+avx2,+avx512f,+mwaitx,+avx512bf16,-avx512fp16,-mwaitx")
HASWELL = HostCpu.parse("haswell", "+avx2,+fma,-avx512f")


def test_host_features_are_deduplicated_later_entries_winning_and_sorted():
    assert ZEN4.features == "+avx2,+avx512bf16,+avx512f,-avx512fp16,-mwaitx"
    assert ZEN4.has("avx512bf16") and not ZEN4.has("mwaitx") and not ZEN4.has("avx512fp16")


def test_flags_name_the_cpu_and_its_features_not_host():
    flags = llvm_cpu_flags(ZEN4)
    assert flags[:2] == [
        "--iree-llvmcpu-target-cpu=znver4",
        "--iree-llvmcpu-target-cpu-features=" + ZEN4.features,
    ]
    assert flags[2:] == list(LLVM_CPU_FLAGS) and not any("host" in f for f in flags)
    assert llvm_cpu_flags(None)[0] == "--iree-llvmcpu-target-cpu=host"  # unresolved


@pytest.mark.parametrize(
    "device, opt, cpu, want",
    [
        ("llvm-cpu", True, ZEN4, ("f16",)),  # AVX-512 BF16 multiplies bf16 natively
        ("llvm-cpu", True, HASWELL, ("bf16", "f16")),
        ("llvm-cpu", True, None, ("bf16", "f16")),
        ("llvm-cpu", False, ZEN4, ("bf16", "f16")),  # opt: false is a generic CPU
        ("cuda", True, None, ()),
        ("rocm", True, None, ()),
    ],
)
def test_half_types_are_widened_where_the_target_multiplies_them_slowly(device, opt, cpu, want):
    assert widened(device, opt, cpu) == want


def test_the_vmfb_key_holds_the_resolved_cpu():
    pytest.importorskip("iree.compiler", reason="needs the 'iree' extra")
    from kiln.runners.iree import IreeOptions, resolved_flags
    from kiln.runners.iree_flags import host_cpu

    cpu = host_cpu()
    assert cpu is not None and cpu.name not in ("", "host", "generic")
    flags = resolved_flags(IreeOptions())
    assert f"--iree-llvmcpu-target-cpu={cpu.name}" in flags
    assert not any(f.endswith("=host") for f in flags)
    assert resolved_flags(IreeOptions(opt=False))[0] == "--iree-llvmcpu-target-cpu=generic"


def test_a_cpu_named_in_flags_replaces_the_host_and_widens_both_halves():
    """Kiln knows nothing of that CPU's features: no host flags, every half type widened."""
    from kiln.ir.graph import Graph, Node, TensorType, make_attrs
    from kiln.runners.iree import IreeOptions, lower, resolved_flags

    options = IreeOptions(flags=("--iree-llvmcpu-target-cpu=znver3",))
    assert resolved_flags(options) == [*LLVM_CPU_FLAGS, "--iree-llvmcpu-target-cpu=znver3"]
    bf16 = TensorType((4, 4), "bf16")
    nodes = (
        Node(0, "arg", (), bf16, make_attrs(name="a", index=0)),
        Node(1, "matmul", (0, 0), bf16, make_attrs()),
    )
    assert "arith.extf %in0 : bf16 to f32" in lower(Graph("mm", nodes, (1,)), options)
