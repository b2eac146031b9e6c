"""``index_dataset(url)``: write the sample-index sidecars and the manifest for shards
another tool wrote (``webdataset.ShardWriter`` tars, Spark or Ray Parquet), or join the
parts of a ``pack --part I/N``; a tar shard is read once (hash and index together), a
Parquet one twice (its footer comes first).

``verify`` rebuilds a shard's index as this module does (``read_shard``), so that a
sidecar ``index`` wrote verifies byte for byte.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, TypeVar, cast

from shardstream.diagnose import nothing_there
from shardstream.digests import checks_of
from shardstream.errors import ShardstreamError, StorageError, UsageError
from shardstream.folder import (
    LEGACY_MANIFEST_NAME,
    META_FOLDER,
    PACK_RECORD_RE,
    PART_RECORD_RE,
    PART_SHARD_RE,
    ShardResult,
    build_manifest,
    fields_and_schema,
    own_name,
    part_record_name,
    sidecar_name,
)
from shardstream.formats import SampleIndex, ShardFormat, available_formats, get_format
from shardstream.formats.checks import BlockHasher
from shardstream.lock import PackLease
from shardstream.manifest import Manifest, ShardInfo
from shardstream.storage import Storage

T = TypeVar("T")
R = TypeVar("R")

_READ_CHUNK = 8 << 20
DEFAULT_THREADS = 4


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


def read_shard(
    storage: Storage, fmt: ShardFormat, path: str
) -> tuple[SampleIndex, tuple[str, ...], str, int]:
    """Index, fields, sha256 and size of a stored shard, read once where the format allows;
    the index is tied to the shard's bytes (``SampleIndex.checks``)."""
    source = fmt.index_source(path, sidecar_name(path))
    companion = None if source is None else _companion(storage, path, source)
    with storage.open(path) as f:
        reader = _OnePass(f, sequential=fmt.sequential_index)
        if companion is None:
            index, fields = fmt.build_index(cast(IO[bytes], reader), name=path)
        else:
            index, fields = fmt.build_index_from(cast(IO[bytes], reader), companion, name=path)
        hashed = reader.finish()
    checks = hashed.checks() if hashed is not None else checks_of(storage, path)
    index.bind_checks(checks)
    return index, fields, checks.sha256, checks.size


def _companion(storage: Storage, path: str, source: str) -> bytes:
    """The bytes of ``source``, the file the format needs beside shard ``path`` to index it."""
    try:
        return storage.read(source)
    except StorageError as error:
        raise UsageError(
            f"shard {path} is indexed from {source} beside it, which cannot be read: {error.message}",
            url=storage.url,
            shard=path,
        ) from None


def map_threaded(function: Callable[[T], R], items: Iterable[T], threads: int) -> list[R]:
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [function(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="shardstream-catalog") as pool:
        return list(pool.map(function, items))


def is_hidden(path: str) -> bool:
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
    present = set(paths)
    formats = {name for path in paths for name, fmt in registered.items() if _is_shard(fmt, path, present)}
    if not formats:
        patterns = " or ".join(f"*{fmt.suffix}" for fmt in registered.values())
        raise UsageError(f"no shards ({patterns} files) in this folder", url=url)
    if len(formats) > 1:
        held = " and ".join(name for name in registered if name in formats)
        raise UsageError(f"the folder holds {held} shards; a dataset has one format", url=url)
    return formats.pop()


def _is_shard(fmt: ShardFormat, path: str, present: set[str]) -> bool:
    """Whether ``index`` takes ``path`` as one of ``fmt``'s shards: a file of its suffix, or
    of another tool's suffix (a Megatron ``.bin``) with that tool's index beside it."""
    if path.endswith(fmt.suffix):
        return True
    return path.endswith(fmt.foreign_suffixes) and fmt.index_source(path, sidecar_name(path)) in present


def _part_records(storage: Storage, files: list[str]) -> dict[str, tuple[ShardInfo, Manifest]]:
    """Shards of finished ``pack --part`` jobs, from their records (in ``.shardstream/``, or
    at the top in the legacy layout); refuses unfinished parts."""
    records = {
        m.group(0): (int(m.group(1)), int(m.group(2))) for f in files if (m := PART_RECORD_RE.match(f))
    }
    part_shards = {int(m.group(1)) for f in files if (m := PART_SHARD_RE.match(f))}
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
            f"part {missing[0]} of {count} is not finished (it has no record "
            f"{part_record_name(missing[0], count)}); wait for its job, or run it again",
            url=storage.url,
        )
    found: dict[str, tuple[ShardInfo, Manifest]] = {}
    for name in sorted(records):
        record = Manifest.from_json(storage.read(name), url=storage.full_url(name))
        for info in record.shards:
            found[info.path] = (info, record)
    return found


def _index_one(storage: Storage, fmt: ShardFormat, path: str) -> ShardResult:
    index, fields, digest, size = read_shard(storage, fmt, path)
    sidecar = index.to_bytes()
    storage.write(sidecar_name(path), sidecar)
    info = ShardInfo(
        path, index.num_samples, size, digest, sidecar_name(path), len(sidecar), index.num_tokens
    )
    return ShardResult(info, tuple(fields), fields_and_schema(index)[1], token_dtype=index.token_dtype)


def index_dataset(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    threads: int = DEFAULT_THREADS,
    rehash: bool = False,
) -> Manifest:
    """Write sample indexes and ``.shardstream/manifest.json`` for the shards under ``url``; return the manifest.

    Shards are the ``*.tar`` or ``*.parquet`` files under ``url`` (recursive, sorted by
    path). Shards listed in the records of finished ``pack --part`` jobs are taken from
    the records (unless ``rehash``); every other shard is read once. ``index`` holds the
    whole destination's lease, as a pack without ``--part`` does (NOTE [ One pack per
    destination ]), and refuses a folder that an unfinished pack left.
    """
    storage = Storage(url, storage_options)
    missing = nothing_there(storage)  # before the lease, whose claim file would make the folder
    if missing is not None:
        storage.close()
        raise UsageError(f"cannot index {storage.url}: {missing}", url=storage.url)
    lease = PackLease(storage)
    try:
        lease.acquire()
        files = storage.list_files()
        _refuse_unfinished_packs(storage, files)
        visible = [f for f in files if not is_hidden(f)]
        format = _shard_format(visible, storage.url)
        fmt = get_format(format)
        present = set(visible)
        shards = [f for f in visible if _is_shard(fmt, f, present)]
        records = _part_records(storage, files)
        present = set(files)
        for path, (info, _) in records.items():
            if path not in present or info.index not in present:
                raise UsageError("a part record lists a shard that is missing", url=storage.url, shard=path)
        for path in shards:
            if PART_SHARD_RE.match(path) and path not in records:
                raise UsageError("shard of a part is not in that part's record", url=storage.url, shard=path)

        def one(path: str) -> ShardResult:
            if path in records and not rehash:
                info, record = records[path]
                dtype = record.tokens.dtype if record.tokens is not None else None
                return ShardResult(_moved(storage, info), record.fields, record.schema, token_dtype=dtype)
            return _index_one(storage, fmt, path)

        legacy = _legacy_manifest(storage, files)
        described = {record.tokens for _, record in records.values() if record.tokens is not None}
        tokens = described.pop() if len(described) == 1 else None  # what the parts' pack knew of its ids
        manifest = build_manifest(format, map_threaded(one, shards, threads), tokens)
        lease.check()
        moved_records = _move_part_records(storage, files, manifest)
        storage.write_manifest(manifest)
        _delete_legacy(storage, files, manifest, legacy, moved_records)
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


# -- the legacy layout (``shardstream.folder``) --------------------------------------


def _legacy_manifest(storage: Storage, files: list[str]) -> Manifest | None:
    """The manifest at the top of a dataset of the legacy layout, if it is there and reads."""
    if LEGACY_MANIFEST_NAME not in files:
        return None
    try:
        return Manifest.from_json(storage.read(LEGACY_MANIFEST_NAME))
    except ShardstreamError:
        return None  # it lists nothing this index may delete


def _moved(storage: Storage, info: ShardInfo) -> ShardInfo:
    """``info`` with its sidecar in ``.shardstream/``, copied there from a legacy part's."""
    target = sidecar_name(info.path)
    if info.index == target:
        return info
    storage.write(target, storage.read(info.index))
    return dataclasses.replace(info, index=target)


def _move_part_records(storage: Storage, files: list[str], manifest: Manifest) -> dict[str, Manifest]:
    """Write the legacy layout's part records into ``.shardstream/``, listing the sidecars
    as the manifest has them (moved), so that a later ``index`` joins the parts again;
    return the legacy records by name."""
    moved = {s.path: s for s in manifest.shards}
    legacy = {}
    for name in files:
        if PART_RECORD_RE.match(name) and own_name(name) == name:
            record = legacy[name] = Manifest.from_json(storage.read(name), url=storage.full_url(name))
            shards = tuple(moved.get(info.path, info) for info in record.shards)
            storage.write(
                f"{META_FOLDER}/{name}", dataclasses.replace(record, shards=shards).to_json().encode()
            )
    return legacy


def _delete_legacy(
    storage: Storage, files: list[str], manifest: Manifest, old: Manifest | None, records: dict[str, Manifest]
) -> None:
    """Delete what the new manifest replaced of the legacy layout: its manifest, its part
    records, and the sidecars that they (never anything else) list beside the shards."""
    present = set(files)
    kept = {s.index for s in manifest.shards}
    listed = {s.index for s in old.shards} if old is not None else set()
    for record in records.values():
        listed |= {s.index for s in record.shards}
    for name in sorted(({LEGACY_MANIFEST_NAME} | set(records) | (listed - kept)) & present):
        storage.delete(name)
