"""What a format knows of its columns' types (``SampleColumns.kinds``): a tar member is
bytes, a typed Parquet column holds none; decoding with that knowledge gives the same
samples and errors as looking at every value's type."""

from __future__ import annotations

import pyarrow as pa
import pytest

import shardstream
from shardstream.dataset.columns import ColumnDecoding
from shardstream.dataset.decode import SampleDecoder
from shardstream.dataset.fields import with_all_fields
from shardstream.formats.parquet.typed import values_of
from shardstream.formats.samples import BYTES_COLUMN, TYPED_COLUMN, UNKNOWN_COLUMN, SampleColumns
from shardstream.pack import ShardWriter


def _write(url: str, fmt: str, count: int = 300) -> None:
    with ShardWriter(url, format=fmt, samples_per_shard=100) as writer:
        for i in range(count):
            json = b'{"id": %d}' % i if i != 123 else b"{not json"
            writer.write(
                {
                    "__key__": f"{i:05d}",
                    "txt": b"t %d" % i,
                    "cls": b"%d" % i,
                    "json": json,
                    "bin": b"\x00%d" % i,
                }
            )


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_decoded_epochs_are_those_of_the_sample_decoder(tmp_path, fmt: str) -> None:
    url = str(tmp_path / fmt)
    _write(url, fmt)
    decoder = SampleDecoder.build()
    raw = list(shardstream.StreamingDataset(url, shuffle=False, decode=False))
    expected = [decoder(sample) for sample in raw if sample["__key__"] != "00123"]
    got = list(shardstream.StreamingDataset(url, shuffle=False, on_error="skip"))
    assert got == expected
    with pytest.raises(shardstream.ShardstreamError, match="00123"):
        list(shardstream.StreamingDataset(url, shuffle=False))


def test_a_column_decoded_by_its_kind_or_by_its_values_types_is_the_same() -> None:
    decoding = ColumnDecoding.of(SampleDecoder.build(), ("txt", "cls", "json", "bin"), None, None)
    keys = ["a", "b"]
    values = [[b"x", b"y"], [b"1", b"2"], [b'{"a": 1}', b"[bad"], [b"\x00", b"\x01"]]
    by_kind = decoding(keys, values, (BYTES_COLUMN,) * 4)
    by_types = decoding(keys, values)
    assert by_kind[0] == by_types[0]
    assert by_kind[1].keys() == by_types[1].keys() == {1}
    assert str(by_kind[1][1]) == str(by_types[1][1])
    typed = [["x", "y"], [1, 2], [b'{"a": 1}', b"[2]"], [None, None]]
    kinds = (TYPED_COLUMN, TYPED_COLUMN, BYTES_COLUMN, TYPED_COLUMN)
    assert decoding(keys, typed, kinds) == decoding(keys, typed)


def test_parquet_column_kinds() -> None:
    strings = pa.chunked_array([["a", "b"]])
    assert values_of(strings, True, "text") == (["a", "b"], TYPED_COLUMN)
    assert values_of(strings, True, None) == ([b"a", b"b"], BYTES_COLUMN)  # JSON text as bytes
    assert values_of(pa.chunked_array([[b"a", None]]), False, None)[1] == UNKNOWN_COLUMN
    assert values_of(pa.chunked_array([[b"a", b"b"]]), False, None)[1] == BYTES_COLUMN
    assert values_of(pa.chunked_array([[1, None]]), False, None)[1] == TYPED_COLUMN
    assert values_of(pa.chunked_array([[[b"a"]]]), False, None)[1] == UNKNOWN_COLUMN  # a list


def test_kinds_follow_take_join_and_missing_fields() -> None:
    one = SampleColumns(("a", "b"), ["k1", "k2"], [[b"1", b"2"], ["x", "y"]], (BYTES_COLUMN, TYPED_COLUMN))
    other = SampleColumns(("a", "b"), ["k3"], [[b"3"], [b"z"]], (BYTES_COLUMN, BYTES_COLUMN))
    assert one.take([1, 0]).kinds == one.kinds
    joined = SampleColumns.joined([one, other])
    assert joined is not None
    assert joined.kinds == (BYTES_COLUMN, UNKNOWN_COLUMN)
    unknown = SampleColumns.joined([one, SampleColumns(("a", "b"), ["k3"], [[b"3"], ["z"]])])
    assert unknown is not None
    assert unknown.kinds == (UNKNOWN_COLUMN, UNKNOWN_COLUMN)  # a part that knows nothing
    whole = with_all_fields(one, ["a", "b", "c"])
    assert isinstance(whole, SampleColumns)
    assert whole.kinds == (BYTES_COLUMN, TYPED_COLUMN, TYPED_COLUMN)
