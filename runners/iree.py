"""The iree target: the traced graph as MLIR, compiled by IREE, run by its runtime.

``prepare`` lowers the graph (``runners.iree_mlir``), compiles it for the
chosen device and keeps the ``.vmfb`` under ``KILN_CACHE_DIR/iree/`` keyed
by everything that decides its bytes, so a second prepare is a file read.
``run`` calls it through the IREE runtime; ``time`` times only the invoke,
with the inputs uploaded to the device once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import re
import sys
import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import TargetError
from kiln.fsutil import write_bytes_atomic
from kiln.ir.graph import Graph
from kiln.ir.interp import NUMPY_DTYPES
from kiln.runners.base import KernelArtifacts, Runner, RunResult
from kiln.runners.iree_flags import (
    DATA_TILING,
    LLVM_CPU_FLAGS,
    HostCpu,
    host_cpu,
    llvm_cpu_flags,
    widened,
)
from kiln.runners.iree_mlir import func_name, to_mlir

MISSING_EXTRA = "the iree target needs the optional 'iree' extra: pip install 'kiln-kernels[iree]'"
# device option -> (compiler target backend, runtime driver)
DEVICES = {
    "llvm-cpu": ("llvm-cpu", "local-task"),
    "cuda": ("cuda", "cuda"),
    "rocm": ("rocm", "hip"),
}
DIAGNOSTIC_LINES = 12
_OPTION_TYPES = {"opt": bool, "device_index": int, "cuda_target": str, "rocm_target": str}


@dataclass(frozen=True)
class IreeOptions:
    """The ``options:`` of an iree target in pipeline.yaml."""

    device: str = "llvm-cpu"
    flags: tuple[str, ...] = ()
    cuda_target: str = "sm_80"  # IREE 3.13 refuses sm_90
    rocm_target: str = "gfx942"
    opt: bool = True
    device_index: int | None = None

    @staticmethod
    def parse(values: dict[str, Any]) -> IreeOptions:
        known = IreeOptions.__dataclass_fields__
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise TargetError(
                f"unknown option {unknown[0]!r} for the iree runner",
                expected="one of: " + ", ".join(known),
                found=unknown[0],
            )
        values = dict(values)
        if values.get("device", "llvm-cpu") not in DEVICES:
            raise TargetError(
                "unknown iree device",
                expected="one of: " + ", ".join(DEVICES),
                found=repr(values["device"]),
            )
        flags = values.get("flags", ())
        if isinstance(flags, str) or not all(isinstance(f, str) for f in flags):
            raise TargetError("iree option 'flags' must be a list of strings", found=repr(flags))
        values["flags"] = tuple(flags)
        for key, kind in _OPTION_TYPES.items():
            value = values.get(key)
            if value is None:
                continue
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                raise TargetError(
                    f"iree option {key!r} has the wrong type",
                    expected=kind.__name__,
                    found=repr(value),
                )
        return IreeOptions(**values)

    @property
    def names_cpu(self) -> bool:
        """The user's flags choose the llvm-cpu target CPU (or its features) themselves."""
        return any(f.startswith("--iree-llvmcpu-target-cpu") for f in self.flags)

    @property
    def tuned_for_host(self) -> bool:
        return self.device == "llvm-cpu" and self.opt and not self.names_cpu

    def compiler_flags(self, cpu: HostCpu | None = None) -> list[str]:
        """Every flag given to iree-compile, in order (part of the cache key).

        ``cpu`` is the resolved host CPU for llvm-cpu with opt: true
        (runners/iree_flags.py); without it the flags say ``=host``.
        """
        if self.device == "cuda":
            base = [f"--iree-cuda-target={self.cuda_target}"]
        elif self.device == "rocm":
            base = [f"--iree-rocm-target={self.rocm_target}"]
        elif self.opt and self.names_cpu:  # their CPU, not this host's
            base = list(LLVM_CPU_FLAGS)
        elif self.opt:
            base = llvm_cpu_flags(cpu)
        elif not self.names_cpu:
            base = ["--iree-llvmcpu-target-cpu=generic"]  # portable, and no warning about it
        else:
            base = []
        return base + list(self.flags)


@dataclass
class IreePrepared:
    """A loaded module: what ``run`` and ``time`` call."""

    graph: Graph
    vmfb: Path
    function: Any  # iree.runtime FunctionInvoker
    device: Any  # iree.runtime HalDevice
    metrics: dict[str, Any] = field(default_factory=dict)


def _iree():
    try:
        import iree.compiler as compiler  # noqa: PLC0415
        import iree.runtime as runtime  # noqa: PLC0415
    except ImportError as exc:
        raise TargetError(MISSING_EXTRA) from exc
    return compiler, runtime


def cache_dir() -> Path:
    from kiln.cache.store import default_cache_dir

    return default_cache_dir() / "iree"


def resolved_flags(options: IreeOptions) -> list[str]:
    """The flags iree-compile gets: ``host`` resolved to this CPU's name and features."""
    return options.compiler_flags(host_cpu() if options.tuned_for_host else None)


def lower(graph: Graph, options: IreeOptions) -> str:
    """The MLIR the target compiles: half types this host multiplies slowly widened in bulk."""
    cpu = host_cpu() if options.tuned_for_host else None
    return to_mlir(graph, widen=widened(options.device, options.opt, cpu))


def dump_mlir(graph: Graph, path: str | os.PathLike, options: IreeOptions | None = None) -> Path:
    """Write the MLIR the iree target compiles for ``graph`` (atomically); by default
    for llvm-cpu with the default options, on this host."""
    path = Path(path)
    write_bytes_atomic(path, lower(graph, options or IreeOptions()).encode())
    return path


def _host_fingerprint(flags: list[str]) -> str:
    """What ``=host`` resolves to: a vmfb tuned for one CPU must not be reused on another."""
    if not any(f.endswith("=host") for f in flags):
        return ""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                cpu += line
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        pass
    return platform.machine() + platform.processor() + cpu


def cache_key(mlir: str, options: IreeOptions, compiler_version: str) -> str:
    """The vmfb's key: the MLIR text iree-compile sees (so any change to Kiln's lowering
    misses), the device, every flag (the host CPU's name and features among them), the
    compiler's version and, where a flag still says ``=host``, what that means here."""
    flags = resolved_flags(options)
    parts = {
        "mlir_sha256": hashlib.sha256(mlir.encode()).hexdigest(),
        "device": options.device,
        "flags": flags,
        "iree": compiler_version,
        "host": _host_fingerprint(flags),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


VMFB_OUTPUT = "vmfb"


def _store_key(key: str) -> str:
    """The vmfb's action key in the shared store, apart from every stage's."""
    return hashlib.sha256(f"iree-vmfb:{key}".encode()).hexdigest()


def _fetch_vmfb(session, key: str) -> bytes | None:
    outputs, _ = session.lookup(_store_key(key))  # verified against its digest
    return None if outputs is None else outputs.get(VMFB_OUTPUT)


def _store_vmfb(session, key: str, vmfb: bytes) -> None:
    try:
        session.store(_store_key(key), {VMFB_OUTPUT: vmfb})
    except OSError:  # a full or read-only cache costs speed, never the test
        pass


def _compiler_version(compiler) -> str:
    try:
        from iree.compiler import version  # noqa: PLC0415

        return str(getattr(version, "VERSION", "")) + str(getattr(version, "REVISIONS", ""))
    except ImportError:
        return getattr(compiler, "__version__", "unknown")


def compile_graph(
    graph: Graph, options: IreeOptions, mlir: str | None = None
) -> tuple[bytes, float]:
    """(vmfb bytes, seconds): one iree-compile run; failures become a TargetError."""
    compiler, _ = _iree()
    backend = DEVICES[options.device][0]
    text = lower(graph, options) if mlir is None else mlir
    start = _time.perf_counter()
    # iree-compile's warnings come back as bytes, written to sys.stderr.buffer when it
    # has one; doit's captured streams have none and refuse bytes: collect them as
    # text here and pass them on as text
    warnings = io.StringIO()
    flags = resolved_flags(options)
    try:
        with contextlib.redirect_stderr(warnings):
            try:
                vmfb = compiler.compile_str(text, target_backends=[backend], extra_args=flags)
            except compiler.CompilerToolError as exc:
                if not (_crashed(exc) and DATA_TILING in flags):
                    raise
                # IREE 3.13 segfaults packing some small half-precision matmuls under data
                # tiling (a grouped NCHW conv_wgrad's): the same module, built without it,
                # is correct and only slower. Deterministic: the crash is, so the vmfb's
                # cache key still decides its bytes.
                vmfb = compiler.compile_str(
                    text,
                    target_backends=[backend],
                    extra_args=[f for f in flags if f != DATA_TILING],
                )
                from kiln.logconfig import warn

                warn(
                    f"iree-compile crashed on kernel {graph.name!r} with {DATA_TILING}; "
                    "built it without data tiling (correct, possibly slower)"
                )
    except compiler.CompilerToolError as exc:
        raise TargetError(
            f"iree-compile failed for kernel {graph.name!r} ({options.device})",
            notes=_diagnostics(str(exc)),
            hint="look at the MLIR Kiln generated: kiln compile ... --dump-mlir FILE "
            "(or runners.iree.dump_mlir(graph, FILE)) and run iree-compile on it",
        ) from exc
    finally:
        if warnings.getvalue().strip():
            sys.stderr.write(warnings.getvalue())
    return vmfb, _time.perf_counter() - start


def _crashed(exc: Exception) -> bool:
    """Whether iree-compile died of a signal (a crash), not of a diagnostic."""
    return re.search(r"^Error code: -\d+$", str(exc), re.MULTILINE) is not None


def _diagnostics(text: str) -> list[str]:
    lines = text.splitlines()
    if "Diagnostics:" in lines:
        lines = lines[lines.index("Diagnostics:") + 1 :]
    lines = [line for line in lines if line.strip()]
    return lines[:DIAGNOSTIC_LINES]


_DEVICES: dict[tuple[str, int | None], Any] = {}


def _device(runtime, driver: str, index: int | None):
    """A HAL device, shared by every module in the process (creating one is not free)."""
    key = (driver, index)
    if key not in _DEVICES:
        try:
            if index is None:
                _DEVICES[key] = runtime.get_device(driver)
            else:
                drv = runtime.get_driver(driver)
                found = drv.query_available_devices()
                if not 0 <= index < len(found):
                    raise TargetError(
                        f"no {driver} device {index}",
                        expected=f"an index below {len(found)}",
                        found=str(index),
                    )
                _DEVICES[key] = drv.create_device(found[index])
        except TargetError:
            raise
        except Exception as exc:  # the runtime raises ValueError/RuntimeError here
            raise TargetError(f"no usable iree {driver!r} device: {_short(exc)}") from exc
    return _DEVICES[key]


def _short(exc: Exception) -> str:
    """The runtime's reason without its source path and advice: 'CUDA driver ... not available'."""
    text = str(exc.__cause__ or exc).splitlines()[0]
    text = text.split("UNAVAILABLE; ", 1)[-1]
    return re.split(r"[;:] please", text)[0]


_warned_unwritable: set[str] = set()


def _unwritable_cache(directory: Path, exc: OSError) -> None:
    """Say once per directory that compiled vmfbs cannot be kept; the run goes on."""
    if str(directory) in _warned_unwritable:
        return
    _warned_unwritable.add(str(directory))
    from kiln.logconfig import warn

    warn(
        f"the iree cache {directory} cannot be written ({exc.strerror or exc}): "
        "compiling without keeping the vmfbs; set KILN_CACHE_DIR to a writable directory"
    )


class IreeRunner(Runner):
    """Runs a kernel's graph through IREE (llvm-cpu by default; cuda/rocm where present)."""

    kind = "iree"

    @property
    def config(self) -> IreeOptions:
        """The options, parsed now: callers may set ``options['device_index']`` after init."""
        return IreeOptions.parse(self.options)

    def check_options(self) -> None:
        IreeOptions.parse(self.options)  # parsing is the check

    @property
    def host_only(self) -> bool:
        return self.options.get("device", "llvm-cpu") == "llvm-cpu"

    def unavailable(self) -> str | None:
        try:
            _, runtime = _iree()
            config = self.config
        except TargetError as err:
            return (
                err.message if err.message == MISSING_EXTRA else None
            )  # bad options: prepare says
        try:
            _device(runtime, DEVICES[config.device][1], config.device_index)
        except TargetError as err:
            return err.message
        return None

    def prepare(self, artifacts: KernelArtifacts) -> IreePrepared:
        compiler, runtime = _iree()
        graph, config = artifacts.graph, self.config
        mlir = lower(graph, config)
        key = cache_key(mlir, config, _compiler_version(compiler))
        path = cache_dir() / f"{key}.vmfb"
        metrics: dict[str, Any] = {"device": config.device, "vmfb": str(path)}
        device = _device(runtime, DEVICES[config.device][1], config.device_index)
        try:
            vmfb = path.read_bytes()
            function = _load(runtime, device, vmfb, graph)
            metrics.update(cache="hit", compile_s=0.0)
        except OSError:  # not cached yet
            function = None
        except Exception as exc:  # noqa: BLE001  a truncated or foreign file: compile again
            from kiln.statefiles import quarantine

            quarantine(path, f"{type(exc).__name__}: {exc}", "it will be compiled again")
            function = None
        shared = self._shared_store()
        if function is None and shared is not None:
            vmfb = _fetch_vmfb(shared, key)
            if vmfb is not None:
                try:
                    function = _load(runtime, device, vmfb, graph)
                    metrics.update(cache="fetched", compile_s=0.0)
                except Exception:  # noqa: BLE001  verified bytes IREE refuses: compile again
                    function = None
                if function is not None:
                    try:
                        write_bytes_atomic(path, vmfb)
                    except OSError as exc:  # a full or read-only disk: run it, keep nothing
                        _unwritable_cache(path.parent, exc)
                        metrics["vmfb"] = None
        if function is None:
            vmfb, seconds = compile_graph(graph, config, mlir)
            if shared is not None:
                _store_vmfb(shared, key, vmfb)
            try:
                write_bytes_atomic(path, vmfb)
            except OSError as exc:  # the vmfb is in hand: run it, keep nothing
                _unwritable_cache(path.parent, exc)
                metrics["vmfb"] = None
            function = _load(runtime, device, vmfb, graph)
            metrics.update(cache="miss", compile_s=seconds)
        return IreePrepared(graph, path, function, device, metrics)

    def _shared_store(self):
        """The project's artifact cache session when it has a remote, else None.

        The local vmfb directory already serves this machine; the shared store
        lets a clean CI runner fetch what another machine compiled.
        """
        config = self.artifact_cache
        if config is None or not config.enabled or not config.remote:
            return None
        from kiln.cache.session import session_for

        return session_for(config)

    def run(self, prepared: IreePrepared, inputs: list[np.ndarray]) -> RunResult:
        start = _time.perf_counter()
        arrays = self._check_inputs(prepared.graph, inputs)
        _, runtime = _iree()
        keep: list[np.ndarray] = []  # host memory the views borrow
        views = _upload_all(runtime, prepared, arrays, keep)
        invoke_start = _time.perf_counter()
        results = self._invoke(prepared, views)
        invoke_s = _time.perf_counter() - invoke_start
        outputs = [
            _to_numpy(r, node.dtype)
            for r, node in zip(results, prepared.graph.output_nodes, strict=True)
        ]
        metrics = dict(prepared.metrics)
        metrics.update(wall_s=_time.perf_counter() - start, invoke_s=invoke_s)
        return RunResult(outputs, metrics)

    def time(
        self, prepared: IreePrepared, inputs: list[np.ndarray], iters: int = 10, warmup: int = 2
    ) -> list[float]:
        """Seconds per call, invoke only: inputs go to the device once, outputs stay there."""
        _, runtime = _iree()
        arrays = self._check_inputs(prepared.graph, inputs)
        keep: list[np.ndarray] = []  # host memory the views borrow
        device_inputs = _upload_all(runtime, prepared, arrays, keep)
        for _ in range(warmup):
            self._invoke(prepared, device_inputs)
        times = []
        for _ in range(iters):
            start = _time.perf_counter()
            self._invoke(prepared, device_inputs)
            times.append(_time.perf_counter() - start)
        return times

    # -- helpers ----------------------------------------------------------
    @staticmethod
    def _check_inputs(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
        args = graph.args
        if len(inputs) != len(args):
            raise TargetError(f"kernel {graph.name!r} takes {len(args)} inputs, got {len(inputs)}")
        arrays = []
        for node, value in zip(args, inputs, strict=True):
            array = np.asarray(value, dtype=NUMPY_DTYPES[node.dtype], order="C")
            if array.shape != node.shape:
                raise TargetError(
                    f"input {node.attr('name')!r} of kernel {graph.name!r} has the wrong shape",
                    expected=str(node.shape),
                    found=str(array.shape),
                )
            arrays.append(array)
        return arrays

    @staticmethod
    def _invoke(prepared: IreePrepared, arrays: list) -> list:
        try:
            result = prepared.function(*arrays)
        except Exception as exc:  # runtime errors arrive as ValueError/RuntimeError
            raise TargetError(f"iree runtime failed on {prepared.graph.name!r}: {exc}") from exc
        return list(result) if isinstance(result, tuple) else [result]


def _load(runtime, device, vmfb: bytes, graph: Graph):
    """The kernel's function from a vmfb, in a fresh VM context on ``device``."""
    config = runtime.Config(device=device)
    context = runtime.SystemContext(config=config)
    module = runtime.VmModule.copy_buffer(config.vm_instance, vmfb)
    context.add_vm_module(module)
    return context.modules[module.name][func_name(graph)]


def _upload_all(runtime, prepared: IreePrepared, arrays: list[np.ndarray], keep: list) -> list:
    args = prepared.graph.args
    return [
        upload(runtime, prepared.device, a, n.dtype, keep)
        for a, n in zip(arrays, args, strict=True)
    ]


def _to_numpy(result, dtype: str) -> np.ndarray:
    """A host copy with the graph's dtype (bf16 arrives as bf16, or as uint16 bits)."""
    array = np.asarray(result.to_host() if hasattr(result, "to_host") else result)
    want = NUMPY_DTYPES[dtype]
    if array.dtype != want and array.dtype.itemsize == want.itemsize:
        array = array.view(want)
    return np.array(array, dtype=want, copy=True)


_HAL_TYPES = {  # kiln dtype -> HalElementType attribute name
    "f32": "FLOAT_32",
    "f16": "FLOAT_16",
    "bf16": "BFLOAT_16",
    "i32": "SINT_32",
    "bool": "BOOL_8",
}
_ALIGN = 64  # IREE's codegen assumes 64-byte aligned bindings


def upload(runtime, device, array: np.ndarray, dtype: str, keep: list):
    """A HAL buffer view of ``array`` on ``device``.

    Where the device can use host memory (llvm-cpu) the array is imported,
    not copied (a 64 MiB input: ~0 ms instead of ~45 ms through
    ``asdevicearray``); it is copied first only if it is not 64-byte aligned.
    bf16 travels as its uint16 bits tagged BFLOAT_16, so no runtime bf16
    support is needed. An imported array is appended to ``keep``: the view
    does not own it, so the caller holds ``keep`` until the call returns.
    """
    element_type = getattr(runtime.HalElementType, _HAL_TYPES[dtype])
    if dtype == "bf16":
        array = array.view(np.uint16)
    elif dtype == "bool":
        array = array.view(np.uint8)
    allocator = device.allocator
    memory = int(runtime.MemoryType.HOST_LOCAL | runtime.MemoryType.DEVICE_VISIBLE)
    usage = int(runtime.BufferUsage.DEFAULT)
    importable = allocator.query_buffer_compatibility(
        memory_type=memory,
        allowed_usage=usage,
        intended_usage=usage,
        allocation_size=max(array.nbytes, 1),
    ) & int(runtime.BufferCompatibility.IMPORTABLE)
    if importable and array.nbytes:
        if array.ctypes.data % _ALIGN:
            array = _aligned_copy(array)
        buffer = allocator.import_host_allocation(array, memory_type=memory, allowed_usage=usage)
        keep.append(array)
        return runtime.HalBufferView(buffer, array.shape, element_type)
    return allocator.allocate_buffer_copy(
        memory_type=runtime.MemoryType.DEVICE_LOCAL,
        allowed_usage=runtime.BufferUsage.DEFAULT,
        device=device,
        buffer=array,
        element_type=element_type,
    )


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    raw = np.empty(array.nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out
