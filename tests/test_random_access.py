"""MapDataset: dataset[i] against the streamed epoch (tar and Parquet, local and S3), batch
fetches (order, duplicates, coalesced reads), key lookup, bounds, errors, DataLoader with
ShardSampler and workers (fork and spawn), pickling."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.dataset.decode import PickleRefusedError
from shardstream.errors import FormatError, StorageError
from shardstream.pack import ShardWriter
from shardstream.storage import Storage

COUNT = 57


def sample(i: int, key: str | None = None) -> dict:
    return {
        "__key__": key or f"k{i:05d}",
        "txt": f"text {i} é",
        "cls": i % 7,
        "json": json.dumps({"i": i, "tags": ["a", str(i)]}).encode(),
    }


def write(
    url: str, fmt: str, count: int = COUNT, per_shard: int = 10, options: dict | None = None, keys=None
):
    with ShardWriter(url, format=fmt, samples_per_shard=per_shard, storage_options=options) as writer:
        for i in range(count):
            writer.write(sample(i, keys[i] if keys else None))


@pytest.fixture(scope="module", params=["tar", "parquet"])
def local(request, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("ra") / request.param)
    write(url, request.param)
    return url, list(shardstream.StreamingDataset(url, shuffle=False))


def test_every_index_is_the_sample_the_epoch_yields(local):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    assert len(dataset) == len(epoch) == COUNT
    assert [dataset[i] for i in range(len(dataset))] == epoch
    raw = shardstream.MapDataset(url, decode=False)
    assert [raw[i] for i in range(COUNT)] == list(
        shardstream.StreamingDataset(url, shuffle=False, decode=False)
    )


def test_negative_indices_bounds_and_types(local):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    assert dataset[-1] == epoch[-1]
    assert dataset[-COUNT] == epoch[0]
    assert dataset[torch.tensor(3)] == epoch[3]  # anything with __index__
    for bad in (COUNT, -COUNT - 1, 10**12):
        with pytest.raises(IndexError):
            dataset[bad]
        with pytest.raises(IndexError):
            dataset.get_many([0, bad])
    with pytest.raises(TypeError):
        dataset[1.0]  # type: ignore[index]
    assert dataset.locate(13) == (1, 3)
    assert dataset.get_many([]) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(-COUNT, COUNT - 1), max_size=40))
def test_batch_fetch_equals_single_fetches_in_caller_order(local, indices):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    got = dataset.get_many(indices)
    assert got == [dataset[i] for i in indices] == [epoch[i] for i in indices]
    if len(indices) > len(set(indices)):  # a repeated index is its own dict
        assert len({id(s) for s in got}) == len(got)


def test_transform_applies_to_every_sample(local):
    url, epoch = local
    dataset = shardstream.MapDataset(url, transform=lambda s: s["__key__"])
    assert dataset[5] == epoch[5]["__key__"]
    assert dataset.get_many([5, 5, 0]) == [epoch[5]["__key__"], epoch[5]["__key__"], epoch[0]["__key__"]]


def count_reads(monkeypatch) -> list:
    reads: list = []
    original = Storage.read

    def counting(self, path, rng=None, **kwargs):
        if not path.endswith(".idx"):
            reads.append((path, rng))
        return original(self, path, rng, **kwargs)

    monkeypatch.setattr(Storage, "read", counting)
    return reads


def test_batch_fetch_coalesces_neighbours_into_one_read_per_shard(local, monkeypatch):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    dataset.get_many([0])  # sidecar of shard 0 loaded
    reads = count_reads(monkeypatch)
    indices = [9, 0, 3, 5, 1, 2, 15, 12, 7]
    assert dataset.get_many(indices) == [epoch[i] for i in indices]
    assert len(reads) == 2  # shards 0 and 1, however many samples of each
    reads.clear()
    preads = count_preads(monkeypatch)
    for i in indices:
        dataset[i]
    assert not reads
    assert len(preads) == len(indices)  # one read per single fetch, of a file kept open


def count_preads(monkeypatch) -> list:
    """The (length, offset) of every ``os.pread``: a local single fetch reads a kept file."""
    preads: list = []
    original = os.pread

    def counting(fd, length, offset):
        preads.append((length, offset))
        return original(fd, length, offset)

    monkeypatch.setattr(os, "pread", counting)
    return preads


def count_opens(monkeypatch) -> list:
    """Every file ``Storage.open`` returns (from any thread)."""
    opened: list = []
    original = Storage.open

    def counting(self, *args, **kwargs):
        got = original(self, *args, **kwargs)
        opened.append(got)
        return got

    monkeypatch.setattr(Storage, "open", counting)
    return opened


def sample_range(dataset, i):
    shard, position = dataset.locate(i)
    return dataset._opened().reader.index(shard).byte_range(position, position + 1)


def test_a_single_fetch_reads_the_sample_once_its_block_was_checked(tmp_path, monkeypatch):
    # NOTE [ Checked single reads ]: the first read of a block checks it and records the
    # CRCs of the samples in it; a later read of any of them reads the sample's bytes only
    url = tmp_path / "singles"
    write(str(url), "tar", count=40, per_shard=40)
    dataset = shardstream.MapDataset(str(url))
    preads = count_preads(monkeypatch)
    assert dataset[6]["txt"] == "text 6 é"
    assert preads[0][0] >= 10 * sample_range(dataset, 6).length  # the whole check block
    preads.clear()
    for i in (6, 7, 20, 6):
        assert dataset[i] == sample(i) | {"json": json.loads(sample(i)["json"])}
    assert preads == [
        (sample_range(dataset, i).length, sample_range(dataset, i).start) for i in (6, 7, 20, 6)
    ]
    shard = url / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    for i in (7, 12):  # one read before, one only checked with its block
        data[data.index(b"text %d " % i)] ^= 0x01
    with open(shard, "r+b") as rewrite:  # in place, under the open file
        rewrite.write(bytes(data))
    for i in (7, 12):
        with pytest.raises(FormatError, match="checksum mismatch") as info:
            dataset[i]
        assert (info.value.offset, info.value.shard) == (sample_range(dataset, i).start, "shard-000000.tar")
        assert f"dataset index {i}" in str(info.value)
    assert dataset[6]["txt"] == "text 6 é"
    dataset.close()


def test_open_files_are_bounded_closed_and_a_truncated_shard_is_a_storage_error(tmp_path, monkeypatch):
    from shardstream.dataset import sample_reads

    url = tmp_path / "files"
    write(str(url), "tar", count=40, per_shard=10)
    monkeypatch.setattr(sample_reads, "OPEN_FILES", 2)
    dataset = shardstream.MapDataset(str(url), verify_checksums=False)
    opened = count_opens(monkeypatch)
    for i in (0, 15, 25, 35, 1):
        assert dataset[i]["__key__"] == f"k{i:05d}"
    assert len(opened) == 5  # shards 0, 1, 2, 3, then 0 again: two kept at a time
    assert [f.closed for f in opened] == [True, True, True, False, False]
    (url / "shard-000003.tar").write_bytes(b"")  # truncated while open
    with pytest.raises(StorageError, match="past the end") as info:
        dataset[36]
    assert info.value.shard == "shard-000003.tar"
    dataset.close()
    assert all(f.closed for f in opened)


def test_threads_share_the_open_files_while_they_are_evicted(tmp_path, monkeypatch):
    # a file evicted while another thread reads it is closed by its last reader, never under a read
    from concurrent.futures import ThreadPoolExecutor

    from shardstream.dataset import sample_reads

    url = tmp_path / "threads"
    write(str(url), "tar", count=40, per_shard=5)
    monkeypatch.setattr(sample_reads, "OPEN_FILES", 1)
    dataset = shardstream.MapDataset(str(url))
    opened = count_opens(monkeypatch)
    indices = [random.Random(seed).randrange(40) for seed in range(800)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(dataset.__getitem__, indices))
    assert [sample["__key__"] for sample in got] == [f"k{i:05d}" for i in indices]
    assert sum(not f.closed for f in opened) <= 1
    dataset.close()
    assert all(f.closed for f in opened)


def test_key_lookup(local):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    for i in (0, 9, 10, 33, COUNT - 1):
        assert dataset.index_of(epoch[i]["__key__"]) == i
        assert dataset.get_by_key(epoch[i]["__key__"]) == epoch[i]
    with pytest.raises(KeyError):
        dataset.index_of("no-such-key")
    with pytest.raises(KeyError):
        dataset.index_of(3)  # type: ignore[arg-type]


def test_key_lookup_bisects_sorted_keys_without_reading_every_sidecar(tmp_path, monkeypatch):
    url = str(tmp_path / "sorted")
    write(url, "tar", count=200, per_shard=5)  # 40 shards
    dataset = shardstream.MapDataset(url)
    sidecars: list = []
    original = Storage.read
    monkeypatch.setattr(
        Storage,
        "read",
        lambda self, path, rng=None, **kw: sidecars.append(path) or original(self, path, rng, **kw),
    )
    assert dataset.index_of("k00123") == 123
    assert len([p for p in sidecars if p.endswith(".idx")]) <= 8  # ~log2(40) + 1, not 40


def test_key_lookup_in_unsorted_shards(tmp_path):
    url = str(tmp_path / "unsorted")
    keys = [f"key-{i:04d}" for i in range(40)]
    random.Random(0).shuffle(keys)
    write(url, "tar", count=40, per_shard=6, keys=keys)
    dataset = shardstream.MapDataset(url)
    for i, key in enumerate(keys):
        assert dataset.index_of(key) == i
        assert dataset.get_by_key(key)["__key__"] == key
    with pytest.raises(KeyError):
        dataset.index_of("key-9999")
    # The README's promise: the key tables of the last 16 shards searched are kept, so
    # another pass over these 7 shards builds none again.
    finder = dataset._opened().finder
    kept = {shard: id(table) for shard, table in finder._tables.items()}
    assert len(kept) == 7
    assert [dataset.index_of(key) for key in keys] == list(range(40))
    assert {shard: id(table) for shard, table in finder._tables.items()} == kept


@pytest.mark.s3
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_s3_every_index_and_a_batch(s3, fmt, tmp_path):
    base, options = s3
    url = f"{base}/{fmt}"
    write(url, fmt, count=25, per_shard=8, options=options)
    epoch = list(shardstream.StreamingDataset(url, storage_options=options, shuffle=False))
    with shardstream.MapDataset(url, storage_options=options) as dataset:
        assert [dataset[i] for i in range(25)] == epoch
        order = list(range(25))
        random.Random(1).shuffle(order)
        assert dataset.get_many(order + order[:3]) == [epoch[i] for i in order + order[:3]]
        assert dataset.index_of(epoch[17]["__key__"]) == 17
    cached = shardstream.MapDataset(url, storage_options=options, cache_dir=str(tmp_path / "cache"))
    assert cached.get_many([3, 24, 0]) == [epoch[3], epoch[24], epoch[0]]
    cached.close()


def test_corrupt_sample_names_index_key_shard_and_url(tmp_path):
    url = str(tmp_path / "bad")
    with ShardWriter(url, format="tar", samples_per_shard=4) as writer:
        for i in range(8):
            writer.write({"__key__": f"k{i}", "json": b"{bad" if i == 6 else b"[%d]" % i})
    dataset = shardstream.MapDataset(url)
    assert dataset[5] == {"__key__": "k5", "json": [5]}
    for fetch in (lambda: dataset[6], lambda: dataset.get_many([1, 6, 7])):
        with pytest.raises(FormatError) as info:
            fetch()
        error = info.value
        assert "'k6'" in str(error)
        assert "dataset index 6" in str(error)
        assert error.shard == "shard-000001.tar"
        assert error.url.endswith("shard-000001.tar")
        assert error.offset is not None


def test_flipped_byte_is_a_checksum_error_unless_unchecked(tmp_path):
    url = tmp_path / "flip"
    write(str(url), "tar", count=8, per_shard=8)
    shard = url / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b"text 6")
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="checksum mismatch") as info:
        shardstream.MapDataset(str(url))[6]
    assert info.value.shard == "shard-000000.tar"
    assert "dataset index 6" in str(info.value)
    with pytest.raises(FormatError, match="checksum mismatch"):
        shardstream.MapDataset(str(url)).get_many([2, 6])
    assert shardstream.MapDataset(str(url), verify_checksums=False)[6]["txt"] != "text 6 é"


def test_pickles_as_configuration(local):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    assert dataset[3] == epoch[3]
    storage = dataset.storage
    again = pickle.loads(pickle.dumps(dataset))
    assert again.source.made_here("map") is None
    assert again.storage is not storage
    assert again[4] == epoch[4]
    assert again.manifest == dataset.manifest


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_with_shard_sampler_and_workers(local, method):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    sampler = dataset.sampler(shuffle=True, seed=3, num_replicas=1, rank=0)
    assert isinstance(sampler, shardstream.ShardSampler)
    loader = torch.utils.data.DataLoader(
        dataset, sampler=sampler, batch_size=6, num_workers=2, collate_fn=list, multiprocessing_context=method
    )
    got = [s["__key__"] for batch in loader for s in batch]
    assert got == [epoch[i]["__key__"] for i in sampler]
    assert sorted(got) == sorted(s["__key__"] for s in epoch)


def test_plain_dataloader_without_workers_uses_batch_fetch(local, monkeypatch):
    url, epoch = local
    dataset = shardstream.MapDataset(url)
    calls: list = []
    original = shardstream.MapDataset.get_many
    monkeypatch.setattr(
        shardstream.MapDataset, "get_many", lambda self, ix: calls.append(list(ix)) or original(self, ix)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=20, collate_fn=list)
    assert [s for batch in loader for s in batch] == epoch
    assert len(calls) == 3  # one batch fetch per batch, not one read per sample


ODD_VALUES = [  # (json, cls, txt) bytes that the built-ins' fast forms must read as the built-ins do
    (b' {"a": 1}', b"3", b"plain"),
    (b'{"a": 1} ', b" 4 ", "é".encode()),
    (b'"\xc3\xa9"', b"+5", b""),
    (b"NaN", b"-6", b"x\0y"),
    (b"[1, 2]", b"7", b"multi\nline"),
]


def test_single_reads_decode_every_value_as_the_epoch_does(tmp_path, monkeypatch):
    # NOTE [ Single-sample decode ]: values, field order and errors are those of the
    # streamed epoch; a user decoder is called once per value; ASCII JSON needs no json.loads
    url = str(tmp_path / "odd")
    with ShardWriter(url, format="tar", samples_per_shard=3) as writer:
        for i, (doc, cls, txt) in enumerate(ODD_VALUES):
            writer.write({"__key__": f"k{i}", "json": doc, "cls": cls, "txt": txt, "up": b"u%d" % i})
    calls = []

    def upper(data):
        calls.append(bytes(data))
        return bytes(data).upper()

    epoch = list(shardstream.StreamingDataset(url, shuffle=False, decoders={"up": upper}))
    calls.clear()
    dataset = shardstream.MapDataset(url, decoders={"up": upper})
    got = [dataset[i] for i in (4, 0, 1, 2, 3, 4)]
    assert got == [epoch[4], *epoch]
    assert list(got[1]) == list(epoch[0])
    assert calls == [b"u4", b"u0", b"u1", b"u2", b"u3", b"u4"]
    loads = []
    original = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: loads.append(a) or original(*a, **k))
    assert dataset[4]["json"] == [1, 2]
    assert loads == []
    assert dataset[0]["json"] == {"a": 1}  # leading whitespace: orjson's reading, else json.loads's
    assert len(loads) == (0 if importlib.util.find_spec("orjson") else 1)  # NOTE [ JSON by orjson ]


def test_single_read_errors_are_the_decoders(tmp_path):
    url = str(tmp_path / "errors")
    with ShardWriter(url, format="tar", samples_per_shard=4) as writer:
        for i in range(4):
            cls = b"x" if i == 1 else b"1"
            writer.write({"__key__": f"k{i}", "boom": b"b", "cls": cls, "pkl": pickle.dumps(i)})

    def boom(data):
        raise ValueError("no")

    for decoders, field in (({}, "'cls'"), ({"boom": boom}, "'boom'")):
        dataset = shardstream.MapDataset(url, decoders=decoders, allow_pickle=True)
        with pytest.raises(FormatError) as info:
            dataset[1]
        with pytest.raises(FormatError) as want:  # what decoding the sample alone raises
            dataset.config.decoder(shardstream.MapDataset(url, decode=False)[1])
        assert field in str(info.value)
        assert "'k1'" in str(info.value)
        assert str(info.value).startswith(str(want.value).split(" (url=")[0] + " [dataset index 1]")
        assert info.value.shard == "shard-000000.tar"
        assert info.value.offset is not None
    with pytest.raises(PickleRefusedError, match="dataset index 0"):
        shardstream.MapDataset(url)[0]


def write_spread(url: str, options: dict | None = None) -> None:
    """One tar shard of 12 samples of ~100 KB: samples 0, 6 and 11 lie > 256 KiB apart."""
    with ShardWriter(url, format="tar", samples_per_shard=12, storage_options=options) as writer:
        for i in range(12):
            writer.write({"__key__": f"k{i:02d}", "bin": bytes([i]) * 100_000})


@pytest.mark.s3
def test_s3_batch_reads_each_shard_once_across_holes(s3, monkeypatch):
    # NOTE [ Batch fetches ]: on object storage a request costs more than its bytes
    base, options = s3
    write_spread(f"{base}/spread", options)
    with shardstream.MapDataset(f"{base}/spread", storage_options=options) as dataset:
        dataset.get_many([1])  # the sidecar
        reads = count_reads(monkeypatch)
        got = dataset.get_many([11, 0, 6])
        assert [sample["bin"][:1] for sample in got] == [b"\x0b", b"\x00", b"\x06"]
        assert len(reads) == 1


def test_a_batch_checks_only_the_blocks_of_its_samples(tmp_path):
    # runs.Read.spans: the holes between a read's runs are read, not checked nor decoded
    url = tmp_path / "holes"
    write_spread(str(url))
    shard = url / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[data.index(bytes([3]) * 100)] ^= 0xFF  # sample 3's first block, in a block of neither 0 nor 4
    shard.write_bytes(bytes(data))
    dataset = shardstream.MapDataset(str(url))
    assert [sample["bin"][:1] for sample in dataset.get_many([4, 0])] == [b"\x04", b"\x00"]  # one read
    with pytest.raises(FormatError, match="checksum mismatch"):
        dataset.get_many([0, 3, 4])


def test_single_reads_of_a_shard_of_mixed_fields(tmp_path):
    # no SampleIndex.singles for it: each sample is decoded as a run of one
    url = str(tmp_path / "mixed")
    with ShardWriter(url, format="tar", samples_per_shard=5) as writer:
        for i in range(10):
            writer.write({"__key__": f"k{i}", "txt": b"t%d" % i, **({"cls": b"%d" % i} if i % 2 else {})})
    epoch = list(shardstream.StreamingDataset(url, shuffle=False))
    dataset = shardstream.MapDataset(url)
    assert dataset._opened().reader.index(0).singles() is None
    assert [dataset[i] for i in (3, 0, 9, 4, 3)] == [epoch[i] for i in (3, 0, 9, 4, 3)]
    dataset.close()
