"""``verify_dataset(url)``: re-read every shard and check it against the manifest: size,
sha256, sample count, and the sidecar against an index rebuilt from the shard (as
``index`` builds it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardstream.catalog.index import DEFAULT_THREADS, is_hidden, map_threaded, read_shard
from shardstream.diagnose import read_manifest
from shardstream.digests import checks_of
from shardstream.errors import FormatError, ShardstreamError, StorageError
from shardstream.formats import SampleIndex, ShardFormat, get_format
from shardstream.formats.checks import ShardChecks
from shardstream.manifest import ShardInfo
from shardstream.storage import Storage


@dataclass(frozen=True, slots=True)
class ShardProblem:
    """One thing wrong with one shard."""

    shard: str
    problem: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What ``verify_dataset`` found; ``ok`` when no shard has a problem.

    ``unchecked`` names the shards whose sidecars are of version 1 (no checksums, NOTE
    [ Checksummed reads ]): they stream, unchecked, and ``shardstream index`` adds the
    checksums; that is a notice, not a problem, so an old dataset still verifies.
    """

    url: str
    num_shards: int
    num_samples: int
    num_bytes: int
    problems: tuple[ShardProblem, ...] = ()
    unlisted: tuple[str, ...] = field(default=())  # shard files the manifest does not list
    unchecked: tuple[str, ...] = field(default=())  # shards whose sidecars have no checksums

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_shards(self) -> list[str]:
        return sorted({p.shard for p in self.problems})


def _check_shard(storage: Storage, fmt: ShardFormat, info: ShardInfo) -> tuple[list[str], bool]:
    """Problems of one shard (empty when it is sound), and whether its sidecar is unchecked."""
    problems = []
    rebuilt: SampleIndex | None = None
    try:  # one pass gives the index, the size and the sha256
        try:
            rebuilt, _fields, digest, size = read_shard(storage, fmt, info.path)
        except FormatError as error:
            problems.append(f"is corrupt: {error}")
            checks = checks_of(storage, info.path)
            digest, size = checks.sha256, checks.size
    except StorageError as error:
        return [f"cannot be read: {error.message}"], False
    if size != info.bytes:
        problems.insert(0, f"is {size} bytes, the manifest says {info.bytes}")
    if digest != info.sha256:
        problems.append(f"has sha256 {digest[:16]}..., the manifest says {info.sha256[:16]}...")
    if rebuilt is not None and rebuilt.num_samples != info.samples:
        problems.append(f"holds {rebuilt.num_samples} samples, the manifest says {info.samples}")
    # against other bytes a rebuilt index differs in its checks: the sha256 already says so
    sidecar, unchecked = _check_sidecar(storage, fmt, info, rebuilt if digest == info.sha256 else None)
    return problems + sidecar, unchecked


def _check_sidecar(
    storage: Storage, fmt: ShardFormat, info: ShardInfo, rebuilt: SampleIndex | None
) -> tuple[list[str], bool]:
    try:
        data = storage.read(info.index)
    except StorageError as error:
        return [f"sample index {info.index} cannot be read: {error.message}"], False
    if info.index_bytes and len(data) != info.index_bytes:
        return [f"sample index is {len(data)} bytes, the manifest says {info.index_bytes}"], False
    try:
        loaded = fmt.load_index(data, name=info.path)  # a sidecar that does not parse is named as corrupt
    except FormatError as error:
        return [f"sample index is corrupt: {error}"], False
    checks = loaded.checks
    if checks is None:  # a version 1 sidecar (NOTE [ Checksummed reads ]): sound if it matches
        old_bytes = loaded.to_bytes(with_checks=False)
        if rebuilt is not None and old_bytes != rebuilt.to_bytes(with_checks=False):
            return ["sample index does not match the shard's contents"], True
        return [], True
    return _check_checked_sidecar(data, checks, info, rebuilt), False


def _check_checked_sidecar(
    data: bytes, checks: ShardChecks, info: ShardInfo, rebuilt: SampleIndex | None
) -> list[str]:
    other = checks.other_shard(info.bytes, info.sha256)
    if other is not None:
        return [f"sample index does not match the shard: {other}"]
    if rebuilt is None or data == rebuilt.to_bytes():
        return []
    return ["sample index does not match the shard's contents"]


def verify_dataset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    threads: int = DEFAULT_THREADS,
) -> VerifyReport:
    """Re-read every shard of the dataset at ``url`` and report each one that is not sound."""
    storage = Storage(url, storage_options)
    try:
        manifest = read_manifest(storage)
        fmt = get_format(manifest.format)

        def one(info: ShardInfo) -> tuple[list[ShardProblem], bool]:
            try:
                found, unchecked = _check_shard(storage, fmt, info)
            except ShardstreamError as error:
                return [ShardProblem(info.path, f"cannot be checked: {error}")], False
            return [ShardProblem(info.path, p) for p in found], unchecked

        results = map_threaded(one, manifest.shards, threads)
        problems = [p for found, _ in results for p in found]
        unchecked = tuple(info.path for info, (_, old) in zip(manifest.shards, results, strict=True) if old)
        listed = {s.path for s in manifest.shards}
        unlisted = tuple(
            f for f in storage.list_files() if f.endswith(fmt.suffix) and f not in listed and not is_hidden(f)
        )
        if not manifest.shards:  # an empty dataset beside shards is a cut-short or hand-made manifest
            problems += [
                ShardProblem(f, "looks like a shard but the manifest lists no shards") for f in unlisted
            ]
        return VerifyReport(
            url=storage.url,
            num_shards=len(manifest.shards),
            num_samples=manifest.num_samples,
            num_bytes=manifest.num_bytes,
            problems=tuple(problems),
            unlisted=unlisted,
            unchecked=unchecked,
        )
    finally:
        storage.close()
