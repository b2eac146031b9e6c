"""Typed Parquet columns passed through to decoders that would make the same values (NOTE
[ Typed values passed through ] in shardstream/dataset/decode.py): decoded samples equal
a tar shard's, the user's decoders still get bytes, and ``decode=False`` gives bytes."""

from __future__ import annotations

import pytest

import shardstream
from shardstream.dataset.decode import SampleDecoder, decoders, typed_values
from shardstream.formats.parquet import typed
from shardstream.pack import ShardWriter


def write(url, fmt, count=700):
    with ShardWriter(url, format=fmt, samples_per_shard=300) as writer:
        for i in range(count):
            sample = {"__key__": f"{i:05d}", "txt": f"text é {i}".encode(), "cls": b"%d\n" % (i - 300)}
            sample["json"] = b'{"id": %d, "tags": ["a"]}' % i
            writer.write(sample)


def epoch(url, **options):
    return list(shardstream.StreamingDataset(url, shuffle=True, seed=1, shuffle_window=100, **options))


@pytest.fixture
def both(tmp_path):
    tar, parquet = str(tmp_path / "tar"), str(tmp_path / "parquet")
    write(tar, "tar")
    write(parquet, "parquet")
    return tar, parquet


def test_typed_values_name_fields_of_the_built_in_text_and_integer_decoders():
    table = tuple(decoders().items())
    assert typed_values(SampleDecoder(table), ("txt", "cls", "json", "jpg", "__key__")) == {
        "txt": "text",
        "cls": "integer",
    }
    mine = SampleDecoder((*table, ("txt", lambda data: data)))
    assert typed_values(mine, ("txt", "cls")) == {"cls": "integer"}


def test_decoded_parquet_samples_equal_tar_ones_without_bytes_of_text_or_integers(both, monkeypatch):
    tar, parquet = both
    made = []
    as_bytes = typed.as_bytes
    monkeypatch.setattr(typed, "as_bytes", lambda column: made.append(str(column.type)) or as_bytes(column))
    got = epoch(parquet)
    assert got == epoch(tar)
    assert all(type(s["txt"]) is str and type(s["cls"]) is int and type(s["json"]) is dict for s in got)
    assert set(made) == {"string"}  # the JSON text alone came as bytes


def test_the_users_decoder_and_decode_false_still_get_bytes(both):
    _tar, parquet = both
    seen = epoch(parquet, decoders={"txt": lambda data: ("user", bytes(data))})
    assert seen[0]["txt"][0] == "user"
    assert type(seen[0]["cls"]) is int
    raw = epoch(parquet, decode=False)
    assert all(type(s["txt"]) is bytes and type(s["cls"]) is bytes for s in raw)
