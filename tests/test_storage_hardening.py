"""Storage hardening (issue 10): reads checked against the manifest, a cache keyed by
content, non-regular files refused, bounded waits, and clear errors (never SIGBUS, never a
bare OSError) for a truncated shard and a full cache disk."""

from __future__ import annotations

import errno
import io
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

import shardstream
from shardstream.errors import StorageError, TransientStorageError
from shardstream.pack import ShardWriter
from shardstream.storage import Expected, RetryPolicy, Storage
from shardstream.types import ByteRange

ROOT = pathlib.Path(__file__).resolve().parent.parent
S3FS_ONLY = {"config_kwargs": {"connector_args": {"keepalive_timeout": 5.0}}}  # keeps reads on s3fs


def write(url: str, fill: int, options: dict | None = None, *, overwrite: bool = False) -> None:
    """20 samples of 1000 bytes ``fill`` each, in two shards; the same sizes for every ``fill``."""
    with ShardWriter(url, samples_per_shard=10, storage_options=options, overwrite=overwrite) as writer:
        for i in range(20):
            writer.write({"__key__": f"k{i:03d}", "bin": bytes([fill]) * 1000})


def stream(url: str, **kwargs) -> dict[str, bytes]:
    dataset = shardstream.StreamingDataset(url, decode=False, shuffle=False, **kwargs)
    try:
        return {s["__key__"]: s["bin"] for s in dataset}
    finally:
        dataset.storage.close()


def run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        **kwargs,
    )


# -- 4: the cache is keyed by content -------------------------------------------------------


@pytest.mark.s3
def test_cache_serves_the_new_dataset_after_pack_overwrite_with_the_same_sizes(s3, tmp_path):
    base, options = s3
    url, cache = f"{base}/ds", str(tmp_path / "cache")
    write(url, 1, options)
    old = Storage(url, options).read_manifest()
    assert set(stream(url, storage_options=options, cache_dir=cache).values()) == {b"\x01" * 1000}
    write(url, 2, options, overwrite=True)
    new = Storage(url, options).read_manifest()
    assert [(s.path, s.bytes, s.index_bytes) for s in new.shards] == [
        (s.path, s.bytes, s.index_bytes) for s in old.shards
    ]
    assert [s.sha256 for s in new.shards] != [s.sha256 for s in old.shards]
    assert set(stream(url, storage_options=options, cache_dir=cache).values()) == {b"\x02" * 1000}


def test_a_cached_download_is_checked_against_the_manifest_sha256(tmp_path):
    storage = Storage(f"memory://hardening-{uuid.uuid4().hex[:8]}", cache_dir=str(tmp_path))
    storage.write("a.tar", b"x" * 5000)
    try:
        wrong = Expected(5000, sha256="0" * 64)
        with pytest.raises(StorageError, match=r"sha256 .* changed since the manifest was written") as info:
            storage.read("a.tar", ByteRange(0, 10), expect=wrong)
        assert not isinstance(info.value, TransientStorageError)
        assert info.value.shard == "a.tar"
        assert not [
            n for n in os.listdir(tmp_path) if n.startswith(("sscache-", ".sscache-tmp")) and ".lock" not in n
        ]
        import hashlib

        right = Expected(5000, sha256=hashlib.sha256(b"x" * 5000).hexdigest())
        assert storage.read("a.tar", ByteRange(0, 10), expect=right) == b"x" * 10
    finally:
        storage.delete("a.tar")


def test_a_cached_download_is_checked_by_its_sidecars_crc_where_known_else_by_sha256(tmp_path, monkeypatch):
    """NOTE [ Filling the cache ]: with the sidecar's CRC-32 known when the bytes are in,
    the fill sums them with it (no sha256); without it, the sha256 is still checked."""
    import hashlib
    import zlib

    from shardstream.storage import cached

    storage = Storage(f"memory://hardening-{uuid.uuid4().hex[:8]}", cache_dir=str(tmp_path))
    data = b"x" * 5000
    storage.write("a.tar", data)
    digest = hashlib.sha256(data).hexdigest()
    hashed = []
    real_sha256 = cached.hashlib.sha256

    def counted_sha256(*args):  # type: ignore[no-untyped-def]
        if not args:  # a fill's running hash (the cache's entry names hash their keys)
            hashed.append("fill")
        return real_sha256(*args)

    real_file_sha256 = cached._file_sha256
    monkeypatch.setattr(cached.hashlib, "sha256", counted_sha256)
    monkeypatch.setattr(cached, "_file_sha256", lambda *a: hashed.append("file") or real_file_sha256(*a))
    try:
        wrong = Expected(5000, sha256=digest, crc32=lambda: zlib.crc32(data) ^ 1)
        with pytest.raises(StorageError, match=r"its CRC-32 is .*, its sample index says .* changed since"):
            storage.read("a.tar", ByteRange(0, 10), expect=wrong)
        assert not [
            n for n in os.listdir(tmp_path) if n.startswith(("sscache-", ".sscache-tmp")) and ".lock" not in n
        ]
        right = Expected(5000, sha256=digest, crc32=lambda: zlib.crc32(data))
        assert storage.read("a.tar", ByteRange(0, 10), expect=right) == b"x" * 10
        assert hashed == []  # the CRC was the check
    finally:
        storage.delete("a.tar")
    storage.write("b.tar", data)
    try:  # the sidecar had not come when the bytes had: the sha256, of the file read back
        late = Expected(5000, sha256="0" * 64, crc32=lambda: None)
        with pytest.raises(StorageError, match=r"its sha256 is .*, the manifest says"):
            storage.read("b.tar", ByteRange(0, 10), expect=late)
        assert hashed == ["file"]
        assert (
            storage.read("b.tar", ByteRange(0, 10), expect=Expected(5000, digest, crc32=lambda: None))
            == b"x" * 10
        )
    finally:
        storage.delete("b.tar")


@pytest.mark.s3
def test_a_cache_fill_checks_the_shard_by_its_sidecars_crc(s3, tmp_path, monkeypatch):
    """A shard changed on the store after its sidecar was written (same size, one byte)
    fails its fill by the CRC-32 the sidecar gives (known: the dataset keeps its sidecars
    across epochs), no sha256 is taken, and nothing of it is kept."""
    from shardstream.storage import cached

    base, options = s3
    url, cache = f"{base}/ds", tmp_path / "cache"
    write(url, 1, options)
    dataset = shardstream.StreamingDataset(
        url, decode=False, shuffle=False, storage_options=options, cache_dir=str(cache)
    )
    try:
        assert {s["bin"] for s in dataset} == {b"\x01" * 1000}
        storage = Storage(url, options)
        shard = storage.read_manifest().shards[1].path
        data = bytearray(storage.read(shard))
        data[700] ^= 1  # in the first sample's data
        storage.write(shard, bytes(data))
        for entry in cache.glob("sscache-*"):
            entry.unlink()
        summed_by = []
        real_init = cached._FileSink.__init__

        def spy_init(self, fd, *, summing, **kwargs):  # type: ignore[no-untyped-def]
            summed_by.append(type(summing).__name__)
            real_init(self, fd, summing=summing, **kwargs)

        monkeypatch.setattr(cached._FileSink, "__init__", spy_init)
        monkeypatch.setattr(cached, "_file_sha256", None)  # never read back
        with pytest.raises(StorageError, match=r"its CRC-32 is .*, its sample index says") as info:
            list(dataset)
        assert info.value.shard == shard
        assert "_Crc32" in summed_by
        assert "sha256" not in str(summed_by).lower()
        kept = [p for p in cache.iterdir() if p.name.startswith(("sscache-", ".sscache-tmp"))]
        assert not [p for p in kept if p.name.startswith(".sscache-tmp") or p.read_bytes() == bytes(data)]
    finally:
        dataset.storage.close()


# -- 5: every read checks the object's size -----------------------------------------------


def test_a_local_shard_of_another_size_than_the_manifest_says_is_refused(tmp_path):
    url = str(tmp_path / "ds")
    write(url, 1)
    with open(os.path.join(url, "shard-000001.tar"), "ab") as f:  # ranged reads still fit
        f.write(b"\0" * 10240)
    with pytest.raises(StorageError, match="changed since the manifest was written") as info:
        stream(url)
    assert info.value.shard == "shard-000001.tar"
    assert "shard-000001.tar" in (info.value.url or "")


@pytest.mark.s3
@pytest.mark.parametrize("reads", ["botocore", "s3fs"])
@pytest.mark.parametrize("window", [20, 4], ids=["whole-get", "ranged"])
def test_an_s3_shard_of_another_size_than_the_manifest_says_is_refused(s3, reads, window):
    base, options = s3
    url = f"{base}/ds"
    write(url, 1, options)
    storage = Storage(url, options)
    storage.write("shard-000001.tar", storage.read("shard-000001.tar") + b"\0" * 10240)
    storage.close()
    options = dict(options, **S3FS_ONLY) if reads == "s3fs" else options
    assert (Storage(url, options)._s3 is None) == (reads == "s3fs")
    with pytest.raises(StorageError, match="changed since the manifest was written") as info:
        stream(url, storage_options=options, shuffle_window=window)
    assert not isinstance(info.value, TransientStorageError)  # permanent: not retried
    assert info.value.shard == "shard-000001.tar"
    assert info.value.url == f"{url}/shard-000001.tar"


@pytest.mark.s3
@pytest.mark.parametrize("reads", ["botocore", "s3fs", "memory"])
def test_storage_read_checks_the_total_size_on_every_path(s3, reads):
    base, options = s3
    if reads == "memory":
        url, options = f"memory://hardening-{uuid.uuid4().hex[:8]}", {}
    else:
        url = f"{base}/ds"
        options = dict(options, **S3FS_ONLY) if reads == "s3fs" else options
    storage = Storage(url, options)
    storage.write("a.bin", b"y" * 3000)
    try:
        assert storage.read("a.bin", ByteRange(10, 20), expect=Expected(3000)) == b"y" * 10
        assert storage.read("a.bin", expect=Expected(3000)) == b"y" * 3000
        for rng in (ByteRange(10, 20), None):
            with pytest.raises(StorageError, match="3000 bytes, the manifest says 3001") as info:
                storage.read("a.bin", rng, expect=Expected(3001))
            assert not isinstance(info.value, TransientStorageError)
            assert info.value.url == f"{storage.url}/a.bin"
    finally:
        storage.delete("a.bin")
        storage.close()


# -- 14: FIFOs are refused, never waited on -------------------------------------------------


def _fifo_dataset(tmp_path, fifo: str) -> str:
    """A dataset whose file ``fifo`` is replaced by a FIFO (that no one ever writes)."""
    url = str(tmp_path / "ds")
    write(url, 1)
    os.remove(os.path.join(url, fifo))  # fails if the dataset has no such file
    os.mkfifo(os.path.join(url, fifo))
    return url


def _shardstream(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardstream", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("command", "fifo"),
    [
        ("verify", ".shardstream/manifest.json"),
        ("verify", ".shardstream/shard-000001.tar.idx"),
        ("inspect", ".shardstream/manifest.json"),
        ("stream", ".shardstream/manifest.json"),
        ("stream", "shard-000001.tar"),
        ("stream", ".shardstream/shard-000001.tar.idx"),
    ],
)
def test_a_fifo_in_a_dataset_is_refused_naming_it(tmp_path, command, fifo):
    url = _fifo_dataset(tmp_path, fifo)
    if command == "stream":
        run = run_python(
            f"""
            import shardstream
            try:
                list(shardstream.StreamingDataset({url!r}, decode=False))
            except shardstream.ShardstreamError as error:
                raise SystemExit(f"error: {{error}}")
            """
        )
    else:
        run = _shardstream(command, url)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "not a regular file (a FIFO)" in output, output
    assert fifo in output, output
    assert "Traceback" not in output, output


@pytest.mark.timeout(300)
def test_index_refuses_a_fifo_shard_naming_it(tmp_path):
    url = _fifo_dataset(tmp_path, "shard-000001.tar")
    shutil.rmtree(os.path.join(url, ".shardstream"))  # shards another tool wrote: no manifest, no sidecars
    run = _shardstream("index", url)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "not a regular file (a FIFO)" in output, output
    assert "shard-000001.tar" in output, output


def test_storage_refuses_non_regular_files_on_every_local_read(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    storage = Storage(str(tmp_path))
    for read in (
        lambda: storage.read("fifo"),
        lambda: storage.read("fifo", ByteRange(0, 1)),
        lambda: storage.open("fifo"),
    ):
        with pytest.raises(StorageError, match=r"not a regular file \(a FIFO\)") as info:
            read()
        assert "fifo" in (info.value.url or "")


# -- 15: an endpoint that never answers fails within the bound ------------------------------


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server")
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections.append(connection)

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self.connections:
            connection.close()
        self.sock.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reads", ["botocore", "s3fs"])
def test_an_endpoint_that_never_answers_fails_within_the_bound_naming_it(reads):
    with SilentServer() as server:
        config: dict = {"connect_timeout": 1, "read_timeout": 1}
        if reads == "s3fs":
            config.update(S3FS_ONLY["config_kwargs"])
        options = {"endpoint_url": server.endpoint, "key": "k", "secret": "s", "config_kwargs": config}
        # Without the bound, 1000 tries of 1 s each would outlast the test's timeout.
        retry = RetryPolicy(attempts=1000, base_delay=0.01, max_delay=0.05, timeout=2)
        storage = Storage("s3://bucket/ds", options, retry=retry)
        assert (storage._s3 is None) == (reads == "s3fs")
        try:
            with pytest.raises(TransientStorageError) as info:
                storage.read("shard-000000.tar", ByteRange(0, 100))
        finally:
            storage.close()
    message = str(info.value)
    assert "RetryPolicy.timeout 2 s" in message, message
    assert "read_timeout 1 s" in message, message
    assert info.value.url == "s3://bucket/ds/shard-000000.tar"
    tries = int(message.split(" failed after ", 1)[1].split(" tries", 1)[0])
    assert tries < 1000


def test_no_try_starts_past_the_deadline_but_min_rate_gives_a_long_read_more_time(monkeypatch):
    from shardstream.storage import retry as retry_module

    clock = [0.0]
    monkeypatch.setattr(retry_module, "_clock", lambda: clock[0])
    calls = []

    def long_then_broken() -> bytes:  # each try runs 100 s (on the fake clock), then times out
        calls.append(clock[0])
        clock[0] += 100.0
        raise TimeoutError("timed out")

    def read(policy: RetryPolicy) -> None:
        calls.clear()
        clock[0] = 0.0
        retry_module.call_with_retry(
            long_then_broken, policy, what="read", url="u", rng=ByteRange(0, 1500), sleep=lambda s: None
        )

    with pytest.raises(TransientStorageError, match=r"after 1 tries .*RetryPolicy\.timeout 10 s"):
        read(RetryPolicy(attempts=5, base_delay=0, timeout=10))
    assert calls == [0.0]
    # 1500 bytes at 10 bytes/s: 150 s for the read, so a second try starts at 100 s
    with pytest.raises(TransientStorageError, match=r"after 2 tries .*150\.0 s at RetryPolicy\.min_rate 10"):
        read(RetryPolicy(attempts=5, base_delay=0, timeout=10, min_rate=10))
    assert calls == [0.0, 100.0]


def test_retry_policy_timeout_is_validated():
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(shardstream.errors.UsageError, match=r"RetryPolicy\.timeout"):
            RetryPolicy(timeout=bad)
    assert RetryPolicy(timeout=None).timeout is None


# -- clear errors: a truncated shard, a full cache disk -----------------------------------------


def test_a_shard_truncated_while_streaming_is_a_storage_error_not_sigbus(tmp_path):
    url = str(tmp_path / "ds")
    with ShardWriter(url, samples_per_shard=200) as writer:
        for i in range(1000):
            writer.write({"__key__": f"k{i:04d}", "bin": os.urandom(20_000)})
    run = run_python(
        f"""
        import os
        import shardstream
        from shardstream.dataset.fetch import ByteFetcher
        from shardstream.errors import StorageError
        from shardstream.storage import Storage
        from shardstream.types import ByteRange

        url = {url!r}
        shards = sorted(n for n in os.listdir(url) if n.endswith(".tar"))
        storage = Storage(url)
        manifest = storage.read_manifest()
        # The bytes of a read are handed out, then the shard is truncated under them.
        fetcher = ByteFetcher(storage, manifest)
        data = fetcher.read(shards[-1], ByteRange(0, 1_000_000))
        os.truncate(os.path.join(url, shards[-1]), 4096)
        assert bytes(data[-10:]) == bytes(memoryview(data)[-10:])
        try:
            fetcher.read(shards[-1], ByteRange(0, 1_000_000))
        except StorageError as error:
            print("first:", type(error).__name__, error)
        # The same under the dataset: the next windows are read ahead while one is consumed.
        dataset = shardstream.StreamingDataset(url, decode=False, shuffle=False, shuffle_window=50)
        samples = iter(dataset)
        next(samples)
        for name in shards:
            os.truncate(os.path.join(url, name), 4096)
        try:
            for sample in samples:
                sum(sample["bin"][::4096])
        except StorageError as error:
            print("second:", type(error).__name__, error)
        """
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])  # -7: killed by SIGBUS
    assert "first: StorageError" in run.stdout, run.stdout
    assert "second: StorageError" in run.stdout, run.stdout
    assert "shard-000000.tar" in run.stdout


def test_a_full_cache_disk_is_a_storage_error_naming_the_cache_and_leaves_no_temp(tmp_path):
    cache = tmp_path / "cache"
    run = run_python(
        f"""
        import os, resource, signal, uuid
        from shardstream.errors import StorageError
        from shardstream.storage import Storage
        from shardstream.types import ByteRange

        storage = Storage(f"memory://full-{{uuid.uuid4().hex}}", cache_dir={str(cache)!r})
        storage.write("shard-000000.tar", os.urandom(500_000))
        # Files this process writes may grow to 64 KiB: past that, write() fails (EFBIG).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            storage.read("shard-000000.tar", ByteRange(0, 10))
        except StorageError as error:
            print(type(error).__name__, error)
        """
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("StorageError cannot write the shard cache in "), run.stdout
    assert str(cache) in run.stdout
    assert "shard-000000.tar" in run.stdout
    assert not [n for n in os.listdir(cache) if n.startswith(".sscache-tmp")]


class _FullDisk(io.FileIO):
    def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_enospc_while_writing_a_cache_entry_is_a_storage_error(tmp_path, monkeypatch):
    storage = Storage(f"memory://enospc-{uuid.uuid4().hex[:8]}", cache_dir=str(tmp_path))
    storage.write("shard-000000.tar", b"z" * 5000)

    def full(fd, data, offset):  # the cache fills its entries with pwrite (NOTE [ Filling the cache ])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    try:
        with pytest.raises(StorageError, match="No space left on device") as info:
            storage.read("shard-000000.tar", ByteRange(0, 10))
        assert str(tmp_path) in info.value.message
        assert info.value.url == f"{storage.url}/shard-000000.tar"
        assert not isinstance(info.value.__cause__, StorageError)
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".sscache-tmp")]
    finally:
        storage.delete("shard-000000.tar")
