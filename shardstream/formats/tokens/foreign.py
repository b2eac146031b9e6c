"""Document ends of token files that other tools wrote, read from their own indexes.

Both keep the tokens as a flat little-endian array with no header, as a token shard
does, so such a file is streamed in place: only its index is translated into ours.

- Megatron-LM indexed datasets, ``X.bin`` + ``X.idx`` (the public ``MMIDIDX`` layout)::

      magic b"MMIDIDX\\x00\\x00", version <Q (1), dtype code <B,
      sequence count <Q, document count <Q,
      sizes int32[sequences], pointers int64[sequences] (bytes), document indices int64[documents]

  A sample is one of its sequences (one per document, as its preprocessing writes them).
- datatrove tokenized files, ``X.ds`` + ``X.ds.index``: the index is the documents' ends
  in tokens (<Q each, no header); tokens are 2 or 4 bytes (its ``token_size``), which the
  ``.ds`` file's size over the last end tells.
"""

from __future__ import annotations

import struct

import numpy as np

from shardstream.errors import FormatError

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
# Megatron-LM's DType codes; 6 (float64) and 7 (float32) are not token ids.
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}
_HEAD = struct.Struct("<9sQBQQ")


def megatron_ends(data: bytes | memoryview, *, name: str) -> tuple[str, np.ndarray]:
    """``(token type, document ends in tokens)`` from the bytes of a Megatron ``.idx`` file.

    The sequences must lie back to back from the start of the ``.bin`` file (pointers are
    the running sum of sizes), as every Megatron-LM writer and merger leaves them.
    """
    view = memoryview(data).cast("B")
    if len(view) < _HEAD.size:
        raise FormatError(
            f"Megatron index is {len(view)} bytes, shorter than its header", shard=name, offset=0
        )
    magic, version, code, sequences, documents = _HEAD.unpack_from(view)
    if magic != MEGATRON_MAGIC:
        raise FormatError("not a Megatron-LM index (no MMIDIDX magic)", shard=name, offset=0)
    if version != 1:
        raise FormatError(f"Megatron index version {version} is not supported (1 is)", shard=name, offset=9)
    dtype = MEGATRON_DTYPES.get(code)
    if dtype is None:
        raise FormatError(
            f"Megatron index token type code {code} is not an integer type", shard=name, offset=17
        )
    need = _HEAD.size + 12 * sequences + 8 * documents
    if len(view) != need:
        raise FormatError(
            f"Megatron index is {len(view)} bytes; {sequences} sequences and {documents} document "
            f"indices need {need}",
            shard=name,
            offset=len(view),
        )
    at = _HEAD.size
    sizes = np.frombuffer(view, dtype="<i4", count=sequences, offset=at).astype(np.int64)
    pointers = np.frombuffer(view, dtype="<i8", count=sequences, offset=at + 4 * sequences)
    if sequences and int(sizes.min()) < 0:
        raise FormatError("Megatron index has a negative sequence size", shard=name, offset=at)
    ends = np.cumsum(sizes, dtype=np.int64)
    starts = (ends - sizes) * np.dtype(dtype).itemsize
    if not np.array_equal(starts, pointers):
        i = int(np.argmax(starts != pointers))
        raise FormatError(
            f"Megatron sequence {i} starts at byte {int(pointers[i])}, not right after the one before "
            f"({int(starts[i])}): only back-to-back sequences can be streamed",
            shard=name,
            offset=at + 4 * sequences + 8 * i,
        )
    return dtype, ends


def datatrove_ends(data: bytes | memoryview, size: int, *, name: str) -> tuple[str, np.ndarray]:
    """``(token type, document ends)`` from a datatrove ``.ds.index`` file and its ``.ds``
    file's ``size`` in bytes."""
    view = memoryview(data).cast("B")
    if len(view) % 8:
        raise FormatError(
            f"datatrove index is {len(view)} bytes, not a whole number of 8-byte ends",
            shard=name,
            offset=len(view),
        )
    ends = np.frombuffer(view, dtype="<u8")
    if len(ends) and (bool(np.any(np.diff(ends.astype(np.int64)) < 0)) or int(ends[-1]) >= 2**62):
        raise FormatError("datatrove index ends are not increasing", shard=name)
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        if size:
            raise FormatError(f"datatrove file has {size} bytes but its index no tokens", shard=name)
        return "uint16", ends.astype(np.int64)
    if size not in (2 * total, 4 * total):
        raise FormatError(
            f"datatrove file is {size} bytes, which is neither 2 nor 4 bytes for each of the {total} "
            "tokens its index ends at",
            shard=name,
            offset=size,
        )
    return ("uint16" if size == 2 * total else "uint32"), ends.astype(np.int64)
