"""A window's runs as arrays: the ranged reads they need, and where their samples go.

# NOTE [ One call per read ]
# A window of the local order has a few runs of thousands of samples; one of
# ``order="global"`` can have thousands of runs of G/L samples or fewer (a rank's part of
# chunks of a lane cut between ranks; a worker count that is not a power of two,
# NOTE [ Nested chunk order ]), close runs of a shard sharing a read. Whatever is done per run in
# Python (a decode call, a byte range, a list to join) then costs more than the samples
# themselves. So runs live in arrays: the reads are planned with array arithmetic
# (``plan_reads``), each read's runs are decoded by one ``ShardFormat.decode_runs`` call
# (tar: one numpy gather of member spans, the values cut by one C ``map``), and the
# samples are put in yield order by one gather per column: Python work per read, none per
# run. Columns (``SampleColumns``) are kept until a sample is yielded, so a decoded window
# builds each sample's dict once. A read whose check blocks failed (``on_error="skip"``),
# or whose one call raised, is redone run by run as before, so its samples, skips and
# errors are exactly those of one call per run.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from shardstream.types import ByteRange

__all__ = [
    "COALESCE_GAP",
    "REMOTE_COALESCE_GAP",
    "Ranges",
    "Read",
    "plan_reads",
    "run_table",
    "taken_from_reads",
]

# NOTE [ Coalescing gap ]
# Runs of one shard closer than this share a read, the bytes between them read and let
# go. Local reads cost a syscall, so their gap only keeps a read from being split by small
# holes. On object storage the trade is a request against the hole's bytes, which the
# server reads and sends and the client receives all the same: the runs of order="global"
# are where it matters (a worker's parts of a lane group in two windows of the sequence
# lie one other worker's part apart, NOTE [ Nested chunk order ]). A server that copies
# the whole object for every ranged GET (moto) favours a wide gap, but a real S3 server
# pays for the holes more than for the requests they save, and through a remote wire with
# many GETs in flight the requests' latencies overlap while a hole's bytes take its
# connection's time as a request's latency would. So the gap is that of local files.
# tools/bench_stream.py --only order --s3-server seaweedfs measures it.
COALESCE_GAP = 256 * 1024
REMOTE_COALESCE_GAP = 256 * 1024


@dataclass(frozen=True, slots=True)
class Read:
    """One ranged read of a shard, serving the runs numbered ``runs`` of a window.

    ``spans``: the ``(start, end)`` of the bytes its runs take, where they leave holes in
    ``rng`` (runs closer than the gap share a read); empty where they fill it. Only these
    bytes are checked and decoded: the holes are read because a request costs more."""

    shard: int
    rng: ByteRange
    runs: tuple[int, ...]
    spans: tuple[tuple[int, int], ...] = ()


def run_table(runs: Sequence[Any]) -> np.ndarray:
    """The runs' ``(shard, start, stop)`` as an ``(n, 3)`` int64 array."""
    table = np.array(list(map(_run_fields, runs)), dtype=np.int64)
    return table.reshape(len(runs), 3)


_run_fields = attrgetter("shard", "start", "stop")
# ``ranges(shard, starts, stops)``: the byte ranges to read for those runs of a shard, as arrays
Ranges = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def plan_reads(runs: Sequence[Any] | np.ndarray, ranges: Ranges, *, gap: int) -> list[Read]:
    """The ranged reads for a window's runs (a ``run_table`` or the runs): runs of one
    shard whose bytes overlap, touch or lie at most ``gap`` bytes apart share one read
    (Parquet runs in one row group overlap; the rest of a resumed window has holes; the
    runs of ``order="global"`` can be a few samples each, see NOTE [ One call per read ]).
    A read's runs are in byte order; reads come in window order (of their first run).
    Array arithmetic throughout: Python work per shard and per read, none per run."""
    table = runs if isinstance(runs, np.ndarray) else run_table(runs)
    numbers = np.flatnonzero(table[:, 2] > table[:, 1])
    shards = table[numbers, 0]
    reads: list[tuple[int, Read]] = []
    for shard in np.unique(shards).tolist():
        mine = numbers[shards == shard]
        lo, hi = ranges(shard, table[mine, 1], table[mine, 2])
        by_start = np.argsort(lo, kind="stable")
        mine, lo, hi = mine[by_start], lo[by_start], hi[by_start]
        reach = np.maximum.accumulate(hi)
        cuts = [0, *(np.flatnonzero(lo[1:] - reach[:-1] > gap) + 1).tolist(), len(mine)]
        firsts = np.minimum.reduceat(mine, cuts[:-1]).tolist()
        holes = (np.flatnonzero(lo[1:] > reach[:-1]) + 1).tolist()  # where a run starts past all before it
        for a, b, first in zip(cuts[:-1], cuts[1:], firsts, strict=True):
            rng = ByteRange(int(lo[a]), int(reach[b - 1]))
            inside = holes[bisect.bisect_right(holes, a) : bisect.bisect_left(holes, b)]
            spans = tuple(zip([a, *inside], [*inside, b], strict=True)) if inside else ()
            covered = tuple((int(lo[i]), int(reach[j - 1])) for i, j in spans)
            reads.append((first, Read(shard, rng, tuple(mine[a:b].tolist()), covered)))
    reads.sort(key=itemgetter(0))
    return [read for _, read in reads]


def taken_from_reads(
    table: np.ndarray, numbers: list[tuple[int, ...]], order: np.ndarray | None
) -> list[int] | None:
    """Where each sample (in ``order`` of the run concatenation, else in run order) is in
    the concatenation of the reads' samples (the reads' runs in ``numbers``, one after
    another), or None where that is the identity."""
    lengths = table[:, 2] - table[:, 1]
    read_runs = np.array(list(chain.from_iterable(numbers)), dtype=np.int64)
    # where each run starts among the reads' samples, and in the run concatenation
    at_read = np.zeros(len(table), dtype=np.int64)
    at_read[read_runs] = np.cumsum(lengths[read_runs]) - lengths[read_runs]
    at_run = np.cumsum(lengths) - lengths
    moved = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(at_read - at_run, lengths)
    if order is not None:
        moved = moved[order]
    if bool(np.array_equal(moved, np.arange(moved.size))):
        return None
    return moved.tolist()
