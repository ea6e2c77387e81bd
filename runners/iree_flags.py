"""Which iree-compile flags and which lowering a target gets on this host.

For llvm-cpu with ``opt: true`` Kiln resolves ``host`` the way iree-compile
does (one tiny compile, once per process) and passes the CPU's LLVM name and
feature list explicitly, so the flags, and with them the vmfb cache key, say
which CPU the code is for: two machines with the same CPU share a key, a
machine without AVX-512 never loads a vmfb built for one.

Measured on an AMD EPYC (znver4, 2 cores; docs/targets.md has the figures):
data tiling with IREE's microkernels runs gemm 1024^3 f32 at OpenBLAS's
speed, and ``--iree-opt-level=O3`` made layernorm ~30% faster. bf16 matmuls
use the mmt4d microkernel's AVX-512 BF16 dot product (about twice the f32
rate); without that instruction (compiled for znver3) the bf16 microkernel
took 83x the f32 time. f16 has no such instruction there, and its
microkernel converts each element inside the inner loop (2x the f32 time).
So a half type the CPU cannot multiply natively is widened to f32 in bulk
before a matmul or convolution (see ``widened``): 1.0-1.1x the f32 time.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from functools import cache

# After the CPU flags, for llvm-cpu with opt: true.
DATA_TILING = "--iree-opt-data-tiling"
LLVM_CPU_FLAGS = (
    DATA_TILING,
    "--iree-llvmcpu-enable-ukernels=all",
    "--iree-opt-level=O3",
)
# A half type whose matmuls the host's IREE microkernels compute natively, at
# or above the f32 rate, when the CPU has one of these LLVM features.
NATIVE_HALF_DOTS = {"bf16": ("avx512bf16", "bf16")}
HALVES = ("bf16", "f16")
_PROBE = "func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }"
_TARGET = re.compile(r'cpu = "([^"]*)", cpu_features = "([^"]*)"')


@dataclass(frozen=True)
class HostCpu:
    """The CPU ``--iree-llvmcpu-target-cpu=host`` means here: LLVM's name and features."""

    name: str  # e.g. znver4
    features: str  # "+avx2,-avx512fp16,...": one entry per feature, sorted

    @staticmethod
    def parse(name: str, features: str) -> HostCpu:
        """From iree-compile's resolved target; later entries win, as in LLVM."""
        signs: dict[str, str] = {}
        for item in features.split(","):
            if item[:1] in "+-" and len(item) > 1:
                signs[item[1:]] = item[0]
        return HostCpu(name, ",".join(sign + f for f, sign in sorted(signs.items())))

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    def flags(self) -> list[str]:
        return [
            f"--iree-llvmcpu-target-cpu={self.name}",
            f"--iree-llvmcpu-target-cpu-features={self.features}",
        ]


@cache
def host_cpu() -> HostCpu | None:
    """What iree-compile resolves ``host`` to (None when it cannot say: then ``=host``)."""
    try:
        import iree.compiler as compiler  # noqa: PLC0415

        # a warning would come back as bytes, which doit's captured stderr refuses
        with contextlib.redirect_stderr(io.StringIO()):
            text = compiler.compile_str(
                _PROBE,
                target_backends=["llvm-cpu"],
                extra_args=["--iree-llvmcpu-target-cpu=host", "--compile-to=preprocessing"],
            )
    except Exception:  # noqa: BLE001  no compiler, or one that prints no target: =host
        return None
    found = _TARGET.search(text.decode() if isinstance(text, bytes) else str(text))
    return HostCpu.parse(*found.groups()) if found else None


def llvm_cpu_flags(cpu: HostCpu | None) -> list[str]:
    """The opt: true flags for llvm-cpu: the resolved CPU (else ``host``), then tuning."""
    target = cpu.flags() if cpu else ["--iree-llvmcpu-target-cpu=host"]
    return target + list(LLVM_CPU_FLAGS)


def widened(device: str, opt: bool, cpu: HostCpu | None) -> tuple[str, ...]:
    """Half types whose matmul and conv operands are converted to f32 in bulk first.

    On llvm-cpu every half type the CPU cannot multiply natively: either way
    each product is exact in f32 and summed in f32, so only the order of the
    sums may differ. GPUs keep their half types for their matrix units.
    """
    if device != "llvm-cpu":
        return ()
    native = cpu if opt else None  # opt: false targets a generic CPU

    def fast(dtype: str) -> bool:
        return native is not None and any(native.has(f) for f in NATIVE_HALF_DOTS.get(dtype, ()))

    return tuple(d for d in HALVES if not fast(d))
