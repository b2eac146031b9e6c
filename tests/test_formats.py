"""One conformance suite for every shard format (tar, Parquet), plus the format registry.

``FormatConformance`` holds the tests; each subclass names a format and the samples it
round-trips. Format-specific behaviour (interop, schema, corrupt shards) is tested in
``test_formats_tar.py`` and ``test_formats_parquet.py``.
"""

from __future__ import annotations

import io
import pickle
import random
from types import MappingProxyType

import numpy as np
import pytest

from shardstream.errors import FormatError, PackError, ShardstreamError, UsageError
from shardstream.formats import (
    ParquetFormat,
    SampleIndex,
    ShardFormat,
    TarFormat,
    available_formats,
    get_format,
    register_format,
)
from shardstream.formats.base import Sample, SampleColumns
from shardstream.types import ByteRange


def write_shard(fmt: ShardFormat, samples: list[Sample], name: str = "shard-0") -> tuple[bytes, SampleIndex]:
    buffer = io.BytesIO()
    encoder = fmt.encoder(buffer, name=name)
    for sample in samples:
        encoder.write(sample)
    assert encoder.num_samples == len(samples)
    index = encoder.close()
    data = buffer.getvalue()
    assert encoder.num_bytes == len(data)
    assert not buffer.closed  # the contract leaves the caller's file open
    return data, index


class FormatConformance:
    """What every format must do. Subclasses set ``fmt`` and may override ``make_samples``."""

    fmt: ShardFormat
    runs_n = 23  # samples in the shard whose every (start, stop) run is decoded

    def make_samples(self, n: int) -> list[Sample]:
        raise NotImplementedError

    def bad_value_sample(self) -> Sample:
        return {"__key__": "bad", "txt": object()}

    @pytest.mark.parametrize("n", [0, 1, 2, 50])
    def test_round_trip_whole_shard(self, n):
        samples = self.make_samples(n)
        data, index = write_shard(self.fmt, samples)
        assert index.num_samples == n
        assert index.keys == [s["__key__"] for s in samples]
        got = list(self.fmt.decode(data, ByteRange(0, len(data)), index, 0, n, name="shard-0"))
        assert got == samples
        view = memoryview(data)
        assert list(self.fmt.decode(view, ByteRange(0, len(data)), index, 0, n, name="shard-0")) == samples

    @pytest.mark.parametrize("n", [0, 1, 7])
    def test_sidecar_round_trip(self, n):
        _data, index = write_shard(self.fmt, self.make_samples(n))
        sidecar = index.to_bytes()
        loaded = self.fmt.load_index(sidecar, name="shard-0")
        assert loaded == index
        assert loaded.to_bytes() == sidecar
        assert loaded.keys == index.keys
        assert [loaded.byte_range(a, b) for a in range(n + 1) for b in range(a, n + 1)] == [
            index.byte_range(a, b) for a in range(n + 1) for b in range(a, n + 1)
        ]
        assert pickle.loads(pickle.dumps(index)) == index

    @pytest.mark.parametrize("n", [0, 1, 9])
    def test_build_index_equals_encoder_index(self, n):
        samples = self.make_samples(n)
        data, index = write_shard(self.fmt, samples)
        built, fields = self.fmt.build_index(io.BytesIO(data), name="shard-0")
        assert built == index
        assert built.keys == index.keys
        expected_fields = {f for s in samples for f in s if not f.startswith("_")}
        assert set(fields) == expected_fields

    def test_decode_every_run_from_its_range_only(self):
        samples = self.make_samples(self.runs_n)
        data, index = write_shard(self.fmt, samples)
        n = len(samples)
        for start in range(n):
            for stop in range(start + 1, n + 1):
                rng = index.byte_range(start, stop)
                assert 0 <= rng.start < rng.end <= len(data)
                got = list(self.fmt.decode(data[rng.start : rng.end], rng, index, start, stop, name="s"))
                assert got == samples[start:stop], (start, stop)

    def test_decode_from_a_wider_range(self):
        samples = self.make_samples(12)
        data, index = write_shard(self.fmt, samples)
        inner = index.byte_range(3, 9)
        rng = ByteRange(max(0, inner.start - 100), min(len(data), inner.end + 100))
        assert list(self.fmt.decode(data[rng.start : rng.end], rng, index, 3, 9, name="s")) == samples[3:9]

    def test_decode_empty_run(self):
        _data, index = write_shard(self.fmt, self.make_samples(4))
        for start in range(5):
            rng = index.byte_range(start, start)
            assert rng.length == 0
            assert list(self.fmt.decode(b"", rng, index, start, start, name="s")) == []

    def test_decode_without_the_needed_bytes_is_a_format_error(self):
        samples = self.make_samples(6)
        data, index = write_shard(self.fmt, samples)
        rng = index.byte_range(2, 4)
        short = data[rng.start : rng.end - 1]
        with pytest.raises(FormatError) as error:
            self.fmt.decode(short, rng, index, 2, 4, name="shard-x")
        assert error.value.shard == "shard-x"
        narrower = ByteRange(rng.start + 1, rng.end)
        with pytest.raises(FormatError):
            self.fmt.decode(data[narrower.start : narrower.end], narrower, index, 2, 4, name="shard-x")

    def random_runs(self, n: int, seed: int) -> list[tuple[int, int]]:
        """Runs in random order and lengths, some empty, some overlapping (resumed windows
        have holes; a read may hold runs of any lengths)."""
        rand = random.Random(seed)
        runs = []
        for _ in range(rand.randint(1, 8)):
            start = rand.randint(0, n)
            runs.append((start, min(n, start + rand.choice([0, 1, 2, 3, 8, n]))))
        return runs

    def test_decode_runs_is_decode_run_after_run(self):
        """NOTE [ One call per read ]: the same samples, in the same order, as one
        ``decode`` call per run; from the whole shard and from the runs' bytes only."""
        samples = self.make_samples(self.runs_n)
        data, index = write_shard(self.fmt, samples)
        for seed in range(60):
            runs = self.random_runs(len(samples), seed)
            starts, stops = (np.array(side, dtype=np.int64) for side in zip(*runs, strict=True))
            lo, hi = index.byte_ranges(starts, stops)
            some = stops > starts
            rng = (
                ByteRange(int(lo[some].min()), int(hi[some].max())) if some.any() else ByteRange(0, len(data))
            )
            for part, where in ((data, ByteRange(0, len(data))), (data[rng.start : rng.end], rng)):
                want = [
                    s for a, b in runs if b > a for s in self.fmt.decode(part, where, index, a, b, name="s")
                ]
                nonempty = (starts[some], stops[some])
                got = self.fmt.decode_runs(part, where, index, *nonempty, name="s")
                listed = got.samples() if isinstance(got, SampleColumns) else got
                assert listed == want, runs
                assert [list(s) for s in listed] == [list(s) for s in want]  # field order too

    def test_decode_runs_without_the_needed_bytes_is_a_format_error(self):
        samples = self.make_samples(6)
        data, index = write_shard(self.fmt, samples)
        rng = index.byte_range(2, 4)
        starts, stops = np.array([3, 2]), np.array([4, 3])
        with pytest.raises(FormatError):  # one byte short of the last run
            self.fmt.decode_runs(data[rng.start : rng.end - 1], rng, index, starts, stops, name="shard-x")

    def test_byte_ranges_are_byte_range_of_each_run(self):
        samples = self.make_samples(self.runs_n)
        _, index = write_shard(self.fmt, samples)
        _, empty = write_shard(self.fmt, [])
        for shard, n in ((index, len(samples)), (empty, 0)):
            for seed in range(40):
                runs = self.random_runs(n, seed)
                starts, stops = (np.array(side, dtype=np.int64) for side in zip(*runs, strict=True))
                lo, hi = shard.byte_ranges(starts, stops)
                assert list(zip(lo.tolist(), hi.tolist(), strict=True)) == [
                    (r.start, r.end) for r in (shard.byte_range(a, b) for a, b in runs)
                ]
        for start, stop in [(-1, 2), (2, 1), (0, len(samples) + 1)]:
            with pytest.raises(UsageError) as one:
                index.byte_range(start, stop)
            with pytest.raises(UsageError) as many:
                index.byte_ranges(np.array([0, start]), np.array([1, stop]))
            assert str(many.value) == str(one.value)

    def test_byte_range_outside_the_shard_is_a_usage_error(self):
        _, index = write_shard(self.fmt, self.make_samples(3))
        for start, stop in [(-1, 2), (2, 1), (0, 4)]:
            with pytest.raises(UsageError):
                index.byte_range(start, stop)

    def test_byte_ranges_grow_with_the_run(self):
        _, index = write_shard(self.fmt, self.make_samples(10))
        for start in range(10):
            for stop in range(start + 1, 10):
                inner, outer = index.byte_range(start, stop), index.byte_range(start, stop + 1)
                assert outer.start <= inner.start
                assert inner.end <= outer.end

    def test_truncated_sidecar_is_a_format_error(self):
        _, index = write_shard(self.fmt, self.make_samples(5))
        sidecar = index.to_bytes()
        for length in sorted({*range(0, 64), *range(0, len(sidecar), max(1, len(sidecar) // 97))}):
            with pytest.raises(FormatError):
                self.fmt.load_index(sidecar[:length], name="s")
        with pytest.raises(FormatError):
            self.fmt.load_index(sidecar + b"\0", name="s")

    def test_corrupt_sidecar_is_a_format_error(self):
        _, index = write_shard(self.fmt, self.make_samples(5))
        sidecar = index.to_bytes()
        positions = sorted({*range(0, 64), *range(0, len(sidecar), max(1, len(sidecar) // 211))})
        for pos in positions:
            corrupt = bytearray(sidecar)
            corrupt[pos] ^= 0x41
            with pytest.raises(FormatError) as error:
                self.fmt.load_index(bytes(corrupt), name="side-1")
            assert error.value.shard == "side-1"

    def test_other_formats_sidecar_is_a_format_error(self):
        other = TarFormat() if isinstance(self.fmt, ParquetFormat) else ParquetFormat()
        _, index = write_shard(other, [{"__key__": "a", "txt": b"x"}])
        with pytest.raises(FormatError, match="format"):
            self.fmt.load_index(index.to_bytes(), name="s")

    def test_same_samples_same_bytes(self):
        samples = self.make_samples(20)
        first, index1 = write_shard(self.fmt, samples)
        second, index2 = write_shard(self.fmt, samples)
        assert first == second
        assert index1.to_bytes() == index2.to_bytes()

    def test_empty_values_round_trip(self):
        samples = [{"__key__": f"e{i}", "txt": b"" if i % 2 else b"x"} for i in range(4)]
        data, index = write_shard(self.fmt, samples)
        assert list(self.fmt.decode(data, ByteRange(0, len(data)), index, 0, 4, name="s")) == samples

    def test_bad_value_names_the_sample_and_keeps_the_encoder_usable(self):
        buffer = io.BytesIO()
        encoder = self.fmt.encoder(buffer, name="shard-v")
        good = self.make_samples(3)
        encoder.write(good[0])
        with pytest.raises(PackError) as error:
            encoder.write(self.bad_value_sample())
        assert "'bad'" in str(error.value)
        assert error.value.shard == "shard-v"
        encoder.write(good[1])
        encoder.write(good[2])
        index = encoder.close()
        data = buffer.getvalue()
        assert list(self.fmt.decode(data, ByteRange(0, len(data)), index, 0, 3, name="s")) == good

    def test_sample_size_is_positive(self):
        for sample in self.make_samples(5):
            assert self.fmt.sample_size(sample) > 0

    def test_write_after_close_is_an_error(self):
        encoder = self.fmt.encoder(io.BytesIO(), name="s")
        encoder.close()
        with pytest.raises(ShardstreamError):
            encoder.write(self.make_samples(1)[0])


class TestTarConformance(FormatConformance):
    fmt = TarFormat()

    def make_samples(self, n: int) -> list[Sample]:
        return [
            {
                "__key__": f"part{i % 3}/sample{i:05d}",
                "cls": str(i % 7).encode(),
                "seg.png": bytes(range(256)) * (i % 5),
                "txt": ("é" * (i * 37 % 600)).encode(),
            }
            for i in range(n)
        ]

    def test_sample_size_is_exact(self):
        samples = self.make_samples(30)
        samples.append({"__key__": "deep/" * 40 + "long", "txt": b"pax"})  # needs a PAX header
        data, _ = write_shard(self.fmt, samples)
        assert sum(self.fmt.sample_size(s) for s in samples) + 1024 == len(data)


class TestParquetConformance(FormatConformance):
    fmt = ParquetFormat()

    def make_samples(self, n: int) -> list[Sample]:
        # every third payload is ~400 kB, so a shard of a few dozen rows has several row groups
        return [
            {
                "__key__": f"sample{i:05d}",
                "txt": b"x" * (400_000 if i % 3 == 2 else i),
                "label": i % 7,
                "score": i / 8,
                "ok": i % 2 == 0,
                "caption": f"caption {i}",
                "tags": [f"t{j}" for j in range(i % 3)],
            }
            for i in range(n)
        ]

    def test_runs_span_several_row_groups(self):
        _, index = write_shard(self.fmt, self.make_samples(self.runs_n))
        assert index.num_row_groups >= 3


def test_registry_knows_tar_and_parquet():
    formats = available_formats()
    assert isinstance(formats, MappingProxyType)
    assert set(formats) >= {"tar", "parquet"}
    assert isinstance(get_format("tar"), TarFormat)
    assert isinstance(get_format("parquet"), ParquetFormat)
    assert get_format("tar").suffix == ".tar"
    assert get_format("parquet").suffix == ".parquet"
    with pytest.raises(TypeError):
        formats["zip"] = TarFormat()  # type: ignore[index]


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(UsageError) as error:
        get_format("zip")
    assert "parquet" in str(error.value)
    assert "tar" in str(error.value)


def test_register_format_and_clobber():
    class OtherTar(TarFormat):
        name = "tar-test-only"

    class Impostor(TarFormat):
        name = "tar-test-only"

    other = OtherTar()
    register_format(other)
    try:
        assert get_format("tar-test-only") is other
        assert available_formats()["tar-test-only"] is other
        register_format(OtherTar())  # the same codec again is fine
        with pytest.raises(UsageError, match="clobber"):
            register_format(Impostor())
        register_format(Impostor(), clobber=True)
        assert isinstance(get_format("tar-test-only"), Impostor)
    finally:
        from shardstream.formats import _registry

        _registry.pop("tar-test-only", None)
    with pytest.raises(UsageError):
        register_format("tar")  # type: ignore[arg-type]


def test_formats_pickle_and_compare_by_class():
    for name in ("tar", "parquet"):
        fmt = get_format(name)
        assert type(pickle.loads(pickle.dumps(fmt))) is type(fmt)


def test_unknown_compression_is_a_usage_error():
    with pytest.raises(UsageError):
        get_format("tar").encoder(io.BytesIO(), name="s", compression="gzip")
    with pytest.raises(UsageError):
        get_format("parquet").encoder(io.BytesIO(), name="s", compression="lz5")
