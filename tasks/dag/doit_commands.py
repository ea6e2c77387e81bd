"""doit commands as Kiln runs them: `info` of an unknown task and `dumpdb` of Kiln's state.

doit's own `info` looks the task up in a dict and prints a KeyError
traceback for a name that is not a task; its `dumpdb` opens the state
file with dbm, which cannot read the sqlite3 file Kiln keeps its state in.
"""

from __future__ import annotations

import difflib
import json
import pprint
import sys

from doit.cmd_base import DoitCmdBase
from doit.cmd_info import Info
from doit.doit_cmd import DoitMain
from doit.exceptions import InvalidCommand


def check_task_name(name: str, names: list[str], lister: str = "kiln list --all") -> None:
    """An unknown task is doit's usage error, worded as `forget` words it, with a near name."""
    if name in names:
        return
    if ":" in name:  # compile:gemm.default.edf is nearer to its siblings than to `compile`
        names = [n for n in names if ":" in n]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f" Did you mean '{close[0]}'?" if close else f" `{lister}` lists the tasks."
    raise InvalidCommand(f"'{name}' is not a task.{hint}")


class KilnInfo(Info):
    """`info TASK`: doit's, with an unknown task as one line instead of a KeyError.

    Plain `doit` in a project gets it from ``[tool.doit.plugins.command]``.
    """

    name = "info"
    lister = "doit list --all"  # plain doit's words (under -m its bin name is __main__.py)

    def _execute(self, pos_args, hide_status=False):
        if len(pos_args) == 1:
            check_task_name(pos_args[0], [t.name for t in self.task_list], self.lister)
        return super()._execute(pos_args, hide_status=hide_status)


class KilnCliInfo(KilnInfo):
    """`kiln info TASK`: the hint names kiln's own list command."""

    lister = "kiln list --all"


class KilnDumpDB(DoitCmdBase):
    """`dumpdb`: every task's saved state from Kiln's sqlite3 state file."""

    name = "dumpdb"
    doc_purpose = "dump dependency DB"
    doc_usage = ""
    doc_description = None
    cmd_options = ()

    def _execute(self, dep_file, backend):
        import sqlite3

        self.dep_manager.close()
        # under plain doit the command kept the stdout it found before dodo.py guarded it
        out = sys.stdout if self.outstream is sys.__stdout__ else self.outstream
        if backend != "sqlite3":  # pragma: no cover - Kiln's config always says sqlite3
            raise InvalidCommand(f"dumpdb reads Kiln's sqlite3 state, not {backend!r}")
        try:
            conn = sqlite3.connect(f"file:{dep_file}?mode=ro", uri=True)
            try:
                rows = conn.execute("select task_id, task_data from doit order by task_id")
                for task_id, data in rows:
                    value = pprint.pformat(json.loads(data), indent=4, width=100)
                    out.write(f"{task_id} -> {value}\n")
            finally:
                conn.close()
        except (sqlite3.Error, ValueError) as exc:
            raise InvalidCommand(f"cannot read the state file {dep_file}: {exc}") from None
        return 0


class KilnDoitMain(DoitMain):
    """doit's command line with Kiln's `info` and `dumpdb`."""

    DOIT_CMDS = tuple(
        {"info": KilnCliInfo, "dumpdb": KilnDumpDB}.get(cmd.get_name(), cmd)
        for cmd in DoitMain.DOIT_CMDS
    )
