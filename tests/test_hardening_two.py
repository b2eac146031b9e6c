"""Hardening, round two (issue 39): no write outside the destination, clear refusals of
folders that are not what they seem."""

from __future__ import annotations

import http.client
import json
import logging
import multiprocessing
import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardstream
from shardstream.catalog import index_dataset, verify_dataset
from shardstream.cli import main
from shardstream.dataset.fetch import expectations
from shardstream.errors import PackError, ShardstreamError, StorageError, TransientStorageError, UsageError
from shardstream.pack import ShardWriter, pack
from shardstream.storage import Expected, ReadPool, RetryPolicy, Storage
from shardstream.storage import cached as cached_module
from shardstream.testing.wanproxy import ForwardingProxy, ProxyHandler
from shardstream.types import ByteRange
from tests.test_pack_restart import snapshot
from tests.test_storage_hardening import stream, write


def corpus(path, tag: str = "doc", count: int = 30):
    path.write_text("".join(json.dumps({"txt": f"{tag} {i}", "cls": i % 3}) + "\n" for i in range(count)))
    return path


@pytest.fixture
def linked(tmp_path):
    """Datasets A and B, A's ``.shardstream`` a link to B's."""
    source = corpus(tmp_path / "c.jsonl")
    pack(source, tmp_path / "B", samples_per_shard=10)
    pack(source, tmp_path / "A", samples_per_shard=10)
    shutil.rmtree(tmp_path / "A" / ".shardstream")
    os.symlink(tmp_path / "B" / ".shardstream", tmp_path / "A" / ".shardstream")
    return tmp_path


# -- item 1: a linked metadata folder ---------------------------------------------------


def test_pack_overwrite_refuses_a_metadata_folder_linked_to_another_dataset(linked, capsys):
    other = corpus(linked / "other.jsonl", "other")
    before = snapshot(linked / "B")
    args = ["pack", str(other), str(linked / "A"), "--overwrite", "--samples-per-shard", "10", "--quiet"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert f"{linked / 'A' / '.shardstream'} is a symbolic link to {linked / 'B' / '.shardstream'}" in err
    assert "outside the dataset folder" in err
    assert snapshot(linked / "B") == before  # B is whole: nothing of it replaced or deleted
    assert verify_dataset(str(linked / "B")).ok


def write_one(folder) -> None:
    with ShardWriter(folder, samples_per_shard=4, overwrite=True) as writer:
        writer.write({"__key__": "a", "txt": "x"})


@pytest.mark.parametrize("write", [index_dataset, write_one])
def test_index_and_a_shard_writer_refuse_the_link_too(linked, write):
    before = snapshot(linked / "B")
    with pytest.raises(StorageError, match=r"is a symbolic link to .* outside the dataset folder") as caught:
        write(str(linked / "A"))
    assert caught.value.url == str(linked / "A" / ".shardstream")
    assert snapshot(linked / "B") == before


def test_a_link_inside_the_folder_and_a_linked_root_still_pack(tmp_path):
    source = corpus(tmp_path / "c.jsonl")
    (tmp_path / "real" / "meta").mkdir(parents=True)
    os.symlink("meta", tmp_path / "real" / ".shardstream")  # leads inside the folder: allowed
    os.symlink(tmp_path / "real", tmp_path / "named")  # the root the user names may be a link
    assert pack(source, tmp_path / "named", samples_per_shard=10).num_samples == 30
    assert verify_dataset(str(tmp_path / "named")).ok
    assert "manifest.json" in os.listdir(tmp_path / "real" / "meta")


def test_storage_refuses_every_write_and_delete_through_an_outside_link(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_bytes(b"keep")
    (tmp_path / "ds").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "ds" / "sub")
    storage = Storage(str(tmp_path / "ds"))
    with pytest.raises(StorageError, match="symbolic link"):
        storage.write("sub/x.bin", b"x")
    with pytest.raises(StorageError, match="symbolic link"), storage.writer("sub/y.bin") as f:
        f.write(b"y")
    with pytest.raises(StorageError, match="symbolic link"):
        storage.delete("sub/keep.txt")
    with pytest.raises(StorageError, match="symbolic link"):
        storage.remove_temp_files(lambda name: True, "sub")
    assert sorted(os.listdir(tmp_path / "elsewhere")) == ["keep.txt"]
    assert storage.read("sub/keep.txt") == b"keep"  # reads follow the link as before


# -- item 12: a metadata folder that is a file ------------------------------------------


@pytest.mark.parametrize("command", ["index", "pack"])
def test_a_metadata_folder_that_is_a_file_is_named(tmp_path, capsys, command):
    source = corpus(tmp_path / "c.jsonl")
    pack(source, tmp_path / "A", samples_per_shard=10)
    shutil.rmtree(tmp_path / "A" / ".shardstream")
    (tmp_path / "A" / ".shardstream").write_text("not a folder")
    if command == "index":
        args = ["index", str(tmp_path / "A")]
    else:
        args = [
            "pack",
            str(source),
            str(tmp_path / "A"),
            "--overwrite",
            "--samples-per-shard",
            "10",
            "--quiet",
        ]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'A' / '.shardstream'} is a regular file, not a folder" in err
    assert "move the file away" in err
    assert (tmp_path / "A" / ".shardstream").read_text() == "not a folder"


# -- item 2: a body that arrives one byte at a time ---------------------------------------


class DripProxy(ForwardingProxy):
    """A proxy that sends each GET's body one byte every ``interval`` seconds."""

    def __init__(self, upstream: str, *, interval: float) -> None:
        super().__init__(upstream)
        self.interval = interval

    def write_body(self, handler: ProxyHandler, response: http.client.HTTPResponse) -> int:
        data = response.read()
        for i in range(len(data)):
            handler.wfile.write(data[i : i + 1])
            if self._stopping.wait(self.interval):
                raise ConnectionAbortedError("proxy stopping")
        return len(data)


# An option that only a botocore client honours (NOTE [ Lean GETs ]): reads go through it.
BOTOCORE = {"tcp_keepalive": False}


@pytest.fixture
def dripping(s3, moto_server):
    """A 4 KiB object behind a proxy that drips bodies at 20 bytes/s; (url, options)."""
    base, options = s3
    with Storage(f"{base}/ds", options) as storage:
        storage.write("shard-000000.tar", bytes(range(256)) * 16)
    with DripProxy(moto_server.endpoint, interval=0.05) as proxy:
        yield f"{base}/ds", {**options, "endpoint_url": proxy.endpoint}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("client", ["lean", "botocore"])
@pytest.mark.parametrize("how", ["range", "whole", "parts"])
def test_a_dripping_body_fails_within_the_read_timeout(dripping, client, how):
    url, options = dripping
    config = {"connect_timeout": 5, "read_timeout": 5, **(BOTOCORE if client == "botocore" else {})}
    retry = RetryPolicy(attempts=50, base_delay=0.01, max_delay=0.02, timeout=1.5)
    storage = Storage(url, {**options, "config_kwargs": config}, retry=retry)
    pool = ReadPool(2)
    reads = {
        "range": lambda: storage.read("shard-000000.tar", ByteRange(0, 4000)),
        "whole": lambda: storage.read("shard-000000.tar"),
        "parts": lambda: storage.read_parts("shard-000000.tar", ByteRange(0, 4096), expect=None, pool=pool),
    }
    try:
        with pytest.raises(TransientStorageError) as info:
            reads[how]()
    finally:
        pool.close()
        storage.close()
    message = str(info.value)
    assert "RetryPolicy.timeout 1.5 s" in message, message
    assert "the body was still arriving at the read's deadline" in message, message
    assert info.value.url == f"{url}/shard-000000.tar"


@pytest.mark.timeout(60)
def test_min_rate_lets_a_slow_steady_body_finish_and_bounds_it_still(dripping):
    url, options = dripping
    slow = RetryPolicy(attempts=3, base_delay=0.01, timeout=0.5, min_rate=5)  # 60 s for 300 bytes
    with Storage(url, options, retry=slow) as storage:
        assert storage.read("shard-000000.tar", ByteRange(0, 30)) == bytes(range(30))  # ~1.5 s
    tight = RetryPolicy(attempts=3, base_delay=0.01, timeout=0.5, min_rate=1000)
    with Storage(url, options, retry=tight) as storage, pytest.raises(TransientStorageError) as info:
        storage.read("shard-000000.tar", ByteRange(0, 1000))
    assert "1.0 s at RetryPolicy.min_rate 1000 bytes/s" in str(info.value)


def test_min_rate_is_validated():
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(UsageError, match=r"RetryPolicy\.min_rate"):
            RetryPolicy(min_rate=bad)
    assert RetryPolicy(timeout=10, min_rate=100).budget(5000) == 50
    assert RetryPolicy(timeout=10, min_rate=100).budget(50) == 10
    assert RetryPolicy(timeout=None, min_rate=100).budget(5000) is None


# -- item 5: a cache shared by processes under a small limit ------------------------------


SHARDS = {f"shard-{n:06d}.tar": bytes([n]) * 5000 + os.urandom(3000) for n in range(4)}


@pytest.fixture
def remote(s3):
    base, options = s3
    with Storage(f"{base}/ds", options) as storage:
        for name, data in SHARDS.items():
            storage.write(name, data)
    return f"{base}/ds", options


def vanishing(monkeypatch, times: int) -> list[str]:
    """Make each cache entry vanish (as another process's eviction does) right after it is
    fetched, the first ``times`` times; the entries that vanished."""
    real = cached_module.cached_path
    gone: list[str] = []

    def fetched_then_evicted(*args, **kwargs):
        entry = real(*args, **kwargs)
        if len(gone) < times:
            os.unlink(entry)
            gone.append(entry)
        return entry

    monkeypatch.setattr(cached_module, "cached_path", fetched_then_evicted)
    return gone


@pytest.mark.parametrize("times", [1, 100])  # fetched again; read uncached when it keeps vanishing
@pytest.mark.parametrize("how", ["map", "read", "open"])
def test_a_cache_entry_evicted_before_it_is_read_is_fetched_again(remote, tmp_path, monkeypatch, how, times):
    url, options = remote
    gone = vanishing(monkeypatch, times)
    name, data = "shard-000001.tar", SHARDS["shard-000001.tar"]
    expect = Expected(len(data))
    with Storage(url, options, cache_dir=str(tmp_path / "cache"), cache_limit=1) as storage:
        if how == "map":
            got = bytes(storage.map(name, ByteRange(10, 6000), expect=expect))
            assert got == data[10:6000]
        elif how == "read":
            assert storage.read(name, ByteRange(10, 6000), expect=expect) == data[10:6000]
        else:
            with storage.open(name, expect=expect) as f:
                assert f.read() == data
    assert gone


def _read_everything(url: str, options: dict, cache: str, rounds: int) -> None:
    with Storage(url, options, cache_dir=cache, cache_limit=1) as storage:
        for _ in range(rounds):
            for name, data in SHARDS.items():
                expect = Expected(len(data))
                if bytes(storage.map(name, ByteRange(100, 7000), expect=expect)) != data[100:7000]:
                    raise SystemExit(3)
                if storage.read(name, ByteRange(0, 50), expect=expect) != data[:50]:
                    raise SystemExit(4)


@pytest.mark.timeout(120)
def test_readers_sharing_a_cache_with_a_tiny_limit_never_die(remote, tmp_path):
    url, options = remote
    context = multiprocessing.get_context("fork")
    readers = [
        context.Process(target=_read_everything, args=(url, options, str(tmp_path / "cache"), 15))
        for _ in range(4)
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(100)
    assert [reader.exitcode for reader in readers] == [0, 0, 0, 0]


# -- item 6: a corrupt cache entry ------------------------------------------------------


def entry_of(url: str, options: dict, cache, shard: int = 0, sidecar: bool = False) -> str:
    """The cache file of shard number ``shard`` of the dataset at ``url`` (or of its sidecar)."""
    with Storage(url, options, cache_dir=str(cache)) as storage:
        manifest = storage.read_manifest()
        info = manifest.shards[shard]
        path = info.index if sidecar else info.path
        key = cached_module.cache_key(storage, path)
        return storage._cache.entry_path(key, expectations(manifest)[path].content_key)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture
def cached_dataset(s3, tmp_path):
    base, options = s3
    url = f"{base}/ds"
    write(url, 7, options)
    cache = tmp_path / "cache"
    assert set(stream(url, storage_options=options, cache_dir=str(cache)).values()) == {b"\x07" * 1000}
    return url, options, cache


def test_a_corrupt_sidecar_in_the_cache_is_fetched_again_too(cached_dataset, caplog):
    url, options, cache = cached_dataset
    sidecar = entry_of(url, options, cache, shard=1, sidecar=True)
    flip(sidecar, 40)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = stream(url, storage_options=options, cache_dir=str(cache))
    assert got == {f"k{i:03d}": b"\x07" * 1000 for i in range(20)}
    warned = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
    assert len(warned) == 1, warned
    assert sidecar in warned[0]


@pytest.mark.parametrize("harm", ["flip", "swap"])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_corrupt_cache_entry_is_dropped_and_fetched_again_with_a_warning(
    cached_dataset, caplog, harm, on_error
):
    url, options, cache = cached_dataset
    first = entry_of(url, options, cache)
    if harm == "flip":
        flip(first, 3000)
    else:  # another dataset's entry of the same size in its place
        other = url.replace("/ds", "/other")
        write(other, 8, options)
        stream(other, storage_options=options, cache_dir=str(cache))
        shutil.copyfile(entry_of(other, options, cache), first)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = stream(url, storage_options=options, cache_dir=str(cache), on_error=on_error)
    assert got == {f"k{i:03d}": b"\x07" * 1000 for i in range(20)}  # every sample, exact
    warned = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
    assert len(warned) == 1, warned
    assert first in warned[0]
    assert "fetched again" in warned[0]
    assert os.path.exists(first)  # filled again, whole
    assert stream(url, storage_options=options, cache_dir=str(cache)) == got


def test_a_second_failure_after_the_entry_is_fetched_again_is_an_error(cached_dataset, caplog):
    url, options, cache = cached_dataset
    with Storage(url, options) as storage:  # the object itself changes, as its cache entry
        data = bytearray(storage.read("shard-000000.tar"))
        data[3000] ^= 0x10
        storage.write("shard-000000.tar", bytes(data))
    flip(entry_of(url, options, cache), 3000)
    with pytest.raises(ShardstreamError, match=r"CRC-32|checksum") as info:
        stream(url, storage_options=options, cache_dir=str(cache))
    assert info.value.url == f"{url}/shard-000000.tar"


# -- item 7: types that change between shards -------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_parquet_shards_that_disagree_on_a_columns_type_are_refused(tmp_path, capsys, workers):
    rows = [{"__key__": f"s{i:03d}", "txt": f"row {i}", "cls": i if i < 10 else str(i)} for i in range(20)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["pack", str(tmp_path / "c.jsonl"), str(tmp_path / "ds"), "--format", "parquet"]
    assert main([*args, "--samples-per-shard", "10", "--workers", str(workers), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "column 'cls' is int64 in shard-000000.parquet (from sample 's000')" in err, err
    assert "but string in shard-000001.parquet (from sample 's010')" in err, err
    assert "one dataset has one schema" in err
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()


def test_a_column_empty_in_one_shard_takes_the_others_type(tmp_path):
    rows = [{"__key__": f"s{i:03d}", "cls": None if i < 10 else i} for i in range(20)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = pack(tmp_path / "c.jsonl", tmp_path / "ds", format="parquet", samples_per_shard=10)
    assert manifest.schema["cls"] == "int64"


# -- item 8: a missing field --------------------------------------------------------------


def _missing_field_corpus(tmp_path):
    rows = [{"__key__": f"s{i:03d}", "txt": f"row {i}"} | ({"cls": i} if i % 3 else {}) for i in range(24)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


@pytest.mark.parametrize("decode", [False, True])
def test_a_missing_field_is_none_in_tar_and_parquet_alike(tmp_path, decode):
    rows = _missing_field_corpus(tmp_path)
    got = {}
    for fmt in ("tar", "parquet"):
        # 8 per shard: shard 0 of a tar has samples both with and without cls
        pack(tmp_path / "c.jsonl", tmp_path / fmt, format=fmt, samples_per_shard=8)
        dataset = shardstream.StreamingDataset(str(tmp_path / fmt), shuffle=False, decode=decode)
        got[fmt] = {s["__key__"]: s for s in dataset}
        assert sorted(got[fmt]) == [row["__key__"] for row in rows]
        for row in rows:
            sample = got[fmt][row["__key__"]]
            assert "cls" in sample, (fmt, sample)
            assert (sample["cls"] is None) == ("cls" not in row), (fmt, sample)
        mapped = shardstream.MapDataset(str(tmp_path / fmt), decode=decode)
        assert mapped[0]["cls"] is None
        assert set(mapped[0]) == set(got[fmt]["s000"])
    if decode:
        assert got["tar"] == got["parquet"]


def test_a_field_only_some_shards_have_is_none_in_the_others(tmp_path):
    rows = [{"__key__": f"s{i:03d}", "txt": f"row {i}"} | ({"cls": i} if i >= 8 else {}) for i in range(16)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for fmt in ("tar", "parquet"):
        pack(tmp_path / "c.jsonl", tmp_path / fmt, format=fmt, samples_per_shard=8)
        samples = list(shardstream.StreamingDataset(str(tmp_path / fmt), shuffle=False))
        assert [s["cls"] for s in samples] == [None] * 8 + list(range(8, 16)), fmt


# -- item 9: numbers that overflow, map columns ---------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_a_uint64_column_above_int64_packs_from_parquet(tmp_path, fmt):
    values = [1, 2**64 - 1, 2**63] + ([None] if fmt == "parquet" else [])  # a tar sample needs a field
    pq.write_table(pa.table({"u": pa.array(values, pa.uint64())}), tmp_path / "u.parquet")
    manifest = pack(tmp_path / "u.parquet", tmp_path / "ds", format=fmt)
    got = [s["u"] for s in shardstream.StreamingDataset(str(tmp_path / "ds"), shuffle=False, decode=False)]
    if fmt == "parquet":
        assert manifest.schema["u"] == "uint64"
        assert got == values
        assert pq.read_table(tmp_path / "ds" / "shard-000000.parquet").column("u").to_pylist() == values
    else:
        assert got == [str(v).encode() for v in values]


@pytest.mark.parametrize("fmt", ["parquet", "tar"])
def test_a_map_column_packs_as_key_value_pairs(tmp_path, fmt):
    maps = [[("a", 1), ("b", 2)], [], None, [("c", None)]]
    column = pa.array(maps, pa.map_(pa.string(), pa.int64()))
    nested = pa.array([{"m": m} for m in maps], pa.struct([pa.field("m", pa.map_(pa.string(), pa.int64()))]))
    pq.write_table(pa.table({"m": column, "s": nested}), tmp_path / "m.parquet")
    pack(tmp_path / "m.parquet", tmp_path / "ds", format=fmt)
    got = list(shardstream.StreamingDataset(str(tmp_path / "ds"), shuffle=False))
    pairs = [None if m is None else [{"key": k, "value": v} for k, v in m] for m in maps]
    if fmt == "parquet":
        assert [s["m"] for s in got] == pairs
        assert [s["s"]["m"] for s in got] == pairs
    else:  # JSON text (the field has no extension that decodes it)
        assert [json.loads(s["m"]) for s in got if s["m"] is not None] == [p for p in pairs if p is not None]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1, 10**30, 3], r"column 'n': sample '000000001' holds 1000000000000000000000000000000, beyond"),
        ([-1, 2**63], r"column 'n': its values need more than 64 bits"),
        ([1] * 1100 + [2**64], r"sample '000001100': column 'n' value 18446744073709551616 does not fit"),
        ([[1, 2**64]], r"column 'n': its values need more than 64 bits"),
    ],
)
def test_integers_beyond_64_bits_are_refused_naming_the_sample(tmp_path, values, message):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"n": v}) + "\n" for v in values))
    with pytest.raises(PackError, match=message) as caught:
        pack(tmp_path / "c.jsonl", tmp_path / "ds", format="parquet")
    assert caught.value.shard == "shard-000000.parquet"
    assert "store such numbers as strings" in str(caught.value) or "does not fit" in str(caught.value)


# -- item 12: messages that mislead ---------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_a_txt_that_is_not_utf8_is_named_not_the_samples_first_file(tmp_path, workers):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cls").write_bytes(b"1")
    (src / "a.txt").write_bytes(b"\xff\xfe bad")
    (src / "b.cls").write_bytes(b"2")
    (src / "b.txt").write_bytes(b"ok")
    with pytest.raises(PackError, match=r"field 'txt' is .* not UTF-8 text") as caught:
        pack(src, tmp_path / "ds", format="parquet", workers=workers)
    assert caught.value.url == f"{src}/a.txt"


@pytest.mark.parametrize("url", ["s3://", "s3:///", "memory://"])
def test_a_url_with_no_bucket_is_refused_not_read_as_a_local_folder(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"the URL names no (bucket|folder)"):
        list(shardstream.StreamingDataset(url))
    with pytest.raises(UsageError, match=r"the URL names no (bucket|folder)"):
        Storage(url)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(("url", "says"), [("s3:", "names no bucket"), ("s3:/bucket/ds", "s3://bucket/ds?")])
def test_a_url_that_lost_a_slash_is_refused_naming_it(tmp_path, monkeypatch, capsys, url, says):
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", url]) == 2
    assert says in capsys.readouterr().err
    (tmp_path / "c.jsonl").write_text('{"txt": "a"}\n')
    with pytest.raises(UsageError, match=re.escape(says)):
        pack(tmp_path / "c.jsonl", url)
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl"]


def test_reading_a_dataset_whose_metadata_folder_is_a_file_names_it(tmp_path, capsys):
    source = corpus(tmp_path / "c.jsonl")
    pack(source, tmp_path / "A", samples_per_shard=10)
    shutil.rmtree(tmp_path / "A" / ".shardstream")
    (tmp_path / "A" / ".shardstream").write_text("not a folder")
    assert main(["inspect", str(tmp_path / "A")]) == 1
    assert f"{tmp_path / 'A' / '.shardstream'} is a regular file, not a folder" in capsys.readouterr().err
    with pytest.raises(StorageError, match="is a regular file, not a folder"):
        list(shardstream.StreamingDataset(str(tmp_path / "A")))


def test_a_missing_bucket_says_so_on_read_and_on_pack(s3, tmp_path):
    _, options = s3
    url = "s3://no-such-bucket-here/ds"
    with pytest.raises(ShardstreamError, match="bucket 'no-such-bucket-here' does not exist"):
        list(shardstream.StreamingDataset(url, storage_options=options))
    with pytest.raises(ShardstreamError, match="bucket 'no-such-bucket-here' does not exist"):
        pack(corpus(tmp_path / "c.jsonl"), url, storage_options=options)


def test_a_map_dataset_heals_a_cache_entry_corrupted_after_its_first_read(cached_dataset, caplog):
    url, options, cache = cached_dataset
    dataset = shardstream.MapDataset(url, storage_options=options, cache_dir=str(cache), decode=False)
    assert dataset[3]["bin"] == b"\x07" * 1000  # its check blocks read, and its CRC recorded
    entry = entry_of(url, options, cache)
    with open(entry, "rb") as f:  # the sample's own bytes, after its 512-byte tar header
        where = f.read().index(b"k003.bin") + 512
    flip(entry, where + 10)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert dataset[3]["bin"] == b"\x07" * 1000
    assert any(entry in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
