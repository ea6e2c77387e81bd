"""The report as one self-contained HTML file: CSS and JS inline, data embedded.

The index table is plain HTML (readable with scripts off); each instance's
detail (timeline columns, graphs, source map) is JSON, deflated and base64
encoded in a ``<script type="application/octet-stream">`` that the page
inflates with the browser's DecompressionStream: a 10k-instruction schedule
costs well under 1 MB. Same data, same bytes: no timestamps, sorted keys.
"""

from __future__ import annotations

import base64
import html
import json
import os
import zlib
from importlib import resources
from pathlib import Path


def asset(name: str) -> str:
    return resources.files("kiln.report").joinpath("assets", name).read_text()


def pack(value) -> str:
    """JSON, deflated (zlib, what DecompressionStream('deflate') reads), base64."""
    raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    return base64.b64encode(zlib.compress(raw, 9)).decode()


def _script_json(value) -> str:
    # "</" would end the <script> element early
    return json.dumps(value, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _num(value, digits: int | None = None) -> str:
    if value is None:
        return '<td data-sort="-1"></td>'
    text = f"{value:.{digits}f}" if digits is not None else str(value)
    return f'<td data-sort="{value}">{_e(text)}</td>'


def _tests_cell(tests: dict) -> str:
    if not tests:
        return "<td></td>"
    parts = []
    for target, t in sorted(tests.items()):
        err = f" {t['max_abs']:.1e}" if isinstance(t.get("max_abs"), int | float) else ""
        cls = _e(t["status"]) + (" stale" if t.get("stale") else "")
        parts.append(f'<span class="{cls}">{_e(target)}: {_e(t["status"])}{err}{_older(t)}</span>')
    return '<td class="text">' + "<br>".join(parts) + "</td>"


def _older(result: dict) -> str:
    """The mark of a result of an older build of the instance (another binary)."""
    return " (older build)" if result.get("stale") else ""


def _bench_cell(bench: dict) -> str:
    parts = []
    for target, row in sorted(bench.items()):
        if row.get("cycles") is not None:
            parts.append(f"{_e(target)}: {row['cycles']} cycles{_older(row)}")
        elif row.get("median_ms") is not None:
            parts.append(f"{_e(target)}: {row['median_ms']:.3g} ms{_older(row)}")
    return '<td class="text">' + "<br>".join(parts) + "</td>"


def index_table(rows: list[dict], anchors: list[str]) -> str:
    head = (
        '<tr><th class="name">kernel instance</th><th>status</th><th>makespan</th>'
        "<th>lower bound</th><th>ratio</th><th>instructions</th><th>SRAM peak</th>"
        "<th>last test</th><th>last bench</th></tr>"
    )
    body = []
    for row, anchor in zip(rows, anchors, strict=True):
        status = row["status"]
        body.append(
            "<tr>"
            f'<td class="name"><a href="#{anchor}">{_e(row["name"])}</a></td>'
            f'<td class="status-{status.replace(" ", "-")}">{_e(status)}</td>'
            + _num(row.get("makespan"))
            + _num(row.get("lower_bound"))
            + _num(row.get("ratio"), 3)
            + _num(row.get("instructions"))
            + _num(row.get("sram_peak"))
            + _tests_cell(row.get("tests") or {})
            + _bench_cell(row.get("bench") or {})
            + "</tr>"
        )
    return f'<table id="index-table"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def compare_table(diff: dict) -> str:
    def pct(v):
        if v is None:
            return "<td></td>"
        cls = "up" if v > 0 else "down" if v < 0 else ""
        return f'<td class="{cls}" data-sort="{v}">{v:+.1f}%</td>'

    rows = []
    for r in diff["rows"]:
        rows.append(
            f'<tr><td class="name">{_e(r["name"])}</td>'
            + _num(r["cycles_before"])
            + _num(r["cycles_after"])
            + pct(r["cycles_change"])
            + _num(r["instructions_before"])
            + _num(r["instructions_after"])
            + pct(r["instructions_change"])
            + f"<td>{'changed' if r['bytes_changed'] else 'same'}</td></tr>"
        )
    extra = "".join(f"<li>added: {_e(n)}</li>" for n in diff["added"])
    extra += "".join(f"<li>removed: {_e(n)}</li>" for n in diff["removed"])
    return (
        f"<p>before: <code>{_e(diff['before'])}</code> · "
        f"after: <code>{_e(diff['after'])}</code></p>"
        '<table id="compare-table"><thead><tr><th class="name">kernel instance</th>'
        "<th>cycles before</th><th>after</th><th>change</th><th>instructions before</th>"
        "<th>after</th><th>change</th><th>bytes</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table><ul>{extra}</ul>"
    )


def render_page(
    title: str,
    entries: list[dict],
    report_path: Path,
    tasks: dict | None = None,
    profile: list[dict] | None = None,
    profile_critical: list[int] | None = None,
    diff: dict | None = None,
) -> str:
    """The whole page. ``entries`` come from data.collect; dump paths become relative links."""
    base = Path(report_path).resolve().parent
    anchors = [f"i-{n}" for n in range(len(entries))]
    sections, blobs = [], []
    for entry, anchor in zip(entries, anchors, strict=True):
        detail = dict(entry["detail"])
        detail["dumps"] = [_relative(p, base) for p in detail.get("dumps", [])]
        row = entry["row"]
        sections.append(
            f'<section class="instance" id="{anchor}" data-name="{_e(row["name"])}">'
            f'<h2>{_e(row["name"])} <small class="hint">{_e(row["path"])} · '
            f"{_e(row['status'])}</small></h2></section>"
        )
        blobs.append(
            f'<script type="application/octet-stream" class="kiln-detail" '
            f'data-section="{anchor}">{pack(detail)}</script>'
        )
    index = {
        "tasks": tasks or {},
        "profile": profile or [],
        "profile_critical": profile_critical or [],
    }
    built = sum(e["row"]["status"] in ("built", "out of date") for e in entries)
    failed = sum(e["row"]["status"] == "failed" for e in entries)
    stale = sum(e["row"]["status"] == "out of date" for e in entries)
    stale_note = f" ({stale} out of date)" if stale else ""
    compare = f"<h2>Compared with another build</h2>{compare_table(diff)}" if diff else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} · kiln report</title>"
        f"<style>{asset('report.css')}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="hint">{len(entries)} kernel instances: {built} built{stale_note}, '
        f"{failed} failed, {len(entries) - built - failed} not built</p>"
        f"{compare}<h2>Kernels</h2>{index_table([e['row'] for e in entries], anchors)}"
        '<h2>Build</h2><div id="build"></div>'
        + "".join(sections)
        + f'<script type="application/json" id="kiln-index">{_script_json(index)}</script>'
        + "".join(blobs)
        + f"<script>{asset('report.js')}</script></body></html>\n"
    )


def _relative(path: str, base: Path) -> str:
    rel = os.path.relpath(Path(path).resolve(), base)
    return Path(rel).as_posix()
