"""Where order="global" lays the chunks of a lane group: one place per group and shard.

See NOTE [ Lane groups ] in global_order.py. Lanes are first laid end to end over the
epoch's positions (lane ``l`` at ``[lane_start[l], lane_start[l + 1])``, chunk ``c`` at
``lane_start[l] + c * take[l]``: the nominal layout). A group is ``group`` consecutive
lanes from a multiple of ``group``; its nominal span is cut at every shard edge inside
it, into segments. A chunk belongs to the segment holding its nominal first sample, and
each segment lays its chunks chunk by chunk, lane by lane within a chunk, from where
the segments before it end. A lane across a shard edge so gives its chunks on each side
to the group's segment on that side, and a worker's chunks ``[c1, c2)`` of every lane
of a segment are one range of positions. O(segments x group) memory: segments are at
most the groups plus the shards.
"""

from __future__ import annotations

import numpy as np


class GroupLayout:
    """Chunk positions of lanes laid by groups of ``group`` lanes and shard segments."""

    def __init__(
        self, ends: np.ndarray, lane_start: np.ndarray, take: np.ndarray, batches: int, group: int
    ) -> None:
        lanes = take.size
        self.group, self.batches = group, batches
        length = np.diff(lane_start)
        firsts = np.arange(0, lanes, group, dtype=np.int64)
        group_lo = lane_start[firsts]
        group_hi = lane_start[np.minimum(firsts + group, lanes)]
        # the shard edges strictly inside a group's nominal span cut it
        edges = ends[(ends > 0) & (ends < lane_start[-1])]
        owner = np.searchsorted(group_lo, edges, side="right") - 1
        inside = (edges > group_lo[owner]) & (edges < group_hi[owner])
        edges, owner = edges[inside], owner[inside]
        numbers = np.arange(firsts.size, dtype=np.int64)
        # by position: an edge lies strictly inside its group, groups that start together
        # are empty and keep their order
        order = np.argsort(np.concatenate([group_lo, edges]), kind="stable")
        start = np.concatenate([group_lo, edges])[order]
        self.owner = np.concatenate([numbers, owner])[order]  # the group of each segment
        last = np.append(self.owner[1:] != self.owner[:-1], True)
        first = np.insert(last[:-1], 0, True)
        stop = np.where(last, group_hi[self.owner], np.append(start[1:], 0))
        # each segment's lanes (padded to ``group`` with empty lanes past the last)
        lane = self.owner[:, None] * group + np.arange(group, dtype=np.int64)
        real = lane < lanes
        lane = np.where(real, lane, 0)
        self.take = np.where(real, take[lane], 0)
        self.length = np.where(real, length[lane], 0)
        base, step = lane_start[lane], np.maximum(self.take, 1)
        lo = np.clip(-((base - start[:, None]) // step), 0, batches)  # ceil((start - base) / step)
        hi = np.clip(-((base - stop[:, None]) // step), 0, batches)
        self.lo = np.where(first[:, None] | ~real, 0, lo)
        self.hi = np.where(~real, 0, np.where(last[:, None], batches, hi))
        sizes = self._before(self.lo, self.hi, self.take, self.length, np.array(batches)).sum(axis=1)
        self.start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        # lane j of its group's segments: the last one whose first chunk is at most c holds
        # chunk c. (j, group, first chunk) rises down the segments, so no sort is needed
        # where every lane of a segment gives each chunk ``take`` samples (not its last
        # chunk), chunk c starts at ``base + c * width`` plus its lane's takes before it
        active = real & (self.length > 0)
        self._inner_lo = np.where(active, self.lo, 0).max(axis=1)
        self._inner_hi = np.minimum(np.where(active, self.hi, batches).min(axis=1), batches - 1)
        self._width = self.take.sum(axis=1)
        inner = self._before(self.lo, self.hi, self.take, self.length, self._inner_lo[:, None]).sum(axis=1)
        self._base = self.start[:-1] + inner - self._inner_lo * self._width
        self._offset = (
            np.cumsum(take) - take - np.repeat(np.cumsum(take)[firsts] - take[firsts], group)[:lanes]
        )
        self._span = (firsts.size + 1) * (batches + 1)
        key = np.arange(group, dtype=np.int64) * self._span + self.owner[:, None] * (batches + 1) + self.lo
        self._keys = key.T.ravel()

    @staticmethod
    def _before(
        lo: np.ndarray, hi: np.ndarray, take: np.ndarray, length: np.ndarray, chunk: np.ndarray
    ) -> np.ndarray:
        """Samples of each lane's chunks ``[lo, min(chunk, hi))`` (broadcast)."""
        return np.minimum(np.clip(chunk, lo, hi) * take, length) - np.minimum(lo * take, length)

    def segments_of(self, lanes: np.ndarray) -> np.ndarray:
        """The segments of the groups of ``lanes``, in position order."""
        groups = np.unique(np.asarray(lanes, dtype=np.int64) // self.group)
        return np.flatnonzero(np.isin(self.owner, groups))

    def spans(self, segments: np.ndarray, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The positions of chunks ``[first, stop)`` of every lane of ``segments``: one
        interval each."""
        lo, hi, take, length = (
            self.lo[segments],
            self.hi[segments],
            self.take[segments],
            self.length[segments],
        )
        start = self.start[segments]
        ends = [start + self._before(lo, hi, take, length, np.array(at)).sum(axis=1) for at in (first, stop)]
        return ends[0], ends[1]

    def starts(self, lanes: np.ndarray, chunks: np.ndarray) -> np.ndarray:
        """The position of the first sample of chunk ``chunks`` of lane ``lanes`` (broadcast)."""
        lanes, chunks = np.broadcast_arrays(
            np.asarray(lanes, dtype=np.int64), np.asarray(chunks, dtype=np.int64)
        )
        group, j = np.divmod(lanes, self.group)
        key = j * self._span + group * (self.batches + 1) + chunks
        flat = np.searchsorted(self._keys, key, side="right") - 1
        row = flat % self.owner.size
        out = self._base[row] + chunks * self._width[row] + self._offset[lanes]
        rest = (chunks < self._inner_lo[row]) | (chunks >= self._inner_hi[row])
        if rest.any():  # a lane of the segment starts or ends there, or the last chunk
            out[rest] = self._starts(row[rest], j[rest], chunks[rest])
        return out

    def _starts(self, row: np.ndarray, j: np.ndarray, chunks: np.ndarray) -> np.ndarray:
        """``starts`` of lane ``j`` of segment ``row``, any chunk (one dimension)."""
        lo, hi, take, length = self.lo[row], self.hi[row], self.take[row], self.length[row]
        chunk = chunks[:, None]
        # every lane's chunks before this one, then this chunk of the segment's lanes before it
        before = self._before(lo, hi, take, length, chunk).sum(axis=1)
        size = np.minimum((chunk + 1) * take, length) - np.minimum(chunk * take, length)
        earlier = (np.arange(self.group) < j[:, None]) & (lo <= chunk) & (chunk < hi)
        return self.start[row] + before + np.where(earlier, size, 0).sum(axis=1)
