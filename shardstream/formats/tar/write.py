"""The tar shard encoder: samples to WebDataset-style members, with no ``tarfile`` on the hot path.

See NOTE [ Compact deterministic tar headers ] in ``tar.header``. A sample
``{"__key__": "a/b", "jpg": ..., "seg.png": ...}`` becomes the members ``a/b.jpg`` and
``a/b.seg.png`` (fields sorted). Fields whose name starts with ``_`` (``__key__``,
``__url__``, ...) are metadata and are not written, as in ``webdataset.TarWriter``.
Member names are validated, and samples sized, in ``tar.header``.
"""

from __future__ import annotations

from typing import IO, NamedTuple

import numpy as np

from shardstream.errors import PackError, shown
from shardstream.formats.base import Sample, ShardEncoder
from shardstream.formats.tar.header import (
    BLOCK,
    CHECKSUM_BASE,
    END_OF_ARCHIVE,
    HEAD_CONST,
    MAX_USTAR_SIZE,
    NAME_FIELD,
    PADDING,
    checksum_field,
    encode_value,
    member_header,
    plain_key,
    sample_members,
    size_field,
)
from shardstream.formats.tar.header import (
    KEY_FIELD_RE as KEY_FIELD_RE,
)
from shardstream.formats.tar.header import (
    exact_sample_size as exact_sample_size,
)
from shardstream.formats.tar.header import (
    sample_size as sample_size,
)
from shardstream.formats.tar.header import (
    webdataset_skips as webdataset_skips,
)
from shardstream.formats.tar.index import TarIndex

# The naming and sizing rules live in tar.header; they are re-exported for the codec's readers.

_FLUSH = 1 << 20  # bytes the encoder gathers before one write to its file object
_DIRECT = 256 << 10  # a sample this large goes to the file object without a copy
_NO_LIMIT = 1 << 62
_CACHE_MAX = 4096  # entries of each per-field header cache
_RECIPES_MAX = 1024  # distinct field sets with a fast-path recipe (per encoder)

# checksum -> the header from the checksum field on (regular member, empty prefix); bounded
_TAILS: dict[int, bytes] = {}
_TAILS_MAX = 1 << 14


def _tail(checksum: int) -> bytes:
    piece = checksum_field(checksum) + HEAD_CONST
    if len(_TAILS) < _TAILS_MAX:
        _TAILS[checksum] = piece
    return piece


class _SlowPath(Exception):
    """Raised inside the fast path for what only the slow path writes (PAX sizes)."""


# A recipe's members for one key length: (field, its name field after the key, header cache
# by data size: the name remainder and size fields, their byte sum, the data's padding and
# the member's bytes).
_Head = tuple[bytes, int, bytes, int]
_Heads = dict[int, _Head]
_Members = tuple[tuple[str, bytes, _Heads], ...]


class _Recipe(NamedTuple):
    """How the fast path writes samples with one field set (see NOTE [ Tar encoder fast path ])."""

    dot_fields: tuple[tuple[str, bytes], ...]  # sorted data fields and their b"." + field
    field_ids: tuple[int, ...]
    by_key_length: dict[int, _Members]


def _head(heads: _Heads, pad: bytes, size: int) -> _Head:
    if size > MAX_USTAR_SIZE:
        raise _SlowPath
    piece = pad + size_field(size)
    head = (piece, sum(piece), PADDING[size % BLOCK], BLOCK + ((size + BLOCK - 1) & -BLOCK))
    if len(heads) < _CACHE_MAX:
        heads[size] = head
    return head


# NOTE [ Tar encoder fast path ]
# write_within() is the pack hot path. A sample whose field set was seen before (so its
# names are validated and have a recipe), whose key is plain (as in NOTE [ Fast tar sample
# sizes ]) and of a length the recipe knows, and whose values are bytes/str/int of less than
# 8 GiB is written from cached header pieces: per member the key, its name remainder and
# size fields (cached by size), its checksum field and the constant rest of the header
# (cached by checksum, which is a constant plus the byte sums of the other pieces), the
# data and its padding. The pieces of many samples are joined into one write of about
# 1 MiB; a sample of 256 KiB or more goes out at once, its values without a copy.
# Anything else goes to _write_slow, which validates everything and writes PAX headers
# as needed; a successful slow write leaves a recipe, so the next sample of that shape is
# fast. Headers other than one block (PAX) are rare, so only those are recorded.


class TarEncoder(ShardEncoder):
    """Writes WebDataset-style samples to ``fileobj``, in writes of about 1 MiB; ``close`` flushes."""

    def __init__(self, fileobj: IO[bytes], *, name: str) -> None:
        self._file = fileobj
        self._name = name
        self._pos = 0
        self._closed = False
        self._prev_key: str | None = None
        self._pieces: list[bytes] = []  # written to the file object by _flush
        self._buffered = 0
        self._keys: list[str] = []
        self._member_first: list[int] = [0]
        self._member_field: list[int] = []
        self._member_size: list[int] = []
        self._long_headers: dict[int, int] = {}  # member -> header bytes, where not one block
        self._fields: list[str] = []
        self._field_ids: dict[str, int] = {}
        self._recipes: dict[tuple[str, ...], _Recipe] = {}  # by the sample's field names in dict order

    @property
    def num_samples(self) -> int:
        return len(self._keys)

    @property
    def num_bytes(self) -> int:
        return self._pos + (len(END_OF_ARCHIVE) if self._closed else 0)

    def write(self, sample: Sample) -> None:
        self.write_within(sample, _NO_LIMIT)

    def write_within(self, sample: Sample, room: int) -> int:
        """Write ``sample`` if it adds at most ``room`` bytes; return the bytes it adds.

        A result over ``room`` means the sample was valid but not written (the shard is
        full for it); an invalid sample raises ``PackError`` and is not written either.
        """
        # See NOTE [ Tar encoder fast path ].
        try:
            key = sample["__key__"]
            recipe = self._recipes[tuple(sample)]
            members = recipe.by_key_length[len(key)]
        except (KeyError, TypeError):
            return self._write_slow(sample, room)
        if type(sample) is not dict or not plain_key(key) or key == self._prev_key or self._closed:
            return self._write_slow(sample, room)
        key_b = key.encode()
        base = CHECKSUM_BASE + sum(key_b)
        tails = _TAILS
        pieces = self._pieces  # this sample's pieces are appended, and taken back if it is not written
        sizes = self._member_size
        mark, count = len(pieces), len(sizes)
        total = 0
        try:
            for field, pad, heads in members:
                value = sample[field]
                if type(value) is not bytes:
                    value = encode_value(value, key, field, self._name)
                size = len(value)
                head = heads.get(size) or _head(heads, pad, size)
                checksum = base + head[1]
                pieces += (key_b, head[0], tails.get(checksum) or _tail(checksum), value, head[2])
                sizes.append(size)
                total += head[3]
        except BaseException as error:
            del pieces[mark:], sizes[count:]
            if isinstance(error, _SlowPath):  # a size of 8 GiB or more
                return self._write_slow(sample, room)
            raise
        if total > room:
            del pieces[mark:], sizes[count:]
            return total
        self._prev_key = key
        self._keys.append(key)
        self._member_field += recipe.field_ids
        self._member_first.append(len(sizes))
        self._pos += total
        if total >= _DIRECT:
            self._write_direct(pieces, mark)
        else:
            self._buffered += total
            if self._buffered >= _FLUSH:
                self._flush()
        return total

    def _output(self, chunks: list[bytes], total: int) -> None:
        """Write or buffer ``chunks``, the pieces of one sample of ``total`` bytes."""
        mark = len(self._pieces)
        self._pieces += chunks
        if total >= _DIRECT:
            self._write_direct(self._pieces, mark)
            return
        self._buffered += total
        if self._buffered >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        if self._pieces:
            self._file.write(b"".join(self._pieces))
            self._pieces.clear()
            self._buffered = 0

    def _write_direct(self, pieces: list[bytes], mark: int) -> None:
        """Write a large sample (``pieces[mark:]``) at once, its large values without a copy."""
        chunks = pieces[mark:]
        del pieces[mark:]
        self._flush()
        small: list[bytes] = []
        for chunk in chunks:
            if len(chunk) < _DIRECT:
                small.append(chunk)
                continue
            if small:
                self._file.write(b"".join(small))
                small = []
            self._file.write(chunk)
        self._pieces += small
        self._buffered += sum(map(len, small))

    def _write_slow(self, sample: Sample, room: int) -> int:
        """Any valid sample: validates everything, converts values, uses PAX headers as needed."""
        if self._closed:
            raise PackError("write after close", shard=self._name, offset=self._pos)
        key, key_b, members = sample_members(sample, self._name)
        if key == self._prev_key:
            raise PackError(f"sample key {shown(key)} repeats the previous sample's key", shard=self._name)
        chunks: list[bytes] = []
        sizes: list[int] = []
        long_headers = {}
        total = 0
        for _field, dot_field, data in members:
            header = member_header(key_b + dot_field, len(data))
            if len(header) != BLOCK:
                long_headers[len(self._member_size) + len(sizes)] = len(header)
            chunks += (header, data, PADDING[len(data) % BLOCK])
            sizes.append(len(data))
            total += len(header) + ((len(data) + BLOCK - 1) & -BLOCK)
        if total > room:
            return total
        self._long_headers.update(long_headers)
        recipe = self._recipe(sample, members, len(key_b))
        self._prev_key = key
        self._keys.append(key)
        self._member_field += recipe.field_ids if recipe is not None else self._ids(members)
        self._member_size += sizes
        self._member_first.append(len(self._member_size))
        self._pos += total
        self._output(chunks, total)
        return total

    def _ids(self, members: list[tuple[str, bytes, bytes]]) -> tuple[int, ...]:
        ids = []
        for field, _, _ in members:
            fid = self._field_ids.get(field)
            if fid is None:
                fid = self._field_ids[field] = len(self._fields)
                self._fields.append(field)
            ids.append(fid)
        return tuple(ids)

    def _recipe(
        self, sample: Sample, members: list[tuple[str, bytes, bytes]], key_length: int
    ) -> _Recipe | None:
        """The recipe for this sample's field set (made if there is room), knowing this key length."""
        shape = tuple(sample)
        recipe = self._recipes.get(shape)
        if recipe is None:
            if len(self._recipes) >= _RECIPES_MAX:
                return None
            dot_fields = tuple((field, dot_field) for field, dot_field, _ in members)
            recipe = self._recipes[shape] = _Recipe(dot_fields, self._ids(members), {})
        longest = max(len(dot_field) for _, dot_field in recipe.dot_fields)
        if key_length not in recipe.by_key_length and key_length + longest <= NAME_FIELD:
            recipe.by_key_length[key_length] = tuple(
                (field, dot_field.ljust(NAME_FIELD - key_length, b"\0"), {})
                for field, dot_field in recipe.dot_fields
            )
        return recipe

    def close(self) -> TarIndex:
        if not self._closed:
            self._pieces.append(END_OF_ARCHIVE)
            self._flush()
            self._closed = True
        sizes = np.asarray(self._member_size, dtype=np.int64)
        headers = np.full(len(sizes), BLOCK, dtype=np.int64)
        if self._long_headers:
            headers[np.fromiter(self._long_headers, np.int64)] = list(self._long_headers.values())
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
