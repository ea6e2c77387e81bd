"""`kiln cache push`: the local store's entries the team cache lacks, uploaded once."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("fsspec", reason="the remote cache needs kiln[distributed]")

from kiln.cache.push import action_keys, push  # noqa: E402
from kiln.cache.remote import RemoteStore  # noqa: E402
from kiln.cache.store import SIDE_PREFIX, LocalStore, sha256  # noqa: E402
from tests.conftest import run_kiln  # noqa: E402


def _filled(tmp_path, count: int) -> LocalStore:
    local = LocalStore(tmp_path / "local")
    for n in range(count):
        outputs = {"artifact": f"artifact {n}".encode(), SIDE_PREFIX + "map.json": b"shared"}
        local.store(f"{n:02x}" * 32, outputs)
    return local


def test_push_uploads_what_the_remote_lacks_and_skips_what_it_has(tmp_path):
    local = _filled(tmp_path, 5)
    remote = RemoteStore(f"file://{tmp_path}/team")
    first_key = action_keys(local)[0]
    remote.store(first_key, local.lookup(first_key), local.get_action(first_key))
    result = push(local, remote, threads=3)
    assert (result.pushed, result.present, result.damaged, result.stopped) == (4, 1, 0, False)
    # the blob every action shares was on the remote already: only the new bytes count
    assert result.bytes == sum(len(f"artifact {n}") for n in range(1, 5))
    reader = RemoteStore(f"file://{tmp_path}/team")
    for key in action_keys(local):
        assert reader.lookup(key) == local.lookup(key)
    again = push(local, RemoteStore(f"file://{tmp_path}/team"))
    assert (again.pushed, again.present, again.bytes) == (0, 5, 0)


def test_a_damaged_local_entry_is_never_pushed(tmp_path):
    local = _filled(tmp_path, 2)
    key = action_keys(local)[0]
    local.blob_path(local.get_action(key)["artifact"]).write_bytes(b"bit rot")
    remote = RemoteStore(f"file://{tmp_path}/team")
    result = push(local, remote)
    assert (result.pushed, result.damaged) == (1, 1)
    assert remote.has_action(key) is False
    assert not (tmp_path / "team" / "cas" / sha256(b"bit rot")[:2]).exists()


def test_an_unavailable_remote_stops_the_push_with_one_warning(tmp_path, capfd):
    remote = RemoteStore("file:///proc/kiln-no-such-dir")
    result = push(_filled(tmp_path, 3), remote)
    assert result.stopped and result.pushed == 0
    assert capfd.readouterr().err.count("kiln: warning: remote cache") == 1


def test_a_url_no_backend_opens_stops_the_push_without_a_traceback(tmp_path, capfd):
    remote = RemoteStore("bogus://x")
    result = push(_filled(tmp_path, 3), remote)
    assert result.stopped and result.pushed == 0
    err = capfd.readouterr().err
    assert err.count("kiln: warning: remote cache bogus://x is unavailable") == 1
    assert "Traceback" not in err


def test_kiln_cache_push_fills_the_team_cache_a_clean_clone_then_fetches(project, tmp_path):
    built = run_kiln(project, "compile", "vector_add", check=True)  # local store only
    assert "compiled)" in built.stdout
    team = f"file://{tmp_path}/team"
    pushed = run_kiln(project, "cache", "push", "--remote", team, check=True)
    assert pushed.stdout.startswith("kiln cache: pushed ") and "were there already" in pushed.stdout
    again = run_kiln(project, "cache", "push", env={"KILN_REMOTE_CACHE": team}, check=True)
    assert "kiln cache: pushed 0 actions (0 B)" in again.stdout

    clone = tmp_path / "clone"
    shutil.copytree(project / "kernels", clone / "kernels")
    shutil.copy(project / "pipeline.yaml", clone / "pipeline.yaml")
    fetched = run_kiln(clone, "compile", "vector_add", env={"KILN_REMOTE_CACHE": team}, check=True)
    assert " 0 compiled)" in fetched.stdout, fetched.stdout


def test_a_project_with_uploads_off_never_pushes_even_to_a_given_remote(project, tmp_path):
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text() + "cache: {upload: false}\n")
    proc = run_kiln(project, "cache", "push", "--remote", f"file://{tmp_path}/team")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "found: cache.upload: false in pipeline.yaml" in proc.stderr
    assert not (tmp_path / "team").exists()
    # --remote wins over a KILN_REMOTE_CACHE that is no URL at all
    env = {"KILN_REMOTE_CACHE": "s3:/x", "KILN_REMOTE_UPLOAD": "1"}
    ok = run_kiln(project, "cache", "push", "--remote", f"file://{tmp_path}/team", env=env)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(
    "args, env, message",
    [
        ((), {}, "error: no team cache to push to"),
        (("--remote", "s3:/x"), {}, "error: --remote is not a usable remote cache URL"),
        (
            ("--remote", "file:///tmp/team"),
            {"KILN_REMOTE_UPLOAD": "0"},
            "error: uploads to file:///tmp/team are off",
        ),
    ],
)
def test_kiln_cache_push_refuses_what_it_cannot_do(tmp_path, args, env, message):
    proc = run_kiln(tmp_path, "cache", "push", *args, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr
