"""A task's failure as doit sees it: TaskFailed carrying Kiln's diagnostic as JSON.

The reporter finds the mark and prints the diagnostic in the user's
chosen format, with no traceback.
"""

from __future__ import annotations

import json

from doit.exceptions import TaskFailed

from kiln.errors import KilnError

DIAGNOSTIC_MARK = "KILN-DIAGNOSTIC "


def failure(err: KilnError) -> TaskFailed:
    return TaskFailed(DIAGNOSTIC_MARK + json.dumps(err.to_dict(), sort_keys=True))
