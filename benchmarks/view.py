"""`kiln view` at scale: page load to first full render, and the report's size.

Synthetic schedules of 1k, 10k and 100k instructions (random DAG programs
scheduled by the schedule stage) are each written as a one-kernel report
and opened in headless chromium; the time from navigation start to the
page saying it has drawn everything (``kiln.renderMs``) is the figure.
Then the example pipeline is built in a temporary copy and its report's
size is measured.

    python benchmarks/view.py [--sizes 1000,10000,100000] [--skip-example] [--screenshot FILE]

Targets: 100k instructions drawn in under 2 s; under 1 MB of HTML per 10k
instructions (with every bar drawn and no console error); the example
build's report under 2 MB. Each is printed with met or MISSED, then
``targets: N met, M missed``; the exit status is 1 when a target is missed,
2 when there is no chromium.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verdicts import Targets, abort

from kiln.ir.schedule_check import random_program
from kiln.report.chromium import LAUNCH_ARGS, find_chromium
from kiln.report.html import render_page
from kiln.report.layout import lir_graph
from kiln.report.schedule_data import schedule_payload
from kiln.stages.schedule import Options, run
from kiln.summary import summarize

REPO = Path(__file__).resolve().parent.parent
RENDER_TARGET_S = 2.0
BYTES_PER_10K_TARGET = 1_000_000
EXAMPLE_TARGET = 2_000_000


def synthetic_report(n: int, path: Path) -> None:
    program = random_program(7, n=n, kernel=f"random{n}")
    sp = run(program, Options(), {})
    summary = summarize(sp, {"clock_mhz": 1000})
    row = {"name": f"random.{n}", "kernel": "random", "shapes": str(n), "path": "synthetic",
           "status": "built", "tests": {}, "bench": {}, "makespan": sp.makespan,
           "lower_bound": summary["lower_bound_cycles"], "ratio": summary["ratio"],
           "instructions": n, "sram_peak": program.sram_peak}  # fmt: skip
    detail = {"name": row["name"], "summary": summary, "schedule": schedule_payload(sp),
              "lir_graph": lir_graph(program), "dumps": []}  # fmt: skip
    path.write_text(render_page(f"synthetic {n}", [{"row": row, "detail": detail}], path))


def render_seconds(browser, path: Path, screenshot: Path | None = None) -> tuple[float, int, list]:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(path.resolve().as_uri())
    page.wait_for_function("window.kiln && window.kiln.ready", timeout=120_000)
    ms = page.evaluate("kiln.renderMs")
    bars = page.evaluate(
        "Object.entries(kiln.timelines).filter(([k]) => k !== '(build)')"
        ".reduce((n, [, t]) => n + +t.canvas.dataset.bars, 0)"
    )
    if screenshot is not None:
        page.locator("section.instance").first.screenshot(path=str(screenshot))
    page.close()
    return ms / 1000.0, bars, errors


def example_report_bytes(tmp: Path) -> int:
    for name in ("kernels", "apps"):
        shutil.copytree(REPO / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipeline.yaml", tmp / "pipeline.yaml")
    kiln = [sys.executable, "-m", "kiln"]
    subprocess.run([*kiln, "compile"], cwd=tmp, check=True, capture_output=True)
    subprocess.run([*kiln, "view", "-o", "report.html"], cwd=tmp, check=True, capture_output=True)
    return (tmp / "report.html").stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--skip-example", action="store_true")
    ap.add_argument("--screenshot", type=Path, help="save the 1k report's kernel section here")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        abort("no chromium found: apt-get install chromium (or set KILN_CHROMIUM)")
    targets = Targets()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        print(f"{'instructions':>12}  {'HTML bytes':>10}  {'per 10k':>9}  {'render s':>8}  bars")
        for n in (int(x) for x in args.sizes.split(",")):
            path = Path(tmp) / f"r{n}.html"
            t = time.perf_counter()
            synthetic_report(n, path)
            write_s = time.perf_counter() - t
            size = path.stat().st_size
            shot = (
                args.screenshot
                if args.screenshot and n == min(int(x) for x in args.sizes.split(","))
                else None
            )
            seconds, bars, errors = render_seconds(browser, path, shot)
            per10k = size * 10_000 / n
            verdicts = [
                targets.judge(
                    f"{n} instructions: size and bars",
                    per10k < BYTES_PER_10K_TARGET and bars == n and not errors,
                )
            ]
            if n >= 100_000:
                verdicts.append(
                    targets.judge(f"{n} instructions: render", seconds < RENDER_TARGET_S)
                )
            print(
                f"{n:>12}  {size:>10}  {per10k:>9.0f}  {seconds:>8.3f}  {bars}"
                + (f"  ERRORS: {'; '.join(errors)}" if errors else "")
                + f"  (written in {write_s:.1f} s)  {', '.join(verdicts)}"
            )
        browser.close()
        print(
            f"judged against: 100k render < {RENDER_TARGET_S} s, "
            f"< {BYTES_PER_10K_TARGET} bytes per 10k instructions"
        )
        if not args.skip_example:
            example = Path(tmp) / "example"
            example.mkdir()
            size = example_report_bytes(example)
            verdict = targets.judge("example build report size", size < EXAMPLE_TARGET)
            print(f"example build report: {size} bytes (target < {EXAMPLE_TARGET})  {verdict}")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
