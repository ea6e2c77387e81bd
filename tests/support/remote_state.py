"""A Dask build's per-process state, emptied for one test and restored after it."""

from __future__ import annotations

from kiln.tasks import cached, chain_batches, remote_exec

from kiln.cache import session as cache_session


def empty_build_state(monkeypatch) -> None:
    """remote_exec's clients and chains, the batchers, settled artifacts and cache sessions."""
    for name, value in (
        ("_clients", {}),
        ("_failed", {}),
        ("_reported", set()),
        ("_lost", set()),
        ("_warned", set()),
        ("_ahead", {}),
        ("_prestarted", set()),
        ("_startable", set()),
    ):
        monkeypatch.setattr(remote_exec, name, value)
    monkeypatch.setattr(chain_batches, "_batchers", {})
    monkeypatch.setattr(cached, "_settled", {})
    monkeypatch.setattr(cache_session, "_sessions", {})


def lir_schedule_chain(
    tmp_path, local_dir: str, executor: dict, remote: str | None = None
) -> tuple[dict, dict]:
    """The lir and schedule stage specs of one instance under ``executor``, from a vISA file."""
    from kiln.cache.config import CacheConfig

    (tmp_path / "kernel.visa").write_bytes(b"visa text")
    config = CacheConfig(local_dir=local_dir, remote=remote)
    common = {"root": str(tmp_path), "instance": "k.small", "options": {}, "machine": {}}
    common.update(dumps=[], cache=config.to_dict(), executor=executor, input_module="-")
    lir = dict(common, stage="lir", stage_index=0, module="kiln.stages.lir")
    lir.update(input=str(tmp_path / "kernel.visa"), artifact=str(tmp_path / "out" / "kernel.lir"))
    sched = dict(common, stage="schedule", stage_index=1, module="kiln.stages.schedule")
    sched.update(input=lir["artifact"], artifact=str(tmp_path / "out" / "kernel.sched"))
    for spec in (lir, sched):
        spec["chain"] = [lir, sched]
    return lir, sched
