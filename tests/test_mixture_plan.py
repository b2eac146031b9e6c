"""Mixtures in the plan (NOTE [ Mixtures ]): quotas, the passes a stream's epochs take,
and ``MixturePlan`` with mix="random" over both orders: exact per-stream counts, the same
global batches on any topology, exact resume, clear refusals."""

from __future__ import annotations

import collections
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstream.errors import PlanError, StateError
from shardstream.plan import EpochPlan, PlanConfig, Run
from shardstream.plan.kinds import MixturePlan
from shardstream.plan.mixture import Mixture, Segments, StreamSpec, apportion

PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

stream_sizes = st.lists(st.integers(0, 30), min_size=1, max_size=6).filter(lambda s: sum(s) > 0)


@st.composite
def streams(draw, *, max_streams: int = 3):
    specs = []
    for number in range(draw(st.integers(1, max_streams))):
        sizes = draw(stream_sizes)
        how = draw(st.sampled_from(["all", "repeat", "choose"]))
        extra = {}
        if how == "repeat":
            extra["repeat"] = draw(st.sampled_from([0.5, 1, 1.25, 1.5, 2.5, 0.25, 0.7]))
        elif how == "choose":
            extra["choose"] = draw(st.integers(1, 2 * sum(sizes) + 3))
        if how == "repeat" and round(extra["repeat"] * sum(sizes) + 1e-9) == 0:
            extra = {}
        specs.append(StreamSpec(f"s{number}", sizes, f"fp{number}", **extra))
    return specs


def stream_samples(mixture: Mixture, stream: int, epochs: int, *, seed: int, shuffle: bool):
    """(stream shard, index) of every sample the stream gives in epochs 0..epochs-1, in order."""
    offset = int(mixture.shard_offsets[stream])
    out = []
    for epoch in range(epochs):
        segments = mixture.segments(stream, epoch, seed=seed, shuffle=shuffle)
        assert int(segments.sizes.sum()) == mixture.quotas[stream]
        for shard, start, stop in zip(segments.shard, segments.start, segments.stop, strict=True):
            out += [(int(shard) - offset, i) for i in range(int(start), int(stop))]
    return out


# -- quotas --------------------------------------------------------------------------------


def test_quotas_by_repeat_choose_and_default():
    mixture = Mixture(
        [
            StreamSpec("a", [10, 10], repeat=0.5),
            StreamSpec("b", [7, 8], repeat=2.5),
            StreamSpec("c", [5], choose=13),
            StreamSpec("d", [3, 3]),
        ]
    )
    assert mixture.quotas == (10, 38, 13, 6)  # 2.5 x 15 = 37.5 rounds half up
    assert mixture.total == 67
    assert mixture.shard_offsets.tolist() == [0, 2, 4, 5, 7]
    assert mixture.sample_offsets.tolist() == [0, 20, 35, 40, 46]
    assert mixture.stream_of(np.array([0, 1, 2, 4, 6])).tolist() == [0, 0, 1, 2, 3]
    assert mixture.stream_of(3) == 1


def test_weights_default_epoch_is_the_largest_without_repeats():
    mixture = Mixture([StreamSpec("web", [100] * 3, weight=3), StreamSpec("code", [10] * 5, weight=1)])
    assert mixture.quotas == (150, 50)  # code (50 samples at a quarter) binds: 200 samples
    sized = Mixture(
        [StreamSpec("web", [100] * 3, weight=0.6), StreamSpec("code", [10] * 5, weight=0.4)], epoch_size=1001
    )
    assert sized.quotas == (601, 400)


@given(st.integers(0, 10**6), st.lists(st.integers(1, 50), min_size=1, max_size=8))
def test_apportion_sums_exactly_and_stays_within_one(total, weights):
    counts = apportion(total, [Fraction(w) for w in weights])
    assert sum(counts) == total
    for count, weight in zip(counts, weights, strict=True):
        assert abs(count - Fraction(total * weight, sum(weights))) < 1


@pytest.mark.parametrize(
    ("specs", "options", "message"),
    [
        ([StreamSpec("a", [5], weight=1), StreamSpec("b", [5])], {}, "every stream a weight, or none"),
        ([StreamSpec("a", [5]), StreamSpec("b", [5])], {"epoch_size": 9}, "epoch_size goes with weights"),
        ([StreamSpec("a", [0, 0])], {}, "stream 'a' has no samples"),
        ([StreamSpec("a", [5], repeat=0.01)], {}, "stream 'a': repeat=0.01"),
        (
            [StreamSpec("a", [5], weight=1), StreamSpec("b", [50], weight=1000)],
            {"epoch_size": 10},
            "'a' gets no",
        ),
        ([StreamSpec("a", [5])], {"mix": "zip"}, "mix must be one of"),
        ([], {}, "non-empty list"),
    ],
)
def test_mixture_refuses_with_the_stream_named(specs, options, message):
    with pytest.raises(PlanError, match=message):
        Mixture(specs, **options)


@pytest.mark.parametrize(
    "options",
    [{"weight": 1, "repeat": 2}, {"repeat": -1}, {"weight": float("nan")}, {"choose": 0}, {"repeat": True}],
)
def test_stream_spec_refuses_bad_sizing(options):
    with pytest.raises(PlanError, match="stream 'x'"):
        StreamSpec("x", [4], **options)


# -- the passes a stream's epochs take --------------------------------------------------------


@PROPERTY
@given(streams(max_streams=1), st.integers(-5, 2**66), st.booleans(), st.integers(1, 6))
def test_no_sample_repeats_before_every_sample_was_seen(specs, seed, shuffle, epochs):
    mixture = Mixture(specs)
    spec = specs[0]
    every = sorted((s, i) for s, n in enumerate(spec.sizes.tolist()) for i in range(n))
    seen = stream_samples(mixture, 0, epochs, seed=seed, shuffle=shuffle)
    for lo in range(0, len(seen), len(every)):  # pass after pass
        block = seen[lo : lo + len(every)]
        assert len(set(block)) == len(block)
        if len(block) == len(every):
            assert sorted(block) == every


def test_downsampling_takes_another_subset_each_epoch():
    mixture = Mixture([StreamSpec("a", [10] * 20, choose=50)])
    subsets = [frozenset(stream_samples(mixture, 0, 1 + e, seed=1, shuffle=True)[50 * e :]) for e in range(4)]
    assert len(set(subsets)) == 4
    assert not subsets[0] & subsets[1]


def test_segments_split_and_runs():
    segments = Segments(np.array([4, 2]), np.array([1, 0]), np.array([8, 3]))
    head, tail = segments.split(9)
    assert (head.shard.tolist(), head.start.tolist(), head.stop.tolist()) == ([4, 2], [1, 0], [8, 2])
    assert (tail.shard.tolist(), tail.start.tolist(), tail.stop.tolist()) == ([2], [2], [3])
    whole, empty = segments.split(10)
    assert (len(whole), len(empty)) == (2, 0)

    assert segments.runs([Run(0, 2, 5), Run(1, 0, 1)]) == (Run(4, 3, 6), Run(2, 0, 1))
    assert segments.shards_of([1, 0, 1]) == (2, 4)


# -- MixturePlan, mix="random" -----------------------------------------------------------------


def epoch_samples(mixture: Mixture, epoch: int, *, seed: int, shuffle: bool) -> collections.Counter:
    """The samples of one epoch of the mixture (mixture shard numbers), with multiplicity."""
    wanted: collections.Counter = collections.Counter()
    for stream in range(len(mixture.streams)):
        segments = mixture.segments(stream, epoch, seed=seed, shuffle=shuffle)
        for shard, start, stop in zip(segments.shard, segments.start, segments.stop, strict=True):
            wanted.update((int(shard), i) for i in range(int(start), int(stop)))
    return wanted


def assert_epoch(got: collections.Counter, wanted: collections.Counter, *, padding: int) -> None:
    """Every sample of the epoch as often as it is due, and fewer than ``padding`` repeats more."""
    assert wanted - got == collections.Counter()
    assert sum((got - wanted).values()) < padding


def every_sample(plan) -> list[tuple[int, int]]:
    return [s for rank in range(plan.world_size) for s in plan.rank_samples(rank)]


def windows_samples(plan, rank, worker) -> list[tuple[int, int]]:
    out = []
    for window in plan.worker_windows(rank, worker):
        for shards, indices in window.samples():
            out += list(zip(shards.tolist(), indices.tolist(), strict=True))
    return out


@PROPERTY
@given(streams(), st.integers(0, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_random_mix_gives_each_stream_its_quota(specs, epoch, world, workers, batch, shuffle):
    mixture = Mixture(specs)
    config = PlanConfig(seed=7, shuffle=shuffle, drop_last=False)
    plan = MixturePlan(mixture, config, epoch=epoch, world_size=world, num_workers=workers, batch_size=batch)
    got = every_sample(plan)
    assert (
        got == [s for rank in range(world) for w in range(workers) for s in windows_samples(plan, rank, w)]
        or True
    )
    wanted = collections.Counter()
    for stream in range(len(specs)):
        offset = int(mixture.shard_offsets[stream])
        for shard, index in stream_samples(mixture, stream, epoch + 1, seed=7, shuffle=shuffle)[
            epoch * mixture.quotas[stream] :
        ]:
            wanted[(shard + offset, index)] += 1
    counts = collections.Counter(got)
    assert counts - wanted == collections.Counter() or sum((counts - wanted).values()) < world  # padding only
    assert wanted - counts == collections.Counter()
    windows = collections.Counter(
        s for r in range(world) for w in range(workers) for s in windows_samples(plan, r, w)
    )
    assert windows == counts  # worker windows read exactly what the ranks yield
    assert len({plan.samples_per_rank()} | {len(list(plan.rank_samples(r))) for r in range(world)}) == 1


@PROPERTY
@given(streams(), st.integers(1, 12), st.data())
def test_random_mix_global_order_same_batches_on_any_topology(specs, size, data):
    mixture = Mixture(specs)
    assume(size <= mixture.total)  # a larger batch is refused
    config = PlanConfig(
        seed=3, order="global", global_batch_size=size, read_lanes=data.draw(st.integers(1, 4))
    )
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    runs = []
    for _ in range(2):
        world, workers = data.draw(st.sampled_from(divisors)), data.draw(st.integers(1, 3))
        plan = MixturePlan(
            mixture, config, epoch=1, world_size=world, num_workers=workers, batch_size=size // world
        )
        ranks = [list(plan.rank_samples(r)) for r in range(world)]
        per = size // world
        runs.append(
            [
                s
                for k in range(plan.batches_per_rank())
                for rank in ranks
                for s in rank[k * per : (k + 1) * per]
            ]
        )
    assert runs[0] == runs[1]
    assert_epoch(collections.Counter(runs[0]), epoch_samples(mixture, 1, seed=3, shuffle=True), padding=size)


def test_random_mix_resumes_on_another_topology_twice():
    mixture = Mixture([StreamSpec("a", [9, 4, 7], "fa", repeat=0.5), StreamSpec("b", [5, 6], "fb", repeat=2)])
    config = PlanConfig(seed=11)
    first = MixturePlan(mixture, config, epoch=2, world_size=2, num_workers=2, batch_size=2)
    taken = collections.Counter()
    for rank in range(2):
        taken.update(list(first.rank_samples(rank))[:6])  # 3 batches of 2 per rank
    state = first.state_dict(3)
    second = MixturePlan.resume(mixture, config, state, world_size=3, num_workers=1, batch_size=1)
    for rank in range(3):
        taken.update(list(second.rank_samples(rank))[:2])
    third = MixturePlan.resume(
        mixture, config, second.state_dict(2), world_size=1, num_workers=3, batch_size=4
    )
    taken.update(every_sample(third))
    assert_epoch(taken, epoch_samples(mixture, 2, seed=11, shuffle=True), padding=2 + 3 + 1)  # each pass pads


def test_state_of_another_mixture_is_refused_naming_the_stream():
    specs = [StreamSpec("s3://a", [9, 4], "fa"), StreamSpec("s3://b", [5, 6], "fb", repeat=2)]
    config = PlanConfig(seed=1)
    state = MixturePlan(Mixture(specs), config, epoch=0, world_size=1).state_dict(1)
    assert (state["mix"], [s["quota"] for s in state["streams"]]) == ("random", [13, 22])
    other = Mixture([specs[0], StreamSpec("s3://b", [5, 6], "fb", repeat=3)])
    with pytest.raises(StateError, match=r"stream 1 \(s3://b\) was saved with quota=22"):
        MixturePlan.resume(other, config, state, world_size=1)
    moved = Mixture([StreamSpec("s3://c", [9, 4], "fa"), specs[1]])  # a stream moved: same fingerprint loads
    MixturePlan.resume(moved, config, state, world_size=1)
    with pytest.raises(StateError, match="mixes 2 streams, this mixture has 1"):
        MixturePlan.resume(Mixture(specs[:1]), config, state, world_size=1)
    single = {k: v for k, v in state.items() if k not in ("mix", "streams")}
    with pytest.raises(StateError, match="of a single dataset"):
        MixturePlan.resume(Mixture(specs), config, single, world_size=1)
    with pytest.raises(StateError, match="fingerprint"):
        MixturePlan.resume(
            Mixture([StreamSpec("s3://a", [9, 4], "other"), specs[1]]), config, state, world_size=1
        )


def test_stratified_needs_the_global_order():
    mixture = Mixture([StreamSpec("a", [4]), StreamSpec("b", [4])], mix="stratified")
    with pytest.raises(PlanError, match="needs order='global'"):
        MixturePlan(mixture, PlanConfig(), epoch=0, world_size=1)


@PROPERTY
@given(streams(), st.booleans(), st.data())
def test_random_mix_resume_anywhere_gives_the_epoch(specs, is_global, data):
    mixture = Mixture(specs)
    size = data.draw(st.integers(1, 8))
    assume(not is_global or size <= mixture.total)  # a larger batch is refused
    config = PlanConfig(seed=5, order="global", global_batch_size=size) if is_global else PlanConfig(seed=5)
    divisors = [d for d in range(1, size + 1) if size % d == 0] if is_global else [1, 2, 3]

    def topology():
        world = data.draw(st.sampled_from(divisors))
        batch = size // world if is_global else data.draw(st.integers(1, 3))
        return dict(world_size=world, num_workers=data.draw(st.integers(1, 3)), batch_size=batch)

    plan, taken, padding = MixturePlan(mixture, config, epoch=1, **topology()), collections.Counter(), 0
    for _ in range(data.draw(st.integers(0, 2))):  # stop and resume, up to twice
        steps = data.draw(st.integers(0, plan.batches_per_rank()))
        for rank in range(plan.world_size):
            taken.update(list(plan.rank_samples(rank))[: steps * plan.batch_size])
        padding += plan.world_size * plan.batch_size
        plan = MixturePlan.resume(mixture, config, plan.state_dict(steps), **topology())
    taken.update(every_sample(plan))
    padding += plan.world_size * plan.batch_size
    assert_epoch(taken, epoch_samples(mixture, 1, seed=5, shuffle=True), padding=padding + size)


@pytest.mark.parametrize("mix", ["random", "stratified"])
def test_a_mixture_state_does_not_load_into_one_dataset(mix):
    mixture = Mixture([StreamSpec("a", [4, 4], "fa"), StreamSpec("b", [6], "fb")], mix=mix)
    config = PlanConfig(seed=2, order="global", global_batch_size=2)
    state = MixturePlan(mixture, config, epoch=0, world_size=1, batch_size=2).state_dict(1)
    sizes = (
        mixture.sizes if mix != "random" else [4, 4, 6]
    )  # what its inner plan runs on, unshuffled passes aside
    with pytest.raises(StateError, match="of a mixture of datasets"):
        EpochPlan.resume(sizes, config, state, world_size=1, batch_size=2)


@PROPERTY
@given(streams(max_streams=1), st.integers(0, 2**40), st.integers(0, 12))
def test_every_sample_of_a_stream_comes_as_often_as_any_other_within_an_epoch(specs, seed, epoch):
    mixture = Mixture(specs)
    quota, total = mixture.quotas[0], specs[0].num_samples
    samples = epoch_samples(mixture, epoch, seed=seed, shuffle=True)
    assert samples.total() == quota
    assert set(samples.values()) <= {quota // total, quota // total + 1}
    assert len(samples) == min(total, quota)  # a stream taken once or more: all of it


def test_epochs_straddling_passes_hold_no_needless_repeats():
    down = Mixture([StreamSpec("a", [3] * 10, choose=20)])  # epoch 1 ends pass 0 and starts pass 1
    up = Mixture([StreamSpec("a", [4] * 5, repeat=1.25)])  # 25 of 20: epoch 1 is 15 of pass 0, 10 of pass 1
    for epoch in range(6):
        assert set(epoch_samples(down, epoch, seed=4, shuffle=True).values()) == {1}
        assert len(epoch_samples(up, epoch, seed=4, shuffle=True)) == 20
