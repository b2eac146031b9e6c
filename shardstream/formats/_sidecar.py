"""The binary container of sample-index sidecars, shared by every format.

Layout (little endian)::

    magic  8 bytes   b"SSINDEX\\0"
    kind   4 bytes   the format, e.g. b"tar\\0" or b"pq\\0\\0"
    version u16, nsections u16
    crc32  u32       of everything after this field
    length u64       of the payload
    nsections x u64  section lengths
    payload          the sections, back to back

A section is raw bytes: a little-endian numpy array or a UTF-8 string table. The
length and CRC make any truncation or bit flip a ``FormatError`` rather than a wrong
index that silently reads other bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import cast

import numpy as np

from shardstream.errors import FormatError
from shardstream.formats.checks import crc32

MAGIC = b"SSINDEX\0"
_HEAD = struct.Struct("<8s4sHHIQ")  # magic, kind, version, nsections, crc32, payload length


def pack_sidecar(kind: bytes, version: int, sections: Sequence[bytes]) -> bytes:
    lengths = struct.pack(f"<{len(sections)}Q", *(len(s) for s in sections))
    payload = b"".join(sections)
    tail = struct.pack("<Q", len(payload)) + lengths + payload
    crc = crc32(struct.pack("<HH", version, len(sections)) + tail)
    return MAGIC + kind + struct.pack("<HHI", version, len(sections), crc) + tail


def unpack_versioned(
    data: bytes | memoryview, kind: bytes, versions: Sequence[int], *, name: str
) -> tuple[int, list[memoryview]]:
    """``(version, sections)`` of a sidecar of one of ``versions`` (the newest last)."""
    view = memoryview(data).cast("B")
    if len(view) < _HEAD.size:
        raise FormatError(f"sample index too short ({len(view)} bytes)", shard=name, offset=0)
    magic, got_kind, got_version, nsections, crc, length = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise FormatError("not a shardstream sample index (bad magic)", shard=name, offset=0)
    if got_kind != kind:
        raise FormatError(f"sample index is for format {got_kind!r}, expected {kind!r}", shard=name, offset=8)
    if got_version not in versions:
        raise FormatError(
            f"sample index version {got_version} is not supported (expected {versions[-1]}); "
            "re-index the dataset with `shardstream index`",
            shard=name,
            offset=12,
        )
    expected = _HEAD.size + 8 * nsections + length
    if len(view) != expected:
        raise FormatError(
            f"sample index is {len(view)} bytes, its header says {expected}", shard=name, offset=len(view)
        )
    if crc32(view[20:], crc32(view[12:16])) != crc:
        raise FormatError("sample index checksum mismatch (corrupt sidecar)", shard=name, offset=16)
    lengths = struct.unpack_from(f"<{nsections}Q", view, _HEAD.size)
    pos = _HEAD.size + 8 * nsections
    sections = []
    for n in lengths:
        sections.append(view[pos : pos + n])
        pos += n
    if pos != len(view):
        raise FormatError("sample index section lengths do not add up", shard=name, offset=pos)
    return got_version, sections


def array_section(values: np.ndarray | Sequence[int], dtype: str) -> bytes:
    return np.ascontiguousarray(values, dtype=dtype).tobytes()


def read_array(section: memoryview, dtype: str, count: int, *, name: str, what: str) -> np.ndarray:
    """A read-only array of exactly ``count`` items, or ``FormatError``."""
    itemsize = np.dtype(dtype).itemsize
    if len(section) != itemsize * count:
        raise FormatError(
            f"sample index section {what!r} has {len(section)} bytes, expected {itemsize * count}", shard=name
        )
    return np.frombuffer(section, dtype=dtype)


def pack_strings(strings: Sequence[str]) -> tuple[bytes, bytes]:
    """(UTF-8 blob, uint64 end offsets): a string table. Surrogates round-trip (tar names)."""
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    ends = np.cumsum(np.fromiter((len(e) for e in encoded), dtype=np.uint64, count=len(encoded)))
    return b"".join(encoded), array_section(ends, "<u8")


# NOTE [ Keys on first use ]
# A reader loads the sidecars of a window in its prefetch thread while the consumer
# decodes the window before (NOTE [ Getting the bytes ] in shardstream/dataset/fetch.py).
# Decoding a shard's keys one by one is most of the cost of loading its sidecar, and a
# zlib CRC of the sidecar releases the GIL long enough for the decoder to take it: under
# the decoder, a window's sidecars then take several times their CPU in wall time, on the
# thread that is the epoch's critical path, so every cost of that thread (the read
# checks' CRCs among them) lands in full. So a string table is checked when its sidecar
# loads (offsets in order, ending at the blob's end) and kept as stored; its strings are
# decoded once, when first asked (by the decoder, for the shard's first run), and a
# sidecar written back reuses the stored bytes. The sidecar's CRC is ISA-L's (NOTE
# [ Checksummed reads ]). tools/bench_stream.py --only small measures it on local shards.
class StringTable:
    """The strings of a sidecar's string table, decoded on first use (NOTE [ Keys on first use ])."""

    __slots__ = ("_blob", "_ends", "_strings")

    def __init__(self, blob: memoryview | None, ends: np.ndarray | None, strings: list[str] | None) -> None:
        self._blob, self._ends, self._strings = blob, ends, strings

    @classmethod
    def of(cls, strings: list[str]) -> StringTable:
        """A table of ``strings``, already decoded."""
        return cls(None, None, strings)

    def __len__(self) -> int:
        return len(self._strings) if self._strings is not None else len(cast(np.ndarray, self._ends))

    def strings(self) -> list[str]:
        """Every string, in order (decoded once, by the first caller)."""
        strings = self._strings
        if strings is None:
            strings = self._strings = _decoded(
                bytes(cast(memoryview, self._blob)), cast(np.ndarray, self._ends)
            )
        return strings

    def at(self, rows: np.ndarray) -> list[str]:
        """The strings at ``rows``, in that order: a slice where they are consecutive (a
        run of samples read in order, the usual case), which makes no int per row."""
        strings = self.strings()
        count = len(rows)
        if count > 1:
            first, last = int(rows[0]), int(rows[-1])
            # only rows inside the table: a slice past its end would come back short, where
            # a row's own lookup raises
            inside = first >= 0 and last < len(strings)
            if inside and last - first == count - 1 and bool((np.diff(rows) == 1).all()):
                return strings[first : last + 1]
        return list(map(strings.__getitem__, rows.tolist()))

    def sections(self) -> tuple[bytes, bytes]:
        """(UTF-8 blob, uint64 end offsets), as ``pack_strings`` gives them."""
        if self._blob is not None and self._ends is not None:
            return bytes(self._blob), array_section(self._ends, "<u8")
        return pack_strings(self.strings())


def _decoded(raw: bytes, ends: np.ndarray) -> list[str]:
    """The strings of a checked table: ASCII ones of one length (zero-padded numbers, the
    usual keys) cut by one ``struct`` call, much faster than one by one."""
    count = len(ends)
    if not count:
        return []
    width = int(ends[0])
    if width and raw.isascii() and bool(np.all(np.diff(ends) == width)):
        return list(map(bytes.decode, struct.unpack(f"{width}s" * count, raw)))
    bounds = ends.tolist()
    # surrogateescape decodes any bytes, so a corrupt table that passed the CRC cannot raise here
    return [
        raw[a:b].decode("utf-8", "surrogateescape") for a, b in zip([0, *bounds[:-1]], bounds, strict=True)
    ]


def unpack_strings(
    blob: memoryview, ends_section: memoryview, count: int, *, name: str, what: str
) -> StringTable:
    """The string table of a blob and its end offsets, checked; its strings decoded on first use."""
    ends = read_array(ends_section, "<u8", count, name=name, what=what + " offsets")
    if count and (int(ends[-1]) != len(blob) or bool(np.any(np.diff(ends.astype(np.int64)) < 0))):
        raise FormatError(f"sample index string table {what!r} is inconsistent", shard=name)
    if not count and len(blob):
        raise FormatError(f"sample index string table {what!r} is inconsistent", shard=name)
    return StringTable(blob, ends, None)
