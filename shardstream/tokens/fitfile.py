"""The best-fit sidecar: a shard's best-fit bins for one sequence length, as bytes.

Layout (little endian)::

    magic    8 bytes  b"SSFIT\\0\\0\\0"
    version  u16, width u16 (bytes of an index: 4 or 8)
    crc32    u32      of everything after this field
    seq_len, block_tokens, documents, tokens   u64 each
    ends_crc u64      CRC-32 of the document ends (int64) it was made from
    ncuts, npieces, nbins                      u64 each
    cuts     int64[ncuts]         where blocks cut a document (token offsets)
    order    uint[npieces]        the pieces, sequence by sequence
    first    uint[nbins + 1]      sequence i is order[first[i]:first[i + 1]]

The length and CRC make truncation or a flipped bit a ``FormatError`` naming the sidecar;
``BestFit.check`` refuses one made for other documents or another sequence length.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from shardstream.crc import crc32
from shardstream.errors import FormatError

FIT_MAGIC = b"SSFIT\0\0\0"
FIT_VERSION = 1
_HEAD = struct.Struct("<8sHHI")  # magic, version, width, crc32
_FIELDS = struct.Struct("<8Q")  # seq_len, block_tokens, documents, tokens, ends_crc, ncuts, npieces, nbins


def ends_crc(ends: np.ndarray) -> int:
    """The CRC-32 of document ends as int64: what ties a sidecar to its shard."""
    return crc32(np.ascontiguousarray(ends, dtype="<i8").tobytes())


@dataclass(frozen=True, slots=True, eq=False)
class BestFit:
    """A shard's best-fit bins (NOTE [ Best-fit bins ] in bestfit.py): the pieces of
    ``split_documents(ends, seq_len, cuts)``, sequence ``i`` being pieces
    ``order[first[i]:first[i + 1]]``."""

    seq_len: int
    block_tokens: int
    documents: int
    tokens: int
    ends_crc: int
    cuts: np.ndarray
    order: np.ndarray
    first: np.ndarray

    @property
    def count(self) -> int:
        return len(self.first) - 1

    def check(self, ends: np.ndarray, seq_len: int, *, name: str | None = None) -> None:
        """Refuse (FormatError) bins made for other documents or another sequence length."""
        if self.seq_len != seq_len:
            raise FormatError(f"best-fit sidecar is for seq_len {self.seq_len}, not {seq_len}", shard=name)
        tokens = int(ends[-1]) if len(ends) else 0
        if (self.documents, self.tokens, self.ends_crc) != (len(ends), tokens, ends_crc(ends)):
            raise FormatError(
                f"best-fit sidecar was made for other documents ({self.documents} documents, "
                f"{self.tokens} tokens; the shard has {len(ends)}, {tokens}): rebuild it",
                shard=name,
            )

    def to_bytes(self) -> bytes:
        width = 4 if len(self.order) < 2**32 else 8
        dtype = f"<u{width}"
        fields = _FIELDS.pack(
            self.seq_len, self.block_tokens, self.documents, self.tokens, self.ends_crc,
            len(self.cuts), len(self.order), self.count,
        )  # fmt: skip
        body = b"".join(
            [
                fields,
                np.ascontiguousarray(self.cuts, dtype="<i8").tobytes(),
                np.ascontiguousarray(self.order, dtype=dtype).tobytes(),
                np.ascontiguousarray(self.first, dtype=dtype).tobytes(),
            ]
        )
        crc = crc32(body, crc32(struct.pack("<HH", FIT_VERSION, width)))
        return _HEAD.pack(FIT_MAGIC, FIT_VERSION, width, crc) + body

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, name: str | None = None) -> BestFit:
        """The bins in ``data``, else FormatError naming ``name`` (the sidecar's path)."""
        view = memoryview(data).cast("B")
        if len(view) < _HEAD.size + _FIELDS.size:
            raise FormatError(f"best-fit sidecar too short ({len(view)} bytes)", shard=name, offset=0)
        magic, version, width, crc = _HEAD.unpack_from(view)
        if magic != FIT_MAGIC:
            raise FormatError("not a shardstream best-fit sidecar (bad magic)", shard=name, offset=0)
        if version != FIT_VERSION:
            raise FormatError(
                f"best-fit sidecar version {version} is not supported (expected {FIT_VERSION}): rebuild it",
                shard=name,
                offset=8,
            )
        if width not in (4, 8):
            raise FormatError(f"best-fit sidecar has index width {width}", shard=name, offset=10)
        fields = _FIELDS.unpack_from(view, _HEAD.size)
        ncuts, npieces, nbins = fields[5:]
        expected = _HEAD.size + _FIELDS.size + 8 * ncuts + width * (npieces + nbins + 1)
        if len(view) != expected:
            raise FormatError(
                f"best-fit sidecar is {len(view)} bytes, its header says {expected}",
                shard=name,
                offset=len(view),
            )
        if crc32(view[_HEAD.size :], crc32(view[8:12])) != crc:
            raise FormatError("best-fit sidecar checksum mismatch (corrupt sidecar)", shard=name, offset=12)
        pos = _HEAD.size + _FIELDS.size
        cuts = np.frombuffer(view, dtype="<i8", count=ncuts, offset=pos)
        pos += 8 * ncuts
        order = np.frombuffer(view, dtype=f"<u{width}", count=npieces, offset=pos)
        first = np.frombuffer(view, dtype=f"<u{width}", count=nbins + 1, offset=pos + width * npieces)
        seq_len, block_tokens, documents, tokens, crc_of_ends = fields[:5]
        fit = cls(
            seq_len, block_tokens, documents, tokens, crc_of_ends,
            cuts.astype(np.int64), order.astype(np.int64), first.astype(np.int64),
        )  # fmt: skip
        _check_bins(fit, name)
        return fit


def _check_bins(fit: BestFit, name: str | None) -> None:
    """Refuse bins that are not a partition of the pieces (a sidecar written by a bug)."""
    first, order = fit.first, fit.order
    if first[0] != 0 or first[-1] != len(order) or (np.diff(first) <= 0).any():
        raise FormatError("best-fit sidecar's sequences do not cover its pieces, each some", shard=name)
    if len(order) and (order.max() >= len(order) or (np.bincount(order) != 1).any()):
        raise FormatError("best-fit sidecar's pieces are not each in one sequence", shard=name)
    if (np.diff(fit.cuts) <= 0).any() or (len(fit.cuts) and (fit.cuts[0] <= 0 or fit.cuts[-1] >= fit.tokens)):
        raise FormatError("best-fit sidecar's cuts are out of order", shard=name)
