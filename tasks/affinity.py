"""Which `-n` process runs a task: every stage task of one kernel instance in the same one.

A stage task that finds its artifact in the cache writes the rest of its
chain from the cache at once (``cached.write_rest_of_chain``), and a stage
reuses the digest of the input its own process just wrote. Both only pay
off when the chain's later tasks run in the process that did that work:
with them spread over the workers, each later task found nothing settled,
hashed its input again and rewrote its instance's manifest, and an `-n 2`
build spent about a third more CPU than `-n 1` on the same actions.
"""

from __future__ import annotations

from kiln.tasks.results import task_instance

_state = {"whole_chains": False}


def chain_of(task_name: str) -> str | None:
    """The kernel instance a compile task belongs to (None: any worker may run it)."""
    owner = task_instance(task_name)
    return None if owner is None else owner[0]


def keep_whole_chains() -> None:
    """In a worker that is sent every task of each chain it starts."""
    _state["whole_chains"] = True


def whole_chains_here() -> bool:
    """Whether this process runs the later tasks of the chains it starts."""
    return _state["whole_chains"]
