"""Where the system's chromium is, and how to start it headless: for the report's
browser tests and benchmarks/view.py (Playwright drives it; its own browser
download is not used)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def find_chromium() -> str | None:
    """$KILN_CHROMIUM, /usr/bin/chromium, or a chromium/chrome on PATH; None if none."""
    for candidate in (os.environ.get("KILN_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None
