"""The backend contract of NOTE [ One backend per Storage ] (storage/backend.py), as the
rest of shardstream sees it through ``Storage``: the backend picked once, explicit
durability, the temp-file sweep, mappings, read-only storage for pack input."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from shardstream.errors import PackError, StorageError, UsageError
from shardstream.pack.sources.base import is_dir, list_inputs, open_input
from shardstream.pack.sources.folder import FolderSource
from shardstream.storage import RetryPolicy, Storage, absolute_url
from shardstream.storage.backend import FsspecBackend, LocalBackend, S3Backend
from shardstream.types import ByteRange


@pytest.fixture
def memory_url():
    url = f"memory://backends-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def test_the_backend_is_picked_once_from_the_url(tmp_path, memory_url):
    assert type(Storage(str(tmp_path))._backend) is LocalBackend
    assert type(Storage(f"file://{tmp_path}")._backend) is LocalBackend
    assert type(Storage(memory_url)._backend) is FsspecBackend
    assert type(Storage("s3://bucket/ds")._backend) is S3Backend
    assert Storage(str(tmp_path)).needs_sync
    assert not Storage(memory_url).needs_sync
    assert Storage(str(tmp_path)).local_root == str(tmp_path)
    assert Storage(memory_url).local_root is None


def test_a_write_that_is_not_durable_is_renamed_without_an_fsync(tmp_path, monkeypatch):
    synced: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))
    )
    storage = Storage(str(tmp_path))
    storage.write("a.bin", b"a", durable=False)
    with storage.writer("b.bin", durable=False) as f:
        f.write(b"b")
    assert synced == []
    assert (tmp_path / "a.bin").read_bytes() == b"a"
    assert (tmp_path / "b.bin").read_bytes() == b"b"
    storage.sync("a.bin")
    storage.sync()  # the folder: the renames into it
    assert synced == [str(tmp_path / "a.bin"), str(tmp_path)]
    storage.write("c.bin", b"c")  # durable by default: its own fsync, under its temp name
    assert len(synced) == 3
    assert ".shardstream-tmp-" in synced[2]


def test_sync_is_nothing_to_do_on_object_stores(memory_url):
    storage = Storage(memory_url)
    storage.write("a.bin", b"a", durable=False)
    storage.sync("a.bin")
    storage.sync()
    assert storage.read("a.bin") == b"a"


def test_a_failed_sync_raises_its_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        Storage(str(tmp_path)).sync("missing.bin")


def test_the_temp_sweep_removes_only_what_the_caller_owns(tmp_path):
    names = [".shardstream-tmp-0a1b-shard-000000.tar", ".shardstream-tmp-ff-other.bin", "shard-000001.tar"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".shardstream-tmp-00-shard-000000.tar").write_bytes(b"x")
    seen: list[str] = []
    Storage(str(tmp_path)).remove_temp_files(
        lambda target: seen.append(target) or target.startswith("shard-")
    )
    assert sorted(seen) == ["other.bin", "shard-000000.tar"]
    assert sorted(os.listdir(tmp_path)) == [".shardstream-tmp-ff-other.bin", "shard-000001.tar", "sub"]
    assert os.listdir(tmp_path / "sub") == [".shardstream-tmp-00-shard-000000.tar"]  # the top only


def test_the_temp_sweep_is_nothing_to_do_on_object_stores(memory_url):
    storage = Storage(memory_url)
    storage.write(".shardstream-tmp-00-shard-000000.tar", b"x")
    storage.remove_temp_files(lambda target: True)
    assert storage.exists(".shardstream-tmp-00-shard-000000.tar")


def test_map_gives_the_bytes_of_a_local_file_and_refuses_an_object_store(tmp_path, memory_url):
    data = bytes(range(256)) * 300
    (tmp_path / "a.bin").write_bytes(data)
    storage = Storage(str(tmp_path))
    view = storage.map("a.bin", ByteRange(70_000, 70_100))
    assert bytes(view) == data[70_000:70_100]
    with pytest.raises(StorageError, match="past the end of the file"):
        storage.map("a.bin", ByteRange(0, len(data) + 1))
    with pytest.raises(UsageError, match="memory-mapped"):
        Storage(memory_url).map("a.bin", ByteRange(0, 1))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(StorageError, match="not a regular file"):  # NOTE [ Only regular files ]
        storage.map("fifo", ByteRange(0, 1))


def test_map_reads_a_cache_entry(tmp_path, memory_url):
    Storage(memory_url).write("a.bin", b"0123456789")
    storage = Storage(memory_url, cache_dir=str(tmp_path / "cache"))
    assert bytes(storage.map("a.bin", ByteRange(2, 5))) == b"234"


def test_a_read_only_storage_refuses_every_change(tmp_path):
    storage = Storage(str(tmp_path), read_only=True)
    for change in (
        lambda: storage.write("a.bin", b"a"),
        lambda: storage.writer("a.bin").__enter__(),
        lambda: storage.delete("a.bin"),
        lambda: storage.remove_temp_files(lambda target: True),
    ):
        with pytest.raises(UsageError, match="read-only"):
            change()
    assert os.listdir(tmp_path) == []
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.read_only
    with pytest.raises(UsageError, match="read-only"):
        clone.write("a.bin", b"a")


def test_is_folder_and_list_sizes(tmp_path, memory_url):
    for url in (str(tmp_path), memory_url):
        storage = Storage(url)
        storage.write("a.bin", b"abc")
        storage.write("sub/b.bin", b"de")
        assert storage.is_folder()
        assert storage.is_folder("sub")
        assert not storage.is_folder("a.bin")
        assert sorted(storage.list_sizes()) == [("a.bin", 3), ("sub/b.bin", 2)]
        with pytest.raises(StorageError, match="not found"):
            storage.is_folder("missing")


def test_absolute_url_names_a_local_folder_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_url("src") == str(tmp_path / "src")
    assert absolute_url(f"file://{tmp_path}/src") == str(tmp_path / "src")
    assert absolute_url("s3://bucket/src") == "s3://bucket/src"


class FlakyMemory:
    """Makes the first ``failures`` reads of every memory:// file system fail transiently."""

    def __init__(self, monkeypatch, failures: int) -> None:
        self.left = failures
        self.calls = 0
        cat_file = MemoryFileSystem.cat_file

        def flaky(fs, path, *args, **kwargs):
            self.calls += 1
            if self.left > 0:
                self.left -= 1
                raise ConnectionResetError("injected reset")
            return cat_file(fs, path, *args, **kwargs)

        monkeypatch.setattr(MemoryFileSystem, "cat_file", flaky)


def test_pack_sources_read_through_storage_retries(memory_url, monkeypatch):
    """NOTE [ One retry layer ]: a transient error reading pack input is retried too."""
    storage = Storage(memory_url)
    storage.write("src/a.txt", b"hello")
    storage.write("src/a.json", b"{}")
    storage.write("data.jsonl", b'{"x": 1}\n')
    source = FolderSource(f"{memory_url}/src")
    (entry,) = list(source.scan())
    flaky = FlakyMemory(monkeypatch, failures=2)
    assert source.load(entry) == {"__key__": "a", "json": b"{}", "txt": b"hello"}
    assert flaky.calls == 4  # two failed tries, then one read per file
    flaky.left = 2
    with open_input(f"{memory_url}/data.jsonl", {}) as f:
        assert f.read() == b'{"x": 1}\n'


def test_pack_sources_say_what_is_missing_on_remote_storage(memory_url, monkeypatch):
    Storage(memory_url).write("src/a.txt", b"hello")
    assert is_dir(f"{memory_url}/src", {})
    assert not is_dir(f"{memory_url}/src/a.txt", {})
    with pytest.raises(UsageError, match="source not found"):
        is_dir(f"{memory_url}/nothing", {})
    with pytest.raises(PackError, match="source file not found"):
        open_input(f"{memory_url}/nothing.jsonl", {})
    assert [(rel, size) for rel, _, size in list_inputs(f"{memory_url}/src", {})] == [("a.txt", 5)]
    FlakyMemory(monkeypatch, failures=100)
    source = FolderSource(f"{memory_url}/src", {})
    source._storage.retry = RetryPolicy(attempts=2, base_delay=0)
    (entry,) = list(source.scan())
    with pytest.raises(PackError, match=r"cannot read file: .*failed after 2 tries"):
        source.load(entry)


@pytest.mark.s3
def test_a_write_to_an_object_store_killed_mid_way_leaves_no_spool_behind(s3, tmp_path):
    """NOTE [ A spool with no name ]: a SIGKILL runs no cleanup, so the spool must have no name."""
    base, options = s3
    child = textwrap.dedent(
        f"""
        import sys
        from shardstream.storage import Storage
        with Storage({f"{base}/ds"!r}, {options!r}) as storage, storage.writer("shard.tar") as f:
            f.write(b"x" * (1 << 20))
            f.flush()
            print("written", flush=True)
            sys.stdin.read()
        """
    )
    spools = tmp_path / "tmp"
    spools.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-c", child],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(spools)},
    )
    try:
        assert process.stdout.readline() == "written\n"
        held = [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd")]
        assert any(path.startswith(str(spools)) for path in held)  # the spool is there, in TMPDIR
    finally:
        process.kill()
        process.communicate()
    assert os.listdir(spools) == []
    with Storage(f"{base}/ds", options) as storage:
        assert not storage.exists("shard.tar")  # nor anything half-written


def test_a_spooled_write_uploads_its_bytes_and_removes_its_spool(memory_url, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the spool's folder, this test's alone
    storage = Storage(memory_url)
    with storage.writer("a.bin") as f:
        f.write(b"spooled")
        assert os.listdir(tmp_path) == []  # a spool with no name
    assert storage.read("a.bin") == b"spooled"

    def stopped() -> None:
        with storage.writer("b.bin") as f:
            f.write(b"dropped")
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        stopped()
    assert not storage.exists("b.bin")
