"""`kiln view`: one self-contained HTML report of a build (see docs/view.md).

data.py reads a build's artifacts and recorded results, layout.py lays
graphs out with networkx, schedule_data.py turns a schedule into timeline
columns, html.py writes the page (assets/ holds its CSS and JS), compare.py
diffs two builds. The report sits beside the CLI: it reads kiln.tasks and
the stages' artifacts, and nothing below it imports it.
"""
