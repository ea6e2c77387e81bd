"""The `kiln` command: parsing, help, completion and the commands' front ends.

The top layer: nothing else in Kiln imports it. ``kiln.cli.command.main`` is the
console script's entry point (and ``python -m kiln``'s).
"""

from kiln.cli.command import main

__all__ = ["main"]
