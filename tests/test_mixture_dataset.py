"""Mixtures through the dataset layer: ``StreamingDataset([Stream(...), ...])`` over local
folders, tar and Parquet (NOTE [ Mixtures ], NOTE [ Mixture reads ], NOTE [ Mixture options ])."""

from __future__ import annotations

import collections
import json
import os
import pickle

import pytest

import shardstream
from shardstream import Stream
from shardstream.errors import FormatError, StateError, UsageError
from shardstream.pack import ShardWriter
from tests.resume_harness import write_dataset
from tests.test_dataset import corrupt_json_dataset
from tests.test_integrity import data_offset, flip
from tests.test_integrity import write as write_checked

SIZES_A = [17, 9, 22]  # tar, 48 samples, taken once
SIZES_B = [5, 6]  # tar, 11 samples, repeat=2.5: 28 (27.5 rounded half up)
ROWS_C = 30  # Parquet in shards of 7 rows, choose=20
QUOTAS = (48, 28, 20)  # 96: no padding on 1, 2, 3 or 4 ranks
BATCH = 4


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """``(root, keys)``: three datasets under ``root`` (a, b: tar; c: Parquet), keys by stream."""
    root = tmp_path_factory.mktemp("mix")
    keys = {0: write_dataset(str(root / "a"), SIZES_A), 1: write_dataset(str(root / "b"), SIZES_B)}
    with ShardWriter(str(root / "c"), format="parquet", samples_per_shard=7) as writer:
        for i in range(ROWS_C):
            writer.write({"__key__": f"row{i:02d}", "text": f"t{i}", "label": i})
    keys[2] = [f"row{i:02d}" for i in range(ROWS_C)]
    return root, keys


def streams(root, *, choose=20):
    return [
        Stream(str(root / "a")),
        Stream(str(root / "b"), repeat=2.5),
        Stream(str(root / "c"), choose=choose),
    ]


def ids(samples):
    return [(sample["__stream__"], sample["__key__"]) for sample in samples]


def collate_ids(samples):
    return ids(samples)


def epoch_ids(root, *, world=1, epoch=0, **kwargs):
    """Every rank's samples of one epoch, iterating each rank's dataset directly."""
    seen = []
    for rank in range(world):
        dataset = shardstream.StreamingDataset(streams(root), num_replicas=world, rank=rank, seed=5, **kwargs)
        dataset.set_epoch(epoch)
        seen.append(list(dataset))
        assert len(seen[-1]) == len(dataset) == sum(QUOTAS) // world
    return seen


@pytest.mark.parametrize("world", [1, 3])
def test_every_stream_yields_its_quota_tagged_and_decoded(streamed, world):
    root, keys = streamed
    samples = [sample for rank in epoch_ids(root, world=world) for sample in rank]
    per_stream = collections.Counter(sample["__stream__"] for sample in samples)
    assert tuple(per_stream[s] for s in range(3)) == QUOTAS
    for sample in samples:  # the tag says where the sample came from: its fields and key
        stream, key = sample["__stream__"], sample["__key__"]
        assert key in keys[stream]
        if stream == 2:
            assert sample == {
                "__key__": key,
                "text": f"t{int(key[3:])}",
                "label": int(key[3:]),
                "__stream__": 2,
            }
        else:
            assert sample["txt"] == f"sample {key}"
            assert isinstance(sample["cls"], int)
    times = collections.Counter(ids(samples))
    assert {times[(0, key)] for key in keys[0]} == {1}
    assert sorted(collections.Counter(times[(1, key)] for key in keys[1]).items()) == [(2, 5), (3, 6)]
    assert len([key for key in keys[2] if (2, key) in times]) == 20
    assert max(times[(2, key)] for key in keys[2]) == 1  # a downsampled stream: each at most once


def test_a_downsampled_stream_takes_another_part_each_epoch_and_covers_itself(streamed):
    root, _keys = streamed
    taken = []
    for epoch in range(3):
        samples = epoch_ids(root, epoch=epoch, decode=False)[0]
        taken.append([key for stream, key in ids(samples) if stream == 2])
    # Epoch 0 takes the first 20 of the stream's first pass, epoch 1 its last 10 and the
    # second pass's first 10 (which may repeat some of those 10), epoch 2 the rest of it.
    assert len(taken[0]) == len(set(taken[0])) == len(taken[2]) == len(set(taken[2])) == len(taken[1]) == 20
    assert len(set(taken[0]) | set(taken[1])) == ROWS_C
    assert len(set(taken[1]) | set(taken[2])) == ROWS_C
    assert set(taken[0]) != set(taken[1]) != set(taken[2])


def test_weights_make_shares_of_an_epoch(streamed):
    root, _ = streamed
    weighted = [
        Stream(str(root / "a"), weight=0.5),
        Stream(str(root / "b"), weight=0.3),
        Stream(str(root / "c"), weight=0.2),
    ]
    dataset = shardstream.StreamingDataset(weighted, epoch_size=50, decode=False)
    assert dataset.quotas == (25, 15, 10)
    per_stream = collections.Counter(sample["__stream__"] for sample in dataset)
    assert [per_stream[s] for s in range(3)] == [25, 15, 10]
    # no epoch_size: the largest at which no stream repeats, floor(11 / 0.3) = 36
    assert shardstream.StreamingDataset(weighted).quotas == (18, 11, 7)


def loader(root, *, world, rank, workers, state=None, **kwargs):
    dataset = shardstream.StreamingDataset(
        streams(root), num_replicas=world, rank=rank, seed=5, decode=False, **kwargs
    )
    made = shardstream.DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=collate_ids)
    if state is not None:
        made.load_state_dict(json.loads(json.dumps(state)))
    return made


def run(made, stop=None):
    """The batches of one epoch (the first ``stop``), and the state after them."""
    got = []
    iterator = iter(made)
    for batch in iterator:
        got.append(batch)
        if stop is not None and len(got) == stop:
            break
    state = made.state_dict()
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    return got, state


def test_resume_mid_epoch_same_topology_gives_the_same_batches(streamed):
    root, _ = streamed
    full, _ = run(loader(root, world=1, rank=0, workers=2))
    head, state = run(loader(root, world=1, rank=0, workers=2), stop=5)
    tail, _ = run(loader(root, world=1, rank=0, workers=2, state=state))
    assert head + tail == full


def test_resume_twice_on_other_world_sizes_and_workers_equals_the_epoch(streamed):
    root, _ = streamed
    whole = collections.Counter(item for rank in epoch_ids(root, decode=False) for item in ids(rank))
    seen: list = []
    states = []
    for rank in range(2):  # 2 ranks x 2 workers, 3 batches each
        got, state = run(loader(root, world=2, rank=rank, workers=2), stop=3)
        seen += [item for batch in got for item in batch]
        states.append(state)
    assert states[0] == states[1]
    again = []
    for rank in range(3):  # 3 ranks x 1 worker (in-process), 2 batches more
        got, state = run(loader(root, world=3, rank=rank, workers=0, state=states[0]), stop=2)
        seen += [item for batch in got for item in batch]
        again.append(state)
    assert again[0] == again[1] == again[2]
    got, _ = run(loader(root, world=1, rank=0, workers=2, state=again[0]))  # 1 rank x 2 workers: the rest
    seen += [item for batch in got for item in batch]
    assert collections.Counter(seen) == whole


def test_persistent_workers_follow_set_epoch(streamed):
    root, _ = streamed
    dataset = shardstream.StreamingDataset(streams(root), seed=5, decode=False)
    made = shardstream.DataLoader(
        dataset, batch_size=BATCH, num_workers=2, collate_fn=collate_ids, persistent_workers=True
    )
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        epochs.append([item for batch in made for item in batch])
        assert [sum(1 for s, _ in epochs[-1] if s == stream) for stream in range(3)] == list(QUOTAS)
        assert len(made) == sum(QUOTAS) // BATCH
    assert epochs[0] != epochs[1]
    made._iterator._shutdown_workers()
    assert len(list(dataset)) == sum(QUOTAS)
    storage = dataset.datasets[0].storage
    again = pickle.loads(pickle.dumps(dataset))
    assert again.datasets[0].storage is not storage  # made anew where it is used
    assert again.quotas == QUOTAS
    assert again.epoch == 1
    assert collections.Counter(ids(again)) == collections.Counter(epochs[1])


def test_a_state_loads_only_into_the_same_mixture(streamed, tmp_path):
    root, _ = streamed
    dataset = shardstream.StreamingDataset(streams(root), seed=5, decode=False, batch_size=BATCH)
    iterator = iter(dataset)
    for _ in range(2 * BATCH):
        next(iterator)
    state = dataset.state_dict()
    iterator.close()
    assert [s["name"] for s in state["plan"]["streams"]] == [s.url for s in streams(root)]
    write_dataset(str(tmp_path / "b2"), [6, 5])  # the same counts in all, other shards
    other = streams(root)
    other[1] = Stream(str(tmp_path / "b2"), repeat=2.5)
    for mixture, refusal in (
        (other, r"stream 1 \(.*b2\) was saved with (num_samples|fingerprint)="),
        (streams(root, choose=10), "stream 2 .* quota=20"),
        (streams(root)[:2], "the state mixes 3 streams, this mixture has 2"),
    ):
        with pytest.raises(StateError, match=refusal):
            shardstream.StreamingDataset(mixture, seed=5, batch_size=BATCH).load_state_dict(state)
    with pytest.raises(StateError, match="the state is of a mixture"):
        shardstream.StreamingDataset(str(root / "a"), seed=5, batch_size=BATCH).load_state_dict(state)
    single = shardstream.StreamingDataset(str(root / "a"), seed=5).state_dict()
    with pytest.raises(StateError, match="of a single dataset, not of a mixture"):
        shardstream.StreamingDataset(streams(root), seed=5).load_state_dict(single)
    resumed = shardstream.StreamingDataset(streams(root), seed=5, decode=False, batch_size=BATCH)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == sum(QUOTAS) - 2 * BATCH


def test_options_are_split_between_streams_and_the_mixture(streamed):
    root, _ = streamed
    own = Stream(str(root / "b"), storage_options={"auto_mkdir": False}, local_reads="map")
    dataset = shardstream.StreamingDataset(
        [str(root / "a"), own], storage_options={"auto_mkdir": True}, on_error="skip", decode=False
    )
    first, second = (part.options for part in dataset.datasets)
    assert (first.storage_options, first.local_reads) == ({"auto_mkdir": True}, "auto")
    assert (second.storage_options, second.local_reads) == ({"auto_mkdir": False}, "map")
    assert first.on_error == second.on_error == "skip"
    assert dataset.config.decoder is None
    assert dataset.quotas == (48, 11)  # a plain URL in the list: all of it once
    assert collections.Counter(s["__stream__"] for s in dataset) == {0: 48, 1: 11}
    by_name = shardstream.StreamingDataset(url=[str(root / "a")], decode=False)
    assert by_name.quotas == (48,)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda root: [Stream(str(root / "a"), weight=1, repeat=2)],
            "at most one of weight, repeat and choose",
        ),
        (lambda root: [Stream(str(root / "a"), choose=0)], "choose"),
        (lambda root: [Stream(str(root / "a"), local_reads="mmap")], "local_reads"),
    ],
)
def test_bad_streams_are_refused_when_made(streamed, make, message):
    root, _ = streamed
    with pytest.raises(UsageError, match=message):
        shardstream.StreamingDataset(make(root))


def test_bad_mixtures_are_refused(streamed):
    root, _ = streamed
    a, b = str(root / "a"), str(root / "b")
    with pytest.raises(UsageError, match="every stream a weight, or none"):
        len(shardstream.StreamingDataset([Stream(a, weight=1), Stream(b)]))
    with pytest.raises(UsageError, match="epoch_size goes with weights"):
        len(shardstream.StreamingDataset([Stream(a), Stream(b)], epoch_size=10))
    with pytest.raises(UsageError, match="needs order='global'"):
        shardstream.StreamingDataset([Stream(a), Stream(b)], mix="stratified")
    with pytest.raises(UsageError, match="mix must be one of"):
        shardstream.StreamingDataset([Stream(a)], mix="shuffled")
    with pytest.raises(UsageError, match="options of a mixture"):
        shardstream.StreamingDataset(a, mix="random")
    with pytest.raises(UsageError, match="one manifest per stream"):
        _ = shardstream.StreamingDataset([Stream(a)]).manifest
    with pytest.raises(UsageError, match="at least one Stream"):
        shardstream.StreamingDataset([])


def test_corrupt_samples_are_named_by_their_stream_or_skipped_and_counted(streamed, tmp_path):
    root, _ = streamed
    bad = str(tmp_path / "bad")
    corrupt_json_dataset(bad)  # 12 samples, 2 of them bad JSON (a decode error)
    flipped = str(tmp_path / "flipped")
    write_checked(flipped)  # 800 samples in 4 shards
    flip(os.path.join(flipped, "shard-000000.tar"), data_offset(flipped, "tar"))  # a check block fails
    mixture = [Stream(str(root / "c"), choose=20), Stream(bad), Stream(flipped)]
    with pytest.raises(FormatError) as caught:
        list(shardstream.StreamingDataset(mixture, shuffle=False))
    assert caught.value.url.startswith(bad) or caught.value.url.startswith(flipped)
    dataset = shardstream.StreamingDataset(mixture, on_error="skip", batch_size=BATCH)
    got = ids(dataset)
    lost = collections.Counter(s for s, _ in got)
    assert lost[0] == 20
    assert lost[1] == 10  # k03 and k08 skipped
    assert 0 < lost[2] < 800  # the samples in the failed block left out
    assert dataset.num_skipped == 832 - len(got)
    assert (1, "k03") not in got
    assert (
        dataset.state_dict()["plan"]["passes"][-1]["steps"] == len(dataset) // BATCH
    )  # skipped ones consumed too


def test_global_order_gives_the_same_global_batches_on_one_and_two_ranks(streamed):
    root, _ = streamed
    size = 8  # 96 samples: 12 global batches

    def global_batches(world):
        ranks = []
        for rank in range(world):
            dataset = shardstream.StreamingDataset(
                streams(root),
                order="global",
                global_batch_size=size,
                num_replicas=world,
                rank=rank,
                decode=False,
            )
            ranks.append(ids(dataset))
        part = size // world
        return [[item for got in ranks for item in got[k * part : (k + 1) * part]] for k in range(96 // size)]

    one = global_batches(1)
    assert one == global_batches(2)
    assert collections.Counter(s for batch in one for s, _ in batch) == dict(enumerate(QUOTAS))


def composed(root, mix, **kwargs):
    return shardstream.StreamingDataset(
        streams(root), mix=mix, order="global", global_batch_size=8, seed=5, decode=False, **kwargs
    )


@pytest.mark.parametrize("mix", ["stratified", "per_stream"])
def test_composed_mixes_make_their_global_batches(streamed, mix):
    root, _ = streamed
    dataset = composed(root, mix)
    got = ids(dataset)
    assert len(got) == sum(QUOTAS)
    assert collections.Counter(s for s, _ in got) == dict(enumerate(dataset.quotas))  # rounded ones
    batches = [collections.Counter(s for s, _ in got[k : k + 8]) for k in range(0, len(got), 8)]
    if mix == "stratified":  # each stream's share of every batch, to within one sample
        assert all(abs(batch[s] - 8 * QUOTAS[s] / sum(QUOTAS)) < 1 for batch in batches for s in range(3))
        assert collections.Counter(s for s, _ in got) == dict(enumerate(QUOTAS))
    else:  # every batch from one stream, the streams' batches in proportion
        assert all(len(batch) == 1 for batch in batches)
        # 12 batches apportioned by the quotas: 6, 3.5 and 2.5, the tie to the first stream
        assert collections.Counter(next(iter(batch)) for batch in batches) == {0: 6, 1: 4, 2: 2}


def test_stratified_resumes_through_the_loader_on_other_workers_and_ranks(streamed):
    root, _ = streamed
    full = run(shardstream.DataLoader(composed(root, "stratified"), batch_size=8, collate_fn=collate_ids))[0]
    made = shardstream.DataLoader(
        composed(root, "stratified"), batch_size=8, num_workers=2, collate_fn=collate_ids
    )
    head, state = run(made, stop=5)
    assert head == full[:5]  # the same global batches on any worker count
    rest = []
    for rank in range(2):  # 2 ranks of 4 samples per global batch
        again = shardstream.DataLoader(
            composed(root, "stratified", num_replicas=2, rank=rank),
            batch_size=4,
            num_workers=1,
            collate_fn=collate_ids,
        )
        again.load_state_dict(state)
        rest.append(run(again)[0])
    assert head + [a + b for a, b in zip(*rest, strict=True)] == full


def twice(data: bytes) -> int:
    return 2 * int(data)


@pytest.mark.parametrize("mixture_decodes", [True, False])
def test_each_stream_may_decode_its_own_way(streamed, mixture_decodes):
    root, _keys = streamed
    cls_twice = {"cls": twice}
    listed = [
        Stream(str(root / "a"), decode=not mixture_decodes),  # the other way round from the mixture
        Stream(str(root / "b"), repeat=2.5, decoders=cls_twice),  # decoded, with its own decoder
        Stream(str(root / "c"), choose=20),  # the mixture's way
    ]
    dataset = shardstream.StreamingDataset(listed, seed=5, decode=mixture_decodes)
    samples = list(dataset)
    assert collections.Counter(s["__stream__"] for s in samples) == dict(enumerate(QUOTAS))
    for sample in samples:
        stream, key = sample["__stream__"], sample["__key__"]
        if stream == 0:
            expected = f"sample {key}" if not mixture_decodes else f"sample {key}".encode()
            assert sample["txt"] == expected
        elif stream == 1:
            assert isinstance(sample["cls"], int)
            assert sample["cls"] % 2 == 0
            assert sample["txt"] == f"sample {key}"
        else:  # Parquet of Python values: the same either way
            assert sample["text"] == f"t{int(key[3:])}"
    assert {s["__stream__"] for s in pickle.loads(pickle.dumps(dataset))} == {0, 1, 2}
