"""A read's tar values cut by one ``struct`` unpack (NOTE [ Fast tar decode ]) are the
values that slicing gives: empty members, a range that starts mid-shard, a memoryview,
and runs out of order (sliced one by one)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from shardstream.formats import get_format
from shardstream.formats.tar import read
from shardstream.pack import ShardWriter


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("tar") / "ds")
    with ShardWriter(url, format="tar", samples_per_shard=1000) as writer:
        for i in range(50):
            writer.write({"__key__": f"{i:04d}", "txt": b"x" * (i * 37 % 700), "cls": b"%d" % i, "e": b""})
    import shardstream

    info = shardstream.StreamingDataset(url).manifest.shards[0]
    with open(f"{url}/{info.path}", "rb") as file:
        data = file.read()
    fmt = get_format("tar")
    index, _ = fmt.build_index(io.BytesIO(data), name=info.path)
    return data, index


def sliced(data, base, index, starts, stops, monkeypatch):
    with monkeypatch.context() as patched:
        patched.setattr(read, "_unpacked", lambda *args: None)
        return read.tar_runs(data, base, index, starts, stops)


@pytest.mark.parametrize(
    ("runs", "start"),
    [
        ([(0, 50)], 0),
        ([(3, 9), (20, 31)], 0),
        ([(10, 20), (30, 40)], 1),
        ([(30, 40), (2, 5)], 0),
        ([(7, 7)], 0),
    ],
)
def test_unpacked_values_are_the_sliced_ones(shard, runs, start, monkeypatch):
    data, index = shard
    starts, stops = (np.array(side, dtype=np.int64) for side in zip(*runs, strict=True))
    base = index.byte_range(start * 10, start * 10 + 1).start - 512 if start else 0
    view = memoryview(data)[base:]
    got = read.tar_runs(view, base, index, starts, stops)
    want = sliced(data[base:], base, index, starts, stops, monkeypatch)
    assert got.keys == want.keys
    assert got.values == want.values
    assert all(type(value) is bytes for column in got.values for value in column)


def test_a_member_past_the_data_is_not_unpacked():
    assert read._unpacked(b"abc", np.array([1]), np.array([5])) is None
    assert read._unpacked(b"abcdef", np.array([3, 1]), np.array([1, 1])) is None
    assert read._unpacked(b"abcdef", np.array([1, 4]), np.array([2, 0])) == [b"bc", b""]
