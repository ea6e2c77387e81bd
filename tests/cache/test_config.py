"""pipeline.yaml ``cache:`` and the environment that overrides it."""

from __future__ import annotations

import pytest

from kiln.cache.config import remote_url_problem, require_remote_support, resolve_cache_config
from kiln.errors import KilnError


def test_env_overrides_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_REMOTE_CACHE", "file:///shared/team")
    monkeypatch.setenv("KILN_REMOTE_UPLOAD", "0")
    config = resolve_cache_config({"remote": "file:///elsewhere", "upload": True, "timeout": 3})
    assert config.remote == "file:///shared/team"
    assert config.upload is False
    assert config.timeout == 3.0
    assert config.local_dir == str(tmp_path / "store")


def test_empty_env_turns_the_remote_off(monkeypatch):
    monkeypatch.setenv("KILN_REMOTE_CACHE", "")
    assert resolve_cache_config({"remote": "file:///x"}).remote is None


def test_missing_extra_is_one_message_naming_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "s3fs" else real(name, *a)
    )
    with pytest.raises(KilnError) as info:
        require_remote_support("s3://bucket/prefix")
    assert info.value.message.endswith("needs s3fs, which is not installed")
    assert "kiln-kernels[distributed]" in info.value.hint
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if "fs" in name else real(name, *a)
    )
    with pytest.raises(KilnError) as info:
        require_remote_support("s3://bucket/prefix")
    assert info.value.message.endswith("needs fsspec and s3fs, which are not installed")


def test_pipeline_yaml_declares_the_remote_and_the_executor(project):
    from kiln.pipeline import load_pipeline

    path = project / "pipeline.yaml"
    text = path.read_text()
    path.write_text(
        "cache: {check: md5, remote: 's3://team/kiln', upload: false, timeout: 4}\n"
        "executor: {kind: dask, address: 'tcp://10.0.0.1:8786'}\n" + text
    )
    pipeline = load_pipeline(path)
    assert pipeline.cache_check == "md5"
    assert pipeline.cache_settings == {"remote": "s3://team/kiln", "upload": False, "timeout": 4}
    assert pipeline.executor == {"kind": "dask", "address": "tcp://10.0.0.1:8786"}


def test_unknown_executor_kind_is_rejected_with_the_key_path(project):
    from kiln.pipeline import load_pipeline

    path = project / "pipeline.yaml"
    path.write_text("executor: {kind: ray}\n" + path.read_text())
    with pytest.raises(KilnError) as info:
        load_pipeline(path)
    assert "executor.kind" in info.value.render()


@pytest.mark.parametrize(
    "value, on",
    [("0", False), ("off", False), ("NO", False), ("False", False), (" 0 ", False)]
    + [("1", True), ("on", True), ("YES", True), ("true", True)],
)
def test_on_off_variables_read_every_spelling_alike(monkeypatch, value, on):
    monkeypatch.setenv("KILN_REMOTE_UPLOAD", value)
    monkeypatch.setenv("KILN_CACHE", value)
    config = resolve_cache_config({"remote": "file:///x"})
    assert config.upload is on and config.enabled is on


def test_a_blank_upload_variable_reads_as_read_only(monkeypatch):
    monkeypatch.setenv("KILN_REMOTE_UPLOAD", "")
    assert resolve_cache_config({"remote": "file:///x"}).upload is False


@pytest.mark.parametrize("name", ["KILN_REMOTE_UPLOAD", "KILN_CACHE"])
def test_an_on_off_variable_with_another_value_is_an_error_naming_it(monkeypatch, name):
    monkeypatch.setenv(name, "disable")
    with pytest.raises(KilnError) as caught:
        resolve_cache_config({"remote": "file:///x"})
    text = caught.value.render()
    assert f"{name} is not on or off" in text and "disable" in text


@pytest.mark.parametrize(
    "url, problem",
    [
        ("foo://bar/baz", "fsspec knows no protocol 'foo'"),
        ("FILE:///tmp/x", "scheme 'FILE' is not lower case"),
        ("s3:/bucket", "neither a URL"),
        ("relative/dir", "neither a URL"),
        ("file://", "names no location"),
        ("   ", "spaces or control characters"),
        ("file:///tmp/x\n", "spaces or control characters"),
    ],
)
def test_unusable_remote_urls_are_named_once(url, problem):
    found = remote_url_problem(url)
    assert found is not None and problem in found[0]


@pytest.mark.parametrize(
    "url, hint",
    [
        ("file://mnt/team-cache", "file:///mnt/team-cache"),
        ("file://localhost/mnt/team-cache", "file:///mnt/team-cache"),
    ],
)
def test_a_file_url_with_two_slashes_is_refused_not_a_cache_inside_the_clone(url, hint):
    # fsspec would resolve it under the working directory: every clone its own "team" cache
    found = remote_url_problem(url, protocols=False)
    assert found is not None and "needs an absolute path" in found[0] and hint in found[1]


@pytest.mark.parametrize("url", ["file:///mnt/team-cache", "/mnt/team-cache", "s3://b/prefix"])
def test_usable_remote_urls_pass(url):
    assert remote_url_problem(url) is None


def test_a_protocol_whose_package_is_missing_names_the_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a)
    )
    problem = remote_url_problem("gs://bucket/x")
    assert problem == ("gs:// needs the package gcsfs, which is not installed", "pip install gcsfs")


def test_a_bad_url_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("KILN_REMOTE_CACHE", "s3:/x")
    with pytest.raises(KilnError) as caught:
        resolve_cache_config({})
    assert "KILN_REMOTE_CACHE is not a usable remote cache URL" in caught.value.render()


def test_the_environment_check_needs_no_fsspec_import(monkeypatch):
    # it runs in every build, no-op ones too: an unknown protocol is the remote's warning
    monkeypatch.setenv("KILN_REMOTE_CACHE", "foo://x/y")
    assert resolve_cache_config({}).remote == "foo://x/y"


@pytest.mark.parametrize(
    "cache, key, message",
    [
        ("{remote: 'foo://x/y'}", "cache.remote", "fsspec knows no protocol 'foo'"),
        ("{remote: 's3:/x'}", "cache.remote", "neither a URL"),
        ("{remote: 'file:///x', timeout: .nan}", "cache.timeout", "not a number of seconds"),
        ("{remote: 'file:///x', timeout: .inf}", "cache.timeout", "<= 3600"),
        ("{remote: 'file:///x', timeout: 99999999999}", "cache.timeout", "3600"),
    ],
)
def test_a_bad_cache_section_is_one_error_at_its_line(project, cache, key, message):
    from kiln.pipeline import load_pipeline

    path = project / "pipeline.yaml"
    path.write_text(f"cache: {cache}\n" + path.read_text())
    with pytest.raises(KilnError) as info:
        load_pipeline(path)
    text = info.value.render()
    assert "pipeline.yaml:1:" in text and key in text and message in text
