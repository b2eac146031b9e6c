"""mix="stratified" and mix="per_stream" (NOTE [ Composed batches ]): the same global
batches on every topology, each stream exactly its rounded quota, stratified shares and
per-stream batches, no repeat within a stream before all of it was seen, exact resume on
another topology (twice), nothing O(batches), and clear refusals."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError, StateError
from shardstream.plan import PlanConfig, Shape
from shardstream.plan.composed import ComposedPlan
from shardstream.plan.composed_sequences import PerStreamSequence, StratifiedSequence
from shardstream.plan.kinds import MixturePlan
from shardstream.plan.mixture import Mixture, StreamSpec
from shardstream.plan.spread import affine, golden_step

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMPOSED = ("stratified", "per_stream")


@st.composite
def mixtures(draw):
    specs = []
    for number in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(st.integers(0, 25), min_size=1, max_size=5).filter(lambda s: sum(s) > 0))
        sizing = draw(st.sampled_from([{}, {"repeat": 0.5}, {"repeat": 2.5}, {"choose": 7}, {"choose": 61}]))
        if round(sizing.get("repeat", 1) * sum(sizes)) == 0:
            sizing = {}
        specs.append(StreamSpec(f"s3://b/s{number}", sizes, f"fp{number}", **sizing))
    return Mixture(specs, mix=draw(st.sampled_from(COMPOSED)))


@st.composite
def configs(draw):
    return PlanConfig(
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**64 - 1)),
        drop_last=draw(st.booleans()),
        shuffle_window=draw(st.one_of(st.none(), st.integers(1, 80))),
        order="global",
        global_batch_size=draw(st.integers(1, 16)),
        read_lanes=draw(st.one_of(st.none(), st.integers(1, 5))),
    )


def topologies(data, size):
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    return data.draw(st.sampled_from(divisors)), data.draw(st.integers(1, 4))


def plan_of(mixture, config, world, workers, *, epoch=0, state=None):
    topology = dict(world_size=world, num_workers=workers, batch_size=config.global_batch_size // world)
    if state is None:
        return MixturePlan(mixture, config, epoch=epoch, **topology)
    return MixturePlan.resume(mixture, config, state, **topology)


def global_batches(plan) -> list[list[tuple[int, int]]]:
    """Global batch k: rank r's k-th DataLoader batch, for r in order."""
    size = plan.batch_size
    ranks = [list(plan.rank_samples(r)) for r in range(plan.world_size)]
    assert {len(r) for r in ranks} == {plan.batches_per_rank() * size}
    return [
        [s for rank in ranks for s in rank[k * size : (k + 1) * size]] for k in range(plan.batches_per_rank())
    ]


def stream_epoch(mixture, stream, epoch, config, quota) -> collections.Counter:
    """The samples stream ``stream`` is due in ``epoch`` at ``quota`` (mixture shard numbers)."""
    segments = mixture.segments(stream, epoch, seed=config.seed, shuffle=config.shuffle, quota=quota)
    due: collections.Counter = collections.Counter()
    for shard, start, stop in zip(
        segments.shard.tolist(), segments.start.tolist(), segments.stop.tolist(), strict=True
    ):
        due.update((shard, i) for i in range(start, stop))
    return due


def by_stream(mixture, samples) -> list[collections.Counter]:
    found: list[collections.Counter] = [collections.Counter() for _ in mixture.streams]
    for shard, index in samples:
        found[mixture.stream_of(shard)][(shard, index)] += 1
    return found


@PROPERTY
@given(mixtures(), configs(), st.integers(0, 3), st.data())
def test_same_global_batches_on_any_topology_each_stream_its_quota(mixture, config, epoch, data):
    assume(not 0 < mixture.total < config.global_batch_size)  # a batch larger than the epoch is refused
    size = config.global_batch_size
    one = plan_of(mixture, config, *topologies(data, size), epoch=epoch)
    batches = global_batches(one)
    assert global_batches(plan_of(mixture, config, *topologies(data, size), epoch=epoch)) == batches
    quotas = one.quotas
    count = mixture.total // size if config.drop_last else -(-mixture.total // size)
    assert len(batches) == count
    assert all(len(batch) == size for batch in batches)
    assert sum(quotas) == count * size
    got = by_stream(mixture, (s for batch in batches for s in batch))
    for stream, quota in enumerate(quotas):
        assert got[stream] == stream_epoch(mixture, stream, epoch, config, quota)
    for batch in batches:
        shares = [sum(c.values()) for c in by_stream(mixture, batch)]
        if mixture.mix == "stratified":  # each stream within one sample of its share
            assert all(q // count <= n <= -(-q // count) for n, q in zip(shares, quotas, strict=True))
        else:  # one stream per batch
            assert sorted(shares)[-1] == size
    if mixture.mix == "per_stream":
        owners = collections.Counter(mixture.stream_of(batch[0][0]) for batch in batches)
        assert [owners[s] * size for s in range(len(quotas))] == list(quotas)


@PROPERTY
@given(mixtures(), configs(), st.data())
def test_resume_on_another_topology_twice_equals_the_run(mixture, config, data):
    assume(not 0 < mixture.total < config.global_batch_size)  # a batch larger than the epoch is refused
    size = config.global_batch_size
    whole = global_batches(plan_of(mixture, config, *topologies(data, size), epoch=2))
    plan, done = plan_of(mixture, config, *topologies(data, size), epoch=2), 0
    for _ in range(2):
        steps = data.draw(st.integers(0, len(whole) - done))
        state = plan.state_dict(steps)
        assert state["mix"] == mixture.mix
        assert state["global_batches"] == done + steps
        plan, done = plan_of(mixture, config, *topologies(data, size), state=state), done + steps
        assert isinstance(plan, ComposedPlan)
        assert global_batches(plan) == whole[done:]


@PROPERTY
@given(mixtures(), configs(), st.data())
def test_worker_windows_read_what_the_ranks_yield(mixture, config, data):
    assume(not 0 < mixture.total < config.global_batch_size)  # a batch larger than the epoch is refused
    plan = plan_of(mixture, config, *topologies(data, config.global_batch_size))
    read: collections.Counter = collections.Counter()
    for rank in range(plan.world_size):
        for worker in range(plan.num_workers):
            for window in plan.worker_windows(rank, worker):
                shards = set(window.shards)
                for run in window.runs:
                    assert run.shard in shards  # a window reads only the shards it names
                    read.update((run.shard, i) for i in range(run.start, run.stop))
    assert read == collections.Counter(s for r in range(plan.world_size) for s in plan.rank_samples(r))


@pytest.mark.parametrize("mix", COMPOSED)
@pytest.mark.parametrize("sizing", [{"choose": 23}, {"repeat": 2.5}, {"repeat": 0.3}])
def test_within_a_stream_no_sample_repeats_before_all_were_seen(mix, sizing):
    specs = [StreamSpec("a", [9, 4, 13, 6], **sizing), StreamSpec("b", [20, 20, 11], choose=40)]
    mixture = Mixture(specs, mix=mix)
    config = PlanConfig(seed=4, order="global", global_batch_size=8, read_lanes=3)
    seen: list[collections.Counter] = [collections.Counter() for _ in specs]
    every = [
        {
            (int(mixture.shard_offsets[s]) + shard, i)
            for shard, n in enumerate(spec.sizes.tolist())
            for i in range(n)
        }
        for s, spec in enumerate(specs)
    ]
    subsets = []
    for epoch in range(7):
        batches = global_batches(plan_of(mixture, config, 2, 3, epoch=epoch))
        got = by_stream(mixture, (s for batch in batches for s in batch))
        subsets.append(frozenset(got[0].items()))
        for stream in range(len(specs)):
            seen[stream].update(got[stream])
            counts = [seen[stream][sample] for sample in every[stream]]
            assert max(counts) - min(counts) <= 1  # a pass is done before the next one starts
    assert len(set(subsets)) > 1  # another subset (or other samples twice) in another epoch


@given(mixtures(), configs(), st.integers(0, 4), st.data())
@PROPERTY
def test_before_counts_what_place_lays_out(mixture, config, epoch, data):
    assume(config.global_batch_size <= mixture.total)  # a larger batch is refused
    kind = StratifiedSequence if mixture.mix == "stratified" else PerStreamSequence
    sequence = kind(mixture, config, epoch=epoch, window=config.window_for(mixture.sizes))
    whole = sequence.place(0, sequence.batches)
    owners = np.zeros(sequence.batches, dtype=np.int64)
    for part, (batches, numbers, offsets) in zip(sequence.parts, whole, strict=True):
        assert numbers.tolist() == list(range(part.sequence.batches))  # each of its batches once, in order
        np.add.at(owners, batches, part.size)
        assert ((offsets >= part.low) & (offsets + part.size <= part.high)).all()
    assert (owners == sequence.size).all()  # every batch full
    lo = data.draw(st.integers(0, sequence.batches))
    hi = data.draw(st.integers(lo, sequence.batches))
    assert sequence.before(lo) == [int((batches < lo).sum()) for batches, _, _ in whole]
    for (batches, numbers, offsets), (all_batches, all_numbers, all_offsets) in zip(
        sequence.place(lo, hi), whole, strict=True
    ):
        inside = (all_batches >= lo) & (all_batches < hi)
        assert batches.tolist() == all_batches[inside].tolist()
        assert numbers.tolist() == all_numbers[inside].tolist()
        assert offsets.tolist() == all_offsets[inside].tolist()


@pytest.mark.parametrize("batches", [2, 7, 64, 198, 377, 1000, 4096])
def test_extras_spread_evenly_over_the_epoch(batches):
    # stream s's extras: the batches whose pi(k) is in a cyclic interval; every prefix of
    # the epoch holds its share to within a few (an identity pi would put them in one run)
    alpha = pow(golden_step(batches), -1, batches)
    places = affine(alpha, 5 % batches, batches, batches)
    ideal = np.arange(1, batches + 1) / batches
    for start in range(0, batches, max(1, batches // 5)):
        for extras in range(1, batches, max(1, batches // 7)):
            held = (places - start) % batches < extras
            assert held.sum() == extras
            assert np.abs(np.cumsum(held) - extras * ideal).max() < 4


def test_per_stream_batches_interleave_evenly():
    specs = [StreamSpec("a", [1000], choose=6400), StreamSpec("b", [500], choose=1600), StreamSpec("c", [90])]
    mixture = Mixture(specs, mix="per_stream")
    config = PlanConfig(seed=9, order="global", global_batch_size=16)
    sequence = PerStreamSequence(mixture, config, epoch=1, window=64)
    owner = np.zeros(sequence.batches, dtype=np.int64)
    for stream, (batches, _, _) in enumerate(sequence.place(0, sequence.batches)):
        owner[batches] = stream
    for stream, count in enumerate(sequence.counts):
        prefix = np.cumsum(owner == stream)
        assert np.abs(prefix - np.arange(1, sequence.batches + 1) * count / sequence.batches).max() < 2


@pytest.mark.parametrize("mix", COMPOSED)
def test_a_long_epoch_plans_without_anything_per_batch(mix):
    # 3 x 10^9 samples in batches of 64: ~5 x 10^7 global batches; an O(batches) plan
    # would hold gigabytes here
    specs = [
        StreamSpec("a", [10**7] * 200),
        StreamSpec("b", [10**6] * 500, repeat=1.5),
        StreamSpec("c", [999] * 7),
    ]
    mixture = Mixture(specs, mix=mix)
    config = PlanConfig(seed=1, order="global", global_batch_size=64, shuffle_window=4096)
    plan = plan_of(mixture, config, 8, 4, epoch=5)
    state = plan.state_dict(plan.batches_per_rank() // 2 + 3)
    resumed = plan_of(mixture, config, 4, 2, state=state)
    head = next(iter(resumed.worker_windows(3, 1)))
    assert len(head) > 0
    assert sum(resumed.quotas) == plan.batches_per_rank() * 64


def test_unshuffled_is_the_same_for_every_seed():
    specs = [StreamSpec("a", [5, 7]), StreamSpec("b", [3, 3, 3], repeat=2)]
    for mix in COMPOSED:
        mixture = Mixture(specs, mix=mix)
        runs = [
            global_batches(
                plan_of(
                    mixture, PlanConfig(shuffle=False, seed=seed, order="global", global_batch_size=6), 2, 2
                )
            )
            for seed in (0, 7)
        ]
        assert runs[0] == runs[1]


def test_refusals_say_why():
    specs = [StreamSpec("s3://a", [9, 4], "fa"), StreamSpec("s3://b", [5, 6], "fb", repeat=2)]
    config = PlanConfig(seed=1, order="global", global_batch_size=6)
    stratified = Mixture(specs, mix="stratified")
    state = plan_of(stratified, config, 2, 1).state_dict(2)
    with pytest.raises(StateError, match="mix='stratified', this mixture has mix='per_stream'"):
        plan_of(Mixture(specs, mix="per_stream"), config, 1, 1, state=state)
    other = Mixture([specs[0], StreamSpec("s3://b", [5, 6], "fb", repeat=3)], mix="stratified")
    with pytest.raises(StateError, match=r"stream 1 \(s3://b\) was saved with quota=22"):
        plan_of(other, config, 1, 1, state=state)
    with pytest.raises(StateError, match="global_batch_size"):
        plan_of(stratified, PlanConfig(seed=1, order="global", global_batch_size=3), 1, 1, state=state)
    with pytest.raises(StateError, match="not on 4 ranks"):
        MixturePlan.resume(stratified, config, state, world_size=4, batch_size=1)
    with pytest.raises(PlanError, match="not on 4 ranks"):
        MixturePlan(stratified, config, epoch=0, world_size=4, batch_size=1)
    with pytest.raises(PlanError, match="needs order='global'"):
        MixturePlan(stratified, PlanConfig(), epoch=0, world_size=1)
    with pytest.raises(StateError, match="the epoch has 6"):
        plan_of(stratified, config, 1, 1, state={**state, "global_batches": 7})
    with pytest.raises(PlanError, match="not 'random'"):
        ComposedPlan.fresh(Mixture(specs), config, 0, Shape(1, 1, 6))


def test_parts_share_one_bound_on_their_cached_chunk_orders():
    from shardstream.plan.global_order import CACHED_BLOCKS
    from shardstream.plan.kinds import MixturePlan
    from shardstream.plan.mixture import Mixture, StreamSpec

    specs = [StreamSpec(f"s{i}", [50] * 4, f"f{i}", repeat=1 + i / 10) for i in range(10)]
    config = PlanConfig(seed=1, order="global", global_batch_size=40)
    for mix in ("stratified", "per_stream"):
        plan = MixturePlan(Mixture(specs, mix=mix), config, epoch=0, world_size=1, batch_size=40)
        parts = plan.sequence.parts
        assert sum(part.sequence.cached_blocks for part in parts) <= max(CACHED_BLOCKS, 4 * len(parts))
