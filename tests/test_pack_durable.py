"""The pack's fast paths: durability before the manifest, sizing while encoding, folder reads, jobs.

NOTE [ Durable before the manifest ] (``shardstream.pack.durable``): shards are renamed
into place without an fsync of their own and fsynced later, always before the manifest.
These tests record every fsync and rename of a real pack to check that order.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import PackError, StorageError
from shardstream.formats import get_format
from shardstream.formats.tar.header import exact_sample_size, sample_size
from shardstream.pack import ShardWriter, open_source, pack
from shardstream.pack.jobs import Packed, ShardJob, pack_entries
from shardstream.storage import local
from tests.test_pack import make_folder, samples, snapshot

TAR = get_format("tar")


class Recorder:
    """Every fsync (by the path of its file descriptor) and rename, in order, from any thread."""

    def __init__(self, monkeypatch, fail_on: str | None = None) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        fsync, replace = os.fsync, os.replace

        def record_fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if fail_on is not None and path.endswith(fail_on):
                raise OSError(errno.EIO, "injected I/O error", path)
            fsync(fd)
            with self._lock:
                self.events.append(("fsync", path))

        def record_replace(src, dst) -> None:
            replace(src, dst)
            with self._lock:
                self.events.append(("rename", os.fspath(dst)))

        monkeypatch.setattr(os, "fsync", record_fsync)
        monkeypatch.setattr(os, "replace", record_replace)

    def position(self, kind: str, path) -> int:
        return self.events.index((kind, os.path.realpath(path)))


def assert_durable_before_manifest(recorder: Recorder, dest) -> None:
    manifest = json.loads((dest / ".shardstream" / "manifest.json").read_text())
    published = recorder.position("rename", dest / ".shardstream" / "manifest.json")
    files = [name for shard in manifest["shards"] for name in (shard["path"], shard["index"])]
    for name in files:
        assert recorder.position("fsync", dest / name) < published, name
    assert recorder.position("fsync", dest) < published  # the renames of the files into place
    # and no shard was fsynced under its temp name, before its rename (the writer's old policy)
    temp = [p for kind, p in recorder.events if kind == "fsync" and local.TEMP_PREFIX in p]
    assert all(p.endswith("manifest.json") for p in temp), temp


def test_shard_writer_makes_shards_durable_before_the_manifest(tmp_path, monkeypatch):
    recorder = Recorder(monkeypatch)
    with ShardWriter(tmp_path / "ds", samples_per_shard=7) as writer:
        for sample in samples(40):
            writer.write(sample)
    assert len(writer.manifest.shards) == 6
    assert_durable_before_manifest(recorder, tmp_path / "ds")


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_pack_makes_shards_durable_before_the_manifest(tmp_path, monkeypatch, workers):
    make_folder(tmp_path / "src", 60)
    recorder = Recorder(monkeypatch)
    manifest = pack(tmp_path / "src", tmp_path / "ds", shard_size="8KB", workers=workers)
    assert len(manifest.shards) > 4
    assert_durable_before_manifest(recorder, tmp_path / "ds")


def test_a_failed_fsync_leaves_no_manifest(tmp_path, monkeypatch):
    make_folder(tmp_path / "src", 30)
    Recorder(monkeypatch, fail_on="shard-000001.tar")
    with pytest.raises(StorageError, match="durable") as info:
        pack(tmp_path / "src", tmp_path / "ds", shard_size="8KB", workers=1)
    assert info.value.url.endswith("shard-000001.tar")
    assert not (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()
    monkeypatch.undo()
    pack(tmp_path / "src", tmp_path / "ds", shard_size="8KB", workers=1)  # a rerun finishes it
    assert (tmp_path / "ds" / ".shardstream" / "manifest.json").exists()


def write_and_fail(path, *, durable: bool) -> None:
    with local.atomic_writer(str(path), durable=durable) as f:
        f.write(b"partial")
        raise RuntimeError("failed mid-way")


def test_deferred_writes_stay_atomic(tmp_path, monkeypatch):
    recorder = Recorder(monkeypatch)
    target = tmp_path / "x.bin"
    with pytest.raises(RuntimeError, match="mid-way"):
        write_and_fail(target, durable=False)
    assert os.listdir(tmp_path) == []
    with local.atomic_writer(str(target), durable=False) as f:
        f.write(b"whole")
    assert target.read_bytes() == b"whole"
    assert [kind for kind, _ in recorder.events] == ["rename"]  # no fsync of its own
    with local.atomic_writer(str(target)) as f:  # durable by default: fsynced before its rename
        f.write(b"again")
    assert [kind for kind, _ in recorder.events] == ["rename", "fsync", "rename"]


def test_shard_writer_and_pack_write_the_same_bytes_for_every_worker_count(tmp_path):
    make_folder(tmp_path / "src", 90)
    source = open_source(tmp_path / "src")
    with ShardWriter(tmp_path / "written", shard_size="9KB") as writer:
        for entry in source.scan():
            writer.write(source.load(entry))
    for workers in (1, 2, 3):
        pack(tmp_path / "src", tmp_path / f"w{workers}", shard_size="9KB", workers=workers)
        assert snapshot(tmp_path / f"w{workers}") == snapshot(tmp_path / "written")


def test_shard_jobs_pickle_as_columns_and_back(tmp_path):
    make_folder(tmp_path / "src", 12)
    entries = list(open_source(tmp_path / "src").scan())
    job = ShardJob(3, "shard-000003.tar", (entries,))
    assert pickle.loads(pickle.dumps(job)) == job
    inline = ShardJob(
        0, "s", ([e._replace(sample={"__key__": e.key}, line=i) for i, e in enumerate(entries)],)
    )
    assert pickle.loads(pickle.dumps(inline)) == inline
    # entries a worker sized reach the worker that writes them still packed, sliced
    packed = Packed(pack_entries(entries), 2, 9)
    forwarded = ShardJob(1, "s", (entries[:2], packed[1:5], entries[9:]))
    assert pickle.loads(pickle.dumps(forwarded)).entries == entries[:2] + entries[3:7] + entries[9:]


@pytest.mark.parametrize(
    ("size", "message"), [(3, "3 bytes when listed, more now"), (8, "8 bytes when listed, 5 now")]
)
def test_folder_file_changed_after_listing_is_named(tmp_path, size, message):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"x" * size)
    source = open_source(tmp_path / "src")
    (entry,) = source.scan()
    (tmp_path / "src" / "a.txt").write_bytes(b"y" * 5)
    with pytest.raises(PackError, match=message) as info:
        source.load(entry)
    assert info.value.url.endswith("a.txt")


# Sizes: the fast path of sample_size (NOTE [ Fast tar sample sizes ]) against the general one
# and against the bytes the encoder writes, including samples it must send to the general path.
_text = st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=70)
_sample = st.builds(
    lambda key, fields, meta: {"__key__": key, **fields, **meta},
    st.one_of(st.from_regex(r"[a-z0-9/]{1,60}[a-z0-9]", fullmatch=True), _text),
    st.dictionaries(
        st.one_of(st.sampled_from(["txt", "cls", "seg.png", "json"]), _text),
        st.one_of(st.binary(max_size=1200), st.text(max_size=300), st.integers(-(10**20), 10**20)),
        max_size=4,
    ),
    st.dictionaries(st.sampled_from(["__url__", "_meta"]), st.text(max_size=5), max_size=1),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(_sample, min_size=1, max_size=6), rooms=st.lists(st.integers(0, 8000), min_size=6))
def test_sizes_and_write_within_agree_with_the_bytes_written(batch, rooms):
    buffer, reference = io.BytesIO(), io.BytesIO()
    encoder, plain = TAR.encoder(buffer, name="p"), TAR.encoder(reference, name="r")
    last = None
    for sample, room in zip(batch * 2, rooms * 2, strict=False):  # twice: the second time from plans
        try:
            expected = exact_sample_size(sample, None)
        except PackError:
            with pytest.raises(PackError):
                sample_size(sample, None)
            continue
        assert sample_size(sample, None) == expected == TAR.sample_size(sample)
        before = encoder.num_bytes
        if encoder.num_samples and sample["__key__"] == last:
            with pytest.raises(PackError, match="repeats"):
                encoder.write_within(sample, room)
            continue
        added = encoder.write_within(sample, room)
        assert added == expected
        if added <= room:
            plain.write(sample)
        assert encoder.num_bytes == before + (added if added <= room else 0)
        if added <= room:
            last = sample["__key__"]
    encoder.close()
    plain.close()
    assert buffer.getvalue() == reference.getvalue()
