"""One conformance suite for ``Storage``, run against memory://, a local folder and S3 (moto over HTTP).

As in fsspec's ``tests/abstract``: the tests live in ``StorageConformance`` and each
backend is a subclass that only says how to make a ``Storage``.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import tempfile
import uuid

import pytest

from shardstream.errors import ManifestError, StorageError, UsageError
from shardstream.manifest import Manifest, ShardInfo
from shardstream.storage import RetryPolicy, Storage, local
from shardstream.storage import retry as retry_module
from shardstream.types import ByteRange

DATA = random.Random(0).randbytes(100_000)


def _write_then_fail(storage: Storage, path: str, data: bytes, check=lambda: None) -> None:
    with storage.writer(path) as f:
        f.write(data)
        check()
        raise RuntimeError("boom")


def _temp_spools() -> set[str]:
    return {e for e in os.listdir(tempfile.gettempdir()) if e.startswith("shardstream")}


class StorageConformance:
    """Behaviour every backend must have. Subclasses define the ``storage`` fixture."""

    def test_url_is_normalised(self, storage):
        assert not storage.url.endswith("/")
        assert storage.full_url("a/b.tar") == storage.url + "/a/b.tar"
        assert Storage(storage.url + "/", storage.storage_options).url == storage.url

    def test_write_then_read_whole_and_ranges(self, storage):
        storage.write("shard-000000.tar", DATA)
        assert storage.read("shard-000000.tar") == DATA
        for start, end in [(0, 1), (10, 20_000), (99_999, 100_000), (0, 100_000), (5, 5)]:
            assert storage.read("shard-000000.tar", ByteRange(start, end)) == DATA[start:end]

    def test_size_and_exists(self, storage):
        storage.write("x.bin", DATA[:1234])
        assert storage.size("x.bin") == 1234
        assert storage.exists("x.bin")
        assert not storage.exists("y.bin")

    def test_list_files_is_recursive_relative_and_sorted(self, storage):
        for name in ["b.tar", "a.tar", "idx/a.idx", "idx/deep/c.idx"]:
            storage.write(name, b"x")
        assert storage.list_files() == ["a.tar", "b.tar", "idx/a.idx", "idx/deep/c.idx"]

    def test_empty_folder_lists_nothing(self, storage):
        assert storage.list_files() == []

    def test_overwrite_replaces_the_whole_object(self, storage):
        storage.write("x.bin", DATA)
        storage.write("x.bin", b"short")
        assert storage.read("x.bin") == b"short"
        assert storage.size("x.bin") == 5

    def test_writer_streams_and_publishes_on_exit(self, storage):
        with storage.writer("sub/out.bin") as f:
            for i in range(0, len(DATA), 7_000):
                f.write(DATA[i : i + 7_000])
            assert not storage.exists("sub/out.bin")  # nothing visible before the end
        assert storage.read("sub/out.bin") == DATA
        assert storage.list_files() == ["sub/out.bin"]

    def test_writer_exception_leaves_nothing(self, storage):
        spools = _temp_spools()
        storage.write("keep.bin", b"old")
        with pytest.raises(RuntimeError, match="boom"):
            _write_then_fail(storage, "keep.bin", b"new half")
        with pytest.raises(RuntimeError, match="boom"):
            _write_then_fail(storage, "new.bin", b"half")
        assert storage.read("keep.bin") == b"old"
        assert not storage.exists("new.bin")
        assert storage.list_files() == ["keep.bin"]
        assert _temp_spools() == spools

    def test_open_reads_sequentially_and_seeks(self, storage):
        storage.write("x.bin", DATA)
        with storage.open("x.bin") as f:
            assert f.read(10) == DATA[:10]
            assert f.read(50_000) == DATA[10:50_010]
            f.seek(99_990)
            assert f.read() == DATA[99_990:]
            assert f.read(1) == b""

    def test_delete_and_delete_missing(self, storage):
        storage.write("x.bin", b"x")
        storage.delete("x.bin")
        assert not storage.exists("x.bin")
        storage.delete("x.bin")

    def test_missing_object_fails_fast_naming_the_url(self, storage, monkeypatch):
        waits: list[float] = []
        monkeypatch.setattr(retry_module, "_sleep", waits.append)
        for call in (
            lambda: storage.read("nope.tar"),
            lambda: storage.read("nope.tar", ByteRange(0, 10)),
            lambda: storage.size("nope.tar"),
            lambda: storage.open("nope.tar"),
        ):
            with pytest.raises(StorageError, match="not found") as info:
                call()
            assert storage.full_url("nope.tar") in str(info.value)
        assert waits == []  # a permanent error is not retried

    def test_range_past_the_end_is_a_permanent_error(self, storage, monkeypatch):
        waits: list[float] = []
        monkeypatch.setattr(retry_module, "_sleep", waits.append)
        storage.write("x.bin", b"0123456789")
        with pytest.raises(StorageError) as info:
            storage.read("x.bin", ByteRange(5, 20))
        assert "x.bin" in str(info.value)
        assert waits == []

    def test_paths_must_stay_inside_the_folder(self, storage):
        for bad in ["/etc/passwd", "../x", "a/../../x", "s3://other/x"]:
            with pytest.raises(UsageError):
                storage.read(bad)

    def test_manifest_round_trip_and_missing_manifest(self, storage):
        with pytest.raises(ManifestError, match="not a shardstream dataset") as info:
            storage.read_manifest()
        assert storage.url in str(info.value)
        manifest = Manifest("tar", (ShardInfo("shard-000000.tar", 3, 100, "ab" * 32, "shard-000000.idx"),))
        storage.write_manifest(manifest)
        assert storage.read_manifest() == manifest
        assert storage.list_files() == [".shardstream/manifest.json"]

    def test_a_manifest_of_the_legacy_layout_is_read_and_the_new_one_wins(self, storage):
        old = Manifest("tar", (ShardInfo("shard-000000.tar", 3, 100, "ab" * 32, "shard-000000.tar.idx"),))
        storage.write("manifest.json", old.to_json().encode())
        assert storage.read_manifest() == old
        new = Manifest(
            "tar", (ShardInfo("shard-000000.tar", 3, 100, "ab" * 32, ".shardstream/shard-000000.tar.idx"),)
        )
        storage.write_manifest(new)
        assert storage.read_manifest() == new

    def test_pickle_round_trip_then_use(self, storage):
        storage.write("x.bin", DATA)
        storage.read("x.bin", ByteRange(0, 10))  # make the live file system first
        clone = pickle.loads(pickle.dumps(storage))
        assert clone.url == storage.url
        assert clone.retry == storage.retry
        assert clone._backend._fs is None  # configuration only, no live client
        assert clone.read("x.bin", ByteRange(100, 200)) == DATA[100:200]
        clone.write("y.bin", b"from clone")
        assert storage.read("y.bin") == b"from clone"

    def test_close_is_idempotent_and_storage_stays_usable(self, storage):
        storage.write("x.bin", b"abc")
        storage.close()
        storage.close()
        assert storage.read("x.bin") == b"abc"


class CrossProcessConformance:
    """For backends whose files other processes see (not memory://)."""

    @pytest.mark.parametrize("method", ["fork", "spawn"])
    def test_used_in_parent_then_in_child_process(self, storage, method):
        storage.write("x.bin", DATA)
        assert storage.read("x.bin", ByteRange(0, 100)) == DATA[:100]
        assert storage.fs is not None  # the parent's live file system exists now
        process = multiprocessing.get_context(method).Process(
            target=_child_copy, args=(storage, os.getpid(), method)
        )
        process.start()
        process.join(timeout=120)
        assert process.exitcode == 0
        assert storage.read("child.bin") == b"child-ok:" + DATA[1000:2000]
        assert storage.read("x.bin", ByteRange(0, 100)) == DATA[:100]  # the parent's fs still works


def _child_copy(storage: Storage, parent_pid: int, method: str) -> None:
    """In a child process: the parent's file system must not be reused; read and write."""
    if os.getpid() == parent_pid:
        raise SystemExit(3)
    inherited = storage._backend._fs
    if (inherited is None) != (method == "spawn"):  # fork inherits the object, spawn unpickles it
        raise SystemExit(4)
    data = storage.read("x.bin", ByteRange(1000, 2000))
    if storage.fs is inherited or storage._backend._fs_pid != os.getpid():
        raise SystemExit(5)
    storage.write("child.bin", b"child-ok:" + data)
    storage.close()


class TestMemory(StorageConformance):
    @pytest.fixture
    def storage(self):
        storage = Storage(f"memory://ds-{uuid.uuid4().hex[:8]}")
        yield storage
        for path in storage.list_files():
            storage.delete(path)
        storage.close()


class TestLocal(StorageConformance, CrossProcessConformance):
    @pytest.fixture
    def storage(self, tmp_path):
        return Storage(str(tmp_path / "dataset"))

    def test_relative_and_file_urls_are_made_absolute(self, tmp_path, monkeypatch):
        monkeypatch.chdir(tmp_path)
        assert Storage("ds/").url == str(tmp_path / "ds")
        assert Storage(f"file://{tmp_path}/ds/").url == f"file://{tmp_path}/ds"
        Storage(f"file://{tmp_path}/ds").write("a.bin", b"a")
        assert Storage("ds").read("a.bin") == b"a"

    def test_writer_leaves_no_temp_file_next_to_the_target(self, storage):
        seen = []

        def look() -> None:
            seen.extend(os.listdir(os.path.join(storage.url, "d")))

        with pytest.raises(RuntimeError, match="boom"):
            _write_then_fail(storage, "d/x.bin", b"abc", look)
        assert len(seen) == 1
        assert seen[0].startswith(".shardstream-tmp-")
        assert os.listdir(os.path.join(storage.url, "d")) == []

    def test_written_file_gets_normal_permissions(self, storage):
        storage.write("x.bin", b"x")
        mode = os.stat(os.path.join(storage.url, "x.bin")).st_mode & 0o777
        umask = os.umask(0)
        os.umask(umask)
        assert mode == 0o666 & ~umask


@pytest.mark.s3
class TestS3(StorageConformance, CrossProcessConformance):
    @pytest.fixture
    def storage(self, s3):
        base, options = s3
        storage = Storage(base + "/dataset/", options, retry=RetryPolicy(attempts=3, base_delay=0.001))
        yield storage
        storage.close()

    def test_endpoint_from_the_environment(self, s3, storage):
        # the s3 fixture set AWS_ENDPOINT_URL and the keys; no storage_options at all
        storage.write("x.bin", b"hello")
        plain = Storage(s3[0] + "/dataset")
        assert plain.read("x.bin", ByteRange(1, 4)) == b"ell"
        plain.close()

    def test_writer_with_many_small_writes(self, storage):
        blob = random.Random(1).randbytes(3 * 2**20 + 17)
        with storage.writer("big.bin") as f:
            view = memoryview(blob)
            for i in range(0, len(blob), 65_536):
                f.write(view[i : i + 65_536])
        assert storage.size("big.bin") == len(blob)
        assert storage.read("big.bin", ByteRange(2**20, 2**20 + 10)) == blob[2**20 : 2**20 + 10]

    def test_bucket_root_as_the_dataset_folder(self, s3):
        base, options = s3
        storage = Storage(base + "/", options)
        storage.write("a.tar", b"a")
        storage.write("sub/b.tar", b"b")
        assert storage.url == base
        assert storage.list_files() == ["a.tar", "sub/b.tar"]
        storage.close()


@pytest.mark.parametrize("url", ["", "memory://", "s3://", "a::memory://x", "nosuchprotocol://x"])
def test_bad_urls_are_usage_errors(url):
    with pytest.raises(UsageError):
        Storage(url)


_URLS = ["data/x", "/abs/x", "~/x", "file:///abs/x", "file://rel/x", "local:///abs/x", "s3://b/k", "memory://m/x",
         "C://windows/x", "gcs://b", "data:text", "x://y"]  # fmt: skip


@pytest.mark.parametrize("url", _URLS)
def test_url_helpers_split_as_fsspec_does(url):
    import fsspec.core

    assert local.split_protocol(url) == tuple(fsspec.core.split_protocol(url))
    if local.is_local_url(url):
        assert local.local_path(url) == os.path.abspath(os.path.expanduser(fsspec.core.strip_protocol(url)))


def test_a_local_pack_and_verify_never_import_fsspec(tmp_path):
    """Local paths are split without fsspec: its import (and asyncio's) is ~50 ms of a command's start."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    script = (
        "import sys\n"
        "from shardstream.cli import main\n"
        f"assert main(['pack', {str(tmp_path / 'src')!r}, {str(tmp_path / 'ds')!r}, '--quiet', '--workers', '2']) == 0\n"
        f"assert main(['verify', {str(tmp_path / 'ds')!r}]) == 0\n"
        "assert 'fsspec' not in sys.modules, 'fsspec was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
