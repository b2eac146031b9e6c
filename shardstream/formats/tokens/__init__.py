"""Token shards: a flat little-endian array of token ids per shard, a sample per document.

A document read through the generic path is ``{"__key__": key, "tokens": ndarray}``.
The shard has no header (``np.memmap`` reads it as it is); where each document ends is
in its sidecar (:class:`TokensIndex`). Megatron-LM (``.bin`` + ``.idx``) and datatrove
(``.ds`` + ``.ds.index``) token files are the same kind of array, so ``shardstream
index`` takes them as token shards in place, their sidecars built from their own indexes.

What the dataset layer calls, all pure::

    ends = doc_ends(index)                       # int64 document ends, in tokens
    rng = index.byte_range(d0, d1)               # one ranged read for documents [d0, d1)
    flat = read_tokens(data, rng, index, d0, d1, name=path)   # their tokens, one array
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import IO

import numpy as np

from shardstream.errors import FormatError, PackError, UsageError, shown
from shardstream.formats.base import (
    Sample,
    SampleColumns,
    SampleIndex,
    ShardEncoder,
    ShardFormat,
    check_covers,
    check_covers_all,
    run_positions,
)
from shardstream.formats.keys import check_key_value
from shardstream.formats.tokens.foreign import datatrove_ends, megatron_ends
from shardstream.formats.tokens.index import TOKEN_DTYPES, TokensIndex, check_dtype
from shardstream.types import ByteRange

__all__ = [
    "TOKEN_DTYPES",
    "TokensEncoder",
    "TokensFormat",
    "TokensIndex",
    "doc_ends",
    "read_tokens",
    "token_dtype_for",
    "tokens_from_bytes",
]

_READ_CHUNK = 8 << 20
_TEXT_BYTES_PER_TOKEN = 4  # what pack assumes of text it has not tokenized yet (sizing only)


def token_dtype_for(vocab_size: int) -> str:
    """The token type of a shard of a vocabulary this large: uint16 where ids fit, else uint32."""
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise UsageError(f"a vocabulary of {vocab_size} ids does not fit uint32 token ids")


def doc_ends(index: SampleIndex) -> np.ndarray:
    """The document ends (int64, in tokens, read-only) of a token shard's index: document
    ``i`` is tokens ``[ends[i-1], ends[i])``."""
    return _tokens_index(index).ends


def tokens_from_bytes(data: bytes | memoryview, dtype: str | np.dtype) -> np.ndarray:
    """Token ids in ``data`` (a whole number of tokens, little endian), without a copy."""
    kind = np.dtype(dtype).newbyteorder("<")
    view = memoryview(data).cast("B")
    if len(view) % kind.itemsize:
        raise FormatError(f"{len(view)} bytes are not a whole number of {kind.name} tokens")
    return np.frombuffer(view, dtype=kind)


def read_tokens(
    data: bytes | memoryview, rng: ByteRange, index: SampleIndex, start: int, stop: int, *, name: str
) -> np.ndarray:
    """The tokens of documents ``[start, stop)``, one flat array, from ``data`` (the bytes
    of ``rng`` in the shard, which must hold ``index.byte_range(start, stop)``). A view of
    ``data``: copy it to keep it past ``data``'s life where ``data`` is a reused buffer."""
    tokens = _tokens_index(index)
    need = tokens.byte_range(start, stop)
    check_covers(data, rng, need, start, stop, name)
    view = memoryview(data).cast("B")[need.start - rng.start : need.end - rng.start]
    return tokens_from_bytes(view, tokens.dtype)


def _tokens_index(index: SampleIndex) -> TokensIndex:
    if not isinstance(index, TokensIndex):
        raise UsageError(f"a token shard needs a TokensIndex, not {type(index).__name__}", shard=index.name)
    return index


def _owned(data: bytes | memoryview) -> bytes | memoryview:
    """``data`` where arrays may keep a view of it (immutable bytes); else a copy."""
    return data if isinstance(data, bytes) else bytes(data)


class TokensEncoder(ShardEncoder):
    """Writes documents (``{"__key__", "tokens"}``) as one flat array of token ids.

    The shard's token type is that of its first document given as a numpy array of
    uint16 or uint32 (what pack's tokenizer gives); documents given as lists of ints make
    uint32 shards. Every later document is stored in that type, or refused with its key
    where an id does not fit it.
    """

    def __init__(self, fileobj: IO[bytes], *, name: str) -> None:
        self._file, self._name = fileobj, name
        self._dtype: np.dtype | None = None
        self._ends: list[int] = []
        self._keys: list[str] = []
        self._total = 0

    def write(self, sample: Sample) -> None:
        key = sample.get("__key__")
        if not isinstance(key, str):
            raise PackError(f"a document needs a string __key__, not {shown(key)}", shard=self._name)
        check_key_value(key, self._name)
        if "tokens" not in sample:
            raise PackError(
                f"document {shown(key)} has no 'tokens' (pack text with a tokenizer: --tokenizer)",
                shard=self._name,
            )
        array = self._as_tokens(sample["tokens"], key)
        if self._dtype is None:
            self._dtype = array.dtype
        self._file.write(array.tobytes())
        self._total += len(array)
        self._ends.append(self._total)
        self._keys.append(key)

    def _as_tokens(self, value: object, key: str) -> np.ndarray:
        dtype = self._dtype
        if dtype is None:
            given = value.dtype.name if isinstance(value, np.ndarray) else None
            dtype = check_dtype(given if given in ("uint16", "uint32") else "uint32", name=self._name)
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as error:
            raise PackError(
                f"document {shown(key)}: tokens are not an array: {error}", shard=self._name
            ) from None
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise PackError(
                f"document {shown(key)}: tokens must be a flat sequence of ints, not {array.dtype} "
                f"of shape {array.shape}",
                shard=self._name,
            )
        if array.dtype != dtype:
            info = np.iinfo(dtype)
            if array.size and (int(array.min()) < info.min or int(array.max()) > info.max):
                raise PackError(
                    f"document {shown(key)}: token id {int(array.max())} or {int(array.min())} does not "
                    f"fit the shard's {dtype.name}",
                    shard=self._name,
                )
            array = array.astype(dtype)
        return np.ascontiguousarray(array)

    @property
    def num_samples(self) -> int:
        return len(self._ends)

    @property
    def num_bytes(self) -> int:
        return self._total * (self._dtype.itemsize if self._dtype is not None else 2)

    def close(self) -> TokensIndex:
        dtype = self._dtype.name if self._dtype is not None else "uint16"
        return TokensIndex.of(
            name=self._name, dtype=dtype, ends=np.array(self._ends, np.int64), keys=self._keys
        )


class TokensFormat(ShardFormat):
    """Flat arrays of token ids; streams Megatron-LM and datatrove token files in place."""

    name = "tokens"
    suffix = ".tokens"
    foreign_suffixes = (".bin", ".ds")
    token_field = "tokens"
    sequential_index = True

    def encoder(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> TokensEncoder:
        if compression not in (None, "none"):
            raise UsageError(f"token shards are not compressed (got compression={compression!r})", shard=name)
        return TokensEncoder(fileobj, name=name)

    def sample_size(self, sample: Sample) -> int:
        tokens = sample.get("tokens")
        if tokens is not None:
            itemsize = tokens.dtype.itemsize if isinstance(tokens, np.ndarray) else 4
            return itemsize * len(tokens)
        # text not tokenized yet: about 2 bytes of tokens per 4 bytes of text
        text = sum(len(v) for k, v in sample.items() if k != "__key__" and isinstance(v, (str, bytes)))
        return 2 * (text // _TEXT_BYTES_PER_TOKEN + 1)

    def file_sizer(self) -> Callable[[str, tuple[str, ...], Sequence[int]], int]:
        def size(key: str, fields: tuple[str, ...], sizes: Sequence[int]) -> int:
            return 2 * (sum(sizes) // _TEXT_BYTES_PER_TOKEN + 1)

        return size

    def index_source(self, path: str, sidecar: str) -> str | None:
        if path.endswith(".bin"):
            return path[: -len(".bin")] + ".idx"
        if path.endswith(".ds"):
            return path + ".index"
        return sidecar  # a flat array alone has no document ends: they are in its sidecar

    def build_index(self, fileobj: IO[bytes], *, name: str) -> tuple[TokensIndex, tuple[str, ...]]:
        raise FormatError(
            "a token shard's document ends are in its sidecar (or a Megatron .idx, a datatrove "
            ".ds.index): index it with the file beside it",
            shard=name,
        )

    def build_index_from(
        self, fileobj: IO[bytes], source: bytes, *, name: str
    ) -> tuple[TokensIndex, tuple[str, ...]]:
        size = _read_through(fileobj)
        if name.endswith(".bin"):
            dtype, ends = megatron_ends(source, name=name)
            index = TokensIndex(name=name, dtype=dtype, ends=ends)
        elif name.endswith(".ds"):
            dtype, ends = datatrove_ends(source, size, name=name)
            index = TokensIndex(name=name, dtype=dtype, ends=ends)
        else:
            index = TokensIndex.from_bytes(source, name=name).without_checks()
        expected = index.num_tokens * index.dtype.itemsize
        if size != expected:
            raise FormatError(
                f"the shard is {size} bytes; its {index.num_samples} documents of {index.dtype.name} "
                f"tokens end at byte {expected}",
                shard=name,
                offset=min(size, expected),
            )
        return index, index.fields

    def load_index(self, data: bytes, *, name: str) -> TokensIndex:
        return TokensIndex.from_bytes(data, name=name)

    def decode(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        start: int,
        stop: int,
        *,
        name: str,
    ) -> Iterator[Sample]:
        tokens = _tokens_index(index)
        if start == stop:
            tokens.byte_range(start, stop)  # raises where the run is outside the shard
            return iter(())
        flat = read_tokens(_owned(data), rng, tokens, start, stop, name=name)
        ends = tokens.ends[start:stop] - tokens.token_range(start, stop)[0]
        pieces = np.split(flat, ends[:-1]) if len(ends) else []
        keys = tokens.key_slice(start, stop)
        return iter([{"__key__": k, "tokens": p} for k, p in zip(keys, pieces, strict=True)])

    def decode_runs(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        starts: np.ndarray,
        stops: np.ndarray,
        *,
        name: str,
    ) -> SampleColumns | list[Sample]:
        tokens = _tokens_index(index)
        lo, hi = tokens.byte_ranges(starts, stops)  # checks the runs
        some = stops > starts
        if not bool(some.any()):
            return []
        starts, stops = starts[some], stops[some]
        check_covers_all(data, rng, (lo[some], hi[some]), starts, stops, name)
        positions = run_positions(starts, stops)
        itemsize = tokens.dtype.itemsize
        if rng.start % itemsize:
            raise FormatError(f"byte range {rng} does not start at a token", shard=name, offset=rng.start)
        owned = memoryview(_owned(data)).cast("B")
        flat = tokens_from_bytes(owned[: len(owned) - len(owned) % itemsize], tokens.dtype)
        base = rng.start // itemsize
        firsts = (tokens.starts_at(positions) - base).tolist()
        lasts = (tokens.ends[positions] - base).tolist()
        pieces = [flat[a:b] for a, b in zip(firsts, lasts, strict=True)]
        return SampleColumns(("tokens",), tokens.keys_at(positions), [pieces])


def _read_through(fileobj: IO[bytes]) -> int:
    """Read a shard to its end (whoever indexes it hashes the bytes as they go): its size."""
    size = 0
    while chunk := fileobj.read(_READ_CHUNK):
        size += len(chunk)
    return size
