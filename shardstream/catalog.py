"""What is in a dataset folder: ``index`` it, ``inspect`` it, ``verify`` it.

- ``index_dataset(url)`` writes the sample-index sidecars and the manifest for shards
  another tool wrote (``webdataset.ShardWriter`` tars, Spark or Ray Parquet), or joins
  the parts of a ``pack --part I/N``; a tar shard is read once (hash and index together),
  a Parquet one twice (its footer comes first).
- ``inspect_dataset(url)`` summarises the manifest: shards, samples, bytes, fields, a
  few keys and the distribution of shard sizes.
- ``verify_dataset(url)`` re-reads every shard and checks it against the manifest:
  size, sha256, sample count, and the sidecar against an index rebuilt from the shard.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar, cast

from shardstream.errors import FormatError, ShardstreamError, StorageError, UsageError
from shardstream.formats import SampleIndex, ShardFormat, available_formats, get_format
from shardstream.formats.checks import BlockHasher, ShardChecks
from shardstream.manifest import Manifest, ShardInfo
from shardstream.pack.dest import PACK_RECORD_RE, PART_RECORD_RE, build_manifest
from shardstream.pack.lock import PackLease
from shardstream.pack.shard import ShardResult, checks_of, fields_and_schema, sha256_of
from shardstream.storage import Storage

__all__ = [
    "DatasetSummary",
    "ShardProblem",
    "VerifyReport",
    "index_dataset",
    "inspect_dataset",
    "verify_dataset",
]

T = TypeVar("T")
R = TypeVar("R")

_PART_SHARD_RE = re.compile(r"^part-(\d{5})-shard-\d{6}\.")
_READ_CHUNK = 8 << 20
_DEFAULT_THREADS = 4


class _OnePass(io.RawIOBase):
    """A read stream that hashes every byte while a format reads the shard in order.

    When the format seeks elsewhere than the current position (Parquet reads its footer
    first), hashing stops and ``digest`` hashes the object in a second pass.
    """

    def __init__(self, file: IO[bytes], *, sequential: bool) -> None:
        super().__init__()
        self._file = file
        self._sequential = sequential
        self._hash = BlockHasher()  # sha256 and block CRCs (NOTE [ Checksummed reads ])
        self._pos = 0
        self.in_order = True

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return not self._sequential

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        data = self._file.read(-1 if size is None else size)
        if self.in_order:
            self._hash.update(data)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET and offset == self._pos:
            return self._pos
        self.in_order = False
        self._pos = self._file.seek(offset, whence)
        return self._pos

    def finish(self) -> BlockHasher | None:
        """The hashes of the whole object if it was all read in order, else None."""
        if not self.in_order:
            return None
        while self.read(_READ_CHUNK):
            pass
        return self._hash


def _read_shard(
    storage: Storage, fmt: ShardFormat, path: str
) -> tuple[SampleIndex, tuple[str, ...], str, int]:
    """Index, fields, sha256 and size of a stored shard, read once where the format allows;
    the index is tied to the shard's bytes (``SampleIndex.checks``)."""
    with storage.open(path) as f:
        reader = _OnePass(f, sequential=fmt.sequential_index)
        index, fields = fmt.build_index(cast(IO[bytes], reader), name=path)
        hashed = reader.finish()
    checks = hashed.checks() if hashed is not None else checks_of(storage, path)
    index.bind_checks(checks)
    return index, fields, checks.sha256, checks.size


def _map(function: Callable[[T], R], items: Iterable[T], threads: int) -> list[R]:
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="shardstream-catalog") as pool:
        return list(pool.map(function, items))


def _hidden(path: str) -> bool:
    """A file under a folder whose name, or a folder's on the way, starts with a dot."""
    return any(part.startswith(".") for part in path.split("/"))


# -- index ------------------------------------------------------------------------


def _shard_format(paths: list[str], url: str) -> str:
    """The one registered format whose suffix the shards under ``url`` have."""
    registered = available_formats()
    for path in paths:
        for fmt in registered.values():
            why = fmt.refusal(path)
            if why is not None:
                raise UsageError(why, url=url, shard=path)
    formats = {name for path in paths for name, fmt in registered.items() if path.endswith(fmt.suffix)}
    if not formats:
        patterns = " or ".join(f"*{fmt.suffix}" for fmt in registered.values())
        raise UsageError(f"no shards ({patterns} files) in this folder", url=url)
    if len(formats) > 1:
        held = " and ".join(name for name in registered if name in formats)
        raise UsageError(f"the folder holds {held} shards; a dataset has one format", url=url)
    return formats.pop()


def _part_records(storage: Storage, files: list[str]) -> dict[str, tuple[ShardInfo, Manifest]]:
    """Shards of finished ``pack --part`` jobs, from their records; refuses unfinished parts."""
    records = {
        m.group(0): (int(m.group(1)), int(m.group(2))) for f in files if (m := PART_RECORD_RE.match(f))
    }
    part_shards = {int(m.group(1)) for f in files if (m := _PART_SHARD_RE.match(f))}
    if not records and not part_shards:
        return {}
    counts = {count for _, count in records.values()}
    if len(counts) != 1:
        what = (
            "no part records (part-IIIII-of-NNNNN.json)"
            if not counts
            else f"records of {sorted(counts)} parts"
        )
        raise UsageError(
            f"the folder holds {what}; pack every part with the same --part I/N", url=storage.url
        )
    count = counts.pop()
    done = {index for index, _ in records.values()}
    missing = sorted(set(range(count)) - done) + sorted(part_shards - set(range(count)))
    if missing:
        raise UsageError(
            f"part {missing[0]} of {count} is not finished (it has no record part-{missing[0]:05d}-of-{count:05d}"
            ".json); wait for its job, or run it again",
            url=storage.url,
        )
    found: dict[str, tuple[ShardInfo, Manifest]] = {}
    for name in sorted(records):
        record = Manifest.from_json(storage.read(name), url=storage.full_url(name))
        for info in record.shards:
            found[info.path] = (info, record)
    return found


def _index_one(storage: Storage, fmt: ShardFormat, path: str) -> ShardResult:
    index, fields, digest, size = _read_shard(storage, fmt, path)
    sidecar = index.to_bytes()
    storage.write(path + ".idx", sidecar)
    info = ShardInfo(path, index.num_samples, size, digest, path + ".idx", len(sidecar))
    return ShardResult(info, tuple(fields), fields_and_schema(index)[1])


def index_dataset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    threads: int = _DEFAULT_THREADS,
    rehash: bool = False,
) -> Manifest:
    """Write sample indexes and ``manifest.json`` for the shards under ``url``; return the manifest.

    Shards are the ``*.tar`` or ``*.parquet`` files under ``url`` (recursive, sorted by
    path). Shards listed in the records of finished ``pack --part`` jobs are taken from
    the records (unless ``rehash``); every other shard is read once. ``index`` holds the
    whole destination's lease, as a pack without ``--part`` does (NOTE [ One pack per
    destination ]), and refuses a folder that an unfinished pack left.
    """
    storage = Storage(url, storage_options)
    lease = PackLease(storage)
    try:
        lease.acquire()
        files = storage.list_files()
        _refuse_unfinished_packs(storage, files)
        visible = [f for f in files if not _hidden(f)]
        format = _shard_format(visible, storage.url)
        fmt = get_format(format)
        shards = [f for f in visible if f.endswith(fmt.suffix)]
        records = _part_records(storage, visible)
        present = set(files)
        for path, (info, _) in records.items():
            if path not in present or info.index not in present:
                raise UsageError("a part record lists a shard that is missing", url=storage.url, shard=path)
        for path in shards:
            if _PART_SHARD_RE.match(path) and path not in records:
                raise UsageError("shard of a part is not in that part's record", url=storage.url, shard=path)

        def one(path: str) -> ShardResult:
            if path in records and not rehash:
                info, record = records[path]
                return ShardResult(info, record.fields, record.schema)
            return _index_one(storage, fmt, path)

        manifest = build_manifest(format, _map(one, shards, threads))
        lease.check()
        storage.write_manifest(manifest)
        lease.release()
        return manifest
    finally:
        lease.release(cleanup=True)
        storage.close()


def _refuse_unfinished_packs(storage: Storage, files: list[str]) -> None:
    """Refuse the record of a pack in progress (NOTE [ Packs in progress ] in ``pack.dest``).

    The record of a part whose part record is there too is of a rerun of a finished
    part without ``overwrite`` (one with it deletes the part record first), which can
    only rewrite the part's shards as they were: that part is joined as finished.
    """
    finished = {m.group(1) for f in files if (m := PART_RECORD_RE.match(f))}
    for name in files:
        match = PACK_RECORD_RE.match(name)
        if match is None or (match.group(1) is not None and match.group(1) in finished):
            continue
        raise UsageError(
            f"an unfinished pack left {name} here: its shards may be missing or half replaced; "
            "rerun that pack (it resumes where it stopped), then index (or, if you know its shards are "
            "whole, delete that record to index them as they are)",
            url=storage.url,
        )


# -- inspect ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatasetSummary:
    """What ``shardstream inspect`` shows."""

    url: str
    format: str
    writer: str
    num_shards: int
    num_samples: int
    num_bytes: int
    fields: tuple[str, ...]
    schema: dict[str, str]
    sample_keys: tuple[str, ...]
    shard_bytes: dict[str, float]  # min, p10, p50, p90, max, mean
    shard_samples: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "format": self.format,
            "writer": self.writer,
            "num_shards": self.num_shards,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "fields": list(self.fields),
            "schema": dict(self.schema),
            "sample_keys": list(self.sample_keys),
            "shard_bytes": dict(self.shard_bytes),
            "shard_samples": dict(self.shard_samples),
        }


def _distribution(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def quantile(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "min": ordered[0],
        "p10": quantile(0.1),
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "max": ordered[-1],
        "mean": round(sum(ordered) / len(ordered), 1),
    }


def inspect_dataset(
    url: str, *, storage_options: Mapping[str, Any] | None = None, sample_keys: int = 5
) -> DatasetSummary:
    """A summary of the dataset at ``url`` from its manifest and its first shard's index."""
    storage = Storage(url, storage_options)
    try:
        manifest = storage.read_manifest()
        keys: list[str] = []
        fmt = get_format(manifest.format)
        for shard in manifest.shards:
            if len(keys) >= sample_keys:
                break
            index = fmt.load_index(storage.read(shard.index), name=shard.path)
            keys += index.keys[: sample_keys - len(keys)]
        return DatasetSummary(
            url=storage.url,
            format=manifest.format,
            writer=manifest.writer,
            num_shards=len(manifest.shards),
            num_samples=manifest.num_samples,
            num_bytes=manifest.num_bytes,
            fields=manifest.fields,
            schema=dict(manifest.schema),
            sample_keys=tuple(keys),
            shard_bytes=_distribution([s.bytes for s in manifest.shards]),
            shard_samples=_distribution([s.samples for s in manifest.shards]),
        )
    finally:
        storage.close()


# -- verify -----------------------------------------------------------------------


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
    try:
        size = storage.size(info.path)
    except StorageError as error:
        return [f"cannot be read: {error.message}"], False
    problems = []
    if size != info.bytes:
        problems.append(f"is {size} bytes, the manifest says {info.bytes}")
    rebuilt: SampleIndex | None = None
    try:
        rebuilt, _fields, digest, _size = _read_shard(storage, fmt, info.path)
    except FormatError as error:
        problems.append(f"is corrupt: {error}")
        digest = sha256_of(storage, info.path)
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
    threads: int = _DEFAULT_THREADS,
) -> VerifyReport:
    """Re-read every shard of the dataset at ``url`` and report each one that is not sound."""
    storage = Storage(url, storage_options)
    try:
        manifest = storage.read_manifest()
        fmt = get_format(manifest.format)

        def one(info: ShardInfo) -> tuple[list[ShardProblem], bool]:
            try:
                found, unchecked = _check_shard(storage, fmt, info)
            except ShardstreamError as error:
                return [ShardProblem(info.path, f"cannot be checked: {error}")], False
            return [ShardProblem(info.path, p) for p in found], unchecked

        results = _map(one, manifest.shards, threads)
        problems = [p for found, _ in results for p in found]
        unchecked = tuple(info.path for info, (_, old) in zip(manifest.shards, results, strict=True) if old)
        listed = {s.path for s in manifest.shards}
        unlisted = tuple(
            f for f in storage.list_files() if f.endswith(fmt.suffix) and f not in listed and not _hidden(f)
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
