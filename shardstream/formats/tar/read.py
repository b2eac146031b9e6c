"""The read hot path of tar shards: the samples of a run, from the bytes of a range.

# NOTE [ Fast tar decode ]
# A worker streaming small samples spends most of its time here, so the loop over samples
# and members runs in C, with no Python frame per member and one tiny one per sample:
# - No header is parsed: member spans come from the index as two Python int lists (numpy
#   does the arithmetic), shifted so they index the object that owns the bytes.
# - Every value is sliced straight out of that object by one C-level ``map``: slicing a
#   ``bytes`` or an ``mmap`` makes the value ``bytes`` with one copy and no other object
#   (a memoryview slice first, then ``bytes()`` of it, costs a second object per member,
#   a large share of the time for small samples). A memoryview of a ``bytes`` or an
#   ``mmap`` (what the dataset's reader hands over for a mapped local range) is resolved
#   to its owner and its offset in it; any other buffer goes the memoryview way.
# - When every sample of the shard has the same fields (the usual case), each sample dict
#   is built by a function generated once per field tuple, a dict display with constant
#   keys (BUILD_CONST_KEY_MAP), much faster than ``dict(zip(names, values))``.
#   Field names enter the generated code only as ``repr()`` literals.
# Values stay ``bytes``, as webdataset gives them, so each field is copied once: out of
# the page cache for a mapped range, out of the response body for object storage.
# ``tar_runs`` does the same for many runs of one read at once (the dataset's reader
# decodes a read's runs in one call): the members of all the runs come from one numpy
# gather, and uniform samples come back as columns, not dicts (``SampleColumns``). There
# the values are cut by ONE ``struct`` unpack of a layout made for the read ("skip this
# many bytes, take that many", member after member): C makes every ``bytes`` straight
# from any buffer, with no slice object per member, which costs as much as the value.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from itertools import chain, repeat
from typing import Any

import numpy as np

from shardstream.formats.base import Sample, SampleColumns, run_positions, sample_builder
from shardstream.formats.samples import BYTES_COLUMN
from shardstream.formats.tar.header import BLOCK as HEADER_BLOCK
from shardstream.formats.tar.index import TarIndex
from shardstream.formats.tar.members import check_uncompressed

# Objects whose slices are ``bytes``; taken at import, so a test that patches
# ``mmap.mmap`` with a recording function does not break the isinstance checks.
_OWNERS = (bytes, mmap.mmap)


# Samples cut and built at a time: their values are still in the CPU cache when their
# dicts are built. For a caller that takes samples as they come (decode is lazy) that is
# faster than cutting all of a shard first (tools/bench_formats.py measures it); the
# dataset's reader lists a run's samples, which is as fast either way.
BLOCK = 256


def tar_samples(
    data: bytes | memoryview, base: int, index: TarIndex, start: int, stop: int
) -> Iterator[Sample]:
    """Samples ``[start, stop)`` of the shard, from ``data`` (its bytes from offset ``base``).

    The caller has checked that ``data`` holds them; values are ``bytes``. The samples
    are cut lazily, a block at a time, so ``data`` must stay as it is until they are.
    """
    if base == 0:  # a shard replaced by its compressed self after indexing says so
        check_uncompressed(bytes(data[:HEADER_BLOCK]), index.name)
    m0, m1 = index.members(start, stop)
    cut = _Cutter(data)
    starts, ends = index.member_spans(m0, m1, base - cut.offset)
    keys = index.key_slice(start, stop)
    uniform = index.uniform_fields()
    if uniform is None:
        return _mixed(keys, index.sample_counts(start, stop), index.member_fields(m0, m1), cut(starts, ends))
    k, build = len(uniform), sample_builder(uniform)
    if not k:  # an empty run of an empty shard
        return map(build, keys)
    if len(keys) == 1:  # one sample (random access): no blocks to chain
        return iter((build(keys[0], *cut(starts, ends)),))

    def block(i: int) -> Iterator[Sample]:
        values = iter(cut(starts[i * k : (i + BLOCK) * k], ends[i * k : (i + BLOCK) * k]))
        return map(build, keys[i : i + BLOCK], *repeat(values, k))

    return chain.from_iterable(map(block, range(0, len(keys), BLOCK)))


def tar_runs(
    data: bytes | memoryview, base: int, index: TarIndex, starts: np.ndarray, stops: np.ndarray
) -> SampleColumns | list[Sample]:
    """The samples of runs ``[starts[i], stops[i])``, one after the other, from ``data``
    (the shard's bytes from offset ``base``): columns when every sample of the shard has
    the same fields (NOTE [ Fast tar decode ]). The caller has checked that ``data`` holds them."""
    if base == 0 and len(starts):  # as tar_samples checks, once per run
        check_uncompressed(bytes(data[:HEADER_BLOCK]), index.name)
    uniform = index.uniform_fields()
    if uniform is None:
        pairs = zip(starts.tolist(), stops.tolist(), strict=True)
        return [sample for a, b in pairs for sample in tar_samples(data, base, index, a, b)]
    positions = run_positions(starts, stops)
    keys = index.keys_at(positions)
    k = len(uniform)
    if not k:
        return SampleColumns((), keys, [])
    members = (index.member_first_at(positions)[:, None] + np.arange(k)).ravel()
    values = _unpacked(data, *index.member_arrays_at(members, base))
    if values is None:  # members out of order in the shard: sliced one by one
        cut = _Cutter(data)
        values = cut(*index.member_spans_at(members, base - cut.offset))
    return SampleColumns(uniform, keys, [values[f::k] for f in range(k)], (BYTES_COLUMN,) * k)


def _unpacked(data: bytes | memoryview, starts: np.ndarray, sizes: np.ndarray) -> list[bytes] | None:
    """The values of members at ``starts`` (offsets in ``data``) of ``sizes`` bytes, by one
    ``struct`` unpack (NOTE [ Fast tar decode ]); None where a member starts before the
    one before it ends, or one lies outside ``data``."""
    count = len(starts)
    if not count:
        return []
    ends = starts + sizes
    gaps = np.empty(count, dtype=np.int64)
    gaps[0] = 0
    np.subtract(starts[1:], ends[:-1], out=gaps[1:])
    if int(starts[0]) < 0 or int(ends[-1]) > len(data) or bool((gaps < 0).any()):
        return None
    pairs = np.empty(2 * count, dtype=np.int64)
    pairs[0::2], pairs[1::2] = gaps, sizes
    layout = struct.Struct(_layout(pairs))  # not struct's cache
    return list(layout.unpack_from(data, int(starts[0])))


def _layout(pairs: np.ndarray) -> bytes:
    """The ``struct`` format ``"<{gap}x{size}s..."`` of ``pairs`` (gap, size, gap, ...;
    none negative), its numbers written by numpy, all of one width with leading zeros
    (which ``struct`` reads as the same counts): formatting them one by one in Python
    costs more than the unpack it lays out."""
    top = int(pairs.max())
    width = len(str(top))
    # uint32 arithmetic where the numbers fit it, int64 beyond (a member over 4 GiB)
    numbers = pairs.astype(np.uint32) if top < 1 << 32 else pairs.copy()
    text = np.empty((len(pairs), width + 1), dtype=np.uint8)
    for column in range(width - 1, -1, -1):
        text[:, column] = numbers % 10
        numbers //= 10
    text[:, :width] += ord("0")
    text[0::2, width] = ord("x")
    text[1::2, width] = ord("s")
    return b"<" + text.tobytes()


class _Cutter:
    """Cuts member values out of ``data``: ``cut(starts, ends)`` with offsets shifted by
    ``-offset`` (see NOTE [ Fast tar decode ]). Holds ``data``, so a mapped range stays
    exported (an ``mmap`` cannot be closed under it) while samples are still cut."""

    __slots__ = ("data", "get", "offset", "owned")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        owner, self.offset = _owner(data)
        self.owned = owner is not None
        self.get = owner.__getitem__ if owner is not None else memoryview(data).cast("B").__getitem__

    def __call__(self, starts: list[int], ends: list[int]) -> list[bytes]:
        if self.owned:
            return list(map(self.get, map(slice, starts, ends)))
        return list(map(bytes, map(self.get, map(slice, starts, ends))))


def _mixed(keys: list[str], counts: list[int], fields: list[str], values: list[bytes]) -> Iterator[Sample]:
    """Samples whose fields differ (a shard written by another tool): one dict at a time."""
    pos = 0
    for key, count in zip(keys, counts, strict=True):
        sample: Sample = {"__key__": key}
        sample.update(zip(fields[pos : pos + count], values[pos : pos + count], strict=True))
        pos += count
        yield sample


def _owner(data: bytes | memoryview) -> tuple[Any, int]:
    """``(obj, offset)`` where ``obj`` is a ``bytes`` or ``mmap`` whose bytes from
    ``offset`` on are ``data``'s, or ``(None, 0)`` when ``data`` is another buffer."""
    if isinstance(data, _OWNERS):
        return data, 0
    view = memoryview(data)
    obj = view.obj
    if not isinstance(obj, _OWNERS) or not view.c_contiguous or not view.nbytes:
        return None, 0
    # A slice of a view keeps the same owner; where it starts in the owner is the
    # difference of the two buffer addresses (both kept alive by ``view`` here).
    inner = np.frombuffer(view, dtype=np.uint8)
    outer = np.frombuffer(obj, dtype=np.uint8)
    offset = int(inner.__array_interface__["data"][0]) - int(outer.__array_interface__["data"][0])
    if not 0 <= offset <= len(outer) - len(inner):
        return None, 0
    return obj, offset
