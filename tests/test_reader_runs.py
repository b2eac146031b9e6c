"""NOTE [ One call per read ]: the reader plans reads with array arithmetic, decodes each
read's runs in one format call and reorders columns; the samples, their order, skips and
errors are those of decoding one run at a time."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.dataset.bulk import WindowDecoding, decode_columns, decode_samples, decoded_columns
from shardstream.dataset.decode import SampleDecoder
from shardstream.dataset.reader import Read, WindowReader, plan_reads
from shardstream.errors import FormatError
from shardstream.formats.base import SampleColumns
from shardstream.pack import ShardWriter
from shardstream.plan import Run
from shardstream.topology import Detector
from shardstream.types import ByteRange
from tests.test_decode_bulk import _values


def per_run_reads(runs, byte_range, *, gap):
    """plan_reads as it was written before it took arrays: one Python step per run."""
    by_shard = {}
    for number, run in enumerate(runs):
        if run.stop > run.start:
            by_shard.setdefault(run.shard, []).append((byte_range(run.shard, run.start, run.stop), number))
    reads = []
    for shard, spans in by_shard.items():
        spans.sort(key=lambda span: span[0].start)
        lo, hi, members = spans[0][0].start, spans[0][0].end, [spans[0][1]]
        covered = [[lo, hi]]  # the bytes the runs take, where they leave holes
        for rng, number in spans[1:]:
            if rng.start - hi <= gap:
                if rng.start > hi:
                    covered.append([rng.start, rng.end])
                covered[-1][1] = max(covered[-1][1], rng.end)
                hi = max(hi, rng.end)
                members.append(number)
                continue
            reads.append(Read(shard, ByteRange(lo, hi), tuple(members), _holes(covered)))
            lo, hi, members, covered = rng.start, rng.end, [number], [[rng.start, rng.end]]
        reads.append(Read(shard, ByteRange(lo, hi), tuple(members), _holes(covered)))
    reads.sort(key=lambda read: min(read.runs))
    return reads


def _holes(covered):
    return tuple(map(tuple, covered)) if len(covered) > 1 else ()


@st.composite
def runs_and_bytes(draw):
    shards = draw(st.integers(1, 4))
    # per shard: each sample's size in bytes (a sample's bytes follow the previous one's)
    sizes = [draw(st.lists(st.integers(0, 3), min_size=1, max_size=30)) for _ in range(shards)]
    runs = []
    for _ in range(draw(st.integers(0, 25))):
        shard = draw(st.integers(0, shards - 1))
        start = draw(st.integers(0, len(sizes[shard])))
        runs.append(Run(shard, start, draw(st.integers(start, len(sizes[shard])))))
    return runs, [np.concatenate(([0], np.cumsum(s))) for s in sizes], draw(st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(runs_and_bytes())
def test_plan_reads_is_the_per_run_plan(case):
    runs, offsets, gap = case

    def byte_range(shard, start, stop):
        return ByteRange(int(offsets[shard][start]), int(offsets[shard][stop]))

    def byte_ranges(shard, starts, stops):
        return offsets[shard][starts], offsets[shard][stops]

    assert plan_reads(runs, byte_ranges, gap=gap) == per_run_reads(runs, byte_range, gap=gap)


def small_sample(i):
    return {
        "__key__": f"{i:06d}",
        "txt": b"text %d" % i,
        "cls": b"%d" % (i % 10),
        "json": b'{"id": %d}' % i if i % 37 else b"{bad",  # some fail to decode
    }


@pytest.fixture(scope="module", params=["tar", "parquet"])
def small(request, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("runs") / request.param)
    with ShardWriter(url, format=request.param, samples_per_shard=300) as writer:
        for i in range(1000):
            writer.write(small_sample(i))
    return url


def worker_of(worker, workers):
    return Detector(worker_info_fn=lambda: types.SimpleNamespace(id=worker, num_workers=workers))


# 3 workers: a worker's chunks of a lane lie among the others' (with a power-of-two count
# they are one range, NOTE [ Nested chunk order ]), so its reads hold many short runs
WORKERS = 3


def global_dataset(url, worker=0, **kw):
    dataset = shardstream.StreamingDataset(
        url, order="global", global_batch_size=32, read_lanes=8, topology=worker_of(worker, WORKERS), **kw
    )
    dataset.loader_slot.shape = (32, WORKERS)
    return dataset


def reader_of(dataset, **kw):
    return WindowReader(dataset.storage, dataset.manifest, prefetch=0, **kw)


def one_run_at_a_time(reader, window):
    """The window's samples as the reader gave them before: a decode call per run, the
    runs' samples one after the other, then in the window's yield order."""
    samples = []
    for run in window.runs:
        info = reader.manifest.shards[run.shard]
        data = reader.bytes.read(info.path, None)
        whole = ByteRange(0, len(data))
        index = reader.index(run.shard)
        samples += reader.format.decode(data, whole, index, run.start, run.stop, name=info.path)
    return [samples[i] for i in window.order.tolist()]


@pytest.mark.parametrize("columns", [False, True])
def test_windows_of_many_short_runs_are_the_per_run_samples(small, columns):
    dataset = global_dataset(small, worker=1)
    plan = dataset.make_plan(num_workers=WORKERS, consume=False)
    reader = reader_of(dataset, columns=columns)
    windows = list(plan.worker_windows(0, 1))
    assert sum(len(w.runs) for w in windows) > 10 * sum(len(reader.fetch(w)) for w in windows)  # short runs
    for window in windows:
        got, holes = reader.decode(window, reader.fetch(window), window.order)
        assert not holes
        assert isinstance(got, SampleColumns) is columns
        listed = got.samples() if isinstance(got, SampleColumns) else got
        assert listed == one_run_at_a_time(reader, window)
        in_run_order, _ = reader.decode(window, reader.fetch(window))
        in_run_order = in_run_order.samples() if isinstance(in_run_order, SampleColumns) else in_run_order
        assert [in_run_order[i] for i in window.order.tolist()] == listed
    reader.close()


def test_a_read_whose_one_call_fails_is_decoded_run_by_run(small, monkeypatch):
    dataset = global_dataset(small)
    plan = dataset.make_plan(num_workers=WORKERS, consume=False)
    reader = reader_of(dataset)
    window = next(iter(plan.worker_windows(0, 0)))
    want, _ = reader.decode(window, reader.fetch(window), window.order)

    def fails(*args, **kwargs):
        raise FormatError("no")

    monkeypatch.setattr(type(reader.format), "decode_runs", fails)
    assert reader.decode(window, reader.fetch(window), window.order) == (want, False)
    # and a run that cannot be decoded is that run's error, as one call per run raised it
    bad = window.runs[len(window.runs) // 2]
    decode = type(reader.format).decode

    def one_fails(self, data, rng, index, start, stop, *, name):
        if (index.name, start) == (reader.index(bad.shard).name, bad.start):
            raise FormatError(f"run [{start}, {stop}) is bad")
        return decode(self, data, rng, index, start, stop, name=name)

    monkeypatch.setattr(type(reader.format), "decode", one_fails)
    with pytest.raises(FormatError, match=rf"run \[{bad.start}, {bad.stop}\) is bad") as error:
        reader.decode(window, reader.fetch(window), window.order)
    assert error.value.shard == reader.manifest.shards[bad.shard].path
    reader.close()


def stream_keys(url, **kw):
    out = []
    for worker in range(WORKERS):
        dataset = global_dataset(url, worker=worker, **kw)
        out.append([s["__key__"] if isinstance(s, dict) else s for s in dataset])
    return out


def test_decoded_global_stream_is_the_raw_stream_decoded_sample_by_sample(small):
    decoder = SampleDecoder.build()
    for worker in range(WORKERS):
        raw = list(global_dataset(small, worker=worker, decode=False))
        want = []
        for sample in raw:
            try:
                want.append(decoder(sample, url=small))
            except FormatError:
                continue  # what on_error="skip" leaves out
        skipping = global_dataset(small, worker=worker, on_error="skip")
        assert list(skipping) == want
        assert skipping.num_skipped == len(raw) - len(want) > 0
        with pytest.raises(FormatError, match="cannot decode field 'json'") as error:
            list(global_dataset(small, worker=worker))
        first_bad = next(s["__key__"] for s in raw if s["json"] == b"{bad")
        assert first_bad in str(error.value)


def test_a_bad_block_skips_its_samples_only_in_a_read_of_many_runs(tmp_path):
    url = str(tmp_path / "ds")
    with ShardWriter(url, format="tar", samples_per_shard=400) as writer:
        for i in range(800):
            writer.write({"__key__": f"{i:06d}", "txt": b"x" * 200})
    clean = stream_keys(url, decode=False)
    shard = shardstream.StreamingDataset(url).manifest.shards[0]
    path = tmp_path / "ds" / shard.path
    data = bytearray(path.read_bytes())
    data[70_000] ^= 0xFF  # in the second 64 KiB check block
    path.write_bytes(bytes(data))
    skipped = stream_keys(url, decode=False, on_error="skip")
    index = shardstream.StreamingDataset(url)
    reader = reader_of(index)
    tar = reader.index(0)
    inside = {
        key
        for i, key in enumerate(tar.keys)
        if tar.byte_range(i, i + 1).start < 2 * 65536 and tar.byte_range(i, i + 1).end > 65536
    }
    reader.close()
    assert inside
    assert skipped == [[k for k in keys if k not in inside] for keys in clean]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["txt", "cls", "json", "bin", "meta.json", "pkl"]),
        min_size=0,
        max_size=4,
        unique=True,
    ),
    st.data(),
    st.booleans(),
)
def test_decoding_columns_is_decoding_their_samples(fields, data, allow_pickle):
    n = data.draw(st.integers(0, 10))
    values = [[data.draw(_values[name]) for _ in range(n)] for name in fields]
    columns = SampleColumns(tuple(fields), [f"k{i}" for i in range(n)], values)
    decoder = SampleDecoder.build(allow_pickle=allow_pickle)
    got, got_errors = decode_columns(decoder, columns, url="u")
    want, want_errors = decode_samples(decoder, columns.samples(), url="u")
    assert [(type(e), str(e)) for e in got_errors.values()] == [
        (type(e), str(e)) for e in want_errors.values()
    ]
    assert sorted(got_errors) == sorted(want_errors)
    assert [s for i, s in enumerate(got) if i not in got_errors] == [
        s for i, s in enumerate(want) if i not in want_errors
    ]


def test_columns_with_a_repeated_field_decode_as_their_samples():
    """A Parquet file may repeat a column name; its sample keeps the last value, and only
    that value is decoded (the first one here is not text)."""
    columns = SampleColumns(("txt", "txt"), ["a", "b"], [[b"\xff", b"\xfe"], [b"one", b"two"]])
    decoder = SampleDecoder.build()
    decoding = WindowDecoding(decoder, decoder, transform=None, skip=False, url="u")
    got = list(decoded_columns(decoding, columns, iter(range(2)), None, None))
    assert got == [{"__key__": "a", "txt": "one"}, {"__key__": "b", "txt": "two"}]
