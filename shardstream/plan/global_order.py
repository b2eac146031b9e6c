"""order="global": an epoch as a sequence of global batches that no topology changes.

The epoch is first a sequence of global batches of ``G = global_batch_size`` samples
that depends only on the shards, seed, epoch, ``G``, the read lanes ``L`` and the
shuffle window; ranks and workers only cut it (NOTE [ Global order ], above
``GlobalSequence``). A resume state is the number of global batches taken (plus the
parameters and the dataset's checksum): it resumes on any ``(R, W)`` with ``R``
dividing ``G``, and the rest of the epoch is the same batches. Memory is
O(shards + window): a worker's window is its batches of one window of the sequence.

The rules sit next to their code: NOTE [ Default lanes ] (``lanes_of``), NOTE [ Lane
groups ] (``group_of``), NOTE [ Padding in the last batch ] (``GlobalSequence``).
Mixtures fit the same mould (plan/mixture.py, plan/composed.py): the mixture decides,
per global batch ``k`` and keyed by ``(seed, epoch, k)`` only, how many of the ``G``
entries each source gives, each source with its own lanes over its own shard order,
and ranks and workers are cut exactly as here. docs/global-order.md is the guide.
"""

from __future__ import annotations

import numpy as np

from shardstream.plan.config import DEFAULT_LANES, DEFAULT_RUN, MAX_LANES, PlanConfig, Run, check_global_batch
from shardstream.plan.groups import GroupLayout
from shardstream.plan.intervals import from_points, points
from shardstream.plan.randomness import TAG_GLOBAL, nested_permutations, random_words
from shardstream.plan.shards import ShardOrder
from shardstream.plan.windows import split_even

# Chunk permutations of a lane are drawn this many words per keyed stream (a block of
# windows); a block's permutations are cached per lane while a worker reads them.
BLOCK_WORDS = 8192
CACHED_BLOCKS = 128  # 8 MiB at most (BLOCK_WORDS int64 each)
# The blocks of many lanes are made in one nested order of about this many words at most
# (a call per lane pays a fixed cost each; all lanes at once would make large temporaries).
_FILL_WORDS = 1 << 14
# NOTE [ Lane groups ]
# A batch holds a chunk of every lane, so a worker with each lane on its own makes about
# L / R requests per window whatever the shards are: many more, smaller reads than the
# local order. Where a shard holds several lanes, their chunks need not lie apart. Lanes
# form groups of group_of's size from every multiple of it: the largest power of two at
# most MAX_GROUP (and the lanes) where a non-empty shard holds 2 lanes or more on average;
# else 1 (there a group's segments would hold one or two lanes each: as many reads, and a
# layout of O(shards) to make). The shard edges inside a group's span of positions cut it
# into segments; a chunk belongs to the segment that holds its first sample, and each
# segment lays its chunks chunk by chunk, lane by lane within a chunk (GroupLayout in
# groups.py). So every chunk stays in its shard (but for a segment's last few samples past
# the edge) and a batch's mix of shards is what it was; groups that moved chunks from one
# shard to the next, or a whole shard's lanes in one group, mixed batches far worse (and
# the latter would cross rank boundaries).
# A group's lanes share the top GROUP_LEVELS levels of their nested order (the words of
# the group's first lane: NOTE [ Nested chunk order ]), so for up to 2 ** GROUP_LEVELS
# workers a worker's part of a segment in a window is one range: one read per segment and
# window, not per lane. The deeper levels stay each lane's, so a batch is spread a little
# less within a shard and as before across shards. MAX_GROUP keeps a group inside one
# rank's lanes where a rank holds a multiple of 8 lanes; a rank holding part of a group
# reads its chunks among the other lanes'. Nothing here depends on R or W.
# What is left: a worker still reads its part of every segment in every window, so fewer,
# longer windows are the lever (the default window of NOTE [ Global window ] in config.py).
# tools/bench_stream.py --only order --s3-server seaweedfs measures the reads' cost against
# the local order; docs/benchmarks.md records it (claims global-order, global-order-8x4).
MAX_GROUP = 8
GROUP_LEVELS = 3


def group_of(lanes: int, shards: int) -> int:
    """Lanes per group (NOTE [ Lane groups ]): the largest power of two at most
    ``MAX_GROUP`` and at most the lanes, where a non-empty shard holds 2 lanes or more; else 1."""
    if lanes < 2 * max(1, shards):
        return 1
    return 1 << (min(MAX_GROUP, lanes).bit_length() - 1)


# NOTE [ Default lanes ]
# How well a global batch mixes depends on its lanes, not on the window: a batch holds one
# chunk of every lane and the window only decides which, so on shards sorted by label a
# batch holds about L places of the epoch whatever the window (tools/shuffle_quality.py).
# With a fixed number of lanes a big batch falls far behind a perfect shuffle; with runs of
# at most DEFAULT_RUN samples batches of every size come close to it. So read_lanes=None
# means max(DEFAULT_LANES, ceil(G / DEFAULT_RUN)), at most G: a function of G alone, so the
# same on every topology. Shorter runs cost reads, most on servers that work per request
# (NOTE [ Lane groups ] wins most of it back; tools/bench_stream.py --only order measures
# it, docs/benchmarks.md records it). A user who knows the shards are mixed already passes
# read_lanes for longer runs. A state records its lanes, so one saved under another default
# is refused, naming both, and resumes with that read_lanes.
def lanes_of(config: PlanConfig) -> int:
    """The read lanes of a global order: never more than the global batch size, and by
    default enough that a lane gives a batch at most ``DEFAULT_RUN`` samples (NOTE
    [ Default lanes ])."""
    if not config.shuffle:
        return 1
    size = int(config.global_batch_size or 1)
    default = min(MAX_LANES, max(DEFAULT_LANES, -(-size // DEFAULT_RUN)))  # NOTE [ Most lanes ]
    return max(1, min(int(config.read_lanes or default), size))


# NOTE [ Global order ]
# The local order cuts the epoch into rank and worker slices, so what global batch k holds
# depends on the topology. Here the epoch is first a sequence of global batches; ranks and
# workers only cut it.
# - Positions are the local order's (shards permuted by (seed, epoch), laid end to end).
#   There are B = ceil(N / G) batches, every one full, the last filled by repeats (NOTE
#   [ Padding in the last batch ]), or B = N // G with drop_last (the tail is dropped).
# - The positions are L lanes of contiguous positions (L at most G; one lane with
#   shuffle=False, so the sequence is manifest order). Lane l gives every batch one chunk of
#   take[l] consecutive positions (take splits G evenly), so a lane is read front to back
#   in runs of about G / L samples. Batch k is its lanes' chunks in lane order.
# - Within a window of M = shuffle_window // G batches, which chunk of a lane each batch
#   takes is a nested permutation (NOTE [ Nested chunk order ] in randomness.py) keyed by
#   (seed, epoch, lane, block), a block being BLOCK_WORDS // M windows, so small windows cost
#   no more keyed streams than big ones. Batches mix L places spread over the epoch, and for
#   any power-of-two W the batches one worker takes of a window take one contiguous range of
#   each lane's chunks, so two workers never read (and check) the same bytes of a lane; a
#   plain keyed permutation interleaves their chunks closer than a read's coalescing gap and
#   a check block, and each worker reads about all of the bytes.
# - Rank r of R (R divides G) takes entries [r G/R, (r+1) G/R) of every batch: whole chunks
#   of its own lanes (two of them cut). Worker w of W takes the rank's batches w, w + W, ...
#   from where the epoch (or the resumed state) starts: torch's DataLoader takes batches
#   from its workers round-robin from worker 0, so they come out in global order, and the
#   DataLoader's batch_size must be G/R.


# NOTE [ Whole chunks per worker ]
# A shuffle of samples across a window of batches would put every rank and worker in every
# run (each worker reading every W-th sample of a chunk), and a rank part that is not whole
# lanes would need reads of single samples; whole chunks avoid both. A worker's Window is
# its batches of whole windows of the sequence (a few at first, for a fast first sample, then
# twice as many each time: NOTE [ Global window ] in config.py), so every lane's part of a
# window is fetched by one Window: the reader joins a lane's nearby chunks into one read, and
# a Window cut inside a window would fetch those bytes again. The grouping says only what
# the reader fetches together; it changes nothing in the sequence. The price is that a batch
# holds runs of G / L consecutive samples of a shard; more lanes mix more and read shorter
# runs, and L is the user's choice or G's (NOTE [ Default lanes ]), never R's or W's.


# NOTE [ Padding in the last batch ]
# Without drop_last the epoch's N samples fill B - 1 global batches and T = N - (B - 1) G
# entries (0 < T <= G) of the last one; its entries [T, G) are repeats. So every batch but
# the last holds real samples only, each sample once: lane l holds (B - 1) take[l]
# positions plus the real entries of its last chunk (the entries of [entry[l], entry[l + 1])
# below T), the lanes laid end to end from lane_start, and the last batch always takes each
# lane's last chunk (the last window's permutation leaves it in place). Entry e >= T of the
# last batch repeats entry (e - T) mod N of the epoch's sequence, the samples its first
# batches hold, as DistributedSampler repeats its first indices: repeats of the first
# positions instead would be a run of the first shards, a last batch of one or two labels
# on shards sorted by label. Nothing here depends on R or W: a rank whose part of the last
# batch lies past T reads repeats only. An epoch with no padding (T = G, or drop_last) has
# the lanes and permutations it always had.
class GlobalSequence:
    """The global batches of one epoch (NOTE [ Global order ]); O(shards + lanes)."""

    def __init__(self, shards: ShardOrder, config: PlanConfig, *, epoch: int, window: int) -> None:
        self.shards, self.seed, self.epoch, self.shuffle = shards, config.seed, epoch, config.shuffle
        self.size = int(config.global_batch_size or 1)
        total = shards.total
        check_global_batch(self.size, total)
        self.batches = total // self.size if config.drop_last else -(-total // self.size)
        self.lanes = lanes_of(config)
        self.take = split_even(self.size, self.lanes)
        self.entry = np.concatenate([[0], np.cumsum(self.take)]).astype(np.int64)
        # NOTE [ Padding in the last batch ]: the real entries of the last batch, and where
        # each lane starts among the epoch's positions
        self.last_real = min(self.size, total - (self.batches - 1) * self.size)
        real = np.clip(self.last_real - self.entry[:-1], 0, self.take)  # of each lane's last chunk
        lengths = (self.batches - 1) * self.take + real
        self.lane_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # NOTE [ Lane groups ]: with groups of one lane, lane l's chunk c starts at
        # lane_start + c * take; else where the group's segment lays it
        self.group = group_of(self.lanes, int(np.count_nonzero(shards.sizes)))
        self._lay_groups(shards)
        self.per_window = max(1, window // self.size)
        self.block = max(1, BLOCK_WORDS // self.per_window)  # windows per keyed stream
        self._blocks: dict[tuple[int, int], np.ndarray] = {}
        self.cached_blocks = CACHED_BLOCKS  # a mixture's parts share this bound (composed_sequences.py)

    def _lay_groups(self, shards: ShardOrder) -> None:
        """Each lane's group's first lane ``lead`` (its own where groups are one lane) and,
        for groups of several lanes, where their chunks lie (NOTE [ Lane groups ])."""
        index = np.arange(self.lanes, dtype=np.int64)
        self.lead, self.layout = index, None
        if self.group > 1:  # else a lane each (the epoch's first sample waits for this: no search)
            self.lead = index - index % self.group
            self.layout = GroupLayout(shards.ends, self.lane_start, self.take, self.batches, self.group)

    def run_length(self) -> float:
        """Samples per read of one lane's chunk (G / L)."""
        return self.size / self.lanes

    def starts(self, lanes: np.ndarray, chunks: np.ndarray) -> np.ndarray:
        """The position of the first sample of chunk ``chunks`` of lane ``lanes`` (broadcast)."""
        if self.layout is None:
            return self.lane_start[lanes] + chunks * self.take[lanes]
        return self.layout.starts(lanes, chunks)

    def pieces(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """``(lane, a, b)``: entries ``[lo, hi)`` of a batch are entries ``[a, b)`` of those lanes' chunks."""
        first = int(np.searchsorted(self.entry, lo, side="right")) - 1
        found = []
        for lane in range(first, self.lanes):
            start = int(self.entry[lane])
            if start >= hi:
                break
            a, b = max(lo, start) - start, min(hi, int(self.entry[lane + 1])) - start
            if b > a:
                found.append((lane, a, b))
        return found

    def chunks(self, batches: np.ndarray, lane: int) -> np.ndarray:
        """Which chunk of ``lane`` each of ``batches`` takes (indices in the lane)."""
        return self.chunks_of(batches, np.array([lane], dtype=np.int64))

    def chunks_of(self, batches: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """Which chunk of lane ``lanes`` batch ``batches`` takes (broadcast together): one
        gather per block of windows for all the lanes, not one call per lane."""
        batches, lanes = np.broadcast_arrays(np.asarray(batches, dtype=np.int64), lanes)
        if not self.shuffle:
            return batches.copy()
        per = self.per_window
        window, within = np.divmod(batches, per)
        block = window // self.block
        out = np.empty(batches.shape, dtype=np.int64)
        for number in np.unique(block).tolist():
            mine = block == number
            used, slot = np.unique(lanes[mine], return_inverse=True)
            rows = np.stack([self._block(lane, number) for lane in used.tolist()])
            out[mine] = window[mine] * per + rows[slot, window[mine] - number * self.block, within[mine]]
        return out

    def _block(self, lane: int, number: int) -> np.ndarray:
        """The chunk permutations of the windows of one block of a lane, one row each."""
        if (lane, number) not in self._blocks:
            self._fill([lane], number)
        return self._blocks[(lane, number)]

    def _prefill(self, batches: np.ndarray, lanes: list[int]) -> None:
        """Make the blocks that ``chunks(batches, lane)`` needs for each of ``lanes`` at once."""
        if self.shuffle and batches.size:
            for number in np.unique(batches // self.per_window // self.block).tolist():
                self._fill(lanes, number)

    def _fill(self, lanes: list[int], number: int) -> None:
        """The blocks ``number`` of ``lanes`` (those not cached, as many as the cache holds):
        each lane's keyed words, in one nested order for ``_FILL_WORDS`` words of them at once."""
        missing = [lane for lane in dict.fromkeys(lanes) if (lane, number) not in self._blocks]
        missing = missing[: self.cached_blocks]
        per, first = self.per_window, number * self.block
        windows = min(self.block, -(-self.batches // per) - first)
        step = max(1, _FILL_WORDS // (windows * per))
        for at in range(0, len(missing), step):
            some = missing[at : at + step]
            for lane, block in zip(some, self._made(some, number, windows), strict=True):
                if len(self._blocks) >= self.cached_blocks:
                    self._blocks.pop(next(iter(self._blocks)))
                self._blocks[(lane, number)] = block

    def _made(self, lanes: list[int], number: int, windows: int) -> np.ndarray:
        """The chunk permutations of block ``number`` of ``lanes``: ``(lanes, windows, per)``."""
        per, first = self.per_window, number * self.block

        def words_of(lane: int) -> np.ndarray:
            return random_words(windows * per, (self.seed, self.epoch, TAG_GLOBAL, lane, number))

        words = np.stack([words_of(lane) for lane in lanes]).reshape(len(lanes), windows, per)
        shared, levels = words, 0
        if self.group > 1:  # NOTE [ Lane groups ]: the top levels are the group's first lane's
            leads = self.lead[lanes].tolist()
            made = {lane: words[k] for k, lane in enumerate(lanes)}
            made.update({lead: words_of(lead).reshape(windows, per) for lead in set(leads) - made.keys()})
            shared, levels = np.stack([made[lead] for lead in leads]), GROUP_LEVELS
        rows = nested_permutations(words.reshape(-1, per), shared.reshape(-1, per), levels)
        rows = rows.reshape(words.shape)
        last = self.batches - (first + windows - 1) * per  # the epoch's last window may be short
        moving = last - (self.last_real < self.size)  # a padded last batch keeps the last chunk
        if moving < per:  # the same words, a nested order of the moving chunks only
            rows[:, -1, :moving] = nested_permutations(words[:, -1, :moving], shared[:, -1, :moving], levels)
            rows[:, -1, moving:last] = np.arange(moving, last)
        return rows

    def positions(self, batches: np.ndarray, pieces: list[tuple[int, int, int]]) -> np.ndarray:
        """Base positions of ``pieces`` of ``batches`` (ascending), in yield order."""
        if not batches.size or not pieces:
            return np.zeros(0, dtype=np.int64)
        lanes = np.array([lane for lane, _, _ in pieces], dtype=np.int64)
        a = np.array([a for _, a, _ in pieces], dtype=np.int64)
        width = np.array([b - a for _, a, b in pieces], dtype=np.int64)
        first = self.entry[lanes] + a  # the batch entry of each piece's first sample
        self._prefill(batches, lanes.tolist())
        chunk = self.chunks_of(batches[:, None], lanes[None, :])
        start = self.starts(lanes, chunk) + a
        real = np.repeat(width[None, :], batches.size, axis=0)
        if batches[-1] == self.batches - 1:  # the last batch: its entries from last_real on repeat
            real[-1] = np.clip(self.last_real - first, 0, width)
        repeat = self.shards.total + first + real - self.last_real  # empty but in the last batch
        # batches outer, lanes inner: the yield order of a rank's part of each batch
        spans = (
            np.stack([start, repeat], axis=2).ravel(),
            np.stack([start + real, repeat + width - real], axis=2).ravel(),
        )
        padded = points(spans)
        beyond = padded >= self.shards.total  # the last batch's repeats
        if beyond.any():
            padded[beyond] = self.entries(padded[beyond] - self.shards.total)
        return padded

    def entries(self, flat: np.ndarray) -> np.ndarray:
        """The positions of entries ``flat`` (taken modulo ``N``) of the epoch's sequence, entry
        ``e`` being entry ``e % G`` of batch ``e // G``: what the last batch's repeats are."""
        batch, entry = np.divmod(flat % self.shards.total, self.size)
        lane = np.searchsorted(self.entry, entry, side="right") - 1
        self._prefill(batch, np.unique(lane).tolist())
        return self.starts(lane, self.chunks_of(batch, lane)) + entry - self.entry[lane]

    def window_shards(self, lo: int, hi: int, pieces: list[tuple[int, int, int]]) -> tuple[int, ...]:
        """The shards the lanes of ``pieces`` hold in the windows of batches ``[lo, hi)``:
        every shard a worker reading some of those batches may read."""
        per, real = self.per_window, self.last_real
        first, stop = lo // per * per, min(-(-hi // per) * per, self.batches)
        lanes = np.array([lane for lane, _, _ in pieces], dtype=np.int64)
        if self.layout is None:  # each lane's chunks [first, stop)
            start, end = self.lane_start[lanes], self.lane_start[lanes + 1]
            spans = (start + first * self.take[lanes], np.minimum(start + stop * self.take[lanes], end))
        else:  # every lane's chunks [first, stop) of each segment of the groups (NOTE [ Lane groups ])
            spans = self.layout.spans(self.layout.segments_of(lanes), first, stop)
        repeats: list[np.ndarray] = []
        for lane, a, b in pieces:
            entry = int(self.entry[lane])
            if stop == self.batches and entry + b > real:  # the last batch's repeats (at most G)
                repeats.append(np.arange(max(entry + a, real) - real, entry + b - real))
        # the groups' shards in one call, in group order (not one per group)
        found = dict.fromkeys(self.shards.shards_in(spans))
        if repeats:  # in one call: its chunk orders are made for all their lanes at once
            for run in self.shards.runs(from_points(np.unique(self.entries(np.concatenate(repeats))))):
                found[run.shard] = None
        return tuple(found)


def window_parts(
    sequence: GlobalSequence, batches: np.ndarray, pieces: list[tuple[int, int, int]]
) -> tuple[tuple[Run, ...], np.ndarray]:
    """The runs (ascending positions) and yield order of a worker's batches of one window."""
    positions = sequence.positions(batches, pieces)
    ascending = np.argsort(positions, kind="stable")
    runs = sequence.shards.runs(from_points(positions[ascending]))
    order = np.empty(positions.size, dtype=np.int64)
    order[ascending] = np.arange(positions.size, dtype=np.int64)
    order.setflags(write=False)
    return runs, order
