"""Packing a folder of files: the walk, sized in chunks by every process of a pack, in order.

NOTE [ Every process sizes and writes ] in ``shardstream.pack.parallel``: a folder is
listed and sized in chunks by whichever process is free, and the chunks are put back in
walk order, so shards, errors and parts do not depend on the number of workers.
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.errors import PackError
from shardstream.formats.base import Sample
from shardstream.pack import Entry, PackOptions, ShardWriter, Source, pack
from shardstream.pack.jobs import Packed, ShardJob, ShardJobs, pack_entries
from shardstream.pack.sources.base import walk
from shardstream.pack.sources.folder import _CHUNK_FILES, _CHUNK_FOLDERS
from tests.test_pack import read_shards, snapshot


def write(path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def make_tree(root) -> None:
    """Files at the top, a flat folder larger than a chunk, many small folders (deeper too)."""
    for i in range(3):
        write(root / f"top{i}.txt", b"top %d" % i)
    flat = _CHUNK_FILES // 2 + 500  # two files a sample: more files than one chunk holds
    for i in range(flat):
        write(root / "flat" / f"{i:05d}.txt", b"flat %d " % i * (1 + i % 5))
        write(root / "flat" / f"{i:05d}.json", b'{"i": %d}' % i)
    for d in range(3 * _CHUNK_FOLDERS + 1):  # more folders than one chunk lists
        for i in range(d % 4):
            write(root / f"many/d{d:02d}/s{i}.txt", b"sample %d of %d" % (i, d))
        if d % 5 == 0:
            write(root / f"many/d{d:02d}/deeper/x.cls", b"%d" % d)
    (root / "empty").mkdir()
    write(root / ".hidden" / "skipped.txt", b"not packed")
    write(root / "many" / ".skipped.txt", b"not packed")


def walk_keys(folder, prefix: str = "") -> list[str]:
    """The keys of a folder in walk order, worked out here with os.scandir alone."""
    entries = sorted((e for e in os.scandir(folder) if not e.name.startswith(".")), key=lambda e: e.name)
    keys = []
    for entry in entries:
        if entry.is_file():
            key = prefix + entry.name.split(".", 1)[0]
            if not keys or keys[-1] != key:
                keys.append(key)
    for entry in entries:
        if entry.is_dir():
            keys += walk_keys(entry.path, f"{prefix}{entry.name}/")
    return keys


def test_a_large_tree_packs_in_walk_order_and_the_same_for_any_workers(tmp_path):
    make_tree(tmp_path / "src")
    runs = {}
    for workers in (1, 2, 3):
        manifest = pack(tmp_path / "src", tmp_path / f"w{workers}", shard_size="64KB", workers=workers)
        runs[workers] = snapshot(tmp_path / f"w{workers}")
    assert runs[1] == runs[2] == runs[3]
    keys = [sample["__key__"] for sample in read_shards(tmp_path / "w2")]
    assert keys == walk_keys(tmp_path / "src")
    assert manifest.num_samples == len(keys) == 3 + _CHUNK_FILES // 2 + 500 + 36 + 5
    # the cuts are those of ShardWriter given the same samples in the same order
    with ShardWriter(tmp_path / "written", shard_size="64KB") as writer:
        for key in keys:
            folder, _, stem = (tmp_path / "src" / key).as_posix().rpartition("/")
            names = sorted(n for n in os.listdir(folder) if n.split(".", 1)[0] == stem)
            writer.write({"__key__": key, **{n.split(".", 1)[1]: read(f"{folder}/{n}") for n in names}})
    assert snapshot(tmp_path / "written") == runs[1]
    flat = read_shards(tmp_path / "w3")[3 + 777]
    assert flat["__key__"] == "flat/00777"
    assert flat["txt"] == b"flat 777 " * 3
    assert json.loads(flat["json"]) == {"i": 777}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_first_bad_file_in_walk_order_is_the_error(tmp_path, workers):
    make_tree(tmp_path / "src")
    for d in range(3 * _CHUNK_FOLDERS + 1):  # later in the walk, and in every later chunk
        write(tmp_path / "src" / "many" / f"d{d:02d}" / "NOEXT", b"late")
    write(tmp_path / "src" / "flat" / "zz", b"early in the walk, but in a later chunk of its folder")
    with pytest.raises(PackError, match="no extension") as info:
        pack(tmp_path / "src", tmp_path / "ds", shard_size="64KB", workers=workers)
    assert info.value.url.endswith("flat/zz")
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()


def test_a_sample_too_large_for_a_shard_fails_only_the_part_that_holds_it(tmp_path):
    for i in range(40):
        write(tmp_path / "src" / f"k{i:02d}.txt", b"x" * (30_000 if i == 5 else 100))
    with pytest.raises(PackError, match="raise shard_size") as info:
        pack(tmp_path / "src", tmp_path / "ds", shard_size="16KB", workers=2, part="0/2")
    assert info.value.url.endswith("k05.txt")
    pack(tmp_path / "src", tmp_path / "ds", shard_size="16KB", workers=2, part="1/2")
    names = []
    for shard in sorted((tmp_path / "ds").glob("part-00001-shard-*.tar")):
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    assert names == [f"k{i:02d}.txt" for i in range(20, 40)]


class SlowThenBad(Source):
    """A lazy source of four chunks: the first is slow to size and bad, the third bad at once."""

    name = "slow-then-bad"
    lazy = True

    @classmethod
    def detect(cls, url, storage_options, is_dir):
        return False

    def scan(self, start=0, stop=None):
        return islice(walk(self), start, stop)

    def chunks(self):
        return iter([("chunk", i) for i in range(4)])

    def expand(self, chunk):
        number = chunk[1]
        if number == 0:
            time.sleep(0.5)  # a worker is still sizing it when this process finds chunk 2 bad
            raise PackError("chunk 0 is bad", url="first")
        if number == 2:
            raise PackError("chunk 2 is bad", url="third")
        return [[Entry(f"k{number}", None, number, self.url)]]

    def size(self, entry, fmt):
        return 1024

    def load(self, entry) -> Sample:
        return {"__key__": entry.key, "txt": b"x"}


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_found_early_by_one_process_waits_for_the_errors_before_it(tmp_path, workers):
    with pytest.raises(PackError, match="chunk 0 is bad"):
        pack(SlowThenBad("slow://"), tmp_path / "ds", workers=workers)


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.lists(st.integers(0, 3000), max_size=40), max_size=12),
    shard_size=st.integers(2000, 40_000),
    per_shard=st.one_of(st.none(), st.integers(1, 50)),
    part=st.one_of(st.none(), st.tuples(st.integers(0, 60), st.integers(0, 60))),
    packed=st.booleans(),
)
def test_cutting_whole_chunks_is_cutting_one_sample_at_a_time(chunks, shard_size, per_shard, part, packed):
    """ShardJobs.take takes a chunk at once when it fits; the shards are those of the rule."""
    options = PackOptions.create(shard_size=shard_size, samples_per_shard=per_shard)
    start, stop = (min(part), max(part)) if part else (0, None)

    def cut(pieces: list[list[int]], packed: bool = False) -> list[list[str]] | str:
        jobs = ShardJobs(SlowThenBad("x"), options, lambda n, e: ShardJob(n, f"s{n}", e), start, stop)
        shards, number = [], 0
        try:
            for sizes in pieces:
                entries = [Entry(f"k{number + i}", None, None, "x") for i in range(len(sizes))]
                number += len(sizes)
                if packed:  # as a worker sends them: this process never unpacks them
                    shards += jobs.take(Packed(pack_entries(entries), 0, len(entries)), list(sizes))
                else:
                    shards += jobs.take(entries, list(sizes))
            shards += jobs.finish()
        except PackError as error:
            return error.message
        return [[entry.key for entry in job.entries] for job in shards]

    one_at_a_time = [[size] for sizes in chunks for size in sizes]
    assert cut(chunks, packed) == cut(one_at_a_time)


class Numbers(Source):
    """A lazy source written as before chunks existed: scan, size and load only."""

    name = "numbers"
    lazy = True

    @classmethod
    def detect(cls, url, storage_options, is_dir):
        return False

    def scan(self, start=0, stop=None):
        return islice((Entry(f"n{i:05d}", None, i, self.url) for i in range(5000)), start, stop)

    def size(self, entry, fmt):
        return 1024 + (entry.where % 7) * 512

    def load(self, entry) -> Sample:
        return {"__key__": entry.key, "txt": b"n" * ((entry.where % 7) * 512)}


def test_a_lazy_source_with_scan_only_is_chunked_by_default(tmp_path):
    for workers in (1, 2):
        pack(Numbers("numbers://"), tmp_path / f"w{workers}", shard_size="256KB", workers=workers)
    assert snapshot(tmp_path / "w1") == snapshot(tmp_path / "w2")
    keys = [sample["__key__"] for sample in read_shards(tmp_path / "w2")]
    assert keys == [f"n{i:05d}" for i in range(5000)]
