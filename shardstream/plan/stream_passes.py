"""A stream's passes in one epoch of a mixture: listed shard by shard, or laid in stretches.

NOTE [ Stretched passes ]
An epoch takes positions ``[e q, (e + 1) q)`` of a stream's endless sequence of passes
(NOTE [ A stream's passes ], at ``Mixture.segments``). Listed, they are one segment per
shard and pass: O(shards x passes), which a stream repeated millions of times cannot
hold. So a stream whose listing would be longer than its budget (``LISTED_PASSES`` passes
of its shards, or its share ``q / total`` of ``SPREAD`` segments, whichever is more) has
its epoch cut into that many equal *stretches* of consecutive positions instead, each one
segment of the plan (``Segments.source``); a run over a stretch becomes runs of real
shards only when a window is read, by bisecting the pass orders it crosses. Those are
O(shards) each and few: passes keep one order for a cycle of at least ``q / N`` passes,
so an epoch crosses at most three cycles. Planning is then O(streams + shards + window)
whatever the passes, and an epoch gives exactly the samples the listing gives (the same
positions of the same passes), in another order.
- The budget takes many segments (``SPREAD`` over all streams) so that a worker's slice,
  and each lane of it, crosses many stretches: the streams stay mixed within a rank and
  within a window as they were.
- The default window and its lanes stay the listing's (``ShardView.listed``: the mean
  listed segment), so a worker holds what it held; the listing's length is counted, not
  made.
- A stream is stretched by its own quota alone (``stretched``), never by the plan's
  config, so a state says by one key whether its mixture was (``Key.STREAM_PASSES``):
  states of mixtures that stay listed are those of before, and a listed state never
  resumes a stretched epoch, nor the reverse.
"""

from __future__ import annotations

import math
from collections import OrderedDict

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
        self._orders: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()

    def order(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(order, starts, ends)`` of pass ``number``: its shards in pass order, and where
        each starts and ends in the pass."""
        key = number // self.cycle
        if key in self._orders:
            self._orders.move_to_end(key)
            return self._orders[key]
        if self.shuffle:
            order = permutation(self.sizes.size, (self.seed, key, TAG_PASS, self.stream))
        else:
            order = np.arange(self.sizes.size, dtype=np.int64)
        ends = np.cumsum(self.sizes[order])
        self._orders[key] = (order, ends - self.sizes[order], ends)
        while len(self._orders) > _CACHED_ORDERS:
            self._orders.popitem(last=False)
        return self._orders[key]

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
        keep = (ends > a) & (starts < b) & (ends > starts)
        first, last = starts[keep], ends[keep]
        return order[keep] + self.offset, np.maximum(first, a) - first, np.minimum(last, b) - first

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

    def stretches(self, count: int) -> Segments:
        """The epoch as ``count`` stretches of equal size (give or take one), in order."""
        count = max(1, min(count, self.quota))
        whole, rest = divmod(self.quota, count)
        index = np.arange(count + 1, dtype=np.int64)
        cuts = index * whole + index * rest // count  # i q // count, without a product past 2**63
        marks = np.full(count, -1, dtype=np.int64)
        return Segments(marks, cuts[:-1], cuts[1:], np.zeros(count, dtype=np.int64), (self,))

    # -- what a stretch reads (view.Stretch) -------------------------------------------------

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
