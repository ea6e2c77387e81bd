"""The team cache on S3: moto's standalone server on 127.0.0.1, s3fs pointed at it.

One build fills the bucket and a clean clone fetches everything; a second
build loses the server in the middle of its uploads and still completes,
with one warning.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln
from tests.support.outdir import build_bytes

pytest.importorskip("s3fs", reason="the S3 cache needs kiln[distributed]")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server]")
boto3 = pytest.importorskip("boto3")

INSTANCES = 4  # vector_add, softmax, gemm.small, gemm.wide
TASKS = INSTANCES  # one compile task (one cache entry) per instance: its whole chain
STAGES = 5
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ, **CREDENTIALS),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        self.client = boto3.client("s3", endpoint_url=self.url, **_boto_credentials())

    def keys(self, bucket: str) -> list[str]:
        found = self.client.list_objects_v2(Bucket=bucket).get("Contents", [])
        return [o["Key"] for o in found]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def _boto_credentials() -> dict:
    return {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }


@pytest.fixture
def s3_server():
    server = MotoServer()
    server.client.create_bucket(Bucket="team-cache")
    yield server
    server.stop()


def s3_project(base: Path, name: str) -> Path:
    project = base / name
    shutil.copytree(REPO / "kernels", project / "kernels", ignore=shutil.ignore_patterns("__py*"))
    cache = "cache: {remote: s3://team-cache/kiln, timeout: 5}\n"
    (project / "pipeline.yaml").write_text(cache + SMALL_PIPELINE + machines_yaml())
    return project


def artifacts(project: Path) -> dict[str, bytes]:
    return build_bytes(project)


def test_build_through_s3_then_clean_clone_fetches_everything(s3_server, tmp_path):
    env = dict(CREDENTIALS, KILN_S3_ENDPOINT_URL=s3_server.url)
    origin = s3_project(tmp_path, "origin")
    proc = run_kiln(origin, "compile", env=env, check=True)
    assert f"(0 fetched, {TASKS} compiled)" in proc.stdout, proc.stderr
    assert len([k for k in s3_server.keys("team-cache") if k.startswith("kiln/ac/")]) == TASKS
    fresh = s3_project(tmp_path, "clone")
    proc = run_kiln(fresh, "compile", env=dict(env, KILN_LOG_INFO="1"), check=True)
    assert f"({TASKS} fetched, 0 compiled)" in proc.stdout, proc.stderr
    assert artifacts(fresh) == artifacts(origin)
    # every chain's entry fetched landed in the local store
    local_actions = [p for p in (fresh / ".cache" / "store" / "ac").glob("*/*") if p.is_file()]
    assert len(local_actions) == TASKS
    again = run_kiln(fresh, "compile", env=env, check=True)
    assert f"0 ran, {TASKS} up to date" in again.stdout


def test_s3_server_killed_mid_upload_build_completes_with_one_warning(s3_server, tmp_path):
    env = dict(
        os.environ, KILN_CACHE_DIR=str(tmp_path / "local"), KILN_S3_ENDPOINT_URL=s3_server.url
    )
    env.update(CREDENTIALS)
    project = s3_project(tmp_path, "origin")
    build = subprocess.Popen(
        [sys.executable, "-m", "kiln", "compile"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not s3_server.keys("team-cache") and time.monotonic() < deadline:
        time.sleep(0.02)
    s3_server.stop()  # uploads have begun: the server goes away under the build
    out, err = build.communicate(timeout=120)
    assert build.returncode == 0, err
    assert f"{TASKS} failed" not in out and "0 failed" in out
    assert err.count("warning") == 1 and "unavailable" in err, err
    assert "Traceback" not in err
    names = {"graph.json", "kernel.visa", "kernel.lir", "kernel.sched", "kernel.edf"}
    assert len([p for p in artifacts(project) if Path(p).name in names]) == INSTANCES * STAGES


def test_a_misspelt_bucket_is_one_warning_not_a_silently_empty_cache(s3_server, tmp_path):
    env = dict(CREDENTIALS, KILN_S3_ENDPOINT_URL=s3_server.url)
    project = s3_project(tmp_path, "typo")
    text = (project / "pipeline.yaml").read_text()
    (project / "pipeline.yaml").write_text(text.replace("s3://team-cache/", "s3://teem-cache/"))
    proc = run_kiln(project, "compile", env=env, check=True)
    assert f"(0 fetched, {TASKS} compiled)" in proc.stdout
    assert proc.stderr.count("warning") == 1, proc.stderr
    assert "s3://teem-cache/kiln is unavailable" in proc.stderr
    assert "The specified bucket does not exist" in proc.stderr
