"""What a compile task hands its action: one kernel instance, typed and frozen.

The ``ChainSpec`` (kiln/driver.py) is what decides the bytes; the rest
says where the instance lives and how the build runs it. A batch of
``ChainJob``s (``batch_to_wire``) is the one conversion to the bytes a
worker receives.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import msgpack

from kiln.cache.config import CacheConfig
from kiln.driver import ChainSpec, StageRecord, chain_dict, chain_from_dict
from kiln.tasks.model.file_digests import digest_of


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """A kernel instance's compile task: its chain, its files and its cache."""

    chain: ChainSpec
    root: str  # the project's root
    pipeline: str  # pipeline.yaml, for locating errors
    out_dir: str  # the instance's out dir: every path of the chain is inside it
    state_dir: str
    sources: tuple[str, ...]  # the kernel's source files (absolute)
    cache: CacheConfig | None  # None: the artifact cache is off
    stage_rows: tuple[int, ...] = ()  # each stage's index in pipeline.yaml's stages:

    @property
    def instance(self) -> str:
        return self.chain.instance


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    """Where chains run: here, a local process pool, or a Dask cluster."""

    kind: str  # "local", "pool" or "dask"
    workers: int = 1
    address: str | None = None  # a Dask scheduler; None: a LocalCluster Kiln starts
    source: str = ""  # where the address came from, for messages


@dataclass(frozen=True, slots=True)
class ChainJob:
    """A chain sent to a worker: the spec, the sources' digests, and what the last run left.

    ``sources`` carries the files' bytes for a worker on another machine
    (Dask); a local pool worker reads the project itself (``root``) and
    keeps stages by ``known`` (early cutoff), reading the out dir.
    """

    chain: ChainSpec
    digests: tuple[tuple[str, str], ...]  # source path relative to the root -> sha256
    root: str = ""
    out_dir: str = ""
    known: tuple[StageRecord, ...] = ()
    sources: tuple[tuple[str, bytes], ...] = ()

    def _row(self, sources: list) -> dict:
        return {
            "chain": chain_dict(self.chain),
            "digests": [list(d) for d in self.digests],
            "root": self.root,
            "out_dir": self.out_dir,
            "known": [[r.name, r.key, r.digest, list(r.files)] for r in self.known],
            "sources": sources,
        }

    @staticmethod
    def _from_row(d: dict, sources: list[tuple[str, bytes]]) -> ChainJob:
        return ChainJob(
            chain=chain_from_dict(d["chain"]),
            digests=tuple((k, v) for k, v in d["digests"]),
            root=d["root"],
            out_dir=d["out_dir"],
            known=tuple(StageRecord(n, k, g, tuple(f)) for n, k, g, f in d["known"]),
            sources=tuple(sources),
        )


def batch_to_wire(jobs: list[ChainJob]) -> bytes:
    """Several jobs as one message, each distinct source file in it once.

    Every instance of a kernel module sends that module: a project of
    1,500 kernels in one 200 KB file sent it 1,500 times, 300 MB through
    the scheduler. The same file's bytes are one object (chain_payload's
    ``source_bytes``), so keying by them hashes each file once.
    """
    blobs: dict[bytes, int] = {}
    rows = [
        job._row([[rel, blobs.setdefault(content, len(blobs))] for rel, content in job.sources])
        for job in jobs
    ]
    return msgpack.packb({"blobs": list(blobs), "jobs": rows}, use_bin_type=True)


def batch_from_wire(data: bytes) -> list[ChainJob]:
    """The jobs of ``batch_to_wire``; jobs that sent one file share one bytes object."""
    batch = msgpack.unpackb(data, raw=False)
    blobs = batch["blobs"]
    return [
        ChainJob._from_row(row, [(rel, blobs[index]) for rel, index in row["sources"]])
        for row in batch["jobs"]
    ]


def source_digests(spec: InstanceSpec) -> dict[str, str]:
    """Each kernel source's sha256, by its path relative to the project's root."""
    root = spec.root.rstrip(os.sep) + os.sep
    return {
        (p[len(root) :] if p.startswith(root) else os.path.relpath(p, spec.root)): digest_of(p)
        for p in spec.sources
    }
