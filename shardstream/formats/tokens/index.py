"""The sample index of a token shard: where every document ends, in tokens.

A token shard is a flat little-endian array of token ids with no header, so document
``i`` is tokens ``[ends[i-1], ends[i])`` and bytes ``itemsize`` times that. The sidecar
holds the token type, the ends, and the documents' keys in the most compact of three
ways (NOTE [ Token shard keys ]).
"""

from __future__ import annotations

import numpy as np

from shardstream.errors import FormatError, UsageError
from shardstream.formats._sidecar import (
    StringTable,
    array_section,
    pack_sidecar,
    pack_strings,
    read_array,
    unpack_strings,
    unpack_versioned,
)
from shardstream.formats.base import SampleIndex
from shardstream.formats.checks import ShardChecks
from shardstream.types import ByteRange

_KIND = b"tok\0"
_VERSION = 1
_SECTIONS = 8  # head, dtype, ends, key blob, key offsets, then the checks' three sections

# Token types a shard may hold: ours are uint16 or uint32; Megatron-LM's indexed datasets
# may also be of the others.
TOKEN_DTYPES = ("uint16", "uint32", "uint8", "int8", "int16", "int32", "int64")

# NOTE [ Token shard keys ]
# A corpus of a billion documents would spend more on keys than on document ends if each
# key were stored. Keys are stored as one of:
# - NUMBERED: decimal numbers of one width, consecutive from ``base`` (what pack names the
#   documents of a source whose documents have no names): width and base alone;
# - NAMED: ``<shard path>:<document>``, the keys of foreign corpora (Megatron-LM,
#   datatrove), as foreign Parquet rows are named: nothing stored;
# - TABLE: any other keys, as a string table.
NUMBERED, NAMED, TABLE = 0, 1, 2


def check_dtype(dtype: object, *, name: str) -> np.dtype:
    """The little-endian numpy type of token type name ``dtype``; ``FormatError`` if not one."""
    if not isinstance(dtype, str) or dtype not in TOKEN_DTYPES:
        raise FormatError(
            f"token type {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}",
            shard=name,
        )
    return np.dtype(dtype).newbyteorder("<")


def numbered(keys: list[str]) -> tuple[int, int] | None:
    """``(width, base)`` when ``keys`` are consecutive zero-padded numbers of one width."""
    if not keys:
        return 0, 0
    first = keys[0]
    width = len(first)
    if not (first.isascii() and first.isdigit()) or width > 18:
        return None
    base = int(first)
    if f"{base:0{width}d}" != first:
        return None
    for i, key in enumerate(keys):
        if key != f"{base + i:0{width}d}":
            return None
    return width, base


class TokensIndex(SampleIndex):
    """Where each document of a token shard ends (in tokens); its keys; its token type."""

    __slots__ = ("_base", "_dtype", "_ends", "_keys", "_mode", "_name", "_width")

    def __init__(
        self,
        *,
        name: str,
        dtype: str,
        ends: np.ndarray,
        keys: list[str] | StringTable | None = None,
        numbering: tuple[int, int] | None = None,
    ) -> None:
        """``keys`` (a table), or ``numbering`` (width, base), or neither (NAMED keys)."""
        self._name = name
        self._dtype = check_dtype(dtype, name=name)
        self._ends = np.asarray(ends, dtype=np.int64)
        self._width, self._base = numbering if numbering is not None else (0, 0)
        self._keys: StringTable | None = None
        if keys is not None:
            self._keys = keys if isinstance(keys, StringTable) else StringTable.of(keys)
            self._mode = TABLE
        else:
            self._mode = NUMBERED if numbering is not None else NAMED
        self._validate()

    @classmethod
    def of(cls, *, name: str, dtype: str, ends: np.ndarray, keys: list[str]) -> TokensIndex:
        """The index of documents named ``keys``, stored as compactly as they allow."""
        numbering = numbered(keys)
        if numbering is not None:
            return cls(name=name, dtype=dtype, ends=ends, numbering=numbering)
        return cls(name=name, dtype=dtype, ends=ends, keys=keys)

    def _validate(self) -> None:
        ends = self._ends
        problem = None
        if ends.ndim != 1:
            problem = "document ends are not a flat array"
        elif len(ends) and (int(ends[0]) < 0 or bool(np.any(np.diff(ends) < 0))):
            problem = "document ends are negative or decreasing"
        elif self._keys is not None and len(self._keys) != len(ends):
            problem = f"{len(self._keys)} keys for {len(ends)} documents"
        elif self._mode == NUMBERED and not 0 <= self._width <= 18:
            problem = f"bad key width {self._width}"
        elif len(ends) and int(ends[-1]) > (2**63 - 1) // self._dtype.itemsize:
            problem = "document ends past any shard's size"
        if problem is not None:
            raise FormatError(f"inconsistent token sample index: {problem}", shard=self._name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_samples(self) -> int:
        return len(self._ends)

    @property
    def num_tokens(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def token_dtype(self) -> str:
        return self._dtype.name

    @property
    def dtype(self) -> np.dtype:
        """The shard's token type (little endian)."""
        return self._dtype

    @property
    def ends(self) -> np.ndarray:
        """Document ends in tokens (int64, read-only)."""
        view = self._ends.view()
        view.flags.writeable = False
        return view

    @property
    def fields(self) -> tuple[str, ...]:
        return ("tokens",)

    @property
    def keys(self) -> list[str]:
        return self.key_slice(0, len(self._ends))

    def without_checks(self) -> TokensIndex:
        """The same index, tied to no shard bytes (to be tied to those just hashed)."""
        keys = self._keys if self._keys is not None else None
        numbering = (self._width, self._base) if self._mode == NUMBERED else None
        return TokensIndex(
            name=self._name, dtype=self._dtype.name, ends=self._ends, keys=keys, numbering=numbering
        )

    def key_slice(self, start: int, stop: int) -> list[str]:
        if self._keys is not None:
            return self._keys.strings()[start:stop]
        if self._mode == NAMED:
            return [f"{self._name}:{i}" for i in range(start, stop)]
        width, base = self._width, self._base
        return [f"{base + i:0{width}d}" for i in range(start, stop)]

    def keys_at(self, positions: np.ndarray) -> list[str]:
        """The keys of the documents at ``positions``, in that order."""
        if self._keys is not None:
            return list(map(self._keys.strings().__getitem__, positions.tolist()))
        if self._mode == NAMED:
            return [f"{self._name}:{i}" for i in positions.tolist()]
        width, base = self._width, self._base
        return [f"{base + i:0{width}d}" for i in positions.tolist()]

    def token_range(self, start: int, stop: int) -> tuple[int, int]:
        """Tokens ``[lo, hi)`` of documents ``[start, stop)``."""
        n = len(self._ends)
        if not 0 <= start <= stop <= n:
            raise UsageError(f"document range [{start}, {stop}) is outside [0, {n})", shard=self._name)
        lo = int(self._ends[start - 1]) if start else 0
        return lo, int(self._ends[stop - 1]) if stop > start else lo

    def byte_range(self, start: int, stop: int) -> ByteRange:
        lo, hi = self.token_range(start, stop)
        size = self._dtype.itemsize
        return ByteRange(lo * size, hi * size)

    def byte_ranges(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(self._ends)
        outside = (starts < 0) | (starts > stops) | (stops > n)
        if bool(outside.any()):
            i = int(np.argmax(outside))
            self.byte_range(int(starts[i]), int(stops[i]))  # raises, naming the run
        size = self._dtype.itemsize
        lo = self.starts_at(starts) * size
        return lo, np.where(stops > starts, self.starts_at(stops) * size, lo)

    def starts_at(self, positions: np.ndarray) -> np.ndarray:
        """Where documents ``positions`` start, in tokens (``n``: the shard's end); without
        an array of every document's start, which a run of a few documents would pay for."""
        ends = self._ends
        if not len(ends):
            return np.zeros(len(positions), dtype=np.int64)
        return np.where(positions > 0, ends[np.maximum(positions - 1, 0)], 0)

    def to_bytes(self, *, with_checks: bool = True) -> bytes:
        checks = self._checks if with_checks else None
        if self._keys is not None:
            key_blob, key_ends = self._keys.sections()
        else:
            key_blob, key_ends = pack_strings([])
        head = [len(self._ends), self._mode, self._width, self._base]
        return pack_sidecar(
            _KIND,
            _VERSION,
            [
                array_section(head, "<i8"),
                self._dtype.name.encode(),
                array_section(self._ends, "<i8"),
                key_blob,
                key_ends,
                *(checks.sections() if checks is not None else ShardChecks.empty_sections()),
            ],
        )

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, name: str) -> TokensIndex:
        _, sections = unpack_versioned(data, _KIND, (_VERSION,), name=name)
        if len(sections) != _SECTIONS:
            raise FormatError(
                f"token sample index has {len(sections)} sections, expected {_SECTIONS}", shard=name
            )
        n, mode, width, base = read_array(sections[0], "<i8", 4, name=name, what="head").tolist()
        if n < 0 or mode not in (NUMBERED, NAMED, TABLE) or base < 0:
            raise FormatError("token sample index has a bad head", shard=name)
        try:
            dtype = bytes(sections[1]).decode("ascii")
        except UnicodeDecodeError:
            raise FormatError("token sample index has a bad token type", shard=name) from None
        ends = read_array(sections[2], "<i8", n, name=name, what="document ends")
        keys = unpack_strings(sections[3], sections[4], n if mode == TABLE else 0, name=name, what="keys")
        checks = ShardChecks.from_sections(sections[5:], name=name)
        index = cls(
            name=name,
            dtype=dtype,
            ends=ends,
            keys=keys if mode == TABLE else None,
            numbering=(width, base) if mode == NUMBERED else None,
        )
        if checks is not None:
            end = index.num_tokens * index.dtype.itemsize
            if checks.size != end:
                raise FormatError(
                    f"token sample index: documents end at byte {end}, the shard has {checks.size}",
                    shard=name,
                )
            index.bind_checks(checks)
        return index

    def __repr__(self) -> str:
        return f"TokensIndex(name={self._name!r}, documents={len(self._ends)}, dtype={self._dtype.name})"
