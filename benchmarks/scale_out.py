"""Scale-out: builds on a Dask cluster and clean clones served by a team cache.

Side by side, in one run, on a generated project of gemm kernels (a cold
``-n 1`` build of at least 10 s at the default size):

- cold compile ``-n 1`` vs ``-n 2`` vs ``--executor dask -n 2`` (a Kiln-started
  LocalCluster of 2 worker processes); targets: dask at least 1.5x faster
  than ``-n 1`` and at least 0.9x the speed of ``-n 2``;
- a ``dask scheduler`` + 2 ``dask worker`` processes, end to end (start to
  built); target: within 1.2x of the LocalCluster; and the per-instance
  overhead (extra wall time per kernel instance over ``-n 2``);
- a clean clone with a warm remote (shared directory, filled by a build of
  its own) vs the floor: the same clean build with every instance's action
  cut down to copying its files (bare_writes.py); targets: 0 compiled, wall
  time at most 1.5x the floor; the no-op build and the clone with ``-n 2``
  are printed beside it, not judged;
- bytes uploaded and fetched, and the clone's hit rate;
- a clean clone from moto's S3 server (when installed); not judged.

Every figure is the median of 3 interleaved runs (each cold build's runs
are printed with their CPU time), beside a same-run calibration: one
process doing a fixed pure-Python loop vs two processes doing half each.

    python benchmarks/scale_out.py [--kernels 1500] [--size 192] [--dir DIR] [--quick]

The projects live on tmpfs when the machine has one (see scratch.py).
Each judged figure is printed with ``met`` or ``MISSED``, then ``targets: N
met, M missed``; the exit status is 1 when a target is missed, 2 when a
build fails (``--quick`` prints the figures and judges nothing: it is the
smoke test).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from parallel import children_cpu, spin
from scratch import add_dir_option, scratch
from verdicts import Targets, abort

REPO = Path(__file__).resolve().parent.parent
SPEEDUP_TARGET = 1.5
VS_PROCESSES_TARGET = 0.9
EXTERNAL_TARGET = 1.2  # an external scheduler + workers over the LocalCluster, end to end
CLONE_TARGET = 1.5  # the clean clone over the floor
RUNS = 3  # every figure the median of this many interleaved runs
CALIBRATION_LOOPS = 10_000_000  # pure-Python work per process of the calibration
MIN_COLD_N1 = 10.0  # seconds: the cold -n 1 build the Dask comparison is made on
STAGES = ("trace", "visa", "lir", "schedule", "edf")
BARE_WRITES = Path(__file__).resolve().parent / "bare_writes.py"


def make_project(root: Path, kernels: int, size: int) -> None:
    pkg = root / "bench_kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    lines = ["from kiln import Tensor, device", ""]
    for k in range(kernels):
        lines += [
            "",
            "@device",
            f'def g{k}(a: Tensor["M", "K"], b: Tensor["K", "N"]):  # noqa: F821',
            f"    return (a @ b) * {k % 5 + 1}.0",
            "",
        ]
    (pkg / "gemms.py").write_text("\n".join(lines))
    stage_rows = "".join(f"  - {{name: {s}, module: kiln.stages.{s}}}\n" for s in STAGES)
    kernel_rows = "".join(
        f"  g{k}: {{shapes: {{M: {size}, K: {size}, N: {size}}}}}\n" for k in range(kernels)
    )
    machine = (REPO / "pipeline.yaml").read_text().split("machines:\n", 1)[1].split("\ntargets:")[0]
    (root / "pipeline.yaml").write_text(
        "project: scale-out-bench\npackages: [bench_kernels]\nmachine: npu-v1\n"
        f"stages:\n{stage_rows}kernels:\n{kernel_rows}machines:\n{machine}\n"
    )


def kiln(
    cwd: Path, *args: str, env: dict | None = None, launcher: Path | None = None
) -> tuple[float, str]:
    """(wall seconds, stdout) of one `kiln` run in ``cwd``; exits on failure.

    ``launcher``: a script run instead of ``python -m kiln`` (bare_writes.py).
    """
    full = dict(os.environ, KILN_CACHE_DIR=str(cwd / ".cache"))
    full.pop("KILN_REMOTE_CACHE", None)
    # every run from cached bytecode, as an installed tool runs (see noop_overhead.py)
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    full["PYTHONPYCACHEPREFIX"] = str(cwd.parent / "pyc")
    full.update(env or {})
    cpu, start = children_cpu(), time.perf_counter()
    command = [sys.executable, str(launcher)] if launcher else [sys.executable, "-m", "kiln"]
    proc = subprocess.run([*command, *args], cwd=cwd, env=full, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    LAST_CPU[0] = children_cpu() - cpu
    if proc.returncode != 0:
        abort(f"kiln {' '.join(args)} failed in {cwd}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc.stdout


LAST_CPU = [0.0]  # CPU seconds of the last kiln run (it and the processes it waited for)


def counts(stdout: str) -> tuple[int, int]:
    m = re.search(r"\((\d+) fetched, (\d+) compiled\)", stdout)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def fresh(base: Path, name: str, kernels: int, size: int) -> Path:
    project = base / name
    make_project(project, kernels, size)
    return project


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def external_cluster(project: Path) -> float:
    """Seconds from starting a scheduler and 2 workers to a finished build through them."""
    dask = shutil.which("dask", path=os.path.dirname(sys.executable)) or "dask"
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    cpu, start = children_cpu(), time.perf_counter()
    procs = [
        subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            **quiet,
        )
    ]
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [dask, "worker", address, "--nthreads", "1", "--no-dashboard"], **quiet
                )
            )
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        kiln(project, "compile", "--scheduler", address, "-n", "2")
        return time.perf_counter() - start
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        LAST_CPU[0] = children_cpu() - cpu  # the scheduler, the workers and the build


S3_KERNELS = 64
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def s3_clone(base: Path, size: int, kernels: int = S3_KERNELS) -> tuple[float, float] | None:
    """(seconds one action at a time, seconds fetching ahead) of a clone from moto's S3 server.

    None when moto's server is not installed. Not judged: moto serves from one
    Python process on the build's own cores, so it flatters neither number.
    """
    import importlib.util

    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
        return None
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    abort("moto's S3 server did not start")
                time.sleep(0.1)
        import boto3

        creds = {k.lower(): v for k, v in S3_ENV.items() if k != "AWS_DEFAULT_REGION"}
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", **creds).create_bucket(
            Bucket="bench"
        )
        env = dict(S3_ENV, KILN_S3_ENDPOINT_URL=url, KILN_REMOTE_CACHE="s3://bench/kiln")
        kiln(fresh(base, "s3-upload", kernels, size), "compile", env=env)
        clone, _ = kiln(fresh(base, "s3-clone", kernels, size), "compile", env=env)
        return clone
    finally:
        server.terminate()
        server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1500)  # -n 1: over 10 s here
    parser.add_argument("--size", type=int, default=192, help="gemm M = K = N")
    parser.add_argument("--quick", action="store_true", help="4 small kernels; judge nothing")
    add_dir_option(parser)
    args = parser.parse_args(argv)
    kernels, size = (4, 64) if args.quick else (args.kernels, args.size)
    instances = kernels
    with scratch("kiln-scale-out-", args.dir) as tmp:
        base = Path(tmp)
        print(f"projects in {base.parent}")
        remote = base / "team-cache"
        warm_env = {"KILN_REMOTE_CACHE": f"file://{remote}"}

        # untimed: every run below imports from the bytecode cache, as an installed tool
        # does, and Dask's own modules (distributed, tornado, ...) are compiled only here
        kiln(fresh(base, "warm-up", 2, 64), "compile", "--executor", "dask", "-n", "2")
        runs = 1 if args.quick else RUNS
        cold: dict[str, list[tuple[float, float]]] = {k: [] for k in COLD}
        for run in range(runs):  # interleaved: a slow spell of the machine hits them all
            origin = fresh(base, f"n1-{run}", kernels, size)
            cold["n1"].append((kiln(origin, "compile")[0], LAST_CPU[0]))
            project = fresh(base, f"n2-{run}", kernels, size)
            cold["n2"].append((kiln(project, "compile", "-n", "2")[0], LAST_CPU[0]))
            shutil.rmtree(project)  # tmpfs is memory: keep only the projects still needed
            project = fresh(base, f"dask-{run}", kernels, size)
            seconds, _ = kiln(project, "compile", "--executor", "dask", "-n", "2")
            cold["dask"].append((seconds, LAST_CPU[0]))
            shutil.rmtree(project)
            project = fresh(base, f"cluster-{run}", kernels, size)
            cold["cluster"].append((external_cluster(project), LAST_CPU[0]))
            shutil.rmtree(project)
            if run:
                shutil.rmtree(base / f"n1-{run - 1}")  # the last one serves the no-op and floor
            loops = CALIBRATION_LOOPS // (10 if args.quick else 1)
            cold["one"].append((spin(1, 2 * loops), 0.0))  # one process doing both halves
            cold["two"].append((spin(2, loops), 0.0))
        t_n1, t_n2, t_dask, t_cluster, c_one, c_two = (
            statistics.median(s for s, _ in cold[k]) for k in COLD
        )
        # the team cache is filled by a build of its own: uploading is no part of -n 1's time
        kiln(fresh(base, "upload", kernels, size), "compile", env=warm_env)
        s3 = s3_clone(base, size, 2 if args.quick else S3_KERNELS)
        # both short and noisy: the median of RUNS each, interleaved
        noops, clones, clones_n2, floors = [], [], [], []
        for run in range(runs):
            noops.append(kiln(origin, "compile")[0])
            clone = fresh(base, f"clone{run}", kernels, size)
            seconds, out = kiln(clone, "compile", env=warm_env)
            clones.append(seconds)
            # the clone as a 2-core CI runner builds it (docs/ci.md): not judged
            two = fresh(base, f"clone{run}-n2", kernels, size)
            clones_n2.append(kiln(two, "compile", "-n", "2", env=warm_env)[0])
            # the least a clone through doit's tasks costs: each task only copies its files
            bare = fresh(base, f"floor{run}", kernels, size)
            floor_env = {"KILN_BARE_FROM": str(origin)}
            floors.append(kiln(bare, "compile", env=floor_env, launcher=BARE_WRITES)[0])
        t_noop, t_clone = statistics.median(noops), statistics.median(clones)
        t_floor = statistics.median(floors)
        t_clone_n2 = statistics.median(clones_n2)
        fetched, compiled = counts(out)
        uploaded = tree_bytes(remote) if remote.exists() else 0
        downloaded = tree_bytes(clone / ".cache" / "store" / "cas")

    speedup = t_n1 / t_dask
    vs_processes = t_n2 / t_dask
    overhead_ms = max(t_dask - t_n2, 0.0) / instances * 1000
    clone_ratio = t_clone / t_floor
    external_ratio = t_cluster / t_dask
    hit_rate = fetched / max(fetched + compiled, 1)
    targets = Targets(judged=not args.quick)
    print(f"generated project: {kernels} gemm {size}^3 kernels, one task each")
    print(f"cold builds: median of {runs} interleaved runs (wall; CPU of processes waited for)")
    print(f"cold -n 1:                         {t_n1:7.2f} s  {_runs(cold['n1'])}")
    if not args.quick and t_n1 < MIN_COLD_N1:  # the comparison needs a build this long
        print(f"  shorter than the {MIN_COLD_N1:g} s asked for: run with more --kernels")
    print(f"cold -n 2:                         {t_n2:7.2f} s  {_runs(cold['n2'])}")
    print(
        f"calibration: one process {c_one:.2f} s, two side by side {c_two:.2f} s "
        f"({c_one / c_two:.2f}x: what two processes get here; -n 2 got {t_n1 / t_n2:.2f}x)"
    )
    print(f"cold dask LocalCluster, 2 workers: {t_dask:7.2f} s  {_runs(cold['dask'])}")
    print(
        f"  speedup vs -n 1: {speedup:.2f}x (target >= {SPEEDUP_TARGET}x) "
        f"{targets.judge('dask speedup vs -n 1', speedup >= SPEEDUP_TARGET)}"
    )
    print(
        f"  speed vs -n 2:   {vs_processes:.2f}x (target >= {VS_PROCESSES_TARGET}x) "
        f"{targets.judge('dask speed vs -n 2', vs_processes >= VS_PROCESSES_TARGET)}"
    )
    print(f"dask scheduler + 2 workers, end to end: {t_cluster:7.2f} s  {_runs(cold['cluster'])}")
    print(
        f"  over the LocalCluster: {external_ratio:.2f}x (target <= {EXTERNAL_TARGET}x) "
        f"{targets.judge('external cluster vs LocalCluster', external_ratio <= EXTERNAL_TARGET)}"
    )
    print(f"per-task overhead over -n 2: {overhead_ms:.1f} ms per kernel instance")
    print(f"no-op build:                       {t_noop:7.2f} s (median of {len(noops)})")
    print(
        f"clean clone, warm remote:          {t_clone:7.2f} s (median of {len(clones)}; "
        f"{fetched} fetched, {compiled} compiled)"
    )
    print(
        f"  floor, each task only copying its files: {t_floor:.2f} s "
        f"(median of {len(floors)}; {t_floor / t_noop:.2f}x the no-op)"
    )
    print(
        "  runs, clone / floor in turn: "
        + ", ".join(f"{c:.2f} / {f:.2f} s" for c, f in zip(clones, floors, strict=True))
    )
    print(
        f"  clone / floor: {clone_ratio:.2f}x (target <= {CLONE_TARGET}x, 0 compiled) "
        f"{targets.judge('clean clone', clone_ratio <= CLONE_TARGET and compiled == 0)}"
    )
    print(
        f"  the same clone with -n 2: {t_clone_n2:.2f} s = {t_clone_n2 / t_noop:.2f}x the no-op "
        "(not judged)"
    )
    print(f"bytes uploaded: {uploaded}, bytes fetched: {downloaded}, hit rate: {hit_rate:.0%}")
    if s3 is None:
        print("clean clone from S3: not measured (needs moto[server] and s3fs)")
    else:
        print(
            f"clean clone from S3 (moto server, {2 if args.quick else S3_KERNELS} kernels): "
            f"{s3:.2f} s (not judged)"
        )
    return targets.finish()


COLD = ("n1", "n2", "dask", "cluster", "one", "two")


def _runs(runs: list[tuple[float, float]]) -> str:
    return "(runs: " + ", ".join(f"{w:.2f} s wall / {c:.2f} s CPU" for w, c in runs) + ")"


if __name__ == "__main__":
    sys.exit(main())
