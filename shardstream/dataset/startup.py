"""Starting at scale: one manifest read per job, and a rank's first sidecars read once.

# NOTE [ One manifest read per job ]
# Thousands of readers that start in the same second must not each GET the manifest:
# on a fresh prefix S3 answers that with 503 SlowDown. So:
# - With torch.distributed initialised (world > 1), making a StreamingDataset (or a
#   MapDataset) is a collective, as making a DDP model is: rank 0 reads the manifests (a mixture's, each
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
#
# NOTE [ First sidecars once per node ]
# Neighbouring ranks of a node share the shards at the edges of their slices (a window
# of order="global" shares many more), and without ``cache_dir`` each rank's main process
# would GET those sidecars itself. So where a launcher started several ranks, the main
# processes keep copies of the first sidecars they read in the node's folder of manifest
# copies (NOTE [ One manifest read per job ]), named by the dataset (endpoint, manifest
# URL and fingerprint: a rewritten dataset names other copies), the sidecar's path and
# the job, and take each other's while fresh. A rank locks the copies of its shards (one
# lock each, taken in one order by every rank, so ranks with no shard in common never
# wait for each other and none waits in a cycle), takes those there, reads the others at
# once and copies them. A copy taken is checked as a sidecar read is (its sample count,
# and the shard its checks were written for); one that fails is read again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from shardstream.errors import UsageError
from shardstream.formats import get_format
from shardstream.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from shardstream.dataset.options import ReadOptions
    from shardstream.formats.base import SampleIndex
    from shardstream.plan import Plan
    from shardstream.storage import Storage
    from shardstream.topology import Detector

__all__ = [
    "FRESH_SECONDS",
    "by_source",
    "first_window_shards",
    "node_first_sidecars",
    "share_detected",
    "share_manifests",
    "source_key",
]

# How long a node's copy of a manifest serves other readers of the same start.
FRESH_SECONDS = 120.0
# What the node's copies are named by: a manifest's, a first-window sidecar's.
_COPIES = ("manifest-", "sidecar-")
# Environment variables that name a launched job, where the launcher sets one.
_JOB_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID")


class _Starting(Protocol):
    """What starting reads of a dataset source (``source.DatasetSource``, which imports
    this module for its first sidecars)."""

    @property
    def options(self) -> ReadOptions: ...
    @property
    def storage(self) -> Storage: ...
    @property
    def manifest(self) -> Manifest: ...
    @property
    def fingerprint(self) -> str: ...
    def adopt_manifest(self, manifest: Manifest, fingerprint: str) -> bool: ...


def source_key(source: _Starting) -> str:
    """What names a source's manifest across processes: endpoint and manifest URL."""
    storage = source.storage
    return f"{storage.endpoint_url}|{storage.full_url(MANIFEST_NAME)}"


def share_manifests(sources: Sequence[_Starting], world: int) -> None:
    """Give each of ``sources`` its manifest with one read per job (NOTE [ One manifest
    read per job ]); ``world``: the world size the dataset detected. Call in the main
    process, where every rank makes the dataset."""
    if _has_process_group():
        _broadcast(sources)
    elif world > 1:
        for source in sources:
            if source.storage.local_root is None:  # remote: a read is a request
                _node_shared(source)


def share_detected(sources: Sequence[_Starting], detector: Detector) -> None:
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


def _broadcast(sources: Sequence[_Starting]) -> None:
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


def _node_shared(source: _Starting) -> None:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): every reader reads its own
        return
    key = source_key(source)
    name = _copy_name(key)
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


def _copy_name(key: str) -> str:
    """The name of a node's copy of what ``key`` names, for this job (where one is named)."""
    job = next((os.environ[name] for name in _JOB_VARIABLES if os.environ.get(name)), "")
    return hashlib.sha256(f"{key}|{job}".encode()).hexdigest()[:32]


def _node_folder(source: _Starting) -> str | None:
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
    _write_bytes(path, json.dumps(record).encode())
    _drop_stale(os.path.dirname(path), keep=path)


def _write_bytes(path: str, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all."""
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _drop_stale(folder: str, keep: str) -> None:
    """Delete the copies of earlier starts (stale ones serve no reader), so the folder holds
    only the manifests of recent starts. A lock file goes with its copy: a reader holding
    it meanwhile reads or writes a copy that the next reader checks anyway."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.path in (keep, keep + ".lock") or not entry.name.startswith(_COPIES):
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > 2 * FRESH_SECONDS:
                    os.unlink(entry.path)


# -- the first window's sidecars --------------------------------------------------------


def node_first_sidecars(
    source: _Starting,
    shards: Sequence[int],
    load: Callable[[Sequence[int]], dict[int, SampleIndex]],
    world: int,
) -> dict[int, SampleIndex]:
    """The sample indexes of ``shards`` (a rank's workers' first windows), each read once
    per node where ``world`` > 1 (NOTE [ First sidecars once per node ]): taken from the
    node's copies, the others read with ``load`` (all at once) and copied for the node's
    other ranks. Call in the main process."""
    folder = _node_folder(source) if world > 1 and shards else None
    if folder is None:
        return load(shards)
    key, infos = f"{source_key(source)}|{source.fingerprint}", source.manifest.shards
    paths = {
        shard: os.path.join(folder, f"sidecar-{_copy_name(f'{key}|{infos[shard].index}')}.idx")
        for shard in shards
    }
    with _locked(sorted(set(paths.values()))) as held:
        if not held:  # no flock, or a folder we cannot write: read our own
            return load(shards)
        got = {
            shard: index
            for shard in paths
            if (index := _kept_sidecar(paths[shard], source, shard)) is not None
        }
        missing = [shard for shard in paths if shard not in got]
        if missing:
            loaded = load(missing)
            for shard in missing:
                _write_bytes(paths[shard], loaded[shard].to_bytes())
            got.update(loaded)
            _drop_stale(folder, keep=paths[missing[0]])
    return got


@contextlib.contextmanager
def _locked(paths: Sequence[str]) -> Iterator[bool]:
    """Hold the locks of the copies at ``paths``, taken in the order given (sorted by every
    rank, so two ranks never wait on each other in a cycle); False where they cannot be."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows)
        yield False
        return
    with contextlib.ExitStack() as held:
        try:
            for path in paths:
                fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
                held.callback(os.close, fd)  # releases the lock
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            held.close()
            yield False
            return
        yield True


def _kept_sidecar(path: str, source: _Starting, shard: int) -> SampleIndex | None:
    """The sample index of ``shard`` kept at ``path``, if it is fresh, whole and the shard's."""
    info = source.manifest.shards[shard]
    try:
        if time.time() - os.stat(path).st_mtime > FRESH_SECONDS:
            return None
        with open(path, "rb") as f:
            index = get_format(source.manifest.format).load_index(f.read(), name=info.path)
    except Exception:  # gone, or half written by a crashed reader: read it again
        return None
    checks = index.checks
    if index.num_samples != info.samples or (checks and checks.other_shard(info.bytes, info.sha256)):
        return None
    return index


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
