"""`kiln cache stats|gc|verify|push` and the compile flags that choose an executor.

Kept apart from kiln/cli/command.py so the CLI only wires them in.
"""

from __future__ import annotations

import json
import os
import re

from kiln.errors import KilnError

SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def add_cache_parser(sub) -> None:
    c = sub.add_parser("cache", help="the content-addressed artifact store (KILN_CACHE_DIR)")
    action = c.add_subparsers(dest="cache_command", metavar="stats|gc|verify|push", required=True)
    action.add_parser("stats", help="entries, bytes, and the last build's hit/fetch/compile counts")
    gc = action.add_parser("gc", help="drop least recently used entries down to a size")
    gc.add_argument(
        "--max-size", required=True, metavar="SIZE", help="e.g. 500M, 2G (K, M, G are 1024-based)"
    )
    action.add_parser("verify", help="re-hash every local entry and drop bad ones")
    push = action.add_parser(
        "push",
        help="upload to the team cache every local entry it lacks (builds upload only "
        "what they compile)",
    )
    push.add_argument(
        "--remote",
        metavar="URL",
        help="the team cache (default: KILN_REMOTE_CACHE, else pipeline.yaml's cache.remote)",
    )


def add_executor_flags(parser) -> None:
    parser.add_argument(
        "--executor", choices=["local", "dask"], help="where stage actions run (default local)"
    )
    parser.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler, tcp://HOST:8786")


def apply_executor_flags(args) -> None:
    """Hand --executor/--scheduler/-n to the task loader through the environment.

    A --scheduler implies dask; an empty one, or one with --executor local,
    is an error. The values themselves are checked where the loader reads
    them (kiln/tasks/executor.py), naming the flag.
    """
    from kiln.tasks.execution.executor import note_flag

    scheduler = getattr(args, "scheduler", None)
    if scheduler is not None:
        if not scheduler.strip():
            raise KilnError(
                "--scheduler is empty",
                expected="a Dask scheduler address, tcp://HOST:PORT",
                found=repr(scheduler),
                hint="drop --scheduler for a local cluster (--executor dask)",
            )
        if getattr(args, "executor", None) == "local":
            raise KilnError(
                "--scheduler names a Dask scheduler, but --executor local runs the stages here",
                expected="--scheduler with --executor dask (or without --executor)",
                found=f"--executor local --scheduler {scheduler}",
                hint="drop one of the two flags",
            )
        args.executor = "dask"
    if getattr(args, "executor", None):
        note_flag("KILN_EXECUTOR", "--executor", args.executor)
    if scheduler is not None:
        note_flag("KILN_SCHEDULER", "--scheduler", scheduler)
    if not hasattr(args, "process"):  # a command without -n
        return
    if args.process is None:  # -n not given
        args.process = 0
    else:  # checked only where a Dask executor plans with it: -n 0 is fine locally
        note_flag("KILN_JOBS", "-n", str(args.process))


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise KilnError(
            f"bad size {text!r} for --max-size",
            expected="a number with an optional unit: 500M, 2G, 1024",
            found=text,
        )
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).upper()])


def cmd_cache(args) -> int:
    from kiln.cache.store import LocalStore, default_cache_dir

    store = LocalStore(default_cache_dir() / "store")
    _require_directory(store.root)
    if args.cache_command == "stats":
        size = store.size()
        last = _last_build(store.root / "last-build.json")
        print(f"kiln cache: {store.root}")
        print(f"  entries: {size.entries} actions, {size.blobs} blobs, {_human(size.bytes)}")
        if last:
            print(
                f"  last build: {last.get('hit', 0)} local hits, {last.get('fetched', 0)} "
                f"fetched from the remote, {last.get('compiled', 0)} compiled (misses)"
            )
        else:
            print("  last build: no record")
        return 0
    if args.cache_command == "gc":
        limit = parse_size(args.max_size)
        removed, freed = store.gc(limit)
        size = store.size()
        print(f"kiln cache: removed {removed} files ({_human(freed)}); now {_human(size.bytes)}")
        return 0
    if args.cache_command == "push":
        return _push(store, args.remote)
    checked, dropped = store.verify()
    for path in dropped:
        print(f"kiln cache: dropped damaged entry {path}")
    print(f"kiln cache: checked {checked} files, dropped {len(dropped)}")
    return 0


def _push(store, url: str | None) -> int:
    from kiln.cache.config import resolve_cache_config
    from kiln.cache.push import push
    from kiln.cache.remote import RemoteStore

    # the project's cache: settings hold even with --remote (upload: false, the timeout)
    config = resolve_cache_config(_project_cache_settings(), remote_flag=url)
    url = config.remote
    if not url:
        raise KilnError(
            "no team cache to push to",
            expected="--remote URL, KILN_REMOTE_CACHE, or cache.remote in pipeline.yaml",
            found="none of them",
            hint="e.g. kiln cache push --remote s3://bucket/kiln (see docs/scale-out.md)",
        )
    if not config.upload:
        raise KilnError(
            f"uploads to {url} are off, and a push writes the team cache",
            expected="uploads on: KILN_REMOTE_UPLOAD=1 (or cache.upload: true)",
            found=(
                f"KILN_REMOTE_UPLOAD={os.environ['KILN_REMOTE_UPLOAD']}"
                if "KILN_REMOTE_UPLOAD" in os.environ
                else "cache.upload: false in pipeline.yaml"
            ),
            hint="push from a job trusted to write the team cache",
        )
    remote = RemoteStore(url, timeout=config.timeout, breaker_dir="")
    result = push(store, remote)
    print(
        f"kiln cache: pushed {result.pushed} actions ({_human(result.bytes)}) to {url}; "
        f"{result.present} were there already"
        + (f"; {result.damaged} damaged local entries dropped" if result.damaged else "")
    )
    if result.stopped or remote.broken:
        print(f"kiln cache: the push stopped: {url} is unavailable (see the warning)")
        return 1
    return 0


def _project_cache_settings() -> dict:
    """pipeline.yaml's ``cache:`` when the command runs inside a project, else {}."""
    from kiln.tasks.model.project import Project, find_pipeline

    try:
        path = find_pipeline()
    except KilnError:  # outside a project: the URL comes from --remote or the environment
        return {}
    return Project(path).pipeline.cache_settings


def _require_directory(root) -> None:
    """The store's place must be (or may become) a directory: say so rather than show it empty."""
    for place in (root, *root.parents):
        if place.exists():
            if place.is_dir():
                return
            raise KilnError(
                f"the artifact cache {root} cannot be used: {place} is not a directory",
                expected="KILN_CACHE_DIR naming a directory (or a place one can be made)",
                found=os.environ.get("KILN_CACHE_DIR", str(place)),
                hint="set KILN_CACHE_DIR to a writable directory",
            )


def _last_build(path) -> dict[str, int]:
    """The last build's counts (hit, fetched, compiled); {} when missing or not Kiln's."""
    try:
        last = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(last, dict):
        return {}
    counts = {k: last.get(k, 0) for k in ("hit", "fetched", "compiled")}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
        return {}
    return counts


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
