"""Sidecars tied to their shards, checked reads, and manifests whose counts lie (issue 10: 5, 6, 12).

See NOTE [ Checksummed reads ] in shardstream/formats/checks.py.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import tarfile
import time
import tracemalloc
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardstream
from shardstream.catalog import index_dataset, verify_dataset
from shardstream.cli import main
from shardstream.errors import FormatError, ShardstreamError
from shardstream.formats import get_format
from shardstream.formats._sidecar import pack_sidecar, unpack_versioned
from shardstream.formats.checks import BLOCK
from shardstream.pack import ShardWriter
from shardstream.storage import Storage

SHARDS, PER_SHARD = 4, 200


def sample(i: int, tag: bytes = b"a") -> dict:
    # equal sizes for every sample and tag: shards (and sidecars) of one dataset are the same size
    return {"__key__": f"k{i:05d}", "txt": tag * 300 + b"%05d" % i, "cls": b"%03d" % (i % 1000)}


def write(url: str, fmt: str = "tar", tag: bytes = b"a", options: dict | None = None, **kwargs) -> None:
    with ShardWriter(url, format=fmt, samples_per_shard=PER_SHARD, storage_options=options, **kwargs) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write(sample(i, tag))


def read(path: str | os.PathLike) -> bytes:
    return pathlib.Path(path).read_bytes()


def manifest(url: str) -> dict:
    return json.loads(pathlib.Path(url, ".shardstream", "manifest.json").read_text())


def stream(url: str, **kwargs) -> list[dict]:
    kwargs.setdefault("decode", False)
    kwargs.setdefault("shuffle", False)
    return list(shardstream.StreamingDataset(url, **kwargs))


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def data_offset(url: str, fmt: str, row: int = 150) -> int:
    """An offset inside sample ``row``'s data (not a header) in the dataset's first shard
    (for Parquet: inside the bytes of its row group)."""
    info = manifest(url)["shards"][0]
    index = get_format(fmt).load_index(read(os.path.join(url, info["index"])), name="s")
    return index.byte_range(row, row + 1).end - 2


# -- item 5: a sidecar names its shard ---------------------------------------------------------


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_sidecar_carries_its_shards_size_sha256_and_block_crcs(tmp_path, fmt):
    url = str(tmp_path / "ds")
    write(url, fmt)
    for info in manifest(url)["shards"]:
        data = read(os.path.join(url, info["path"]))
        index = get_format(fmt).load_index(read(os.path.join(url, info["index"])), name="s")
        checks = index.checks
        assert checks is not None
        assert (checks.size, checks.sha256) == (info["bytes"], info["sha256"])
        expected = [zlib.crc32(data[i : i + BLOCK]) for i in range(0, len(data), BLOCK)]
        assert checks.crcs.tolist() == expected


def test_another_shards_sidecar_is_refused_when_streaming_and_by_verify(tmp_path):
    url = str(tmp_path / "ds")
    write(url)
    info = manifest(url)["shards"]
    assert info[0]["bytes"] == info[1]["bytes"]
    assert info[0]["index_bytes"] == info[1]["index_bytes"]
    shutil.copy(os.path.join(url, info[1]["index"]), os.path.join(url, info[0]["index"]))
    with pytest.raises(FormatError, match="written for another shard") as caught:
        stream(url)
    assert caught.value.shard == info[0]["path"]
    problems = {p.shard: p.problem for p in verify_dataset(url).problems}
    assert "written for another shard" in problems[info[0]["path"]]


def test_a_shard_swapped_for_another_of_equal_size_is_an_error(tmp_path):
    url = str(tmp_path / "ds")
    write(url)
    info = manifest(url)["shards"]
    a, b = (os.path.join(url, info[i]["path"]) for i in (0, 1))
    os.rename(a, a + ".tmp")
    os.rename(b, a)
    os.rename(a + ".tmp", b)
    with pytest.raises(FormatError, match="checksum mismatch") as caught:
        stream(url)
    assert caught.value.shard == info[0]["path"]
    assert caught.value.offset == 0


# -- item 6: every read is checked -------------------------------------------------------------


@pytest.mark.parametrize("local_reads", ["copy", "map"])
@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_flipped_byte_in_sample_data_is_a_format_error_naming_shard_and_offset(tmp_path, fmt, local_reads):
    url = str(tmp_path / "ds")
    write(url, fmt, compression=None if fmt == "tar" else "none")  # uncompressed: a flip is silent
    expected = stream(url, local_reads=local_reads)
    offset = data_offset(url, fmt)
    flip(os.path.join(url, manifest(url)["shards"][0]["path"]), offset)
    with pytest.raises(FormatError, match="checksum mismatch") as caught:
        stream(url, local_reads=local_reads)
    assert caught.value.shard == manifest(url)["shards"][0]["path"]
    assert caught.value.offset == offset - offset % BLOCK
    # the option that turns the check off streams the flipped byte as data, as before
    unchecked = stream(url, verify_checksums=False, local_reads=local_reads)
    assert len(unchecked) == len(expected)
    assert unchecked != expected


@pytest.mark.parametrize("local_reads", ["copy", "map"])
def test_on_error_skip_leaves_out_the_samples_of_a_failed_block_only(tmp_path, local_reads):
    url = str(tmp_path / "ds")
    write(url)
    offset = data_offset(url, "tar", row=90)  # inside a block in the middle of shard 0
    flip(os.path.join(url, manifest(url)["shards"][0]["path"]), offset)
    dataset = shardstream.StreamingDataset(
        url, decode=False, shuffle=False, on_error="skip", local_reads=local_reads
    )
    got = list(dataset)
    assert 0 < dataset.num_skipped < PER_SHARD
    assert len(got) + dataset.num_skipped == SHARDS * PER_SHARD
    assert all(s == sample(int(s["__key__"][1:])) for s in got)


def _recorded(monkeypatch, cls, name: str, events: list[tuple], tag: str, *, sleep: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    """``cls.name(self, first, ...)`` spied: it sleeps ``sleep`` s, then does its work and
    appends ``(tag, first's shard or first)`` to ``events`` (a shard file's reads only)."""
    original = getattr(cls, name)

    def spy(self, first, *args):  # type: ignore[no-untyped-def]
        time.sleep(sleep if not isinstance(first, str) or first.endswith(".tar") else 0.0)
        done = original(self, first, *args)
        if not isinstance(first, str) or first.endswith(".tar"):
            events.append((tag, getattr(first, "shard", first)))
        return done

    monkeypatch.setattr(cls, name, spy)


def test_a_streams_reads_are_decoded_while_its_later_reads_are_checked(tmp_path, monkeypatch):
    # NOTE [ Checks beside decoding ]: a window's first read is decoded once its own check
    # is done, while the check of its others runs on; every read is checked before any of
    # its bytes is decoded, and a window's samples come only when all its reads are.
    from shardstream.dataset.reader import WindowReader

    url = str(tmp_path / "ds")
    write(url)  # one window of 4 shards (shuffle=False): 4 reads
    events: list[tuple] = []
    _recorded(monkeypatch, WindowReader, "check", events, "checked", sleep=0.05)
    _recorded(monkeypatch, WindowReader, "_decode_read", events, "decoded")
    got = stream(url, local_reads="map")
    assert got == [sample(i) for i in range(SHARDS * PER_SHARD)]
    for shard in range(SHARDS):
        assert events.index(("checked", shard)) < events.index(("decoded", shard))
    assert events.index(("decoded", 0)) < events.index(("checked", SHARDS - 1))


def test_a_local_windows_reads_are_checked_as_they_land(tmp_path, monkeypatch):
    # NOTE [ Checks as reads land ]: local reads run one after another, and each one's check
    # begins in the checker's thread while the reads after it are still being read.
    from shardstream.dataset.fetch import ByteFetcher
    from shardstream.dataset.reader import WindowReader

    url = str(tmp_path / "ds")
    write(url)  # one window of 4 shards (shuffle=False): 4 reads
    events: list[tuple] = []
    _recorded(monkeypatch, WindowReader, "check", events, "checked")
    # each read waits after its bytes are in: time for the checker's thread to check the one before
    _recorded(monkeypatch, ByteFetcher, "read", events, "read", sleep=0.05)
    got = stream(url, local_reads="copy")
    assert got == [sample(i) for i in range(SHARDS * PER_SHARD)]
    reads = [i for i, event in enumerate(events) if event[0] == "read"]
    assert len(reads) == SHARDS
    assert events.index(("checked", 0)) < reads[-1]  # the first read checked before the last is in


def test_reads_on_s3_are_widened_to_check_blocks_and_checked(s3, tmp_path):
    base, options = s3
    url = base + "/ds"
    write(url, options=options)
    assert len(stream(url, storage_options=options, shuffle=True, shuffle_window=50)) == SHARDS * PER_SHARD
    storage = Storage(url, options)
    try:
        path = storage.read_manifest().shards[2].path
        data = bytearray(storage.read(path))
        data[3 * BLOCK + 100] ^= 0x40
        storage.write(path, bytes(data))
    finally:
        storage.close()
    with pytest.raises(FormatError, match="checksum mismatch") as caught:
        stream(url, storage_options=options, shuffle=True, shuffle_window=50)
    assert caught.value.shard == path
    assert caught.value.offset == 3 * BLOCK


def test_pack_overwrite_during_an_epoch_ends_in_a_clear_error(tmp_path):
    url = str(tmp_path / "ds")
    write(url, tag=b"a")
    dataset = shardstream.StreamingDataset(url, decode=False, shuffle=False, shuffle_window=50)
    samples = iter(dataset)
    first = [next(samples) for _ in range(10)]
    assert first == [sample(i, b"a") for i in range(10)]
    write(url, tag=b"b", overwrite=True)  # same names, same sizes, other bytes
    rest = []
    with pytest.raises(FormatError, match=r"checksum mismatch|written for another shard"):
        rest.extend(samples)
    assert all(got["txt"].startswith(b"a") for got in rest), "a sample of the new dataset, old manifest"


# -- sidecars of version 1 ---------------------------------------------------------------------


def to_version_1(url: str, fmt: str) -> None:
    """Rewrite every sidecar as shardstream wrote it before checks (version 1), and the manifest."""
    kind, count = (b"tar\0", 10) if fmt == "tar" else (b"pq\0\0", 5)
    data = manifest(url)
    for info in data["shards"]:
        path = os.path.join(url, info["index"])
        _, sections = unpack_versioned(read(path), kind, (2,), name=info["path"])
        old = pack_sidecar(kind, 1, [bytes(s) for s in sections[:count]])
        pathlib.Path(path).write_bytes(old)
        info["index_bytes"] = len(old)
    pathlib.Path(url, ".shardstream", "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_version_1_sidecars_stream_verify_names_them_and_index_rewrites_them(tmp_path, fmt):
    url = str(tmp_path / "ds")
    write(url, fmt)
    expected = stream(url)
    to_version_1(url, fmt)
    assert stream(url) == expected
    report = verify_dataset(url)
    assert report.ok, report.problems  # an old dataset is sound, only unchecked when streamed
    assert report.unchecked == tuple(info["path"] for info in manifest(url)["shards"])
    index_dataset(url)
    assert verify_dataset(url).ok
    assert verify_dataset(url).unchecked == ()
    assert stream(url) == expected
    flip(os.path.join(url, manifest(url)["shards"][0]["path"]), data_offset(url, fmt))
    with pytest.raises(FormatError, match="checksum mismatch"):
        stream(url)


def test_index_writes_checked_sidecars_for_foreign_tar_and_parquet(tmp_path):
    tars = tmp_path / "tars"
    tars.mkdir()
    for s in range(2):
        with tarfile.open(tars / f"shard-{s:06d}.tar", "w") as archive:
            for i in range(100):
                value = b"foreign %d " % i * 40
                member = tarfile.TarInfo(f"s{s}k{i:03d}.txt")
                member.size = len(value)
                archive.addfile(member, io.BytesIO(value))
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    table = pa.table({"text": [f"row {i} " * 30 for i in range(300)], "n": np.arange(300)})
    pq.write_table(table, parquet / "part-0.parquet", row_group_size=50, compression="none")
    for url in (str(tars), str(parquet)):
        built = index_dataset(url)
        for info in built.shards:
            index = get_format(built.format).load_index(read(os.path.join(url, info.index)), name="x")
            assert index.checks is not None
            assert index.checks.sha256 == info.sha256
        count = len(stream(url))
        assert count == built.num_samples
        shard = os.path.join(url, built.shards[0].path)
        raw = read(shard)
        flip(shard, raw.index(b"foreign 7" if url == str(tars) else b"row 77") + 3)
        with pytest.raises(FormatError, match="checksum mismatch"):
            stream(url)


# -- item 12: counts that lie --------------------------------------------------------------------


@pytest.mark.parametrize("claimed", [10**8, 10**12, 10**15])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_manifest_claiming_huge_counts_fails_clearly_before_allocating(tmp_path, claimed, shuffle):
    url = str(tmp_path / "ds")
    write(url)
    data = manifest(url)
    data["shards"][1]["samples"] = claimed
    data["num_samples"] = sum(s["samples"] for s in data["shards"])
    pathlib.Path(url, ".shardstream", "manifest.json").write_text(json.dumps(data))
    tracemalloc.start()
    try:
        with pytest.raises(ShardstreamError, match=f"the manifest says {claimed}") as caught:
            # a loop, not list(): list() preallocates len(dataset), the manifest's claim
            for _ in shardstream.StreamingDataset(url, shuffle=shuffle, decode=False):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.shard == data["shards"][1]["path"]
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB allocated before the check"


def test_a_window_is_laid_out_lazily_whatever_the_manifest_claims():
    # NOTE [ Window size ]: the default is never capped (old states must resume); the
    # window is laid out only after its shards' counts are checked (test above).
    from shardstream.plan import EpochPlan, PlanConfig
    from shardstream.plan.config import MAX_WINDOW

    tracemalloc.start()
    try:
        plan = EpochPlan([10, 10**15, 10], PlanConfig(), epoch=0, world_size=1)
        windows = plan.worker_windows(0, 0)
        next(windows)  # a window is made; its samples are not laid out until asked for
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.shuffle_window > 10**15
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB allocated for a plan of a 10**15-sample shard"
    with pytest.raises(shardstream.errors.PlanError, match="at most"):
        PlanConfig(shuffle_window=MAX_WINDOW + 1)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_version_1_sidecar_of_another_shard_is_still_a_problem(tmp_path, fmt):
    url = str(tmp_path / "ds")
    write(url, fmt)
    to_version_1(url, fmt)
    data = manifest(url)
    first, second = data["shards"][0], data["shards"][1]
    for key in ("index", "index_bytes"):
        first[key], second[key] = second[key], first[key]
    pathlib.Path(url, ".shardstream", "manifest.json").write_text(json.dumps(data))
    report = verify_dataset(url)
    assert not report.ok
    assert report.bad_shards == sorted([first["path"], second["path"]])
    assert all("does not match the shard's contents" in p.problem for p in report.problems)
    assert set(report.unchecked) == {info["path"] for info in data["shards"]}


def test_cli_verify_of_an_old_dataset_exits_0_with_a_note(tmp_path, capsys):
    url = str(tmp_path / "ds")
    write(url, "tar")
    to_version_1(url, "tar")
    assert main(["verify", url]) == 0
    out = capsys.readouterr().out
    assert f"{SHARDS} shards have sample indexes without checksums" in out
    assert "shardstream index" in out
    assert out.strip().endswith(": OK")
    assert main(["verify", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["ok"]
    assert len(shown["unchecked"]) == SHARDS
