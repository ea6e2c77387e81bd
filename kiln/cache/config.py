"""Where the cache lives and how it behaves: pipeline.yaml ``cache:`` plus env overrides.

``KILN_REMOTE_CACHE`` (a URL; empty turns the remote off) and
``KILN_REMOTE_UPLOAD=0`` (read-only, for untrusted pull-request builds)
override the file; ``KILN_CACHE=0`` turns the whole store off.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass

from kiln.cache.store import default_cache_dir

DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    local_dir: str = ""
    remote: str | None = None
    upload: bool = True
    timeout: float = DEFAULT_TIMEOUT

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_cache_config(settings: dict | None, remote_flag: str | None = None) -> CacheConfig:
    """pipeline.yaml's ``cache:`` mapping, with the environment's overrides applied.

    ``remote_flag``: a URL given on the command line (``--remote``), which wins.
    """
    settings = settings or {}
    remote = settings.get("remote")
    if remote_flag is not None:
        remote = remote_flag
        check_remote_url(remote, "--remote")
    elif "KILN_REMOTE_CACHE" in os.environ:
        remote = os.environ["KILN_REMOTE_CACHE"] or None
        if remote:
            check_remote_url(remote, "KILN_REMOTE_CACHE")
    upload = bool(settings.get("upload", True))
    if "KILN_REMOTE_UPLOAD" in os.environ:
        # empty reads as off: a read-only build is the safe side of a blank variable
        upload = env_flag("KILN_REMOTE_UPLOAD", empty=False)
    if remote:
        require_remote_support(remote)
    return CacheConfig(
        enabled=env_flag("KILN_CACHE", empty=True) if "KILN_CACHE" in os.environ else True,
        local_dir=str(default_cache_dir() / "store"),
        remote=remote,
        upload=upload,
        timeout=float(settings.get("timeout", DEFAULT_TIMEOUT)),
    )


FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True}
FLAG_VALUES.update({"0": False, "false": False, "no": False, "off": False})


def env_flag(name: str, *, empty: bool) -> bool:
    """An on/off environment variable: 1/0, true/false, yes/no, on/off, any case.

    Anything else is an error rather than a guess: a pull-request job that
    writes KILN_REMOTE_UPLOAD=of must not upload to the team cache.
    """
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return empty
    if raw not in FLAG_VALUES:
        from kiln.errors import KilnError

        raise KilnError(
            f"{name} is not on or off",
            expected="one of 1, true, yes, on / 0, false, no, off",
            found=os.environ[name],
            hint=f"set {name}=0 (off) or {name}=1 (on), or unset it",
        )
    return FLAG_VALUES[raw]


def require_remote_support(url: str) -> None:
    """One clear error, naming the extra, when the packages a remote URL needs are absent."""
    from kiln.errors import KilnError

    needed = ["fsspec"] + (["s3fs"] if url.startswith(("s3://", "s3a://")) else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise KilnError(
            f"the remote cache {url!r} needs {' and '.join(missing)}, "
            f"which {'is' if len(missing) == 1 else 'are'} not installed",
            hint="pip install 'kiln-kernels[distributed]' "
            "(or unset KILN_REMOTE_CACHE / cache.remote)",
        )


def remote_url_problem(url: str, *, protocols: bool = True) -> tuple[str, str] | None:
    """(what is wrong, a hint) when ``url`` cannot name a remote cache, else None.

    Checked when the build starts, once, rather than as one failure per task:
    a URL needs a scheme fsspec knows (lower case, as fsspec spells them) and
    a path, and must be free of spaces and control characters around it.
    A plain absolute path is a shared directory. ``protocols`` False skips
    what needs fsspec imported (about 0.13 s): the check of every build's
    environment stays cheap, and the remote itself warns of a protocol it
    cannot open.
    """
    import re

    if url != url.strip() or any(ord(ch) < 32 for ch in url):
        return "it has spaces or control characters around or in it", "remove them"
    if url.startswith("/"):
        return None
    match = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", url, flags=re.S)
    if match is None:
        return (
            "it is neither a URL (scheme://path) nor an absolute directory",
            "write file:///abs/dir for a shared directory, or s3://bucket/prefix",
        )
    scheme, rest = match.groups()
    if not rest.strip("/"):
        return f"it names no location after {scheme}://", f"write {scheme}://<where>"
    if not scheme.islower() and scheme.lower() in ("file", "s3", "s3a", "gs", "gcs", "memory"):
        return f"scheme {scheme!r} is not lower case", f"write {scheme.lower()}://{rest}"
    if scheme in ("file", "local") and not rest.startswith("/"):
        # fsspec reads file://mnt/x as ./mnt/x: each clone would fill a private "team" cache
        host, _, path = rest.partition("/")
        absolute = "/" + (path if host == "localhost" else rest)
        return (
            f"{scheme}:// needs an absolute path, and {rest!r} would be a directory "
            "under the directory the build runs in",
            f"write {scheme}://{absolute} (three slashes)",
        )
    if not protocols or importlib.util.find_spec("fsspec") is None:
        return None  # require_remote_support names the extra
    from fsspec.registry import known_implementations, registry

    known = set(known_implementations) | set(registry)
    if scheme not in known:
        from kiln.pipeline.yamlpos import did_you_mean

        if scheme.lower() in known:
            return f"scheme {scheme!r} is not lower case", f"write {scheme.lower()}://{rest}"
        hint = did_you_mean(scheme, sorted(known)) or "use file://, s3:// or another protocol"
        return f"fsspec knows no protocol {scheme!r}", hint
    spec = known_implementations.get(scheme)
    if spec is not None and scheme not in registry:
        package = spec["class"].split(".")[0]
        if package != "fsspec" and importlib.util.find_spec(package) is None:
            extra = "'kiln-kernels[distributed]'" if package == "s3fs" else package
            return f"{scheme}:// needs the package {package}, which is not installed", (
                f"pip install {extra}"
            )
    return None


def check_remote_url(url: str, source: str) -> None:
    """Raise one clear error, naming ``source`` (the env var), for a URL that cannot work.

    Runs for every build, no-op ones too: only what needs no fsspec import.
    """
    problem = remote_url_problem(url, protocols=False)
    if problem is not None:
        from kiln.errors import KilnError

        raise KilnError(
            f"{source} is not a usable remote cache URL: {problem[0]}",
            expected="file:///shared/dir, /shared/dir or s3://bucket/prefix",
            found=repr(url),
            hint=problem[1],
        )
