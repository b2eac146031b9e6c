"""JSON decoded by orjson where it gives what ``json.loads`` gives (NOTE [ JSON by orjson ]):
the same objects, key order and types for every document, and ``json.loads``'s own value
or error wherever orjson would differ or refuses; the same without orjson installed."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.dataset import decode

# documents where orjson differs from json.loads or refuses, and some where both agree
EDGES = [
    b"18446744073709551616",  # beyond 64 bits: a float in orjson, an int in json
    b"-9223372036854775809",
    b"18446744073709551615",
    b"-9223372036854775808",
    b'{"id": 123456789012345678901234567890}',
    b"[1, 99999999999999999999]",
    b'"12345678901234567890"',
    b"NaN",
    b"-Infinity",
    b"[Infinity]",
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"\xef\xbb\xbf{}",  # a UTF-8 byte-order mark: json reads it as utf-8-sig
    b'"\\ud800"',  # a lone surrogate escaped
    b'"\xed\xa0\x80"',  # a surrogate encoded (json decodes with surrogatepass)
    b'"\xf4\x90\x80\x80"',
    b"\xff",
    b'"\xc3\xa9"',
    b'{"a": 1, "a": 2, "b": 3}',
    b'{"a": 1, "b": 2, "a": 3}',
    b"1\x00",  # a NUL after the first byte: json reads UTF-16
    b'"\x00"',
    b'"a\tb"',
    b"[" * 3000 + b"]" * 3000,  # deeper than orjson allows
    b"1" * 5000,  # more digits than int() converts
    b" 1 ",
    b"\n[1]\r\n",
    b"1 2",
    b"",
    b"-0",
    b"-0.0",
    b"4.9e-324",
    b"17976931348623158e292",
    b"9007199254740993.0",
    b'{"x": [1.5, "y", null, true, false, {"z": {}}]}',
]


def loaded(data: bytes) -> tuple[str, object]:
    try:
        return "ok", json.loads(data)
    except Exception as error:
        return "error", type(error)


def tried(function, data):
    try:
        return "ok", function(data)
    except Exception as error:
        return "error", type(error)


def exactly(a, b) -> bool:
    """Equal values of the same types (NaN equal to NaN), dict keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(exactly(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(exactly, a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def same(got, want) -> bool:
    return got[0] == want[0] and (exactly(got[1], want[1]) if got[0] == "ok" else got[1] is want[1])


def column(values: list[bytes]) -> list[tuple[str, object]]:
    """The bulk column form, or, where it raises, each value by ``json.loads``'s verdict."""
    try:
        return [("ok", value) for value in decode._json_column(values)]
    except Exception:
        return [loaded(value) for value in values]


@pytest.fixture(params=["orjson", "json"])
def parser(request, monkeypatch):
    """Both ways of parsing: with orjson (where installed) and without it."""
    if request.param == "orjson":
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(decode, "_orjson", None)
    return request.param


@pytest.mark.parametrize("doc", EDGES)
def test_one_value_is_what_json_loads_gives(parser, doc):
    assert same(tried(decode._json_value, doc), loaded(doc))
    assert same(tried(decode._json_value, memoryview(doc)), loaded(doc))


def test_a_column_with_edges_is_what_json_loads_gives(parser):
    good = [doc for doc in EDGES if loaded(doc)[0] == "ok"]
    assert all(same(a, b) for a, b in zip(column(good), map(loaded, good), strict=True))
    for doc in EDGES:  # a column of plain documents with one edge among them
        values = [b'{"a": 1}', doc, b"[2]"]
        got, want = column(values), [loaded(v) for v in values]
        if want[1][0] == "ok":
            assert all(same(a, b) for a, b in zip(got, want, strict=True))


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=10,
)
_docs = st.one_of(
    _values.map(lambda value: json.dumps(value).encode()),
    _values.map(lambda value: json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.binary(max_size=8),
    st.text(max_size=8).map(lambda text: text.encode("utf-8", "surrogatepass")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_docs, min_size=1, max_size=8))
def test_random_documents_are_what_json_loads_gives(docs):
    for doc in docs:
        assert same(tried(decode._json_value, doc), loaded(doc))
    want = [loaded(doc) for doc in docs]
    if all(verdict == "ok" for verdict, _ in want):
        assert all(same(a, b) for a, b in zip(column(docs), want, strict=True))
