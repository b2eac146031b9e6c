"""NOTE [ Nested chunk order ]: the batches one DataLoader worker takes of a window of
order="global" take one contiguous range of each lane's chunks, for every power-of-two
worker count, so two workers do not read (and check) the same bytes; states of the
sequence before it are refused; on object storage a worker's close parts of a lane share
a read (NOTE [ Coalescing gap ])."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.dataset.reader import WindowReader
from shardstream.errors import StateError
from shardstream.pack import ShardWriter
from shardstream.plan import EpochPlan, PlanConfig, Run
from shardstream.plan.global_order import GlobalSequence
from shardstream.plan.kinds import MixturePlan
from shardstream.plan.mixture import Mixture, StreamSpec
from shardstream.plan.randomness import nested_permutations, random_words

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def contiguous(values: np.ndarray) -> bool:
    return values.size == 0 or int(values.max() - values.min()) + 1 == values.size


@PROPERTY
@given(st.integers(1, 300), st.integers(0, 2**40), st.integers(1, 3))
def test_nested_permutations_keep_every_residue_class_together(n, seed, rows):
    made = nested_permutations(random_words(rows * n, (seed,)).reshape(rows, n))
    assert np.array_equal(made, nested_permutations(random_words(rows * n, (seed,)).reshape(rows, n)))
    for row in made:
        assert sorted(row.tolist()) == list(range(n))
        for workers in (2, 4, 8, 16):
            for first in range(min(workers, n)):
                assert contiguous(row[first::workers])


def test_nested_permutations_differ_by_key():
    rows = {tuple(nested_permutations(random_words(64, (seed,))[None, :])[0]) for seed in range(20)}
    assert len(rows) == 20


@st.composite
def windows_and_workers(draw):
    size = draw(st.integers(1, 24))
    config = PlanConfig(
        seed=draw(st.integers(0, 2**40)),
        drop_last=draw(st.booleans()),
        shuffle_window=draw(st.integers(1, 400)),
        order="global",
        global_batch_size=size,
        read_lanes=draw(st.one_of(st.none(), st.integers(1, 9))),
    )
    sizes = draw(st.lists(st.integers(0, 60), min_size=1, max_size=12))
    assume(not 0 < sum(sizes) < size)  # a batch larger than the epoch is refused
    return sizes, config, draw(st.sampled_from([1, 2, 4, 8]))


@PROPERTY
@given(windows_and_workers(), st.data())
def test_a_workers_chunks_of_a_lane_in_a_window_are_contiguous(drawn, data):
    sizes, config, workers = drawn
    size = config.global_batch_size
    plan = EpochPlan(sizes, config, epoch=0, world_size=1, num_workers=workers, batch_size=size)
    sequence = plan.sequence
    # a resumed epoch counts workers from the batches taken (of a window begun, a worker
    # takes the rest of its range)
    taken = data.draw(st.integers(0, sequence.batches))
    padded = sequence.last_real < sequence.size  # its last batch keeps the last chunk (in place)
    for first in range(0, sequence.batches, sequence.per_window):
        batches = np.arange(first, min(first + sequence.per_window, sequence.batches - padded))
        for worker in range(workers):
            mine = batches[(batches - taken) % workers == worker]
            for lane in range(sequence.lanes):
                assert contiguous(sequence.chunks(mine, lane))


@st.composite
def grouped_layouts(draw):
    # few shards, many lanes: lanes share groups (NOTE [ Lane groups ])
    size = draw(st.integers(8, 48))
    config = PlanConfig(
        seed=draw(st.integers(0, 2**40)),
        drop_last=draw(st.booleans()),
        shuffle_window=draw(st.integers(1, 600)),
        order="global",
        global_batch_size=size,
        read_lanes=draw(st.one_of(st.none(), st.integers(4, size))),
    )
    sizes = draw(st.lists(st.integers(0, 200), min_size=1, max_size=4))
    assume(not 0 < sum(sizes) < size)  # a batch larger than the epoch is refused
    return sizes, config, draw(st.sampled_from([1, 2, 4, 8]))


@PROPERTY
@given(grouped_layouts(), st.data())
def test_a_workers_part_of_a_lane_group_in_a_window_is_one_range_per_shard(drawn, data):
    sizes, config, workers = drawn
    size = config.global_batch_size
    plan = EpochPlan(sizes, config, epoch=0, world_size=1, num_workers=workers, batch_size=size)
    sequence = plan.sequence
    if not sequence.batches:
        return
    taken = data.draw(st.integers(0, sequence.batches))
    padded = sequence.last_real < sequence.size  # its last batch's repeats are other batches' samples
    for first in range(0, sequence.batches, sequence.per_window):
        batches = np.arange(first, min(first + sequence.per_window, sequence.batches - padded))
        for worker in range(workers):
            mine = batches[(batches - taken) % workers == worker]
            for lead in np.unique(sequence.lead).tolist():
                lanes = np.flatnonzero(sequence.lead == lead)
                assert lanes.size <= sequence.group
                assert lanes[0] == lead
                assert contiguous(lanes)
                pieces = [(lane, 0, int(sequence.take[lane])) for lane in lanes.tolist()]
                positions = sequence.positions(mine, pieces)
                assert np.unique(positions).size == positions.size
                if sequence.layout is None:  # a lane each: its chunks of a window are one range
                    assert contiguous(positions)
                    continue
                # one range per segment of the group: its part of a shard (NOTE [ Lane groups ])
                segment = np.searchsorted(sequence.layout.start, positions, side="right")
                for number in np.unique(segment).tolist():
                    assert contiguous(positions[segment == number])
                assert np.unique(segment).size <= sequence.layout.segments_of(lanes).size


@PROPERTY
@given(grouped_layouts())
def test_chunks_tile_the_positions_each_in_the_shard_of_its_place_end_to_end(drawn):
    # NOTE [ Lane groups ]: a chunk lies in the shard that its first sample's place in the
    # lanes laid end to end is in, but for a segment's last samples (fewer than a chunk)
    # past that shard's end
    sizes, config, _ = drawn
    sequence = EpochPlan(sizes, config, epoch=0, world_size=1, batch_size=config.global_batch_size).sequence
    if sequence.layout is None or not sequence.batches:
        return
    lanes = np.arange(sequence.lanes)[:, None]
    chunks = np.arange(sequence.batches)[None, :]
    nominal = sequence.lane_start[lanes] + chunks * sequence.take[lanes]
    real = nominal < sequence.lane_start[lanes + 1]  # a last chunk may have no real entries
    placed = sequence.starts(lanes, chunks)
    # the chunks tile the positions, one after another
    length = sequence.lane_start[lanes + 1] - sequence.lane_start[lanes]
    size = np.minimum((chunks + 1) * sequence.take[lanes], length) - np.minimum(
        chunks * sequence.take[lanes], length
    )
    order = np.argsort(placed[size > 0], kind="stable")
    begin, width = placed[size > 0][order], size[size > 0][order]
    assert begin[0] == 0
    assert np.array_equal(begin[1:], (begin + width)[:-1])
    assert begin[-1] + width[-1] == sequence.lane_start[-1]
    ends = sequence.shards.ends
    shard = np.searchsorted(ends, nominal[real], side="right")
    spill = placed[real] - ends[np.minimum(shard, ends.size - 1)]
    inside = np.searchsorted(ends, placed[real], side="right") == shard
    assert np.all(inside | ((spill >= 0) & (spill < sequence.take.max())))


def test_lanes_of_a_shard_are_grouped_and_read_together(tmp_path):
    # 2 shards of 2000 samples of ~1 KiB, 64 lanes: groups of 8 lanes. With runs 64 KiB apart
    # sharing a read, each of 2 workers reads about half of the bytes, with check blocks 0.6
    # (a worker's part of a group is ~250 KiB; sequence 2 laid each lane's ~31 KiB parts
    # apart, the other worker's between them: 0.98 of the bytes, with check blocks all), and
    # without coalescing one read per group and window (sequence 2: 55 reads, one per lane)
    url = str(tmp_path / "data")
    with ShardWriter(url, samples_per_shard=2000, format="tar") as writer:
        for i in range(4000):
            writer.write(small_sample(i))
    dataset = shardstream.StreamingDataset(url, decode=False)
    total = sum(shard.bytes for shard in dataset.manifest.shards)
    config = PlanConfig(seed=5, order="global", global_batch_size=64, shuffle_window=4096)
    plan = EpochPlan(
        dataset.manifest.shard_sizes, config, epoch=0, world_size=1, num_workers=2, batch_size=64
    )
    assert (plan.sequence.lanes, plan.sequence.group, plan.sequence.batches) == (64, 8, 63)
    assert plan.sequence.per_window == 64  # one window: each worker's one Window
    for gap, verify, most in ((64 * 1024, False, 0.55), (64 * 1024, True, 0.65), (0, False, 0.55)):
        reader = WindowReader(dataset.storage, dataset.manifest, coalesce_gap=gap, verify_checksums=verify)
        try:
            for worker in range(2):
                read = reads = 0
                for window in plan.worker_windows(0, worker):
                    planned = reader.plan_fetch(window.runs, reader.load_indexes(list(window.shards)))
                    read, reads = read + planned.bytes, reads + len(planned.reads)
                assert read < most * total
                assert reads <= 10  # 8 groups and a lane across the 2 shards (in 2 reads)
        finally:
            reader.close()


def one_window_of_two_workers(tmp_path, shards: int, per_shard: int) -> tuple[GlobalSequence, list, int]:
    """``(sequence, each worker's planned reads, the shards' bytes)`` of ``shards`` tar
    shards of ``per_shard`` small samples, a global batch of 64 and one window, 2 workers,
    reads neither joined nor widened to check blocks."""
    url = str(tmp_path / "data")
    with ShardWriter(url, samples_per_shard=per_shard, format="tar") as writer:
        for i in range(shards * per_shard):
            writer.write(small_sample(i))
    dataset = shardstream.StreamingDataset(url, decode=False)
    config = PlanConfig(seed=5, order="global", global_batch_size=64, shuffle_window=shards * per_shard)
    plan = EpochPlan(
        dataset.manifest.shard_sizes, config, epoch=0, world_size=1, num_workers=2, batch_size=64
    )
    reader = WindowReader(dataset.storage, dataset.manifest, coalesce_gap=0, verify_checksums=False)
    try:
        planned = []
        for worker in range(2):
            (window,) = plan.worker_windows(0, worker)
            planned.append(reader.plan_fetch(window.runs, reader.load_indexes(list(window.shards))))
    finally:
        reader.close()
    return plan.sequence, planned, sum(shard.bytes for shard in dataset.manifest.shards)


def test_a_lane_across_a_shard_edge_is_read_with_the_groups_on_both_sides(tmp_path):
    # 3 shards of 1536 samples, 64 lanes of 72 samples: groups of 8 lanes span 576 samples,
    # so each of the 2 shard edges cuts a group in the middle of one of its lanes. Each side
    # of the edge is one segment of that group, with the lane's chunks on that side (NOTE
    # [ Lane groups ]): a worker of 2 reads at most one range per segment, 8 groups and 2
    # edges (8 here: two parts of neighbouring groups touch). Sequence 3 made that lane a
    # group of its own, in 2 pieces, and cut its group in two around it: 10 and 12 reads.
    sequence, planned, total = one_window_of_two_workers(tmp_path, 3, 1536)
    assert (sequence.lanes, sequence.group, sequence.batches, sequence.per_window) == (64, 8, 72, 72)
    assert sequence.layout.start.size - 1 == 10  # segments
    for worker in planned:
        assert len(worker.reads) <= 10
        assert worker.bytes < 0.55 * total


def test_lanes_are_grouped_by_8_where_a_shard_holds_fewer(tmp_path):
    # 20 shards of 160 samples, 64 lanes of 50: 3.2 lanes a shard. Groups of 8 lanes,
    # cut at the 16 shard edges inside them: 24 segments, a read each for a worker of 2.
    # Groups that had to fit in a shard (at most the lanes per shard, 2) made 48 segments
    # and 39 and 36 reads (NOTE [ Lane groups ]).
    sequence, planned, _ = one_window_of_two_workers(tmp_path, 20, 160)
    assert (sequence.lanes, sequence.group, sequence.per_window) == (64, 8, 50)
    assert sequence.layout.start.size - 1 == 24  # segments
    assert all(len(worker.reads) <= 24 for worker in planned)


def small_sample(i: int) -> dict:
    return {"__key__": f"{i:07d}", "txt": b"lorem ipsum %d " % i * 8}


def test_two_workers_read_about_half_the_bytes_each(tmp_path):
    # 2 workers of order="global" read a batch's chunks of 8 samples (8 KiB) each: with a
    # keyed permutation each worker's chunks lay among the other's (closer than a read's
    # coalescing gap and a check block) and each read all the bytes of every lane; one
    # window, so a worker's chunks of a lane are one range of 500 samples (~500 KiB)
    url = str(tmp_path / "data")
    with ShardWriter(url, samples_per_shard=500, format="tar") as writer:
        for i in range(4000):
            writer.write(small_sample(i))
    dataset = shardstream.StreamingDataset(url, decode=False)
    total = sum(shard.bytes for shard in dataset.manifest.shards)
    config = PlanConfig(seed=3, order="global", global_batch_size=32, read_lanes=4, shuffle_window=4000)
    plan = EpochPlan(
        dataset.manifest.shard_sizes, config, epoch=0, world_size=1, num_workers=2, batch_size=32
    )
    reader = WindowReader(dataset.storage, dataset.manifest)
    try:
        for worker in range(2):
            read = 0
            for window in plan.worker_windows(0, worker):
                read += reader.plan_fetch(window.runs, reader.load_indexes(list(window.shards))).bytes
            assert read < 0.6 * total
    finally:
        reader.close()


def test_a_state_of_the_earlier_global_sequence_is_refused():
    sizes = [40] * 10
    config = PlanConfig(seed=1, order="global", global_batch_size=8)
    state = EpochPlan(sizes, config, epoch=0, world_size=2, num_workers=2, batch_size=4).state_dict(3)
    assert state["global_sequence"] == 4
    EpochPlan.resume(sizes, config, state, world_size=1, batch_size=8)
    earlier = {key: value for key, value in state.items() if key != "global_sequence"}
    with pytest.raises(StateError, match="order='global' sequence 1, this shardstream makes sequence 4"):
        EpochPlan.resume(sizes, config, earlier, world_size=1, batch_size=8)
    # sequence 2 laid each lane's chunks on its own, 3 a lane across a shard edge on its
    # own (NOTE [ Lane groups ])
    for older in (2, 3):
        with pytest.raises(
            StateError, match=f"order='global' sequence {older}, this shardstream makes sequence 4"
        ):
            EpochPlan.resume(sizes, config, {**state, "global_sequence": older}, world_size=1, batch_size=8)
    with pytest.raises(StateError, match="sequence 5"):
        EpochPlan.resume(sizes, config, {**state, "global_sequence": 5}, world_size=1, batch_size=8)


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize(("apart", "reads"), [(130, 2), (60, 1)])
def test_runs_share_a_read_within_a_quarter_mebibyte(tmp_path, where, apart, reads):
    # NOTE [ Coalescing gap ]: ~540 KiB between two runs of a shard is a second request,
    # on object storage as on local files (its bytes cost more than the request); ~200
    # KiB is read with them
    url = str(tmp_path / "data") if where == "local" else f"memory://gap-{tmp_path.name}"
    with ShardWriter(url, samples_per_shard=1000, format="tar") as writer:
        for i in range(200):
            writer.write({"__key__": f"{i:05d}", "bin": bytes([i % 256]) * 4000})
    dataset = shardstream.StreamingDataset(url, decode=False)
    reader = WindowReader(dataset.storage, dataset.manifest)
    try:
        planned = reader.plan_fetch([Run(0, 0, 10), Run(0, apart, apart + 10)], reader.load_indexes([0]))
        assert len(planned.reads) == reads
    finally:
        reader.close()


@pytest.mark.parametrize("mix", ["stratified", "per_stream"])
def test_a_composed_mixtures_state_of_the_earlier_sequence_is_refused(mix):
    # its parts are GlobalSequences: their chunks changed order too
    specs = [StreamSpec("s3://a", [9, 4], "fa"), StreamSpec("s3://b", [5, 6], "fb", repeat=2)]
    config = PlanConfig(seed=1, order="global", global_batch_size=6)
    mixture = Mixture(specs, mix=mix)
    state = MixturePlan(mixture, config, epoch=0, world_size=1, batch_size=6).state_dict(2)
    MixturePlan.resume(mixture, config, state, world_size=2, batch_size=3)
    earlier = {key: value for key, value in state.items() if key != "global_sequence"}
    with pytest.raises(StateError, match="order='global' sequence 1"):
        MixturePlan.resume(mixture, config, earlier, world_size=2, batch_size=3)


@PROPERTY
@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=12),
    st.integers(1, 64),
    st.integers(1, 400),
    st.integers(0, 2**20),
)
def test_chunks_of_many_lanes_at_once_are_each_lanes_chunks(sizes, size, window, seed):
    """``chunks_of`` (one gather for all the lanes of a window) gives ``chunks`` of each lane."""
    from shardstream.plan.global_order import GlobalSequence
    from shardstream.plan.shards import ShardOrder

    if sum(sizes) == 0:
        return
    assume(size <= sum(sizes))  # a larger batch is refused
    config = PlanConfig(seed=seed, order="global", global_batch_size=size)
    shards = ShardOrder(np.array(sizes, dtype=np.int64), shuffle=True, seed=seed, epoch=1)
    sequence = GlobalSequence(shards, config, epoch=1, window=window)
    batches = np.arange(0, sequence.batches, 3, dtype=np.int64)
    lanes = np.arange(sequence.lanes, dtype=np.int64)[::-1]
    table = sequence.chunks_of(batches[:, None], lanes[None, :])
    for column, lane in enumerate(lanes.tolist()):
        assert np.array_equal(table[:, column], sequence.chunks(batches, lane))
    picked = np.resize(lanes, batches.size)  # one lane per batch
    assert np.array_equal(
        sequence.chunks_of(batches, picked),
        [
            int(sequence.chunks(np.array([b]), lane)[0])
            for b, lane in zip(batches, picked.tolist(), strict=True)
        ],
    )


@PROPERTY
@given(st.lists(st.integers(0, 30), min_size=1, max_size=10), st.data())
def test_shards_in_are_the_shards_of_the_runs_interval_by_interval(sizes, data):
    """``ShardOrder.shards_in``: the shards each interval's runs read, in the order given."""
    from shardstream.plan.shards import ShardOrder

    shards = ShardOrder(np.array(sizes, dtype=np.int64), shuffle=True, seed=3, epoch=0)
    if shards.total == 0:
        return
    cuts = data.draw(
        st.lists(st.tuples(st.integers(0, shards.total), st.integers(0, shards.total)), max_size=6)
    )
    starts = np.array([min(a, b) for a, b in cuts], dtype=np.int64)
    stops = np.array([max(a, b) for a, b in cuts], dtype=np.int64)
    expected = [
        run.shard
        for lo, hi in zip(starts.tolist(), stops.tolist(), strict=True)
        for run in shards.runs((np.array([lo]), np.array([hi])))
    ]
    assert shards.shards_in((starts, stops)) == expected
