"""The report in a real headless browser: it draws, hovers, selects, without errors.

Playwright drives the system's chromium (``executable_path``; Playwright's
own browser download is not used). Skipped when either is missing; CI
installs chromium (see .ci/run).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln.report.chromium import LAUNCH_ARGS, find_chromium

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None:
        pytest.skip("no chromium found (apt-get install chromium, or set KILN_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, report: Path):
    """The report, loaded and fully drawn, with every console error collected."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(report.resolve().as_uri())
    pg.wait_for_function("document.body.dataset.ready", timeout=30_000)
    pg.errors = errors
    yield pg
    pg.close()


def test_page_renders_without_console_errors(page):
    assert page.evaluate("document.body.dataset.ready") == "1"
    assert page.errors == []
    assert page.locator("#index-table tbody tr").count() == 5
    assert page.locator(".diagnostic").inner_text().count("matmul") == 1


def test_every_instruction_is_drawn_as_one_bar(page):
    counts = page.evaluate(
        "Object.entries(kiln.timelines).filter(([k]) => k !== '(build)')"
        ".map(([k, t]) => [k, +t.canvas.dataset.bars, +t.canvas.dataset.instructions])"
    )
    assert len(counts) == 4
    for name, bars, instructions in counts:
        assert bars == instructions > 0, name


def test_hovering_a_bar_shows_its_instruction(page):
    section = page.locator("section[data-name='softmax.small']")
    section.locator(".timeline canvas").scroll_into_view_if_needed()
    text = page.evaluate("kiln.timelines['softmax.small'].d.text[3]")
    pos = page.evaluate("kiln.timelines['softmax.small'].barCentre(3)")
    page.mouse.move(pos["x"], pos["y"])
    tip = section.locator(".tooltip")
    assert tip.is_visible()
    assert tip.inner_text().startswith(f"#3 {text}")
    assert "cycles" in tip.inner_text() and "deps" in tip.inner_text()


def test_clicking_a_source_line_highlights_what_it_produced(page, tmp_path):
    section = page.locator("section[data-name='softmax.small']")
    line = section.locator(".src-line", has_text=".exp()")
    line.click()
    lit = section.locator(".visa-line.hl")
    assert lit.count() >= 1
    # each line reads "<line number><instruction>"
    assert all(re.sub(r"^\d+", "", t).startswith("exp ") for t in lit.all_inner_texts())
    canvas = section.locator(".timeline canvas")
    assert canvas.get_attribute("data-highlighted") == str(lit.count())
    assert section.locator(".graph.traced .node.hl").count() == 1
    section.screenshot(path=str(tmp_path / "softmax-small.png"))
    assert (tmp_path / "softmax-small.png").stat().st_size > 10_000


def test_clicking_a_visa_instruction_highlights_its_source_line(page):
    section = page.locator("section[data-name='softmax.small']")
    section.locator(".visa-line", has_text="div %").first.click()
    assert section.locator(".src-line.hl").all_inner_texts() == [
        t for t in section.locator(".src-line").all_inner_texts() if "e / e.sum" in t
    ]
    assert section.get_attribute("data-selected") == "1"


def test_clicking_a_bar_selects_it_and_zoom_keeps_it_drawn(page):
    section = page.locator("section[data-name='gemm.wide']")
    section.locator(".timeline canvas").scroll_into_view_if_needed()
    pos = page.evaluate("kiln.timelines['gemm.wide'].barCentre(0)")
    page.mouse.click(pos["x"], pos["y"])
    assert section.locator(".visa-line.hl").get_attribute("data-instr") == "0"
    page.mouse.move(pos["x"], pos["y"])
    page.mouse.wheel(0, -400)  # zoom in around the bar
    span = page.evaluate("(t => t.t1 - t.t0)(kiln.timelines['gemm.wide'])")
    assert span < page.evaluate("kiln.timelines['gemm.wide'].end")
    assert section.locator(".timeline canvas").get_attribute("data-highlighted") == "1"


def test_index_sorts_by_a_column(page):
    page.locator("#index-table th", has_text="instructions").click()
    page.locator("#index-table th", has_text="instructions").click()  # descending
    first = page.locator("#index-table tbody tr").first.locator("td").first.inner_text()
    most = page.evaluate(
        "Object.entries(kiln.timelines).filter(([k]) => k !== '(build)')"
        ".sort((a, b) => b[1].n - a[1].n)[0][0]"
    )
    assert first == most
