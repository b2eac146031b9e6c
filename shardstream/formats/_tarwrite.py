"""The tar shard encoder: samples to WebDataset-style members, with no ``tarfile`` on the hot path.

See NOTE [ Compact deterministic tar headers ] in ``_tarheader``. A sample
``{"__key__": "a/b", "jpg": ..., "seg.png": ...}`` becomes the members ``a/b.jpg`` and
``a/b.seg.png`` (fields sorted). Fields whose name starts with ``_`` (``__key__``,
``__url__``, ...) are metadata and are not written, as in ``webdataset.TarWriter``.
"""

from __future__ import annotations

import re
from typing import IO, Any, NamedTuple

import numpy as np

from shardstream.errors import PackError
from shardstream.formats._tarheader import (
    BLOCK,
    CHECKSUM_BASE,
    END_OF_ARCHIVE,
    HEAD_CONST,
    MAX_USTAR_SIZE,
    PADDING,
    member_header,
    size_field,
)
from shardstream.formats._tarindex import TarIndex
from shardstream.formats.base import Sample, ShardEncoder

__all__ = ["TarEncoder", "encode_value", "sample_members"]

# How webdataset splits a member name into key and field, and the names it skips as metadata.
KEY_FIELD_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
WDS_SKIPPED_RE = re.compile(r"__[^/]*__($|/)")
_SIZE_CACHE_MAX = 1 << 16  # distinct sizes whose header pieces are kept
_PLANS_MAX = 1024  # distinct field sets with a fast-path plan


# checksum -> its header field; at most 512 * 255 entries, in practice a few thousand
_CHECKSUMS: dict[int, bytes] = {}


def _checksum(value: int) -> bytes:
    field = _CHECKSUMS[value] = b"%06o\0 " % value
    return field


def webdataset_skips(name: str) -> bool:
    """True for a member name that ``webdataset.WebDataset`` drops as metadata."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return True
    return WDS_SKIPPED_RE.match(name) is not None


def encode_value(value: Any, key: str, field: str, shard: str | None) -> bytes:
    """A field value as member bytes: bytes-like as is, ``str`` as UTF-8, ``int`` as its decimal text."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise PackError(
                f"sample {key!r} field {field!r}: text is not valid Unicode ({error})", shard=shard
            ) from None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    try:
        return memoryview(value).tobytes()
    except TypeError:
        raise PackError(
            f"sample {key!r} field {field!r}: a tar field must be bytes, str or int, not {type(value).__name__}",
            shard=shard,
        ) from None


def check_key(key: Any, shard: str | None) -> bytes:
    """The UTF-8 key, after checking it names members that split back to it in every reader."""
    if not isinstance(key, str) or not key:
        raise PackError(f"sample key must be a non-empty str, not {key!r}", shard=shard)
    base = key.rsplit("/", 1)[-1]
    if not base or "." in base or "\0" in key:
        raise PackError(
            f"sample key {key!r} is not usable in a tar shard: its last path part must be non-empty, "
            "without '.' (the first dot starts the field name) and without NUL",
            shard=shard,
        )
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PackError(f"sample key {key!r} is not valid Unicode ({error})", shard=shard) from None


def check_field(field: Any, key: str, shard: str | None) -> bytes | None:
    """``b"." + field`` in UTF-8, or None for a metadata field (leading ``_``) that is not written."""
    if not isinstance(field, str):
        raise PackError(f"sample {key!r}: field names must be str, not {field!r}", shard=shard)
    if field.startswith("_"):
        return None
    if not field or "/" in field or "\0" in field:
        raise PackError(
            f"sample {key!r}: field name {field!r} must be non-empty, without '/' or NUL", shard=shard
        )
    try:
        return b"." + field.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PackError(
            f"sample {key!r}: field name {field!r} is not valid Unicode ({error})", shard=shard
        ) from None


def sample_members(sample: Sample, shard: str | None) -> tuple[str, bytes, list[tuple[str, bytes, bytes]]]:
    """Validate a sample (slow, general path): key, UTF-8 key, sorted ``(field, b"." + field, data)``."""
    if not isinstance(sample, dict):
        raise PackError(f"a sample must be a dict, not {type(sample).__name__}", shard=shard)
    key_b = check_key(sample.get("__key__"), shard)
    key = key_b.decode("utf-8")  # the same str, now typed
    members: list[tuple[str, bytes, bytes]] = []
    for field in _sorted_fields(sample, key, shard):
        dot_field = check_field(field, key, shard)
        if dot_field is None:
            continue
        name = (key_b + dot_field).decode("utf-8")
        if webdataset_skips(name):
            raise PackError(
                f"sample {key!r}: member {name!r} would be skipped as metadata by webdataset", shard=shard
            )
        split = KEY_FIELD_RE.match(name)
        if split is None or split.group(1) != key or split.group(2) != field:
            # e.g. a newline before a dotted directory: webdataset's regex would read another key
            raise PackError(
                f"sample {key!r}: member {name!r} would not read back as this key and field", shard=shard
            )
        members.append((field, dot_field, encode_value(sample[field], key, field, shard)))
    if not members:
        raise PackError(f"sample {key!r} has no fields; a tar sample needs at least one", shard=shard)
    return key, key_b, members


def _sorted_fields(sample: Sample, key: Any, shard: str | None) -> list:
    try:
        return sorted(sample)
    except TypeError:
        raise PackError(f"sample {key!r}: field names must be str", shard=shard) from None


def sample_size(sample: Sample, shard: str | None) -> int:
    total = 0
    _key, key_b, members = sample_members(sample, shard)
    for _field, dot_field, data in members:
        total += (
            len(member_header(key_b + dot_field, len(data))) + len(data) + len(PADDING[len(data) % BLOCK])
        )
    return total


class _SlowPath(Exception):
    """Raised inside the fast path for what only the slow path writes (PAX sizes)."""


class _Plan(NamedTuple):
    """How to write a sample with a given field set: per member (field, name pads by key length, sum)."""

    members: tuple[tuple[str, list[bytes], int], ...]
    field_ids: tuple[int, ...]
    header_sizes: tuple[int, ...]


# NOTE [ Tar encoder fast path ]
# write() is the pack hot path. A sample whose field names were seen before (so they are
# validated and have a plan), whose key is plain (ASCII, no dot, no leading "_") and whose
# values are bytes/str/int of less than 8 GiB is written with locals bound once, header
# pieces cached per field name, per size and per checksum, and one write call. Anything
# else goes to _write_slow, which validates everything and writes PAX headers as needed;
# a successful slow write leaves a plan, so the next sample of that shape is fast.


class TarEncoder(ShardEncoder):
    """Writes WebDataset-style samples to ``fileobj``; one ``write`` call per sample."""

    def __init__(self, fileobj: IO[bytes], *, name: str) -> None:
        self._file = fileobj
        self._name = name
        self._pos = 0
        self._closed = False
        self._prev_key: str | None = None
        self._keys: list[str] = []
        self._member_first: list[int] = [0]
        self._member_field: list[int] = []
        self._member_header: list[int] = []  # header bytes before each member's data
        self._member_size: list[int] = []
        self._fields: list[str] = []
        self._field_ids: dict[str, int] = {}
        self._plans: dict[tuple[str, ...], _Plan] = {}  # by the sample's field names in dict order
        self._size_info: dict[int, tuple[bytes, int]] = {}

    @property
    def num_samples(self) -> int:
        return len(self._keys)

    @property
    def num_bytes(self) -> int:
        return self._pos + (len(END_OF_ARCHIVE) if self._closed else 0)

    def write(self, sample: Sample) -> None:
        # See NOTE [ Tar encoder fast path ].
        try:
            key = sample["__key__"]
            plan = self._plans[tuple(sample)]
        except (KeyError, TypeError):
            return self._write_slow(sample)
        if (
            type(key) is not str
            or not key
            or "." in key
            or "\0" in key
            or key[0] == "_"
            or key[-1] == "/"
            or key == self._prev_key
            or self._closed
            or not key.isascii()  # non-ASCII keys take the slow path, which checks their encoding
        ):
            return self._write_slow(sample)
        key_b = key.encode()
        klen = len(key_b)
        base = CHECKSUM_BASE + sum(key_b)
        size_info = self._size_info
        checksums = _CHECKSUMS
        chunks: list = []
        sizes = []
        pos = self._pos
        try:
            for field, pads, fsum in plan.members:
                value = sample[field]
                if type(value) is not bytes:
                    value = encode_value(value, key, field, self._name)
                size = len(value)
                si = size_info.get(size) or self._size_piece(size)
                chk = base + fsum + si[1]
                chunks += (key_b, pads[klen], si[0], checksums.get(chk) or _checksum(chk), HEAD_CONST)
                chunks += (value, PADDING[size & 511])
                sizes.append(size)
                pos += (size + 1023) & ~511  # header block + data rounded up to blocks
        except (IndexError, _SlowPath):  # a key too long for ustar, or a size of 8 GiB or more
            return self._write_slow(sample)
        self._file.write(b"".join(chunks))
        self._prev_key = key
        self._keys.append(key)
        self._member_field += plan.field_ids
        self._member_header += plan.header_sizes
        self._member_size += sizes
        self._member_first.append(len(self._member_size))
        self._pos = pos

    def _commit(
        self, key: str, fids: tuple[int, ...], headers: tuple[int, ...], sizes: list[int], end: int
    ) -> None:
        self._prev_key = key
        self._keys.append(key)
        self._member_field += fids
        self._member_header += headers
        self._member_size += sizes
        self._member_first.append(len(self._member_size))
        self._pos = end

    def _size_piece(self, size: int) -> tuple[bytes, int]:
        if size > MAX_USTAR_SIZE:
            raise _SlowPath
        piece = size_field(size)
        si = (piece, sum(piece))
        if len(self._size_info) < _SIZE_CACHE_MAX:
            self._size_info[size] = si
        return si

    def _write_slow(self, sample: Sample) -> None:
        """Any valid sample: validates everything, converts values, uses PAX headers as needed."""
        if self._closed:
            raise PackError("write after close", shard=self._name, offset=self._pos)
        key, key_b, members = sample_members(sample, self._name)
        if key == self._prev_key:
            raise PackError(f"sample key {key!r} repeats the previous sample's key", shard=self._name)
        chunks: list = []
        headers, sizes = [], []
        pos = self._pos
        for _field, dot_field, data in members:
            header = member_header(key_b + dot_field, len(data))
            chunks += (header, data, PADDING[len(data) % BLOCK])
            headers.append(len(header))
            sizes.append(len(data))
            pos += len(header) + len(data) + len(PADDING[len(data) % BLOCK])
        self._file.write(b"".join(chunks))
        fids = tuple(self._field_id(field) for field, _, _ in members)
        self._commit(key, fids, tuple(headers), sizes, pos)
        if len(self._plans) < _PLANS_MAX:
            self._plans[tuple(sample)] = self._plan(members)

    def _field_id(self, field: str) -> int:
        fid = self._field_ids.get(field)
        if fid is None:
            fid = self._field_ids[field] = len(self._fields)
            self._fields.append(field)
        return fid

    def _plan(self, members: list[tuple[str, bytes, bytes]]) -> _Plan:
        entries = []
        for field, dot_field, _ in members:
            pads = [dot_field.ljust(100 - klen, b"\0") for klen in range(101 - len(dot_field))]
            entries.append((field, pads, sum(dot_field)))
        fids = tuple(self._field_ids[field] for field, _, _ in members)
        return _Plan(tuple(entries), fids, (BLOCK,) * len(members))

    def close(self) -> TarIndex:
        if not self._closed:
            self._file.write(END_OF_ARCHIVE)
            self._closed = True
        headers = np.asarray(self._member_header, dtype=np.int64)
        sizes = np.asarray(self._member_size, dtype=np.int64)
        ends = np.cumsum(headers + sizes + (-sizes % BLOCK))
        header_starts = ends - (headers + sizes + (-sizes % BLOCK))
        first = np.asarray(self._member_first, dtype=np.int64)
        return TarIndex.from_lists(
            name=self._name,
            keys=self._keys,
            sample_start=header_starts[first[:-1]],
            member_first=first,
            fields=self._fields,
            member_field=self._member_field,
            member_offset=header_starts + headers,
            member_size=sizes,
            archive_end=self._pos,
        )
