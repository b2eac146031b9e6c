"""A stream's passes in one epoch of a mixture: listed shard by shard, or laid in stretches.

NOTE [ Stretched passes ]
An epoch takes positions ``[e q, (e + 1) q)`` of a stream's endless sequence of passes
(NOTE [ A stream's passes ], at ``Mixture.segments``). Listed, they are one segment per
shard and pass: O(shards x passes), which a stream repeated millions of times cannot
hold. So a stream whose listing may be longer than its budget (``LISTED_PASSES`` passes
of its shards, or its share ``q / total`` of ``SPREAD`` segments, whichever is more) is
*stretched*: the stretched streams of an epoch together become as many virtual shards as
their budgets add up to (``Stretches``), shard ``j`` holding the ``j``-th equal part of
each stream's positions, laid in rounds of one mean listed segment, each round a piece
of every stream in proportion. A run over a virtual shard becomes runs of real shards
only when a window is read, by bisecting the rounds and the pass orders it crosses; those
are O(shards) each and few, as passes keep one order for a cycle of at least ``q / N``
passes, so an epoch crosses at most three cycles. Planning is O(streams + shards +
window) whatever the passes, and an epoch gives exactly the samples the listing gives
(the same positions of the same passes), in another order.
- Why rounds: the plan's lanes read a virtual shard front to back, a window at a time.
  Stretches of one stream each would keep a lane on one stream for a whole stretch (an
  epoch over the budget's count), so a rank's mix would drift far from the weights for
  millions of samples; in rounds, a lane crosses every stream about as often as it
  crossed listed segments, and a rank's mix stays at the weights.
- The default window and its lanes stay the listing's (``ShardView.listed``: the mean
  listed segment), so a worker holds what it held; the listing's length is counted, not
  made.
- A stream is stretched by its own quota alone (``stretched``), never by the plan's
  config, so a state says by one key whether its mixture was (``Key.STREAM_PASSES``):
  states of mixtures that stay listed are those of before, and a listed state never
  resumes a stretched epoch, nor the reverse.
- mix="stratified" and "per_stream" lay each stream alone (its own ``Stretches``, one
  round per shard), as their parts are of one stream each.
"""

from __future__ import annotations

import math

import numpy as np

from shardstream.plan.config import Run
from shardstream.plan.randomness import TAG_PASS, permutation
from shardstream.plan.view import Segments

# A stream is listed while its listing is at most this many passes of its shards, or
# its share of SPREAD segments (NOTE [ Stretched passes ]).
LISTED_PASSES = 16
SPREAD = 1 << 18
# Pass orders kept per stream: an epoch crosses at most three cycles of one order.
_CACHED_ORDERS = 4


def budget(nonempty: int, quota: int, total: int) -> int:
    """The segments a stream of ``nonempty`` non-empty shards giving ``quota`` of an epoch
    of ``total`` samples may have (NOTE [ Stretched passes ])."""
    return max(LISTED_PASSES * nonempty, -(-SPREAD * quota // max(1, total)))


def stretched(sizes: np.ndarray, quota: int, total: int) -> bool:
    """Whether a stream's epoch is laid in stretches: its listing may be longer than its
    budget (a bound, the same for every epoch)."""
    nonempty = int(np.count_nonzero(sizes))
    passes = -(-quota // max(1, int(sizes.sum()))) + 1
    return passes * nonempty > budget(nonempty, quota, total)


class StreamPasses:
    """The passes of one stream that epoch ``epoch`` takes ``quota`` positions of."""

    def __init__(
        self,
        sizes: np.ndarray,
        *,
        stream: int,
        offset: int,
        seed: int,
        shuffle: bool,
        epoch: int,
        quota: int,
    ) -> None:
        self.sizes, self.stream, self.offset = sizes, stream, offset
        self.seed, self.shuffle, self.quota = seed, shuffle, quota
        self.total = int(sizes.sum())
        self.lo, self.hi = epoch * quota, (epoch + 1) * quota  # Python ints: e q may pass 2**63
        # passes of one order: an epoch that ends one and starts the next takes each sample
        # as often as any other, give or take one (NOTE [ Mixtures ])
        self.cycle = quota // math.gcd(self.total, quota) if quota else 1
        self.nonempty = tuple((np.flatnonzero(sizes) + offset).tolist())
        self._orders: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def order(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(order, starts, ends)`` of pass ``number``: its shards in pass order, and where
        each starts and ends in the pass."""
        key = number // self.cycle
        found = self._orders.get(key)
        if found is not None:
            return found
        if self.shuffle:
            order = permutation(self.sizes.size, (self.seed, key, TAG_PASS, self.stream))
        else:
            order = np.arange(self.sizes.size, dtype=np.int64)
        ends = np.cumsum(self.sizes[order])
        found = (order, ends - self.sizes[order], ends)
        if len(self._orders) >= _CACHED_ORDERS:  # single dict operations: safe for reader threads
            self._orders.clear()
        self._orders[key] = found
        return found

    def _groups(self) -> list[tuple[int, int, int, int]]:
        """``(pass, count, a, b)``: the epoch as groups of ``count`` passes of one order from
        ``pass`` on, each taking its positions ``[a, b)`` (one group per partial pass)."""
        total, groups = self.total, []
        number, stop = self.lo // total, -(-self.hi // total)
        while number < stop:
            a, b = max(self.lo - number * total, 0), min(self.hi - number * total, total)
            count = 1
            if (a, b) == (0, total):  # whole passes up to the last whole one or the cycle's end
                count = min(self.hi // total, (number // self.cycle + 1) * self.cycle) - number
            groups.append((number, count, a, b))
            number += count
        return groups

    def _pass(self, number: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions ``[a, b)`` of pass ``number`` as ``(shards, starts, stops)`` of its
        non-empty shards, in pass order."""
        order, starts, ends = self.order(number)
        # the shards ending after a and starting before b: one slice (both rise), O(log shards)
        lo, hi = int(np.searchsorted(ends, a, side="right")), int(np.searchsorted(starts, b, side="left"))
        first, last = starts[lo:hi], ends[lo:hi]
        keep = last > first
        first, last = first[keep], last[keep]
        return order[lo:hi][keep] + self.offset, np.maximum(first, a) - first, np.minimum(last, b) - first

    def listed(self) -> Segments:
        """The epoch as one segment per shard and pass (NOTE [ A stream's passes ])."""
        if not self.total:
            return Segments.concat([])
        parts = []
        for number, count, a, b in self._groups():
            shard, start, stop = self._pass(number, a, b)
            parts.append(Segments(np.tile(shard, count), np.tile(start, count), np.tile(stop, count)))
        return Segments.concat(parts)

    def count(self) -> int:
        """How many segments :meth:`listed` gives, without making them."""
        if not self.total:
            return 0
        return sum(count * self._pass(number, a, b)[0].size for number, count, a, b in self._groups())

    # -- positions of the epoch, as stretches read them ---------------------------------------

    def runs(self, start: int, stop: int) -> list[Run]:
        """Positions ``[start, stop)`` of the epoch as runs of mixture shards, in order."""
        total, found = self.total, []
        u, v = self.lo + start, self.lo + stop
        while u < v:
            number = u // total
            base = number * total
            shards, first, last = self._pass(number, u - base, min(v - base, total))
            found += [
                Run(s, a, b) for s, a, b in zip(shards.tolist(), first.tolist(), last.tolist(), strict=True)
            ]
            u = base + total
        return found

    def shards(self, start: int, stop: int) -> tuple[int, ...]:
        """The mixture shards positions ``[start, stop)`` read: every one once they span a pass."""
        if stop - start >= self.total:
            return self.nonempty
        return tuple(dict.fromkeys(run.shard for run in self.runs(start, stop)))

    def sample(self, position: int) -> tuple[int, int]:
        """``(mixture shard, index)`` of one position of the epoch."""
        u = self.lo + position
        number, within = divmod(u, self.total)
        order, starts, ends = self.order(number)
        slot = int(np.searchsorted(ends, within, side="right"))
        return int(order[slot]) + self.offset, within - int(starts[slot])


def _cuts(quota: int, count: int) -> np.ndarray:
    """``i * quota // count`` for ``i`` in ``[0, count]``, without a product past 2**63."""
    if count >= 1 << 31:  # i * (quota % count) could pass 2**63: Python's integers
        return np.array([i * quota // count for i in range(count + 1)], dtype=np.int64)
    whole, rest = divmod(quota, count)
    index = np.arange(count + 1, dtype=np.int64)
    return index * whole + index * rest // count


class Stretches:
    """The epochs of the stretched streams of a mixture as ``count`` virtual shards of
    rounds (NOTE [ Stretched passes ]); implements ``view.Stretch`` over offsets of them
    laid end to end. Shard ``j`` holds positions ``[c_s(j), c_s(j + 1))`` of each stream
    ``s`` (``c_s(j) = j q_s // count``), in rounds of about ``size`` samples, each round a
    piece of every stream in proportion, in stream order."""

    def __init__(self, passes: list[StreamPasses], count: int, size: int) -> None:
        self.passes = passes
        count = max(1, min(count, max(p.quota for p in passes)))  # no shard empty
        self.cuts = np.stack([_cuts(p.quota, count) for p in passes])
        self.offsets = self.cuts.sum(axis=0)
        self.size = max(1, size)

    def segments(self) -> Segments:
        """The virtual shards, for a plan to run on."""
        count = self.offsets.size - 1
        marks = np.full(count, -1, dtype=np.int64)
        return Segments(marks, self.offsets[:-1], self.offsets[1:], np.zeros(count, dtype=np.int64), (self,))

    def _shard(self, offset: int) -> tuple[int, int, list[int], int]:
        """``(shard, its first offset, its samples of each stream, its rounds)``."""
        shard = int(np.searchsorted(self.offsets, offset, side="right")) - 1
        counts = [int(c[shard + 1] - c[shard]) for c in self.cuts]
        rounds = 1 if len(counts) == 1 else max(1, sum(counts) // self.size)
        return shard, int(self.offsets[shard]), counts, rounds

    @staticmethod
    def _round(counts: list[int], rounds: int, x: int) -> int:
        """The round of a shard that holds its offset ``x``."""
        lo, hi = 0, rounds - 1
        while lo < hi:  # the last round starting at or before x
            mid = (lo + hi + 1) // 2
            if sum(mid * n // rounds for n in counts) <= x:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _pieces(self, offset: int, stop: int) -> list[tuple[int, int, int]]:
        """``(stream, start, stop)``: offsets ``[offset, stop)`` (within one shard) as
        positions of the streams' epochs, in order."""
        shard, base, counts, rounds = self._shard(offset)
        x, y = offset - base, stop - base
        number, found = self._round(counts, rounds, x), []
        at = sum(number * n // rounds for n in counts)
        while at < y:
            for stream, n in enumerate(counts):
                lo, hi = number * n // rounds, (number + 1) * n // rounds
                u, v = max(x, at), min(y, at + hi - lo)
                if v > u:
                    first = int(self.cuts[stream, shard]) + lo - at
                    found.append((stream, first + u, first + v))
                at += hi - lo
            number += 1
        return found

    def _spans(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        found = []
        while start < stop:
            end = min(stop, int(self.offsets[int(np.searchsorted(self.offsets, start, side="right"))]))
            found += self._pieces(start, end)
            start = end
        return found

    def runs(self, start: int, stop: int) -> list[Run]:
        return [run for s, a, b in self._spans(start, stop) for run in self.passes[s].runs(a, b)]

    def shards(self, start: int, stop: int) -> tuple[int, ...]:
        """Every shard the streams' positions in the virtual shards ``[start, stop)`` touch
        may read (each stream's whole part of those shards: a superset, found in O(streams))."""
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        last = int(np.searchsorted(self.offsets, stop, side="left"))
        found: dict[int, None] = {}
        for stream, passes in enumerate(self.passes):
            a, b = int(self.cuts[stream, first]), int(self.cuts[stream, last])
            found.update(dict.fromkeys(passes.shards(a, b)))
        return tuple(found)

    def sample(self, position: int) -> tuple[int, int]:
        stream, a, _ = self._pieces(position, position + 1)[0]
        return self.passes[stream].sample(a)
