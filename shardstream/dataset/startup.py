"""Starting at scale: one manifest read per job, and a rank's first sidecars read once.

# NOTE [ One manifest read per job ]
# Thousands of readers that start in the same second must not each GET the manifest:
# on a fresh prefix S3 answers that with 503 SlowDown. So:
# - With torch.distributed initialised (world > 1), making a StreamingDataset is a
#   collective, as making a DDP model is: rank 0 reads the manifests (a mixture's, each
#   stream's) and broadcasts them with ``broadcast_object_list`` over the default group
#   (over a gloo group made for it, and destroyed after, where the default backend has no
#   CPU transport, as NCCL has not). Every rank must therefore make the dataset at the same
#   point of its program, in the same order as its other collectives; a dataset made on
#   some ranks only (an evaluation set on rank 0) passes ``share_manifest=False``.
# - A rank takes what was broadcast only for a dataset it names itself (the same endpoint
#   and manifest URL) and whose fingerprint it recomputes to the one rank 0 sent: a rank
#   that was given another dataset reads its own, so no rank ever uses the manifest of
#   another dataset. Where rank 0's read failed, the others read theirs and fail with
#   their own error.
# - DataLoader workers never read it: the manifest pickles with the dataset (and a fork
#   child has it already).
# - Without a process group, readers of remote storage that a launcher started as several
#   ranks (``WORLD_SIZE`` > 1) share one read per node: a copy of the manifest in the
#   cache directory (or the temp dir), written under a file lock by the first reader and
#   taken by the others while it is fresh (``FRESH_SECONDS``: the readers of one start,
#   not a later job that may see a rewritten dataset; the job's id from the launcher, where
#   there is one, keys it too). Its recorded fingerprint is checked on every take.
#
# NOTE [ First sidecars through the parent ]
# The sidecars of a worker's first window are what it reads before its first sample. The
# main process makes the plan its workers follow before it starts them (the DataLoader's
# ``begin``), so it reads the sidecars of every worker's first window there, once and
# concurrently, and the dataset carries them to the workers (pickled for spawn, inherited
# by fork): a shard read by several workers costs one GET, and a worker seeds its sidecar
# LRU (a mixture's: the one its streams' readers share) with its first window's before it
# reads. Only the first epoch a DataLoader plans is read ahead: persistent workers started
# then read their later windows' sidecars themselves, and reading those again in the
# parent would double them. Where ``cache_dir`` is set, sidecars go through the node's
# shard cache instead (one fill per node, under its entry lock), and local files cost no
# request: neither is read ahead here, nor (for now) a token dataset read as sequences.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardstream.errors import UsageError
from shardstream.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from shardstream.dataset.source import DatasetSource
    from shardstream.plan import Plan
    from shardstream.topology import Detector

__all__ = [
    "FRESH_SECONDS",
    "by_source",
    "first_window_shards",
    "share_detected",
    "share_manifests",
    "source_key",
]

# How long a node's copy of a manifest serves other readers of the same start.
FRESH_SECONDS = 120.0
# Environment variables that name a launched job, where the launcher sets one.
_JOB_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID")


def source_key(source: DatasetSource) -> str:
    """What names a source's manifest across processes: endpoint and manifest URL."""
    storage = source.storage
    return f"{storage.endpoint_url}|{storage.full_url(MANIFEST_NAME)}"


def share_manifests(sources: Sequence[DatasetSource], world: int) -> None:
    """Give each of ``sources`` its manifest with one read per job (NOTE [ One manifest
    read per job ]); ``world``: the world size the dataset detected. Call in the main
    process, where every rank makes the dataset."""
    if _has_process_group():
        _broadcast(sources)
    elif world > 1:
        for source in sources:
            if source.storage.local_root is None:  # remote: a read is a request
                _node_shared(source)


def share_detected(sources: Sequence[DatasetSource], detector: Detector) -> None:
    """:func:`share_manifests` in the world ``detector`` finds, for a dataset that takes no
    rank of its own (a ``MapDataset``); nothing in a DataLoader worker, which has the
    manifest from its parent. A rank outside its world reads its own manifest here."""
    if detector.in_worker():
        return
    try:
        _, world = detector.rank()
    except UsageError:
        world = 1
    share_manifests(sources, world)


# -- with a process group -----------------------------------------------------------------


def _has_process_group() -> bool:
    """Whether torch.distributed has a process group of more than one rank (the real one:
    an injected topology detector does not make a collective possible)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def _cpu_group() -> Iterator[Any]:
    """A group whose backend carries CPU tensors: the default one where it does, else a
    gloo group made (by every rank: it is a collective) for this broadcast."""
    import torch.distributed as dist

    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or "mpi" in backend:
        yield None
        return
    group = dist.new_group(backend="gloo")
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


def _broadcast(sources: Sequence[DatasetSource]) -> None:
    import torch.distributed as dist

    sent: list[Any] = [None]
    failed: BaseException | None = None
    keys: list[str] = []
    try:  # a rank that fails here still joins the broadcast, so no other rank waits on it
        keys = [source_key(source) for source in sources]
        if dist.get_rank() == 0:  # where this read fails, the others read their own and fail alike
            sent[0] = [(key, s.manifest, s.fingerprint) for key, s in zip(keys, sources, strict=True)]
    except Exception as error:
        failed = error
    with _cpu_group() as cpu:
        dist.broadcast_object_list(sent, src=0, group=cpu)
    if failed is not None:
        raise failed
    by_key = {key: (manifest, fingerprint) for key, manifest, fingerprint in sent[0] or []}
    for key, source in zip(keys, sources, strict=True):
        got = by_key.get(key)
        if got is not None and isinstance(got[0], Manifest):
            source.adopt_manifest(got[0], got[1])  # checks the fingerprint


# -- without one: a node-local copy under a file lock -------------------------------------


def _node_shared(source: DatasetSource) -> None:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): every reader reads its own
        return
    key = source_key(source)
    job = next((os.environ[name] for name in _JOB_VARIABLES if os.environ.get(name)), "")
    name = hashlib.sha256(f"{key}|{job}".encode()).hexdigest()[:32]
    folder = _node_folder(source)
    if folder is None:
        return
    path = os.path.join(folder, f"manifest-{name}.json")
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return  # a folder we cannot write: read our own
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        kept = _fresh_copy(path, key)
        if kept is not None and source.adopt_manifest(*kept):
            return
        manifest = source.manifest  # read from storage, once for the node
        _write_copy(path, key, manifest, source.fingerprint)
    finally:
        os.close(fd)  # releases the lock


def _node_folder(source: DatasetSource) -> str | None:
    base = source.options.cache_dir or tempfile.gettempdir()
    folder = os.path.join(base, f"shardstream-start-{os.getuid() if hasattr(os, 'getuid') else 0}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return folder


def _fresh_copy(path: str, key: str) -> tuple[Manifest, str] | None:
    """The manifest and fingerprint kept at ``path`` for ``key``, if it is fresh and whole."""
    try:
        if time.time() - os.stat(path).st_mtime > FRESH_SECONDS:
            return None
        with open(path, encoding="utf-8") as f:
            kept: Mapping[str, Any] = json.load(f)
        if kept.get("key") != key:
            return None
        return Manifest.from_json(kept["manifest"], url=key), str(kept["digest"])
    except Exception:  # gone, half written by a crashed reader, or no manifest: read it again
        return None


def _write_copy(path: str, key: str, manifest: Manifest, fingerprint: str) -> None:
    record = {"key": key, "digest": fingerprint, "manifest": manifest.to_json()}
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    _drop_stale(os.path.dirname(path), keep=path)


def _drop_stale(folder: str, keep: str) -> None:
    """Delete the copies of earlier starts (stale ones serve no reader), so the folder holds
    only the manifests of recent starts. A lock file goes with its copy: a reader holding
    it meanwhile reads or writes a copy that the next reader checks anyway."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.path in (keep, keep + ".lock") or not entry.name.startswith("manifest-"):
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > 2 * FRESH_SECONDS:
                    os.unlink(entry.path)


# -- the first window's sidecars --------------------------------------------------------


def first_window_shards(plan: Plan, rank: int, worker: int) -> tuple[int, ...]:
    """The shards (as the plan numbers them) of ``worker``'s first window."""
    first = next(iter(plan.worker_windows(rank, worker)), None)
    return () if first is None else tuple(first.shards)


def by_source(shards: Sequence[int], counts: Sequence[int]) -> dict[int, list[int]]:
    """``shards`` numbered as a mixture numbers them (stream ``s``'s shard ``i`` is the sum
    of the earlier streams' shard counts plus ``i``; one dataset: as its manifest does),
    grouped by source: ``{source: [its shard numbers]}``."""
    bases, total = [], 0
    for count in counts:
        bases.append(total)
        total += count
    grouped: dict[int, list[int]] = {}
    for shard in shards:
        number = _stream_of(bases, shard)
        grouped.setdefault(number, []).append(shard - bases[number])
    return grouped


def _stream_of(bases: Sequence[int], shard: int) -> int:
    lo, hi = 0, len(bases) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bases[mid] <= shard:
            lo = mid
        else:
            hi = mid - 1
    return lo
