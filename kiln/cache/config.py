"""Where the cache lives and how it behaves: pipeline.yaml ``cache:`` plus env overrides.

``KILN_REMOTE_CACHE`` (a URL; empty turns the remote off) and
``KILN_REMOTE_UPLOAD=0`` (read-only, for untrusted pull-request builds)
override the file; ``KILN_CACHE=0`` turns the whole store off;
``KILN_PREFETCH_THREADS`` sets how many threads fetch a clean clone's
actions ahead from a slow remote (0: none; see tasks/prefetch.py).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from kiln.cache.store import default_cache_dir

DEFAULT_TIMEOUT = 10.0
DEFAULT_PREFETCH_THREADS = 8
MAX_PREFETCH_THREADS = 64


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    local_dir: str = ""
    remote: str | None = None
    upload: bool = True
    timeout: float = DEFAULT_TIMEOUT
    prefetch_threads: int = DEFAULT_PREFETCH_THREADS

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_cache_config(settings: dict | None) -> CacheConfig:
    """pipeline.yaml's ``cache:`` mapping, with the environment's overrides applied."""
    settings = settings or {}
    remote = settings.get("remote")
    if "KILN_REMOTE_CACHE" in os.environ:
        remote = os.environ["KILN_REMOTE_CACHE"] or None
    upload = bool(settings.get("upload", True))
    if "KILN_REMOTE_UPLOAD" in os.environ:
        upload = os.environ["KILN_REMOTE_UPLOAD"].strip().lower() not in ("0", "false", "no", "")
    if remote:
        require_remote_support(remote)
    return CacheConfig(
        enabled=os.environ.get("KILN_CACHE", "1").strip() not in ("0", "false", "no"),
        local_dir=str(default_cache_dir() / "store"),
        remote=remote,
        upload=upload,
        timeout=float(settings.get("timeout", DEFAULT_TIMEOUT)),
        prefetch_threads=prefetch_threads() if remote else 0,
    )


def prefetch_threads() -> int:
    """KILN_PREFETCH_THREADS, checked: a whole number from 0 (off) to MAX_PREFETCH_THREADS."""
    raw = os.environ.get("KILN_PREFETCH_THREADS", "").strip()
    if not raw:
        return DEFAULT_PREFETCH_THREADS
    if not raw.isdigit() or int(raw) > MAX_PREFETCH_THREADS:
        from kiln.errors import KilnError

        raise KilnError(
            "KILN_PREFETCH_THREADS is not a thread count",
            expected=f"a whole number from 0 (no fetching ahead) to {MAX_PREFETCH_THREADS}",
            found=raw,
            hint=f"unset it for the default ({DEFAULT_PREFETCH_THREADS})",
        )
    return int(raw)


def require_remote_support(url: str) -> None:
    """One clear error, naming the extra, when the packages a remote URL needs are absent."""
    import importlib.util

    from kiln.errors import KilnError

    needed = ["fsspec"] + (["s3fs"] if url.startswith(("s3://", "s3a://")) else [])
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise KilnError(
            f"the remote cache {url!r} needs {', '.join(missing)}, which is not installed",
            hint="pip install 'kiln[distributed]' (or unset KILN_REMOTE_CACHE / cache.remote)",
        )
