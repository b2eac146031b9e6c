"""ShardCutter: NOTE [ Shard boundaries ] in one place, and the same shards from every writer.

``ShardWriter`` and ``pack`` (one process, or a pool sizing chunks and writing shards in
any order) all cut with the cutter; these tests check the rule against its wording, and
the shards each of them writes against one another.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shardstream.errors import PackError
from shardstream.formats import get_format
from shardstream.pack import PackOptions, ShardWriter, open_source, pack, parallel
from shardstream.pack.cutter import SampleTooLarge, ShardCutter
from shardstream.pack.durable import ShardSync
from shardstream.pack.jobs import JobContext
from shardstream.pack.sources import folder
from shardstream.storage import Storage
from tests.test_pack import read_shards, snapshot


def worded_cut(sizes: list[int], budget: int, most: int) -> list[list[int]]:
    """The shards of NOTE [ Shard boundaries ] as it is worded: positions of their samples."""
    shards: list[list[int]] = []
    for i, size in enumerate(sizes):
        if size > budget:
            raise ValueError(i)
        if shards and len(shards[-1]) < most and sum(sizes[j] for j in shards[-1]) + size <= budget:
            shards[-1].append(i)
        else:
            shards.append([i])
    return shards


def shards_from(begins: list[int], count: int) -> list[list[int]]:
    ends = [*begins[1:], count] if begins else []
    return [list(range(b, e)) for b, e in zip(begins, ends, strict=True)]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 600), max_size=80),
    budget=st.integers(1, 2500),
    most=st.integers(1, 12),
    runs=st.lists(st.integers(1, 20), min_size=1, max_size=10),
)
def test_the_cutter_cuts_as_the_rule_is_worded_whatever_the_runs_it_is_given(sizes, budget, most, runs):
    try:
        expected: list[list[int]] | int = worded_cut(sizes, budget, most)
    except ValueError as error:
        expected = error.args[0]
    cutter, begins, lo, turn = ShardCutter(budget, most), [], 0, 0
    refused = None
    try:
        while lo < len(sizes):  # the sizes in runs of varied lengths, as chunks come
            hi = min(lo + runs[turn % len(runs)], len(sizes))
            begins += cutter.cut(sizes, lo, hi)
            lo, turn = hi, turn + 1
    except SampleTooLarge as error:
        refused = error
    if refused is not None:
        assert refused.position == expected
        assert (refused.size, refused.budget) == (sizes[expected], budget)
        return
    assert shards_from(begins, len(sizes)) == expected
    if sizes:
        assert (cutter.count, cutter.nbytes) == (len(expected[-1]), sum(sizes[i] for i in expected[-1]))


def test_the_cutter_raises_an_error_found_while_sizing_when_it_reaches_it():
    bad = PackError("sample 'k2': unreadable")
    cutter = ShardCutter(100, 10)
    assert cutter.cut([10, 10]) == [0]
    with pytest.raises(PackError, match="unreadable"):
        cutter.cut([10, bad, 500])  # the error comes first: it is raised, not the oversize
    with pytest.raises(SampleTooLarge) as info:
        ShardCutter(100, 10).cut([10, 500, bad])
    assert info.value.position == 1


def test_the_cutter_has_no_shard_before_the_first_sample():
    cutter = ShardCutter(50, 3)
    assert cutter.room == -1
    assert cutter.cut([50, 1, 0, 0, 0, 1]) == [0, 1, 4]  # the first; full by bytes; full by count
    assert (cutter.count, cutter.nbytes, cutter.room) == (2, 1, 49)
    cutter.begin()
    assert (cutter.count, cutter.nbytes, cutter.room) == (0, 0, 50)


def _write_source(root: pathlib.Path, kind: str, lengths: list[int]) -> pathlib.Path:
    if kind == "jsonl":
        path = root / "c.jsonl"
        lines = [{"__key__": f"k{i:03d}", "txt": "x" * n, "cls": i % 3} for i, n in enumerate(lengths)]
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return path
    for i, n in enumerate(lengths):
        sub = root / "src" / f"d{i % 3}"  # three folders: the walk lists them in chunks of their own
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"k{i:03d}.txt").write_bytes(b"x" * n)
        if i % 4 == 0:
            (sub / f"k{i:03d}.cls").write_bytes(b"%d" % i)
    return root / "src"


def _keys_by_shard(dest: pathlib.Path) -> list[list[str]]:
    counts = [
        shard["samples"]
        for shard in json.loads((dest / ".shardstream" / "manifest.json").read_text())["shards"]
    ]
    keys = [sample["__key__"] for sample in read_shards(dest)]
    out, start = [], 0
    for count in counts:
        out.append(keys[start : start + count])
        start += count
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["folder", "jsonl"]),
    lengths=st.lists(st.integers(0, 1000), min_size=1, max_size=40),
    shard_size=st.integers(3500, 12_000),
    per_shard=st.one_of(st.none(), st.integers(1, 12)),
    chunk_files=st.integers(1, 12),
)
def test_shard_writer_and_serial_and_parallel_packs_write_the_same_shards(
    kind, lengths, shard_size, per_shard, chunk_files
):
    """The writer's cut and the pool's cut agree: the same samples in the same shards, in order."""
    options = {"shard_size": shard_size, "samples_per_shard": per_shard}
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        src = _write_source(root, kind, lengths)
        source = open_source(src)
        samples = [source.load(entry) if source.lazy else entry.sample for entry in source.scan()]
        fmt = get_format("tar")
        budget, most = PackOptions.create(**options).limits()
        try:
            expected = worded_cut([fmt.sample_size(sample) for sample in samples], budget, most)
        except ValueError:
            expected = None  # a sample too large for a shard: every writer refuses it
        runs = {}
        with mock.patch.object(folder, "_CHUNK_FILES", chunk_files):  # many chunks, sized by any process
            for name, workers in (("serial", 1), ("parallel", 3)):
                try:
                    pack(src, root / name, workers=workers, **options)
                except PackError as error:
                    runs[name] = error.message
                else:
                    runs[name] = _keys_by_shard(root / name)
        try:
            with ShardWriter(root / "written", **options) as writer:
                for sample in samples:
                    writer.write(sample)
        except PackError as error:
            runs["written"] = error.message
        else:
            runs["written"] = _keys_by_shard(root / "written")
        event("refused" if expected is None else f"{kind}, {min(len(expected), 4)} shards (4: or more)")
        if expected is None:
            assert all("more than a shard" in message for message in runs.values()), runs
            return
        keys = [[samples[i]["__key__"] for i in shard] for shard in expected]
        assert runs == {"serial": keys, "parallel": keys, "written": keys}
        assert snapshot(root / "serial") == snapshot(root / "parallel") == snapshot(root / "written")


def test_a_pool_without_worker_processes_refuses_what_needs_them(tmp_path):
    """Its checks raise PackError, which ``python -O`` keeps (an assert would vanish)."""
    (tmp_path / "c.jsonl").write_text('{"txt": "a"}\n')
    storage = Storage(str(tmp_path / "ds"))
    options = PackOptions.create(samples_per_shard=1)
    context = JobContext(storage, open_source(tmp_path / "c.jsonl"), options)
    sync = ShardSync(storage)
    try:
        pool = parallel._Pool(context, 0, sync, None)
        with pytest.raises(PackError, match="no worker process"):
            pool.hand_out(iter(()))
        with pytest.raises(PackError, match="before it was given the shard jobs"):
            pool.cut()
    finally:
        sync.close()
        storage.close()
