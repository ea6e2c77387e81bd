"""kill -9 at any moment of a cold build, then a rebuild: every artifact as a clean build's."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

from tests.conftest import run_kiln
from tests.tasks.artifacts import clean_build, snapshot, wipe

SEED = 9
POINTS = 3


def test_build_killed_at_random_moments_then_rebuilt_is_byte_identical(project):
    env = dict(os.environ, KILN_CACHE_DIR=str(project / ".cache"))
    start = time.monotonic()
    reference = clean_build(project)
    cold = time.monotonic() - start
    rng = random.Random(SEED)
    for point in range(POINTS):
        wipe(project)
        delay = rng.uniform(0.2, 1.0) * cold  # anywhere from start-up to the last stage
        build = subprocess.Popen(
            [sys.executable, "-m", "kiln", "compile", "-n", str(1 + point % 2)],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        build.kill()
        build.wait()
        rebuilt = run_kiln(project, "compile", "--no-wait", timeout=120)
        assert rebuilt.returncode == 0, (point, delay, rebuilt.stderr)
        assert snapshot(project) == reference, (point, delay)
