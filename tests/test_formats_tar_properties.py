"""Properties of the tar codec (hypothesis).

Arbitrary keys (long ones need PAX, unicode), field names and payloads round-trip
through encoder -> build_index -> decode and through Python's tarfile; truncated,
corrupted or garbage bytes given to ``build_index`` give an index or a ``FormatError``,
never another exception and never a hang.
"""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import FormatError, PackError, shown
from shardstream.formats.tar.header import BLOCK
from shardstream.types import ByteRange
from tests.test_formats import write_shard
from tests.test_formats_tar import FMT, SAMPLES, decode_all, expected_members, tar_members

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0_")
_base = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="./\0_"),
    min_size=1,
    max_size=60,
)
_key = st.tuples(st.lists(st.text(alphabet=_chars, min_size=1, max_size=60), max_size=4), _base).map(
    lambda parts: "/".join([*parts[0], parts[1]])
)
_field = st.text(
    alphabet=st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters=".\n"),
    min_size=1,
    max_size=12,
)
_sample = st.tuples(_key, st.dictionaries(_field, st.binary(max_size=1500), min_size=1, max_size=4))
_samples = st.lists(_sample, max_size=8).map(
    lambda items: [{"__key__": key, **fields} for key, fields in items]
)


def write_what_is_accepted(samples: list[dict]):
    """Write every sample the encoder accepts; a rejected one must be named and leave no trace."""
    buffer = io.BytesIO()
    encoder = FMT.encoder(buffer, name="p")
    written = []
    for sample in samples:
        before = buffer.tell()
        try:
            encoder.write(sample)
            rejected = None
        except PackError as error:
            rejected = str(error)
        if rejected is None:
            written.append(sample)
        else:
            assert shown(sample["__key__"]) in rejected  # cut if long: NOTE [ Names in error messages ]
            assert buffer.tell() == before
    index = encoder.close()
    return buffer.getvalue(), index, written


@SETTINGS
@given(samples=_samples)
def test_property_round_trip(samples):
    data, index, samples = write_what_is_accepted(samples)
    built, _ = FMT.build_index(io.BytesIO(data), name="p")
    assert built == index
    assert decode_all(data, built) == samples
    assert tar_members(data) == expected_members(samples)
    assert sum(FMT.sample_size(s) for s in samples) + 2 * BLOCK == len(data)
    n = len(samples)
    for start in range(n):
        rng = index.byte_range(start, n)
        assert list(FMT.decode(data[rng.start : rng.end], rng, index, start, n, name="p")) == samples[start:]


_BASE_TAR, _ = write_shard(FMT, SAMPLES)


def _check_build_index(data: bytes) -> None:
    try:
        index, _ = FMT.build_index(io.BytesIO(data), name="fuzz.tar")
    except FormatError as error:
        rejected_by = error.shard
    else:
        rejected_by = None
        # accepted: the index must be usable on these very bytes
        list(FMT.decode(data, ByteRange(0, len(data)), index, 0, index.num_samples, name="fuzz.tar"))
    assert rejected_by in (None, "fuzz.tar")


@SETTINGS
@given(cut=st.integers(min_value=0, max_value=len(_BASE_TAR)))
def test_property_truncated_tar(cut):
    _check_build_index(_BASE_TAR[:cut])


@SETTINGS
@given(
    flips=st.lists(st.tuples(st.integers(0, len(_BASE_TAR) - 1), st.integers(0, 255)), min_size=1, max_size=6)
)
def test_property_corrupted_tar(flips):
    data = bytearray(_BASE_TAR)
    for pos, value in flips:
        data[pos] = value
    _check_build_index(bytes(data))


_HEADERS = [
    0,
    *(i for i in range(BLOCK, len(_BASE_TAR), BLOCK) if _BASE_TAR[i + 257 : i + 263] == b"ustar\0"),
]


@SETTINGS
@given(
    header=st.sampled_from(_HEADERS),
    flips=st.lists(st.tuples(st.integers(0, BLOCK - 1), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_property_corrupted_headers(header, flips):
    data = bytearray(_BASE_TAR)
    for pos, value in flips:
        data[header + pos] = value
    _check_build_index(bytes(data))


@SETTINGS
@given(garbage=st.binary(max_size=4000), prefix=st.integers(0, 3))
def test_property_garbage(garbage, prefix):
    _check_build_index(_BASE_TAR[: prefix * BLOCK * 2] + garbage)
