"""The optimised streaming read path: tar decode from bytes, mmaps and views of them
(NOTE [ Fast tar decode ]), generated sample builders with odd field names, whole-shard
GETs on object storage (NOTE [ Whole shards ]) and the per-Storage sidecar cache
(NOTE [ Sidecars across epochs ])."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import mmap
import os
import signal
import tarfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.dataset.reader import INDEX_CACHE_SIZE, IndexCache, WindowReader
from shardstream.errors import ShardstreamError, StorageError
from shardstream.formats import TarFormat
from shardstream.formats.tar.read import BLOCK, _owner, sample_builder
from shardstream.manifest import Manifest, ShardInfo
from shardstream.storage import Storage
from shardstream.types import ByteRange
from tests.faultproxy import FaultProxy
from tests.resume_harness import write_dataset
from tests.test_formats import write_shard

FMT = TarFormat()
N = 2 * BLOCK + 90  # runs cross the decoder's block boundaries


def uniform_samples(n: int) -> list[dict]:
    """Same fields in every sample (the generated-builder path); sizes vary, some empty."""
    return [
        {
            "__key__": f"u/{i:05d}",
            "bin": bytes([i % 251]) * (i * 37 % 2900),
            "cls": str(i).encode(),
            "txt": f"sample {i}".encode() * (i % 3),
        }
        for i in range(n)
    ]


def mixed_samples(n: int) -> list[dict]:
    """Fields that differ between samples (the one-dict-at-a-time path)."""
    samples = []
    for i in range(n):
        sample = {"__key__": f"m/{i:05d}", "cls": str(i).encode()}
        if i % 3:
            sample["bin"] = bytes([i % 7]) * (i * 53 % 2100)
        if i % 5 == 0:
            sample["json"] = b'{"i": %d}' % i
        samples.append(sample)
    return samples


@pytest.fixture(scope="module", params=["uniform", "mixed"])
def shard(request, tmp_path_factory):
    """``(samples, data, index, path)`` of a tar shard on disk."""
    samples = uniform_samples(N) if request.param == "uniform" else mixed_samples(N)
    data, index = write_shard(FMT, samples)
    assert (index.uniform_fields() is None) == (request.param == "mixed")
    path = tmp_path_factory.mktemp("tarread") / "shard.tar"
    path.write_bytes(data)
    return samples, data, index, str(path)


RUNS = [(0, N), (1, 2), (5, 300), (BLOCK - 1, 2 * BLOCK + 1), (400, N), (N - 1, N), (300, 300)]


def decode(data, rng: ByteRange, index, start: int, stop: int) -> list[dict]:
    return list(FMT.decode(data, rng, index, start, stop, name="shard.tar"))


def check_samples(got: list[dict], expected: list[dict]) -> None:
    assert got == expected
    for sample in got:
        for field, value in sample.items():
            if field != "__key__":
                assert type(value) is bytes, (sample["__key__"], field, type(value))


@pytest.mark.parametrize(("start", "stop"), RUNS)
def test_bytes_views_and_bytearrays_decode_the_same_samples(shard, start, stop):
    samples, data, index, _ = shard
    need = index.byte_range(start, stop)
    whole = ByteRange(0, len(data))
    tail = ByteRange(need.start, len(data))
    expected = samples[start:stop]
    check_samples(decode(data, whole, index, start, stop), expected)
    check_samples(decode(data[need.start : need.end], need, index, start, stop), expected)
    check_samples(decode(memoryview(data)[need.start :], tail, index, start, stop), expected)
    check_samples(decode(memoryview(data)[need.start : need.end], need, index, start, stop), expected)
    # Buffers that own no bytes/mmap: the values are still bytes.
    check_samples(decode(bytearray(data[need.start : need.end]), need, index, start, stop), expected)
    check_samples(decode(memoryview(bytearray(data))[need.start :], tail, index, start, stop), expected)


@pytest.mark.parametrize(("start", "stop"), RUNS)
def test_mapped_file_and_views_of_it_decode_the_same_samples(shard, start, stop):
    samples, data, index, path = shard
    need = index.byte_range(start, stop)
    expected = samples[start:stop]
    with open(path, "rb") as f:
        whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # As the dataset's fetcher maps a range: from an aligned offset, viewed from the range's start.
        base = need.start - need.start % mmap.ALLOCATIONGRANULARITY
        part = mmap.mmap(f.fileno(), max(need.end - base, 1), offset=base, access=mmap.ACCESS_READ)
    try:
        check_samples(decode(whole, ByteRange(0, len(data)), index, start, stop), expected)
        view = memoryview(whole)[need.start :]
        check_samples(decode(view, ByteRange(need.start, len(data)), index, start, stop), expected)
        view.release()
        view = memoryview(part)[need.start - base :]
        check_samples(decode(view, need, index, start, stop), expected)
        view.release()
    finally:
        whole.close()
        part.close()


def test_owner_of_a_view_is_its_bytes_or_mmap_and_the_view_offset(shard):
    """The fast path is taken: a view at an offset resolves to its owner, anything else not."""
    _, data, _, path = shard
    assert _owner(data) == (data, 0)
    got, offset = _owner(memoryview(data)[12345:])
    assert got is data
    assert offset == 12345
    got, offset = _owner(memoryview(data)[100:][23:])  # a view of a view keeps the owner
    assert got is data
    assert offset == 123
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        view = memoryview(mapped)[5000:9000]
        got, offset = _owner(view)
        assert got is mapped
        assert offset == 5000
        view.release()
    finally:
        mapped.close()
    assert _owner(bytearray(data)) == (None, 0)
    assert _owner(memoryview(bytearray(data))[10:]) == (None, 0)
    assert _owner(memoryview(data)[::2]) == (None, 0)  # not contiguous
    assert _owner(memoryview(data)[7:7]) == (None, 0)  # empty


def test_decoding_holds_a_mapped_range_until_it_is_cut(tmp_path):
    """Samples are cut lazily: the mmap cannot be closed under a live decode iterator."""
    samples = uniform_samples(2 * BLOCK)
    data, index = write_shard(FMT, samples)
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)[512:]
    iterator = FMT.decode(view, ByteRange(512, len(data)), index, 1, 2 * BLOCK, name="t")
    del view  # the decoder keeps it (and so the mapping) until every sample is cut
    first = next(iterator)
    with pytest.raises(BufferError):
        mapped.close()
    assert [first, *iterator] == samples[1:]
    del iterator
    mapped.close()


# -- generated sample builders ----------------------------------------------------------------

# Names that would break out of a naively quoted literal and run code: if any ran, it would
# append to the key (a list here) or raise.
INJECTIONS = [
    "a': key.append('ran'), 'b",
    'a": key.append("ran"), "b',
    "'+key.append('ran')+'",
    "a\\': key.append('ran'), 'b",
    "x'''}; key.append('ran'); {'''",
    'x"""}; key.append("ran"); {"""',
    "}, key.append('ran'), {",
    "\n'): key.append('ran') #",
]
ODD_NAMES = [
    "'",
    '"',
    "\\",
    "\\'",
    "'''",
    '"""',
    "\n",
    "\r\n\t",
    "{",
    "}",
    "{}",
    "{v0}",
    "%s",
    "ünïcødé",
    "ключ",
    "🙂",
    "\x00",
    "\ud800",
    "__import__('os')",
    "__import__('os').system('false')",
    "lambda: 0",
    "key",
    "v0",
    "__key__",
    "",
    *INJECTIONS,
]


def expected_sample(key, fields, values) -> dict:
    sample = {"__key__": key}
    sample.update(dict(zip(fields, values, strict=True)))
    return sample


def check_builder(fields: tuple[str, ...]) -> None:
    key: list[str] = []
    values = [f"value {i}".encode() for i in range(len(fields))]
    got = sample_builder(fields)(key, *values)
    assert key == [], "a field name was executed"
    expected = expected_sample(key, fields, values)
    assert list(got.items()) == list(expected.items())  # same keys, values and order


@pytest.mark.parametrize("name", ODD_NAMES, ids=ascii)
def test_builder_with_one_odd_name(name):
    check_builder((name,))
    check_builder(("cls", name, "txt"))


def test_builder_with_all_odd_names_and_repeats():
    check_builder(tuple(ODD_NAMES))
    check_builder(("a", "b", "a"))  # a repeated name keeps its last value, in its first place
    check_builder(("'", "b", "'", "'"))
    check_builder(())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=6))
def test_builder_equals_dict_zip(fields):
    check_builder(tuple(fields))


def foreign_tar(samples: list[dict]) -> bytes:
    """A tar written by Python's tarfile (another tool), members in the samples' field order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for sample in samples:
            for field, value in sample.items():
                if field != "__key__":
                    info = tarfile.TarInfo(f"{sample['__key__']}.{field}")
                    info.size = len(value)
                    archive.addfile(info, io.BytesIO(value))
    return buffer.getvalue()


def test_odd_field_names_from_another_tool_decode_as_written():
    # a name starting with "_" (metadata, such as __key__) is refused by the index: see test_tar_hostile
    names = ["a'b", 'q"x', "back\\slash", "{brace}", "ünï", "x=__import__('os')", *INJECTIONS[:3]]
    samples = [
        {"__key__": f"k{i:03d}", **{name: f"{i}:{j}".encode() * j for j, name in enumerate(names)}}
        for i in range(BLOCK + 5)
    ]
    data = foreign_tar(samples)
    index, _ = FMT.build_index(io.BytesIO(data), name="foreign.tar")
    assert index.uniform_fields() == tuple(names)
    assert decode(data, ByteRange(0, len(data)), index, 0, len(samples)) == samples
    need = index.byte_range(3, BLOCK + 4)
    tail = memoryview(data)[need.start :]
    assert decode(tail, ByteRange(need.start, len(data)), index, 3, BLOCK + 4) == samples[3 : BLOCK + 4]


# -- whole shards on object storage -----------------------------------------------------------

# Samples 0-7 of a shard take 17920 bytes in the tar (16 KiB payload), later ones 2560: a run
# [0, 4) leaves 83 KiB of a 12-sample shard (more than WHOLE_SHARD_SLACK), [0, 6) 46 KiB.
SAMPLE_BYTES = 17920


def payload_size(i: int) -> int:
    return 16 * 1024 if i < 8 else 1024


def write_big(url: str, shard_sizes: list[int], options: dict) -> dict[str, bytes]:
    """A tar dataset with 16 KiB and 1 KiB samples; returns ``{key: payload}``."""
    storage = Storage(url, options)
    payloads, shards = {}, []
    for shard, count in enumerate(shard_sizes):
        path = f"shard-{shard:06d}.tar"
        buffer = io.BytesIO()
        encoder = FMT.encoder(buffer, name=path)
        for i in range(count):
            key = f"s{shard}-{i:03d}"
            payloads[key] = key.encode().ljust(payload_size(i), bytes([65 + i]))
            encoder.write({"__key__": key, "bin": payloads[key], "cls": str(i).encode()})
        sidecar = encoder.close().to_bytes()
        data = buffer.getvalue()
        storage.write(path, data)
        storage.write(path + ".idx", sidecar)
        digest = hashlib.sha256(data).hexdigest()
        shards.append(ShardInfo(path, count, len(data), digest, path + ".idx", len(sidecar)))
    storage.write_manifest(Manifest(format="tar", shards=tuple(shards), fields=("bin", "cls")))
    storage.close()
    return payloads


class RecordingProxy(FaultProxy):
    """A proxy that injects nothing and records the Range header of every GET."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, seed=0, error_rate=0.0, reset_rate=0.0, truncate_rate=0.0)
        self.gets: list[tuple[str, str]] = []

    def decide(self, method: str, path: str, byte_range: str) -> str:
        if method == "GET":
            self.gets.append((path.split("?")[0].rsplit("/", 1)[-1], byte_range))
        return super().decide(method, path, byte_range)

    def shard_ranges(self) -> list[str]:
        return [rng for name, rng in self.gets if name.endswith(".tar")]


@pytest.mark.s3
@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (12, [""]),  # the whole shard: a plain GET
        (6, ["", "ranged"]),  # [0, 6) leaves less than WHOLE_SHARD_SLACK: a plain GET; [6, 12) not
        (4, ["ranged"] * 3),  # [0, 4) leaves more: ranged, as are runs not at the start
    ],
)
def test_whole_shard_read_is_a_plain_get(s3, moto_server, window, expected):
    base, options = s3
    url = f"{base}/ds"
    payloads = write_big(url, [12], options)
    with RecordingProxy(moto_server.endpoint) as proxy:
        dataset = shardstream.StreamingDataset(
            url,
            storage_options=dict(options, endpoint_url=proxy.endpoint),
            shuffle=False,
            shuffle_window=window,
            decode=False,
        )
        got = {s["__key__"]: s["bin"] for s in dataset}
        dataset.storage.close()
    assert got == payloads
    ranges = proxy.shard_ranges()
    # windows are fetched ahead concurrently on object storage: their GETs come in any order
    assert sorted("ranged" if r.startswith("bytes=") else r for r in ranges) == sorted(expected), ranges


@pytest.mark.s3
@pytest.mark.parametrize("on_error", ["raise", "skip"])
# Either way the shard's first read finds its size changed (NOTE [ Reads check the manifest ]).
@pytest.mark.parametrize(("window", "offset"), [(24, 0), (4, 0)], ids=["whole-get", "ranged"])
def test_shard_shorter_than_the_manifest_says_names_the_shard(s3, window, offset, on_error):
    base, options = s3
    url = f"{base}/ds"
    write_big(url, [12, 12], options)
    storage = Storage(url, options)
    storage.write("shard-000001.tar", storage.read("shard-000001.tar")[:100_000])
    storage.close()
    dataset = shardstream.StreamingDataset(
        url, storage_options=options, shuffle=False, shuffle_window=window, on_error=on_error
    )
    with pytest.raises(StorageError, match="changed since the manifest was written") as info:
        list(dataset)
    dataset.storage.close()
    error = info.value
    assert isinstance(error, ShardstreamError)
    assert error.shard == "shard-000001.tar"
    assert error.url == f"{url}/shard-000001.tar"
    assert error.offset == offset  # the read that came up short: the whole shard, or [4, 8)


# -- sidecars across epochs -------------------------------------------------------------------


class SidecarReads:
    def __init__(self, monkeypatch):
        self.paths: list[str] = []
        original = Storage.read

        def read(storage, path, rng=None, **kwargs):
            if path.endswith(".idx"):
                self.paths.append(path)
            return original(storage, path, rng, **kwargs)

        monkeypatch.setattr(Storage, "read", read)


def test_sidecars_are_read_once_for_two_epochs(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    keys = write_dataset(url, [5, 7, 4])
    reads = SidecarReads(monkeypatch)
    dataset = shardstream.StreamingDataset(url, decode=False, shuffle_window=6)
    first = [s["__key__"] for s in dataset]
    dataset.set_epoch(1)
    second = [s["__key__"] for s in dataset]
    assert sorted(first) == sorted(second) == sorted(keys)
    assert first != second
    assert sorted(reads.paths) == [f"shard-{i:06d}.tar.idx" for i in range(3)]
    # Another dataset has another Storage, and reads them again.
    assert len(list(shardstream.StreamingDataset(url, decode=False))) == len(keys)
    assert len(reads.paths) == 6


def test_windows_fetched_at_once_read_each_sidecar_once(tmp_path, monkeypatch):
    """NOTE [ One read per sidecar ]: a sidecar being read is waited for, not read again."""
    url = str(tmp_path / "ds")
    write_dataset(url, [5, 7, 4])
    reads = SidecarReads(monkeypatch)
    slow = Storage.read

    def read(storage, path, rng=None, **kwargs):
        time.sleep(0.2 if path.endswith(".idx") else 0)  # both windows ask while the first reads
        return slow(storage, path, rng, **kwargs)

    monkeypatch.setattr(Storage, "read", read)
    storage = Storage(url)
    reader = WindowReader(storage, storage.read_manifest())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(reader.load_indexes, [[0, 1, 2], [2, 1]]))
    assert sorted(reads.paths) == [f"shard-{i:06d}.tar.idx" for i in range(3)]
    assert [index.num_samples for index in got[0].values()] == [5, 7, 4]
    assert got[1] == {2: got[0][2], 1: got[0][1]}
    reader.close()


def test_sidecar_cache_is_keyed_by_the_manifest_entry(tmp_path):
    url = str(tmp_path / "ds")
    write_dataset(url, [5])
    storage, indexes = Storage(url), IndexCache()  # one dataset's LRU, shared by its readers
    old = storage.read_manifest()
    assert WindowReader(storage, old, indexes=indexes).index(0).num_samples == 5
    write_dataset(url, [7])  # the same path rewritten, in a new manifest
    new = storage.read_manifest()
    assert new.shards[0].path == old.shards[0].path
    assert WindowReader(storage, new, indexes=indexes).index(0).num_samples == 7
    assert WindowReader(storage, old, indexes=indexes).index(0).num_samples == 5  # still cached


def test_a_window_of_more_shards_than_the_lru_reads_each_sidecar_once(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    shards = 2 * INDEX_CACHE_SIZE + 8
    keys = write_dataset(url, [4] * shards)
    reads = SidecarReads(monkeypatch)
    dataset = shardstream.StreamingDataset(url, decode=False, shuffle_window=4 * shards)
    assert sorted(s["__key__"] for s in dataset) == sorted(keys)
    assert sorted(reads.paths) == [f"shard-{i:06d}.tar.idx" for i in range(shards)]


def test_sidecar_cache_is_a_bounded_lru(tmp_path, monkeypatch):
    url = str(tmp_path / "ds")
    shards = INDEX_CACHE_SIZE + 4
    write_dataset(url, [1] * shards)
    reads = SidecarReads(monkeypatch)
    dataset = shardstream.StreamingDataset(url, decode=False, shuffle_window=1)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        assert len(list(dataset)) == shards
    cache = dataset.sources[0].indexes
    assert cache.size == INDEX_CACHE_SIZE
    assert sum(cache.get(info) is not None for info in dataset.manifest.shards) == INDEX_CACHE_SIZE
    assert shards + 4 <= len(reads.paths) < 2 * shards  # evicted ones read again, the rest not

    infos = dataset.manifest.shards[:3]
    lru = IndexCache(size=2)
    lru.put(infos[0], "a")
    lru.put(infos[1], "b")
    assert lru.get(infos[0]) == "a"  # now the most recently used
    lru.put(infos[2], "c")
    assert [lru.get(info) for info in infos] == ["a", None, "c"]


def test_sidecar_cache_is_made_anew_in_a_forked_child(tmp_path):
    """The dataset keeps its sidecars with its Storage, and a fork child makes both anew
    (the parent's cache and its lock are never used there)."""
    url = str(tmp_path / "ds")
    write_dataset(url, [5, 6])
    dataset = shardstream.StreamingDataset(url, decode=False)
    assert len(list(dataset)) == 11
    info = dataset.manifest.shards[0]
    parent_cache = dataset.sources[0].indexes
    assert parent_cache is not None
    assert parent_cache.get(info) is not None
    read, write = os.pipe()
    # Fork while another thread would hold the cache's lock: the child must not use it.
    lock = parent_cache._lock
    lock.acquire()
    try:
        pid = os.fork()
    except BaseException:
        lock.release()
        raise
    if pid == 0:  # the child
        answer = b"error"
        try:
            os.close(read)
            signal.alarm(20)  # a deadlock on an inherited lock ends the child
            count = len(list(dataset))  # a new Storage, and with it a new cache
            cache = dataset.sources[0].indexes
            fresh = cache is not parent_cache and count == 11 and cache.get(info) is not None
            answer = f"fresh={fresh}".encode()
        finally:
            os.write(write, answer)
            os._exit(0)
    lock.release()
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    assert answer == b"fresh=True"
    assert dataset.sources[0].indexes is parent_cache
    assert parent_cache.get(info) is not None
