"""Which executor runs stage actions: local (doit's own runners) or a Dask cluster.

pipeline.yaml ``executor: {kind, address}``; the CLI's ``--executor``,
``--scheduler`` and ``-n`` flags override it through ``KILN_EXECUTOR``,
``KILN_SCHEDULER`` and ``KILN_JOBS``. An address implies ``kind: dask``,
in the file as on the command line. Every value is checked here, once,
before any task runs: a bad one is one message naming where it came from.
Asking for dask without ``kiln-kernels[distributed]`` is one clear error naming the extra.
"""

from __future__ import annotations

import importlib.util
import os
import re

from kiln.errors import KilnError

DISTRIBUTED_HINT = "pip install 'kiln-kernels[distributed]'"
DEFAULT_WORKERS = 2
MAX_WORKERS = 4096
FILE = "pipeline.yaml"
# the schemes distributed's comm registry knows; all but inproc need HOST:PORT
HOST_PORT_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
ADDRESS_FORM = "tcp://HOST:PORT (or tls://, ws://, wss://, ucx://, inproc://)"
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s/:\[\]@]+):(\d{1,5})/?")

# env var -> (flag, value): what the CLI set from its own flags (see note_flag)
_from_flags: dict[str, tuple[str, str]] = {}


def note_flag(variable: str, flag: str, value: str) -> None:
    """The CLI sets ``variable`` from ``flag``: messages then name the flag, not the variable."""
    os.environ[variable] = value
    _from_flags[variable] = (flag, value)


def source_of(variable: str) -> str:
    """``--scheduler`` when the CLI set ``variable`` from that flag, else the variable."""
    flag = _from_flags.get(variable)
    return flag[0] if flag and flag[1] == os.environ.get(variable) else variable


def resolve_executor(settings: dict | None, root) -> dict | None:
    """The executor spec that stage actions carry (None: run in doit's own workers).

    ``source`` in the spec says where the address came from, for messages
    about the scheduler (see tasks/execution/remote_exec.py). A chain's files come back
    from the worker directly: the artifact cache may be off.
    """
    settings = settings or {}
    jobs = os.environ.get("KILN_JOBS", "").strip()
    if jobs and not jobs.isdigit() and source_of("KILN_JOBS") == "KILN_JOBS":
        worker_count()  # not a number at all: refused whichever executor runs (-n 0 is local)
    file_address = settings.get("address")
    env_kind = os.environ.get("KILN_EXECUTOR", "").strip()
    env_address = os.environ.get("KILN_SCHEDULER", "").strip()
    if env_kind:
        kind = env_kind.lower()
        if kind not in ("local", "dask"):
            raise KilnError(
                f"{source_of('KILN_EXECUTOR')} names an unknown executor {env_kind!r}",
                expected="local or dask",
                found=env_kind,
            )
        if kind == "local" and env_address:
            kind_from, address_from = source_of("KILN_EXECUTOR"), source_of("KILN_SCHEDULER")
            raise KilnError(
                f"{address_from} names a Dask scheduler, but {kind_from} asks for local",
                expected="a scheduler address with the dask executor only",
                found=f"{kind_from} local, {address_from} {env_address}",
                hint=f"drop {address_from}, or use the dask executor",
            )
    else:
        # an address implies dask, as --scheduler does; one from the environment wins
        kind = (
            "dask" if env_address else settings.get("kind") or ("dask" if file_address else "local")
        )
        if kind == "local" and file_address:
            raise KilnError(
                f"executor.address in {FILE} names a Dask scheduler, but executor.kind is local",
                expected="executor.kind: dask with an address (or no address)",
                found=f"kind: local, address: {file_address}",
                hint="remove executor.address, or set executor.kind: dask",
            )
    if kind == "local":
        return None
    if kind != "dask":  # the schema allows only these two; a hand-built dict may not
        raise KilnError(
            f"unknown executor {kind!r} at executor.kind in {FILE}",
            expected="local or dask",
            found=str(kind),
        )
    if importlib.util.find_spec("distributed") is None:
        raise KilnError(
            "the dask executor needs dask.distributed, which is not installed",
            hint=DISTRIBUTED_HINT,
        )
    if env_address:
        address, source = env_address, source_of("KILN_SCHEDULER")
    else:
        address, source = file_address, f"executor.address in {FILE}"
    if address:
        check_scheduler_address(address, source)
    return {"kind": "dask", "address": address, "workers": worker_count(), "source": source}


def check_scheduler_address(address: str, source: str) -> None:
    """One message, naming ``source``, for an address Dask could not connect to."""
    scheme, sep, location = address.partition("://")
    scheme = scheme.lower()
    if sep and scheme == "inproc" and location:
        return
    if sep and scheme in HOST_PORT_SCHEMES:
        found = _HOST_PORT.fullmatch(location)
        if found and 0 < int(found.group(2)) < 65536:
            return
    raise KilnError(
        f"{source} is not a Dask scheduler address",
        expected=ADDRESS_FORM,
        found=address,
        hint="the scheduler prints its address when it starts "
        "(`dask scheduler`: 'Scheduler at: tcp://...')",
    )


def scheduler_host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a checked TCP-based address (tcp, tls, ws, wss); None for the rest."""
    scheme, _, location = address.partition("://")
    if scheme.lower() not in ("tcp", "tls", "ws", "wss"):
        return None
    found = _HOST_PORT.fullmatch(location)
    if not found:
        return None
    return found.group(1).strip("[]"), int(found.group(2))


def worker_count() -> int:
    """KILN_JOBS (or ``-n``), checked: how many workers Kiln plans for (and starts)."""
    raw = os.environ.get("KILN_JOBS", "").strip()
    if not raw:
        return DEFAULT_WORKERS
    if not raw.isdigit() or not 0 < int(raw) <= MAX_WORKERS:
        source = source_of("KILN_JOBS")
        raise KilnError(
            f"{source} is not a worker count",
            expected=f"a whole number of Dask workers from 1 to {MAX_WORKERS}",
            found=raw,
            hint=f"{'leave -n out' if source == '-n' else 'unset KILN_JOBS'} "
            f"for the default of {DEFAULT_WORKERS} workers",
        )
    return int(raw)
