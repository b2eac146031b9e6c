"""Bulk decoding (NOTE [ Bulk decode ]): the same samples and the same errors as decoding
one sample at a time, on random samples (hypothesis), and on_error="skip" in a stream."""

from __future__ import annotations

import json
import logging
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardstream
from shardstream.dataset.bulk import decode_samples
from shardstream.dataset.decode import SampleDecoder
from shardstream.errors import FormatError, ShardstreamError, UsageError
from shardstream.pack import ShardWriter

_json_docs = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=6,
    ).map(lambda value: json.dumps(value).encode()),
    st.sampled_from(
        [b"", b" 1", b"1 ", b"{bad", b"12", b"3", b'"a', b'b"', b"[1", b"2]", b"\xff", b"nul\0", b"1e5"]
    ),
    st.binary(max_size=6),
)
_texts = st.one_of(st.text(max_size=8).map(str.encode), st.binary(max_size=6))
_ints = st.one_of(st.integers(-(10**6), 10**6).map(lambda i: b" %d\n" % i), st.binary(max_size=4))
_values = {
    "txt": _texts,
    "cls": _ints,
    "json": _json_docs,
    "bin": st.binary(max_size=4),
    "meta.json": _json_docs,
    "pkl": st.just(pickle.dumps(1)),
}


@st.composite
def samples(draw):
    out = []
    for number in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 9)) == 0:
            out.append(None)  # a sample the format could not read
            continue
        names = draw(
            st.sampled_from(
                [
                    ("txt", "cls", "json"),
                    ("txt", "cls", "json"),
                    ("json", "bin"),
                    ("meta.json",),
                    ("pkl", "txt"),
                ]
            )
        )
        sample = {"__key__": f"k{number}"}
        for name in names:
            value = draw(_values[name])
            kind = draw(st.integers(0, 39))  # mostly bytes: the columns' fast path
            sample[name] = memoryview(value) if kind == 0 else bytearray(value) if kind == 1 else value
        if draw(st.integers(0, 9)) == 0:
            sample["txt"] = "typed already"  # a Parquet string column
        out.append(sample)
    return out


def one_by_one(decoder, items):
    results = []
    for item in items:
        if item is None:
            results.append(("none", None))
            continue
        try:
            results.append(("ok", decoder(item, url="u")))
        except ShardstreamError as error:
            results.append(("error", (type(error), str(error))))
    return results


def in_bulk(decoder, items):
    decoded, errors = decode_samples(decoder, items, url="u")
    results = []
    for position, item in enumerate(items):
        if position in errors:
            error = errors[position]
            results.append(("error", (type(error), str(error))))
        elif item is None:
            results.append(("none", decoded[position]))
        else:
            results.append(("ok", decoded[position]))
    return results


def same(a, b):
    """Equal, with NaN-free floats and the same key order (dict == ignores order)."""
    return a == b and [list(r[1]) if r[0] == "ok" else None for r in a] == [
        list(r[1]) if r[0] == "ok" else None for r in b
    ]


@settings(max_examples=300, deadline=None)
@given(samples(), st.booleans())
def test_bulk_equals_one_by_one(items, allow_pickle):
    decoder = SampleDecoder.build(allow_pickle=allow_pickle)
    assert same(in_bulk(decoder, items), one_by_one(decoder, items))


@settings(max_examples=100, deadline=None)
@given(st.lists(_json_docs, max_size=30))
def test_a_json_column_is_what_json_loads_gives(docs):
    decoder = SampleDecoder.build()
    items = [{"__key__": str(i), "json": doc} for i, doc in enumerate(docs)]
    assert same(in_bulk(decoder, items), one_by_one(decoder, items))


def test_json_values_that_would_run_together_are_parsed_one_by_one():
    decoder = SampleDecoder.build()
    items = [{"__key__": str(i), "json": doc} for i, doc in enumerate([b"12", b"34", b'"a', b'b", 5'])]
    decoded, errors = decode_samples(decoder, items)
    assert decoded[:2] == [{"__key__": "0", "json": 12}, {"__key__": "1", "json": 34}]
    assert sorted(errors) == [2, 3]


def test_user_decoders_run_once_per_value_and_their_errors_pass_through():
    seen = []

    def upper(data):
        seen.append(bytes(data))
        if data == b"boom":
            raise UsageError("not this one")
        return bytes(data).upper()

    decoder = SampleDecoder.build({"txt": upper})
    items = [{"__key__": "a", "txt": b"x"}, {"__key__": "b", "txt": b"boom"}, {"__key__": "c", "txt": b"y"}]
    decoded, errors = decode_samples(decoder, items)
    assert seen == [b"x", b"boom", b"y"]
    assert decoded == [{"__key__": "a", "txt": b"X"}, None, {"__key__": "c", "txt": b"Y"}]
    assert type(errors[1]) is UsageError


def test_first_failing_field_names_the_error():
    decoder = SampleDecoder.build()
    item = {"__key__": "k", "cls": b"x", "json": b"{bad"}
    with pytest.raises(FormatError) as info:
        decoder(item)
    _, errors = decode_samples(decoder, [item])
    assert str(errors[0]) == str(info.value)
    assert "'cls'" in str(errors[0])


def write_bad(url):
    keys = []
    with ShardWriter(url, format="tar", samples_per_shard=6) as writer:
        for i in range(18):
            key = f"k{i:02d}"
            bad_json, bad_txt = i in (3, 8), i == 13
            writer.write(
                {
                    "__key__": key,
                    "txt": b"\xff" if bad_txt else b"t%d" % i,
                    "cls": b"%d" % i,
                    "json": b"{bad" if bad_json else b'{"i": %d}' % i,
                }
            )
            keys.append(key)
    return keys


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_on_error_skip_leaves_out_only_the_bad_samples(tmp_path, caplog, fmt):
    url = str(tmp_path / fmt)
    if fmt == "tar":
        keys = write_bad(url)
    else:
        with ShardWriter(url, format="parquet", samples_per_shard=6) as writer:
            for i in range(18):
                writer.write(
                    {"__key__": f"k{i:02d}", "n": i, "meta.json": b"{bad" if i in (3, 8) else b"[1]"}
                )
        keys = [f"k{i:02d}" for i in range(18)]
    bad = {"k03", "k08"} | ({"k13"} if fmt == "tar" else set())
    dataset = shardstream.StreamingDataset(url, on_error="skip", shuffle=False)
    with caplog.at_level(logging.WARNING, logger="shardstream.dataset"):
        got = list(dataset)
    assert [s["__key__"] for s in got] == [k for k in keys if k not in bad]
    assert dataset.num_skipped == len(bad)
    with pytest.raises(FormatError) as info:
        list(shardstream.StreamingDataset(url, shuffle=False))
    assert "'k03'" in str(info.value)
    assert info.value.shard is not None
    assert info.value.offset is not None


def test_raise_yields_the_samples_before_the_bad_one(tmp_path):
    url = str(tmp_path / "bad")
    write_bad(url)
    iterator = iter(shardstream.StreamingDataset(url, shuffle=False))
    assert [next(iterator)["__key__"] for _ in range(3)] == ["k00", "k01", "k02"]
    with pytest.raises(FormatError, match="k03"):
        next(iterator)


def test_state_dict_mid_window_counts_what_was_taken(tmp_path):
    url = str(tmp_path / "ok")
    with ShardWriter(url, format="tar", samples_per_shard=50) as writer:
        for i in range(100):
            writer.write({"__key__": f"k{i:03d}", "txt": b"t", "cls": b"1"})
    dataset = shardstream.StreamingDataset(url, shuffle=False, batch_size=4)
    iterator = iter(dataset)
    taken = [next(iterator)["__key__"] for _ in range(8)]
    state = dataset.state_dict()
    del iterator
    resumed = shardstream.StreamingDataset(url, shuffle=False, batch_size=4)
    resumed.load_state_dict(state)
    rest = [s["__key__"] for s in resumed]
    assert taken + rest == [f"k{i:03d}" for i in range(100)]


@pytest.mark.parametrize("chunk", [1, 4, 5])
def test_chunk_boundaries_keep_skips_errors_and_positions(tmp_path, monkeypatch, chunk):
    from shardstream.dataset import bulk

    monkeypatch.setattr(bulk, "CHUNK", chunk)
    url = str(tmp_path / "bad")
    keys = write_bad(url)
    dataset = shardstream.StreamingDataset(url, on_error="skip", shuffle=True, seed=1)
    got = [s["__key__"] for s in dataset]
    assert sorted(got) == sorted(k for k in keys if k not in ("k03", "k08", "k13"))
    assert dataset.num_skipped == 3
    reference = [
        s["__key__"]
        for s in shardstream.StreamingDataset(url, on_error="skip", shuffle=True, seed=1, decode=False)
    ]
    assert got == [k for k in reference if k not in ("k03", "k08", "k13")]
    with pytest.raises(FormatError) as info:
        list(shardstream.StreamingDataset(url, shuffle=False))
    assert "'k03'" in str(info.value)
    assert info.value.shard == "shard-000000.tar"
