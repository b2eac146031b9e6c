"""StreamingDataset: local, memory:// and S3 (moto over HTTP), tar and Parquet, decoding,
ranks, epochs, ranged and coalesced reads, errors, pickling."""

from __future__ import annotations

import logging
import os
import pickle
import uuid

import fsspec
import pytest

import shardstream
from shardstream.dataset.fetch import ByteFetcher
from shardstream.dataset.reader import COALESCE_GAP, plan_reads
from shardstream.errors import FormatError, StorageError, UsageError
from shardstream.pack import ShardWriter
from shardstream.plan import Run
from shardstream.storage import Storage
from shardstream.types import ByteRange
from tests.resume_harness import assert_exactly_once, write_dataset

SIZES = [6, 10, 3, 8, 9]  # 36 samples


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("dataset") / "ds")
    return url, write_dataset(url, SIZES)


def keys_of(dataset):
    return [sample["__key__"] for sample in dataset]


def test_streams_every_sample_once_decoded(local):
    url, keys = local
    dataset = shardstream.StreamingDataset(url)
    samples = list(dataset)
    assert len(dataset) == len(keys) == len(samples)
    assert_exactly_once([s["__key__"] for s in samples], keys)
    by_key = {s["__key__"]: s for s in samples}
    assert by_key["s001-0007"] == {"__key__": "s001-0007", "txt": "sample s001-0007", "cls": 7}
    assert [s["__key__"] for s in samples] != keys  # shuffled by default


def test_decode_false_gives_bytes_and_transform_applies(local):
    url, _ = local
    raw = next(iter(shardstream.StreamingDataset(url, decode=False, shuffle=False)))
    assert raw == {"__key__": "s000-0000", "txt": b"sample s000-0000", "cls": b"0"}
    dataset = shardstream.StreamingDataset(url, shuffle=False, transform=lambda s: (s["__key__"], s["cls"]))
    assert next(iter(dataset)) == ("s000-0000", 0)


def test_no_shuffle_is_manifest_order(local):
    url, keys = local
    assert keys_of(shardstream.StreamingDataset(url, shuffle=False)) == keys


def test_epochs_and_seeds(local):
    url, keys = local
    dataset = shardstream.StreamingDataset(url, seed=1)
    first = keys_of(dataset)
    assert keys_of(dataset) == first  # the epoch changes only through set_epoch
    dataset.set_epoch(1)
    second = keys_of(dataset)
    assert second != first
    assert sorted(second) == sorted(keys)
    assert keys_of(shardstream.StreamingDataset(url, seed=2)) != first
    with pytest.raises(shardstream.ShardstreamError):
        dataset.set_epoch(-1)


@pytest.mark.parametrize(("world", "drop_last"), [(3, False), (5, False), (5, True)])
def test_ranks_split_the_epoch(local, world, drop_last):
    url, keys = local
    parts = [
        keys_of(shardstream.StreamingDataset(url, num_replicas=world, rank=r, drop_last=drop_last))
        for r in range(world)
    ]
    counts = {len(p) for p in parts}
    assert len(counts) == 1
    everything = [k for p in parts for k in p]
    if drop_last:
        assert len(set(everything)) == len(everything) == counts.pop() * world
    else:
        assert set(everything) == set(keys)
        assert len(everything) - len(keys) < world
    dataset = shardstream.StreamingDataset(url, num_replicas=world, rank=0, drop_last=drop_last)
    assert len(dataset) == len(parts[0])


def test_rank_and_world_from_environment(local, monkeypatch):
    url, _ = local
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from_env = keys_of(shardstream.StreamingDataset(url))
    assert from_env == keys_of(shardstream.StreamingDataset(url, num_replicas=2, rank=1))
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(UsageError):
        len(shardstream.StreamingDataset(url))


def test_memory_url():
    url = f"memory://shardstream-test-{uuid.uuid4().hex[:8]}/ds"
    try:
        keys = write_dataset(url, [4, 5])
        assert_exactly_once(keys_of(shardstream.StreamingDataset(url)), keys)
    finally:
        fsspec.filesystem("memory").rm(url.rsplit("/", 1)[0], recursive=True)


@pytest.mark.s3
def test_s3_with_options_and_with_environment(s3):
    base, options = s3
    url = f"{base}/ds"
    keys = write_dataset(url, [7, 5, 9], storage_options=options)
    assert_exactly_once(keys_of(shardstream.StreamingDataset(url, storage_options=options)), keys)
    # AWS_ENDPOINT_URL and the AWS_* keys are set by the fixture: no options needed.
    assert_exactly_once(keys_of(shardstream.StreamingDataset(url)), keys)


@pytest.mark.s3
def test_s3_through_the_local_cache(s3, tmp_path):
    base, options = s3
    url = f"{base}/ds"
    keys = write_dataset(url, [6, 9, 5], storage_options=options)
    cache = tmp_path / "cache"
    dataset = shardstream.StreamingDataset(
        url, storage_options=options, cache_dir=str(cache), cache_limit=1 << 30
    )
    assert_exactly_once(keys_of(dataset), keys)
    assert len([p for p in cache.iterdir() if p.name.startswith("sscache-")]) >= 3
    # The shards are gone from S3: another epoch is read from the cache alone.
    storage = Storage(url, options)
    for info in dataset.manifest.shards:
        storage.delete(info.path)
    storage.close()
    dataset.set_epoch(1)
    assert_exactly_once(keys_of(dataset), keys)
    uncached = shardstream.StreamingDataset(url, storage_options=options)
    with pytest.raises(StorageError, match="not found"):
        keys_of(uncached)


def test_parquet_rows_with_and_without_key_column(tmp_path):
    url = str(tmp_path / "pq")
    with ShardWriter(url, format="parquet", samples_per_shard=7) as writer:
        for i in range(20):
            writer.write({"__key__": f"row{i:02d}", "text": f"t{i}", "label": i, "scores": [i, i + 0.5]})
    samples = list(shardstream.StreamingDataset(url))
    assert len(samples) == 20
    by_key = {s["__key__"]: s for s in samples}
    assert by_key["row13"] == {"__key__": "row13", "text": "t13", "label": 13, "scores": [13.0, 13.5]}
    # Parquet written by another tool has no key column: the key is "<shard>:<row>".
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream.formats import get_format
    from shardstream.manifest import Manifest, ShardInfo

    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), other / "part-0.parquet")
    storage = Storage(str(other))
    with storage.open("part-0.parquet") as f:
        index, fields = get_format("parquet").build_index(f, name="part-0.parquet")
    storage.write("part-0.parquet.idx", index.to_bytes())
    size = os.path.getsize(other / "part-0.parquet")
    info = ShardInfo("part-0.parquet", 3, size, "0" * 64, "part-0.parquet.idx")
    storage.write_manifest(Manifest(format="parquet", shards=(info,), fields=fields))
    rows = list(shardstream.StreamingDataset(str(other), shuffle=False))
    assert rows == [{"__key__": f"part-0.parquet:{i}", "x": i + 1} for i in range(3)]


# -- reads ------------------------------------------------------------------------------------


class RecordingReads:
    """Every read the dataset makes (shards mapped or read, sidecars)."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[str, ByteRange | None]] = []
        original = ByteFetcher.read

        def read(fetcher, path, rng=None):
            self.reads.append((path, rng))
            return original(fetcher, path, rng)

        monkeypatch.setattr(ByteFetcher, "read", read)

    def shard_reads(self):
        return [(p, r) for p, r in self.reads if p.endswith(".tar")]


def test_reads_are_ranged_and_bounded_by_the_window(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    keys = write_dataset(url, [40] * 6)
    recorder = RecordingReads(monkeypatch)
    window = 12
    assert_exactly_once(keys_of(shardstream.StreamingDataset(url, shuffle_window=window, decode=False)), keys)
    reads = recorder.shard_reads()
    sizes = {info.path: info.bytes for info in Storage(url).read_manifest().shards}
    assert all(rng is not None and rng.length < sizes[path] for path, rng in reads)
    sample_bytes = max(sizes.values()) / 40
    assert max(rng.length for _, rng in reads) <= window * sample_bytes
    indexes = [p for p, _ in recorder.reads if p.endswith(".idx")]
    assert len(indexes) == len(set(indexes)) == 6  # each sidecar read once


def test_unshuffled_reads_are_one_per_shard(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    write_dataset(url, [10] * 4)
    recorder = RecordingReads(monkeypatch)
    list(shardstream.StreamingDataset(url, shuffle=False, shuffle_window=20))
    assert [p for p, _ in recorder.shard_reads()] == [f"shard-{i:06d}.tar" for i in range(4)]


def test_plan_reads_coalesces_close_runs_of_a_shard():
    def byte_ranges(shard, starts, stops):
        return 1000 * starts, 1000 * stops

    runs = [Run(0, 0, 3), Run(1, 0, 2), Run(0, 3, 5), Run(0, 8, 9), Run(0, 5000, 5001), Run(2, 4, 4)]
    reads = plan_reads(runs, byte_ranges, gap=COALESCE_GAP)
    assert [(r.shard, r.rng, r.runs) for r in reads] == [
        (0, ByteRange(0, 9000), (0, 2, 3)),
        (1, ByteRange(0, 2000), (1,)),
        (0, ByteRange(5_000_000, 5_001_000), (4,)),
    ]


def test_resumed_window_reads_its_holes_in_one_read(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    keys = write_dataset(url, [30])
    dataset = shardstream.StreamingDataset(url, shuffle_window=30, batch_size=5, decode=False)
    iterator = iter(dataset)
    head = [next(iterator)["__key__"] for _ in range(10)]
    state = dataset.state_dict()
    iterator.close()
    recorder = RecordingReads(monkeypatch)
    resumed = shardstream.StreamingDataset(url, shuffle_window=30, batch_size=5, decode=False)
    resumed.load_state_dict(state)
    assert_exactly_once(head + keys_of(resumed), keys)
    assert len(recorder.shard_reads()) == 1


# -- errors -----------------------------------------------------------------------------------


def corrupt_json_dataset(url):
    keys = []
    with ShardWriter(url, format="tar", samples_per_shard=5) as writer:
        for i in range(12):
            key = f"k{i:02d}"
            writer.write({"__key__": key, "json": b"{bad" if i in (3, 8) else b'{"i": %d}' % i})
            keys.append(key)
    return keys


def test_corrupt_sample_raises_naming_url_shard_and_key(tmp_path):
    url = str(tmp_path / "bad")
    corrupt_json_dataset(url)
    with pytest.raises(FormatError) as info:
        list(shardstream.StreamingDataset(url, shuffle=False))
    error = info.value
    assert "'k03'" in str(error)
    assert error.shard == "shard-000000.tar"
    assert error.url.endswith("shard-000000.tar")
    assert error.offset is not None


def test_on_error_skip_skips_counts_and_logs_once_per_shard(tmp_path, caplog):
    url = str(tmp_path / "bad")
    keys = corrupt_json_dataset(url)
    dataset = shardstream.StreamingDataset(url, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardstream.dataset"):
        got = keys_of(dataset)
    assert sorted(got) == sorted(k for k in keys if k not in ("k03", "k08"))
    assert dataset.num_skipped == 2
    warned = [r for r in caplog.records if "on_error='skip'" in r.getMessage()]
    assert len(warned) == 2  # k03 and k08 lie in two different shards
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardstream.dataset"):
        keys_of(dataset)
    assert dataset.num_skipped == 4
    assert not [r for r in caplog.records if "on_error='skip'" in r.getMessage()]


def test_pickle_is_refused_and_skipped_when_skipping(tmp_path):
    url = str(tmp_path / "pkl")
    with ShardWriter(url, format="tar", samples_per_shard=5) as writer:
        writer.write({"__key__": "a", "pkl": pickle.dumps({"x": 1})})
    with pytest.raises(shardstream.dataset.PickleRefusedError):
        list(shardstream.StreamingDataset(url, on_error="raise"))
    skipping = shardstream.StreamingDataset(url, on_error="skip")
    assert list(skipping) == []  # never unpickled: left out, as an undecodable sample is
    assert skipping.num_skipped == 1
    assert list(shardstream.StreamingDataset(url, allow_pickle=True)) == [{"__key__": "a", "pkl": {"x": 1}}]


def test_missing_shard_names_url_shard_and_byte_range(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [5, 5])
    os.remove(os.path.join(url, "shard-000001.tar"))
    with pytest.raises(StorageError) as info:
        list(shardstream.StreamingDataset(url, shuffle=False, on_error="skip"))
    error = info.value
    assert error.shard == "shard-000001.tar"
    assert "shard-000001.tar" in error.url
    assert "bytes [" in str(error)
    assert error.offset is not None


def test_truncated_shard_is_a_storage_error(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [5, 5])
    path = os.path.join(url, "shard-000000.tar")
    with open(path, "r+b") as f:
        f.truncate(1024)
    with pytest.raises(StorageError, match="past the end"):
        list(shardstream.StreamingDataset(url, shuffle=False))


def test_not_a_dataset(tmp_path):
    with pytest.raises(shardstream.ShardstreamError, match="manifest"):
        len(shardstream.StreamingDataset(str(tmp_path)))


@pytest.mark.parametrize(
    "kwargs",
    [{"on_error": "ignore"}, {"batch_size": 0}, {"shuffle_window": 0}, {"seed": 1.5}, {"transform": 3}],
)
def test_bad_options(local, kwargs):
    with pytest.raises(UsageError):
        shardstream.StreamingDataset(local[0], **kwargs)


# -- processes --------------------------------------------------------------------------------


def test_pickles_as_configuration(local):
    url, _ = local
    dataset = shardstream.StreamingDataset(url, seed=4)
    dataset.set_epoch(2)
    expected = keys_of(dataset)
    storage = dataset.storage
    again = pickle.loads(pickle.dumps(dataset))
    assert again.epoch == 2
    # the manifest travels, not re-read
    assert again.sources[0].__getstate__()["manifest"] == dataset.manifest
    assert again.storage is not storage  # a storage of its own, made where it is used
    assert keys_of(again) == expected


def test_storage_is_made_anew_after_fork(local):
    url, _ = local
    dataset = shardstream.StreamingDataset(url)
    parent = dataset.storage
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh Storage, which still reads the dataset
        try:
            ok = dataset.storage is not parent and len(keys_of(dataset)) == len(dataset)
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert dataset.storage is parent


def test_large_local_samples_are_read_right_and_never_mapped(tmp_path, monkeypatch):
    """Ranges of local files are read, not mapped: a mapped file truncated in place kills
    the process with SIGBUS (NOTE [ Getting the bytes ])."""
    import mmap

    url = str(tmp_path / "big")
    payloads = {f"b{i:02d}": os.urandom(100_000 + 1000 * i) for i in range(12)}
    with ShardWriter(url, format="tar", samples_per_shard=5) as writer:
        for key, data in payloads.items():
            writer.write({"__key__": key, "bin": data, "cls": b"1"})
    maps = []
    original = mmap.mmap

    def recording_mmap(*args, **kwargs):
        maps.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", recording_mmap)  # wherever storage would map from
    samples = list(shardstream.StreamingDataset(url, decode=False, shuffle_window=4))
    assert {s["__key__"]: s["bin"] for s in samples} == payloads
    assert all(type(s["bin"]) is bytes for s in samples)
    assert not maps, "local files were mapped"
    os.truncate(os.path.join(url, "shard-000001.tar"), 100_000)
    with pytest.raises(StorageError, match="changed since the manifest was written") as info:
        list(shardstream.StreamingDataset(url, decode=False, shuffle=False))
    assert info.value.shard == "shard-000001.tar"
