"""A third shard format, defined and registered by this file alone, packs, streams,
indexes and verifies like tar and Parquet: what the rest of shardstream needs of a
format is in the ``ShardFormat`` contract, never in a test of its name (``test_layers``
keeps it so).

The format stores a sample as one line of JSON; its sample index is the key and the end
offset of every line, and the shard's checks (NOTE [ Checksummed reads ]).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from typing import IO

import pytest

from shardstream.catalog import index_dataset, verify_dataset
from shardstream.cli import main
from shardstream.dataset import StreamingDataset
from shardstream.errors import FormatError, ManifestError, UsageError
from shardstream.formats import (
    SampleIndex,
    ShardEncoder,
    ShardFormat,
    _unregister_format,
    available_formats,
    get_format,
    register_format,
)
from shardstream.formats.base import Sample, check_covers
from shardstream.formats.checks import ShardChecks
from shardstream.manifest import MANIFEST_NAME, Manifest
from shardstream.pack import pack
from shardstream.types import ByteRange

NAME, SUFFIX = "jsonrec-test", ".jsonrec"


def _line(sample: Sample) -> bytes:
    record = {k: v for k, v in sample.items() if k == "__key__" or not k.startswith("_")}
    return json.dumps(record, sort_keys=True, ensure_ascii=True).encode() + b"\n"


class LinesIndex(SampleIndex):
    def __init__(self, name: str, keys: list[str], ends: list[int], fields: tuple[str, ...]) -> None:
        self._name, self._keys, self._ends, self._fields = name, keys, ends, fields

    @property
    def num_samples(self) -> int:
        return len(self._keys)

    @property
    def keys(self) -> list[str]:
        return list(self._keys)

    @property
    def name(self) -> str:
        return self._name

    @property
    def fields(self) -> tuple[str, ...]:
        return self._fields

    def byte_range(self, start: int, stop: int) -> ByteRange:
        if not 0 <= start <= stop <= len(self._keys):
            raise UsageError(f"bad sample run [{start}, {stop})", shard=self._name)
        begin = self._ends[start - 1] if start else 0
        return ByteRange(begin, self._ends[stop - 1] if stop > start else begin)

    def to_bytes(self, *, with_checks: bool = True) -> bytes:
        body = json.dumps({"keys": self._keys, "ends": self._ends, "fields": list(self._fields)}).encode()
        checks = self.checks if with_checks else None
        sections = checks.sections() if checks is not None else ShardChecks.empty_sections()
        return struct.pack("<I", len(body)) + body + b"".join(struct.pack("<Q", len(s)) + s for s in sections)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, name: str) -> LinesIndex:
        view = memoryview(data).cast("B")
        try:
            (length,) = struct.unpack_from("<I", view)
            body = json.loads(bytes(view[4 : 4 + length]))
            pos, sections = 4 + length, []
            for _ in range(3):
                (n,) = struct.unpack_from("<Q", view, pos)
                sections.append(view[pos + 8 : pos + 8 + n])
                pos += 8 + n
            index = cls(name, body["keys"], body["ends"], tuple(body["fields"]))
        except (struct.error, ValueError, KeyError, TypeError) as error:
            raise FormatError(f"not a jsonrec sample index: {error}", shard=name) from None
        checks = ShardChecks.from_sections(sections, name=name)
        if checks is not None:
            index.bind_checks(checks)
        return index


class LinesEncoder(ShardEncoder):
    def __init__(self, fileobj: IO[bytes], name: str) -> None:
        self._file, self._name = fileobj, name
        self._keys: list[str] = []
        self._ends: list[int] = []
        self._fields: set[str] = set()

    def write(self, sample: Sample) -> None:
        line = _line(sample)
        self._file.write(line)
        self._keys.append(sample["__key__"])
        self._ends.append(self.num_bytes + len(line))
        self._fields.update(k for k in sample if not k.startswith("_"))

    @property
    def num_samples(self) -> int:
        return len(self._keys)

    @property
    def num_bytes(self) -> int:
        return self._ends[-1] if self._ends else 0

    def close(self) -> LinesIndex:
        return LinesIndex(self._name, self._keys, self._ends, tuple(sorted(self._fields)))


class LinesFormat(ShardFormat):
    name = NAME
    suffix = SUFFIX

    def encoder(self, fileobj: IO[bytes], *, name: str, compression: str | None = None) -> LinesEncoder:
        if compression not in (None, "none"):
            raise UsageError("jsonrec shards are not compressed", shard=name)
        return LinesEncoder(fileobj, name)

    def sample_size(self, sample: Sample) -> int:
        return len(_line(sample))

    def build_index(self, fileobj: IO[bytes], *, name: str) -> tuple[LinesIndex, tuple[str, ...]]:
        encoder = LinesEncoder(io.BytesIO(), name)
        for number, line in enumerate(fileobj.read().splitlines()):
            try:
                encoder.write(json.loads(line))
            except (ValueError, KeyError, TypeError) as error:
                raise FormatError(f"line {number} is not a sample: {error}", shard=name) from None
        index = encoder.close()
        return index, index.fields

    def load_index(self, data: bytes, *, name: str) -> LinesIndex:
        return LinesIndex.from_bytes(data, name=name)

    def decode(
        self,
        data: bytes | memoryview,
        rng: ByteRange,
        index: SampleIndex,
        start: int,
        stop: int,
        *,
        name: str,
    ) -> Iterator[Sample]:
        need = index.byte_range(start, stop)
        check_covers(data, rng, need, start, stop, name)
        chunk = bytes(memoryview(data)[need.start - rng.start : need.end - rng.start])
        return iter([json.loads(line) for line in chunk.splitlines()])


@pytest.fixture
def lines_format() -> Iterator[LinesFormat]:
    fmt = LinesFormat()
    register_format(fmt)
    try:
        yield fmt
    finally:
        _unregister_format(NAME)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "".join(json.dumps({"txt": f"sample {i}" + "x" * (i % 5), "n": i}) + "\n" for i in range(30))
    )
    return path


def test_pack_stream_verify(tmp_path, corpus, lines_format):
    dest = tmp_path / "ds"
    manifest = pack(corpus, dest, format=NAME, samples_per_shard=7, workers=1)
    assert manifest.format == NAME
    assert manifest.shard_sizes == [7, 7, 7, 7, 2]
    assert all(s.path.endswith(SUFFIX) for s in manifest.shards)
    assert manifest.fields == ("n", "txt")
    samples = list(StreamingDataset(str(dest), shuffle=False))
    assert [s["n"] for s in samples] == list(range(30))
    assert samples[3]["txt"] == "sample 3xxx"
    report = verify_dataset(str(dest))
    assert report.ok, report.problems
    assert not report.unchecked  # the pack tied every sidecar to its shard's bytes
    shard = dest / manifest.shards[1].path
    shard.write_bytes(shard.read_bytes().replace(b"sample 8", b"sample 9"))
    assert verify_dataset(str(dest)).bad_shards == [manifest.shards[1].path]


def test_shard_size_cut_and_index(tmp_path, corpus, lines_format):
    dest = tmp_path / "ds"
    manifest = pack(corpus, dest, format=NAME, shard_size=200, workers=1)
    assert manifest.num_samples == 30
    assert len(manifest.shards) > 1
    assert all(s.bytes <= 200 for s in manifest.shards)  # the cut used the format's sample_size
    (dest / MANIFEST_NAME).unlink()
    for shard in manifest.shards:
        (dest / shard.index).unlink()
    indexed = index_dataset(str(dest))  # found by the registered suffix
    assert indexed.format == NAME
    assert [(s.path, s.samples, s.sha256) for s in indexed.shards] == [
        (s.path, s.samples, s.sha256) for s in manifest.shards
    ]
    assert verify_dataset(str(dest)).ok


def test_cli_and_manifest_follow_the_registry(tmp_path, corpus, lines_format):
    dest = tmp_path / "ds"
    args = ["pack", str(corpus), str(dest), "--format", NAME, "--samples-per-shard", "10", "--workers", "1"]
    assert main(args) == 0
    assert main(["verify", str(dest)]) == 0
    text = (dest / MANIFEST_NAME).read_text()
    assert Manifest.from_json(text).format == NAME
    _unregister_format(NAME)
    assert NAME not in available_formats()
    with pytest.raises(ManifestError, match="unknown shard format"):
        Manifest.from_json(text)
    assert main(["pack", str(corpus), str(tmp_path / "other"), "--format", NAME]) == 2  # not a choice now


def test_unregister_keeps_the_built_in_formats():
    tar = get_format("tar")
    _unregister_format("tar")
    assert get_format("tar") is tar
    _unregister_format("no-such-format")  # nothing to forget
    assert {"tar", "parquet"} <= set(available_formats())
