"""Which stage tasks send their chain to Dask before they run (see tasks/ahead_runner.py).

A task whose stage the cache lacks, under the dask executor, sends the
chain from its stage at once and runs once the chain is back: its action
then writes the outputs as it would have after waiting for them itself
(tasks/remote_exec.py ``run_chain_remotely``). Every other task runs at
once: one the cache holds, one written by its chain's walk, one that
dumps (dumps are made here), one whose action will report an error.

With a remote cache the lookup is an answer away (up to its timeout): it
is asked on one of ``LOOKUP_THREADS`` threads, which fetch the chain's run
of actions into the local store, as the task itself would, or send the
chain when the remote lacks it. Those threads never start a cluster (the
build's first action does, or ``prestart``), and when a run ends
(``end_chains_ahead``: done, failed or interrupted) the lookups not yet
started are dropped and the others send nothing more: a Ctrl-C neither
waits for a thousand remote answers nor starts the cluster it just closed.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

LOOKUP_THREADS = 16


class Lookups:
    """One run's lookup threads, made on first use; closed when the run ends."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None
        self.closed = False

    def submit(self, fn, *args) -> None:
        with self.lock:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="kiln-lookup")
            self.pool.submit(fn, self, *args)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)  # their tasks are never run now


_lookups = [Lookups()]


def end_chains_ahead() -> None:
    """The run is over: drop the lookups not started; the next run gets fresh threads."""
    lookups, _lookups[0] = _lookups[0], Lookups()
    lookups.close()


def begin_task(task) -> Future | None:
    """A Future settled when ``task`` may run (its chain is back); None: run it now."""
    from kiln.tasks.compile import stage_spec

    spec = stage_spec(task)
    if spec is None or "executor" not in spec:
        return None
    try:
        return begin(spec)
    except Exception:  # the action meets the same problem and reports it
        return None


def begin(spec: dict) -> Future | None:
    """``begin_task`` for the stage ``spec`` of a build with the dask executor."""
    from kiln.tasks.cached import is_settled

    from kiln.cache.config import CacheConfig
    from kiln.cache.session import session_for

    settings = spec.get("cache")
    if not settings or not settings.get("enabled") or spec["dumps"] or is_settled(spec):
        return None  # built here, or written by its chain's walk
    session = session_for(CacheConfig(**settings))
    if session.remote is None:
        from kiln.tasks.cached import stage_key

        return _send_unless_stored(spec, session, stage_key(spec))
    ready: Future = Future()
    _lookups[0].submit(_look_up_then_send, spec, session, ready)
    return ready


def _send_unless_stored(spec: dict, session, key: str, *, start: bool = True) -> Future | None:
    """Send the chain unless the local store holds ``key``, its first action."""
    from kiln.tasks.remote_exec import send_ahead

    if session.local.get_action(key) is not None:
        return None
    return send_ahead(spec, start=start)


def _look_up_then_send(lookups: Lookups, spec: dict, session, ready: Future) -> None:
    """On a lookup thread: fetch the chain from the remote, or send it; then settle ``ready``."""
    from kiln.tasks.cached import stage_key
    from kiln.tasks.prefetch import chain_id, keys_after

    sent = None
    try:
        session.claim(chain_id(spec))  # a walk fetching it ahead is waited for
        key = stage_key(spec)
        if session.local.get_action(key) is None:
            after = keys_after(spec["chain"], spec["stage_index"], None, stage_key)
            session.fetch_run(key, after, ahead=True)
            if not lookups.closed:  # sent only when the remote lacked it too
                sent = _send_unless_stored(spec, session, key, start=False)
    except Exception:  # the task itself meets it again and says so
        sent = None
    if sent is None:
        ready.set_result(None)
    else:
        sent.add_done_callback(lambda _: ready.set_result(None))
