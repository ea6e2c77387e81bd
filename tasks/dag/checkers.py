"""doit's file checkers, told what the compile loader already knows.

doit asks its checker whether each target exists and stats each file
dependency of each task: on a no-op build of thousands of instances that
is a second stat of every artifact the damage check has just statted, and
the same kernel module statted once per instance. The compile loader
hands over both facts (``note_checked``) and these checkers answer from
them; anything else goes to the file system as doit's own checkers do.
"""

from __future__ import annotations

import os

from doit.dependency import MD5Checker as DoitMD5Checker
from doit.dependency import TimestampChecker as DoitTimestampChecker

# (paths the damage check found unchanged, source files no task writes), replaced by each
# load of the compile tasks: a checker is made before its run's tasks are loaded
_CHECKED: list[tuple[frozenset[str], frozenset[str]]] = [(frozenset(), frozenset())]


def note_checked(intact: set[str], sources: set[str]) -> None:
    """Record this load's unchanged artifacts and the kernel sources its tasks depend on."""
    _CHECKED[0] = (frozenset(intact), frozenset(sources))


class _Informed:
    """The shared part: exists() from the damage check, one stat per source file."""

    def __init__(self):
        self._stats: dict[str, os.stat_result] = {}

    def exists(self, file_path):
        # an artifact found unchanged a moment ago exists: no task deletes another's files
        return file_path in _CHECKED[0][0] or os.path.exists(file_path)

    def info(self, file_path):
        if file_path not in _CHECKED[0][1]:
            return os.stat(file_path)  # anything a task may write is statted afresh
        stat = self._stats.get(file_path)
        if stat is None:
            stat = self._stats[file_path] = os.stat(file_path)
        return stat


# doit records its checker's class name with every task and forgets a task whose name
# differs: these keep doit's names, so switching to them rebuilds nothing
class TimestampChecker(_Informed, DoitTimestampChecker):
    """doit's timestamp checker, answering from what the loader checked."""


class MD5Checker(_Informed, DoitMD5Checker):
    """doit's md5 checker, answering from what the loader checked."""
