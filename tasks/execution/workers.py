"""The worker processes of an `-n N` build: start method, shared imports, no orphans.

Plain ``doit -n N`` runs tasks in doit's own process runner; ``kiln compile
-n N`` runs chains on a process pool (tasks/execution/pool.py). Loading tasks imports
nothing heavy (a no-op build stays fast), so without help every worker
would import numpy, ml_dtypes and the stages on its first task, once per
worker: for a short build that is most of the work. Instead the parent
imports the stage modules right before it forks the first worker (only a
build with work to do forks), and forked workers share them; under the
forkserver start method the server preloads them.

``KILN_MP_START=fork|spawn|forkserver`` picks the start method (default:
Python's). Workers exit when the build that started them dies, so a
killed build leaves no process behind (and none holding the project lock).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterable

from kiln.errors import KilnError

START_METHOD_ENV = "KILN_MP_START"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_preload: list[str] = []
_state = {"hooks": False, "guarded": False, "parent": 0, "exit_hook": False}


def prepare_workers(modules: Iterable[str]) -> None:
    """Call before running tasks: applies KILN_MP_START and arms the shared imports."""
    method = os.environ.get(START_METHOD_ENV, "").strip()
    if method:
        methods = multiprocessing.get_all_start_methods()
        if method not in methods:
            raise KilnError(
                f"unknown multiprocessing start method {method!r} in {START_METHOD_ENV}",
                expected="one of: " + ", ".join(methods),
                found=method,
            )
        multiprocessing.set_start_method(method, force=True)
    make_full_collections_rare()  # forked workers inherit it
    skip_final_collection()
    _preload[:] = list(dict.fromkeys(modules))
    if multiprocessing.get_start_method() == "forkserver":
        multiprocessing.set_forkserver_preload(list(_preload))
    if not _state["hooks"] and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_import_before_fork, after_in_child=_after_fork_in_child)
        _state["hooks"] = True


def _import_before_fork() -> None:
    # In the parent, just before a fork: import once what every worker would import.
    _state["parent"] = os.getpid()
    modules, _preload[:] = list(_preload), []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the task that needs it reports the error
            pass
    if modules:
        # keep the imported objects out of the workers' garbage collections: a
        # collection touches every object, copying the shared pages into each worker
        gc.freeze()


def _after_fork_in_child() -> None:
    _state["guarded"] = False
    die_with_parent(_state["parent"])


def die_with_parent(parent_pid: int) -> None:
    """Linux: ask the kernel to kill this process when its parent dies."""
    if not sys.platform.startswith("linux") or not parent_pid:
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


FULL_COLLECTION_EVERY = 1000  # young-generation collections per full one (Python's: 10)


def make_full_collections_rare() -> None:
    """Raise the garbage collector's full-collection threshold for this build process.

    Stages make many short-lived objects, freed by reference counting, and each
    full collection walks every live object (numpy, the stages, doit's tasks):
    with Python's thresholds they took about a quarter of a cold `-n 1` build
    (11 s against 7.6 s). Young collections run as often as before, so cycles
    among new objects are still freed at once; a user's own higher setting stays.
    """
    young, middle, full = gc.get_threshold()
    if 0 < full < FULL_COLLECTION_EVERY:
        gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def skip_final_collection() -> None:
    """Spare this build process the garbage collection Python runs as it exits.

    That last collection walks every object still alive (doit's tasks, the
    pipeline, numpy) only to free memory the exiting process gives back
    anyway: about 0.3 s of every run of a 1,500-instance project, a third of
    its no-op build. Freezing the objects at exit keeps them out of it;
    ``atexit`` handlers run first, and files are closed as before.
    """
    if not _state["exit_hook"]:
        _state["exit_hook"] = True
        atexit.register(_freeze_unless_checked)


def _freeze_unless_checked() -> None:
    # IREE's bindings (nanobind) check at exit that their objects were freed, and
    # print a page of leak warnings for frozen ones: a run that used IREE pays
    if not any(name == "iree" or name.startswith("iree.") for name in sys.modules):
        gc.freeze()


def guard_worker() -> None:
    """In a worker of any start method: exit as soon as the process that started it dies.

    Called by task actions (cheap after the first call). A forkserver or
    spawn worker's OS parent may not be the build, so this watches the
    build's own sentinel rather than the parent pid.
    """
    if _state["guarded"]:
        return
    _state["guarded"] = True
    make_full_collections_rare()  # a spawned or forkserver worker did not inherit it
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    threading.Thread(target=_exit_when_gone, args=(parent,), daemon=True).start()


def _exit_when_gone(parent) -> None:
    parent.join()
    os._exit(1)
