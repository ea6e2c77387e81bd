"""Starting a build's executor: early for a first build, on demand after it."""

from __future__ import annotations

import shutil
import socket
import threading
from types import SimpleNamespace

import pytest

from tests.conftest import REPO, SMALL_PIPELINE, machines_yaml, run_kiln

pytest.importorskip("distributed", reason="the dask executor needs kiln[distributed]")


def fake_project(tmp_path, kind: str) -> SimpleNamespace:
    pipeline = SimpleNamespace(
        executor={"kind": kind}, stages=[SimpleNamespace(module="kiln.stages.trace")]
    )
    return SimpleNamespace(
        pipeline=pipeline, root=tmp_path, dep_file=tmp_path / ".kiln" / "doit.sqlite3"
    )


def test_a_dask_build_with_nothing_to_do_never_contacts_the_scheduler(tmp_path):
    project = tmp_path / "p"
    shutil.copytree(REPO / "kernels", project / "kernels", ignore=shutil.ignore_patterns("__py*"))
    (project / "pipeline.yaml").write_text(SMALL_PIPELINE + machines_yaml())
    run_kiln(project, "compile", check=True)
    accepted = []
    with socket.socket() as server:  # a "scheduler" that counts who calls
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        done = threading.Event()

        def count():
            while not done.is_set():
                try:
                    accepted.append(server.accept()[0])
                except OSError:
                    continue

        counter = threading.Thread(target=count, daemon=True)
        counter.start()
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        proc = run_kiln(project, "compile", "--scheduler", address, check=True, timeout=60)
        done.set()
        counter.join(5)
    for conn in accepted:
        conn.close()
    assert "0 ran" in proc.stdout and proc.stderr == ""
    assert accepted == []  # up to date: no connection, no cluster, no wait
