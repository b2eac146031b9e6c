"""S3 reads through the synchronous botocore client (NOTE [ S3 reads without s3fs ]).

Configuration (credentials, profile, anon, endpoint, request extras, timeouts) and the
error paths are checked against ``StubS3``, a small S3 look-alike on 127.0.0.1 that
records every request and answers planned faults; reads through faults and across
processes run against moto over HTTP.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import http.server
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from aiobotocore.session import AioSession
from botocore import UNSIGNED

import shardstream
from shardstream.errors import StorageError, TransientStorageError
from shardstream.storage import RetryPolicy, Storage, s3lean, s3read
from shardstream.storage import retry as retry_module
from shardstream.storage.s3lean import LeanClient
from shardstream.storage.s3read import S3Reader
from shardstream.types import ByteRange
from tests.faultproxy import FaultProxy

DATA = random.Random(21).randbytes(300_000)
FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.002)
_ERROR_XML = '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{}</Code><Message>{}</Message></Error>'


class StubS3:
    """An S3 look-alike on 127.0.0.1: GET (ranged) and HEAD of objects kept in a dict.

    ``requests`` records ``(method, path, headers)``; ``plan`` holds actions for the
    next GETs, one each: ``(status, code)`` answers an S3 error, ``"short"`` sends 10
    bytes fewer than asked (with a matching Content-Length), ``"whole"`` ignores Range,
    ``("stall", seconds)`` waits before answering.
    """

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.plan: list[object] = []
        stub = self

        class Handler(_StubHandler):
            owner = stub

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="stub-s3", daemon=True)

    def gets(self) -> list[dict[str, str]]:
        return [headers for method, _, headers in self.requests if method == "GET"]


class _StubHandler(http.server.BaseHTTPRequestHandler):
    owner: StubS3
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers at stop

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.owner.requests.append(("HEAD", self.path, dict(self.headers)))
        data = self.owner.objects.get(self.path.split("?")[0])
        if data is None:
            self._answer(404, b"")
        else:
            self._answer(200, b"", length=len(data))

    def do_GET(self) -> None:
        self.owner.requests.append(("GET", self.path, dict(self.headers)))
        action = self.owner.plan.pop(0) if self.owner.plan else None
        if isinstance(action, tuple) and action[0] == "stall":
            time.sleep(action[1])
        elif isinstance(action, tuple):
            status, code = action
            self._answer(status, _ERROR_XML.format(code, code).encode(), kind="application/xml")
            return
        data = self.owner.objects.get(self.path.split("?")[0])
        if data is None:
            self._answer(404, _ERROR_XML.format("NoSuchKey", "no such key").encode(), kind="application/xml")
            return
        spec = self.headers.get("Range", "")
        if not spec or action == "whole":
            self._answer(200, data)
            return
        start, end = (int(x) for x in spec.removeprefix("bytes=").split("-"))
        if start >= len(data):
            self._answer(416, _ERROR_XML.format("InvalidRange", "bad range").encode(), kind="application/xml")
            return
        body = data[start : min(end + 1, len(data))]
        if action == "short":
            body = body[:-10]
        extra = [("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")]
        self._answer(206, body, headers=extra)

    def _answer(self, status, body, *, length=None, kind="binary/octet-stream", headers=()):
        self.send_response(status)
        for name, value in [
            ("Content-Type", kind),
            ("Content-Length", str(len(body) if length is None else length)),
            ("ETag", '"' + hashlib.md5(body).hexdigest() + '"'),
            ("Last-Modified", email.utils.formatdate(usegmt=True)),
            *headers,
        ]:
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(OSError):  # a client that timed out has gone
            self.wfile.write(body)


@pytest.fixture(params=["lean", "botocore"])
def stub(request, monkeypatch):
    """The stub server; each test runs with a LeanClient and with the botocore client
    (NOTE [ Lean GETs ]): both must send and read the same."""
    if request.param == "botocore":
        monkeypatch.setattr(s3lean.LeanClient, "create", classmethod(lambda cls, *given: None))
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = StubS3({"/bkt/ds/x.bin": DATA})
    server._thread.start()
    yield server
    server._server.shutdown()
    server._server.server_close()
    server._thread.join(timeout=10)


def _stub_storage(stub: StubS3, **options) -> Storage:
    return Storage("s3://bkt/ds", {"endpoint_url": stub.endpoint, **options}, retry=FAST)


def _credential(headers: dict[str, str]) -> str | None:
    auth = headers.get("Authorization")
    return None if auth is None else auth.split("Credential=")[1].split("/")[0]


# -- configuration -------------------------------------------------------------------


def test_reads_skip_s3fs_entirely(stub):
    storage = _stub_storage(stub, key="k", secret="s")
    assert storage.read("x.bin") == DATA
    assert storage.read("x.bin", ByteRange(1000, 251_000)) == DATA[1000:251_000]
    assert storage._backend._fs is None  # no s3fs file system was made for reads
    assert [h.get("Range") for h in stub.gets()] == [None, "bytes=1000-250999"]
    storage.close()


def test_credentials_from_options_environment_and_profile(stub, tmp_path, monkeypatch):
    for options in ({"key": "opt-key", "secret": "s"}, {"username": "user-key", "password": "p"}, {}):
        storage = _stub_storage(stub, **options)
        storage.read("x.bin", ByteRange(0, 10))
        storage.close()
    (tmp_path / "credentials").write_text(
        "[team]\naws_access_key_id = profile-key\naws_secret_access_key = x\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    storage = _stub_storage(stub, profile="team")
    storage.read("x.bin", ByteRange(0, 10))
    storage.close()
    anonymous = _stub_storage(stub, anon=True, key="ignored", secret="ignored")
    assert anonymous.read("x.bin", ByteRange(0, 10)) == DATA[:10]
    client = anonymous._s3.client
    if isinstance(client, LeanClient):
        assert client.credentials is None
    else:
        assert client.meta.config.signature_version is UNSIGNED
    anonymous.close()
    seen = [_credential(h) for h in stub.gets()]
    assert seen == ["opt-key", "user-key", "env-key", "profile-key", None]


def test_endpoint_from_client_kwargs_or_the_environment(stub, monkeypatch):
    via_client_kwargs = Storage("s3://bkt/ds", {"client_kwargs": {"endpoint_url": stub.endpoint}}, retry=FAST)
    assert via_client_kwargs.read("x.bin", ByteRange(5, 9)) == DATA[5:9]
    via_client_kwargs.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", stub.endpoint)
    via_environment = Storage("s3://bkt/ds", retry=FAST)
    assert via_environment.read("x.bin", ByteRange(5, 9)) == DATA[5:9]
    via_environment.close()
    assert len(stub.gets()) == 2


def test_requester_pays_and_additional_kwargs_reach_get_object(stub):
    storage = _stub_storage(
        stub,
        requester_pays=True,
        s3_additional_kwargs={"ExpectedBucketOwner": "123456789012", "ACL": "private"},
    )
    assert storage.read("x.bin", ByteRange(0, 100)) == DATA[:100]
    storage.close()
    (headers,) = stub.gets()
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["x-amz-request-payer"] == "requester"
    assert lower["x-amz-expected-bucket-owner"] == "123456789012"
    assert "x-amz-acl" not in lower  # not a GetObject parameter: filtered out, as s3fs does


def test_config_kwargs_reach_the_client_and_a_timeout_is_retried(stub):
    storage = _stub_storage(stub, config_kwargs={"read_timeout": 0.3, "max_pool_connections": 3})
    stub.plan = [("stall", 1.5)]
    assert storage.read("x.bin", ByteRange(0, 100)) == DATA[:100]
    client = storage._s3.client
    if isinstance(client, LeanClient):
        assert client.pool.pool.maxsize == 3
        assert client.timeouts == (5, 0.3)
    else:
        assert client.meta.config.max_pool_connections == 3
        assert client.meta.config.retries["total_max_attempts"] == 1  # one retry layer
    assert len(stub.gets()) == 2
    storage.close()


@pytest.mark.parametrize(
    "options",
    [
        {"session": AioSession()},
        {"version_aware": True},
        {"config_kwargs": {"connector_args": {"keepalive_timeout": 5.0}}},
        {"some_future_s3fs_option": 1},
    ],
    ids=["session", "version_aware", "connector_args", "unknown"],
)
def test_options_only_s3fs_understands_keep_reads_on_s3fs(options):
    assert S3Reader.create({"key": "k", **options}) is None
    assert Storage("s3://bkt/ds", options)._s3 is None


def test_options_that_do_not_affect_reads_keep_the_fast_path():
    storage = Storage("s3://bkt/ds", {"default_block_size": 2**20, "cache_regions": True, "use_ssl": False})
    assert storage._s3 is not None


@pytest.mark.s3
def test_s3fs_fallback_still_reads(s3):
    base, options = s3
    storage = Storage(
        base + "/ds", dict(options, config_kwargs={"connector_args": {"keepalive_timeout": 5.0}}), retry=FAST
    )
    storage.write("x.bin", DATA)
    assert storage._s3 is None
    assert storage.read("x.bin", ByteRange(7, 70_007)) == DATA[7:70_007]
    storage.close()


# -- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "text"),
    [
        ((404, "NoSuchKey"), "not found"),
        ((403, "AccessDenied"), "access denied"),
        ((400, "InvalidRequest"), "InvalidRequest"),
    ],
    ids=["404", "403", "400"],
)
def test_permanent_errors_fail_fast_naming_url_and_range(stub, monkeypatch, action, text):
    waits: list[float] = []
    monkeypatch.setattr(retry_module, "_sleep", waits.append)
    storage = _stub_storage(stub)
    stub.plan = [action]
    with pytest.raises(StorageError, match=text) as info:
        storage.read("x.bin", ByteRange(100, 200))
    storage.close()
    assert "s3://bkt/ds/x.bin" in str(info.value)
    assert "bytes [100, 200)" in str(info.value)
    assert info.value.offset == 100
    assert len(stub.gets()) == 1
    assert waits == []


def test_a_missing_object_is_not_found(stub):
    storage = _stub_storage(stub)
    with pytest.raises(StorageError, match="not found"):
        storage.read("nope.bin")
    assert not storage.exists("nope.bin")
    storage.close()


def test_range_starting_past_the_end_is_permanent(stub):
    storage = _stub_storage(stub)
    with pytest.raises(StorageError, match="past the end") as info:
        storage.read("x.bin", ByteRange(len(DATA), len(DATA) + 5))
    assert "s3://bkt/ds/x.bin" in str(info.value)
    assert len(stub.gets()) == 1
    storage.close()


def test_transient_errors_and_short_bodies_are_retried(stub):
    storage = _stub_storage(stub)
    stub.plan = [(503, "SlowDown"), (500, "InternalError"), "short"]
    assert storage.read("x.bin", ByteRange(50, 50_050)) == DATA[50:50_050]
    assert len(stub.gets()) == 4  # botocore tries once each time: our policy alone retries
    storage.close()


def test_botocore_tries_once_so_the_policy_counts_every_get(stub):
    storage = Storage(
        "s3://bkt/ds", {"endpoint_url": stub.endpoint}, retry=RetryPolicy(attempts=2, base_delay=0.001)
    )
    stub.plan = [(503, "SlowDown")] * 3
    with pytest.raises(TransientStorageError, match=r"bytes \[0, 10\) failed after 2 tries") as info:
        storage.read("x.bin", ByteRange(0, 10))
    assert info.value.url == "s3://bkt/ds/x.bin"
    assert len(stub.gets()) == 2
    storage.close()


def test_a_server_that_ignores_range_still_gives_the_range(stub):
    storage = _stub_storage(stub)
    stub.plan = ["whole"]
    assert storage.read("x.bin", ByteRange(123, 4567)) == DATA[123:4567]
    storage.close()


# -- through a fault-injecting proxy over moto ---------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize(("error", "reset", "truncate"), [(0.0, 0.0, 0.5), (0.0, 0.5, 0.0), (0.2, 0.1, 0.2)])
def test_reads_through_faults_on_the_botocore_path(s3, moto_server, error, reset, truncate):
    # A fixed bucket name: the proxy's choices hang on the request path, so they repeat run to run.
    options = s3[1]
    base = "s3://faults-fixed"
    moto_server.create_bucket("faults-fixed")
    Storage(base, options).write("shard.bin", DATA)
    with FaultProxy(
        moto_server.endpoint, seed=7, error_rate=error, reset_rate=reset, truncate_rate=truncate
    ) as proxy:
        policy = RetryPolicy(attempts=25, base_delay=0.001, max_delay=0.005)
        storage = Storage(base, dict(options, endpoint_url=proxy.endpoint), retry=policy)
        rng = random.Random(8)
        for _ in range(12):
            start = rng.randrange(0, len(DATA) - 1)
            end = rng.randrange(start + 1, min(len(DATA), start + 80_000) + 1)
            assert storage.read("shard.bin", ByteRange(start, end)) == DATA[start:end]
        assert storage.read("shard.bin") == DATA
        assert storage._backend._fs is None  # every GET went through botocore
        storage.close()
    assert proxy.faults() > 0
    assert proxy.stats["truncate"] > 0 or truncate == 0
    assert proxy.stats["reset"] > 0 or reset == 0


# -- processes, threads, pickling ----------------------------------------------------


def test_a_new_process_streams_s3_without_importing_s3fs(s3):
    # s3fs brings aiobotocore and aiohttp: 1-2 s of a spawned DataLoader worker's start
    base, options = s3
    with shardstream.ShardWriter(
        base + "/ds", format="tar", samples_per_shard=4, storage_options=options
    ) as w:
        for i in range(10):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * 100})
    code = (
        "import sys, shardstream\n"
        f"dataset = shardstream.StreamingDataset({base + '/ds'!r}, storage_options={options!r}, shuffle=False)\n"
        "print(len(list(dataset)), 's3fs' in sys.modules, 'aiohttp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["10", "False", "False"]


@pytest.fixture
def moto_storage(s3):
    base, options = s3
    storage = Storage(base + "/ds", options, retry=FAST)
    storage.write("x.bin", DATA)
    yield storage
    storage.close()


def test_pickle_carries_configuration_not_the_client(moto_storage):
    assert moto_storage.read("x.bin", ByteRange(0, 10)) == DATA[:10]
    assert moto_storage._s3._client is not None
    clone = pickle.loads(pickle.dumps(moto_storage))
    assert clone._s3 is not None
    assert clone._s3._client is None
    reader = pickle.loads(pickle.dumps(moto_storage._s3))
    assert reader._client is None
    assert clone.read("x.bin", ByteRange(10, 20)) == DATA[10:20]
    assert clone._s3.client is not moto_storage._s3.client
    clone.close()


@pytest.mark.parametrize("close_first", [False, True], ids=["read_first", "close_first"])
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_child_processes_make_their_own_client(moto_storage, method, close_first):
    assert moto_storage.read("x.bin", ByteRange(0, 10)) == DATA[:10]
    parent_client = moto_storage._s3.client
    _run_child(method, _child_reads, moto_storage, os.getpid(), close_first)
    assert moto_storage._s3.client is parent_client  # the parent keeps its own
    assert moto_storage.read("child.bin") == DATA[2000:3000]


def test_fork_while_another_thread_makes_a_client(moto_storage):
    """A child forked while the client lock is held must still make its client."""
    moto_storage.close()
    with s3read._lock:  # as if another thread were making a client at fork time
        _run_child("fork", _child_reads, moto_storage, os.getpid(), False)
    assert moto_storage.read("child.bin") == DATA[2000:3000]


def test_a_fork_child_never_closes_the_parents_s3fs_session(moto_storage):
    """The parent's s3fs file system, let go of in a fork child, must neither close its
    session there (s3fs's finalizer would ask the parent's event loop, which no thread runs
    in the child, and wait a second for the answer: a stall of whatever thread collected
    it, a DataLoader worker's decoding in the global order bench) nor be collected there
    (aiohttp would log its session as unclosed)."""
    assert moto_storage._backend.fs._s3 is not None  # the session is open: its finalizer is set
    _run_child("fork", _child_lets_go_of_parents_fs, moto_storage, os.getpid())
    assert moto_storage.read("x.bin", ByteRange(0, 10)) == DATA[:10]
    assert moto_storage.size("x.bin") == len(DATA)  # its s3fs session still works in the parent


def _child_lets_go_of_parents_fs(storage: Storage, parent_pid: int) -> None:
    import gc
    import weakref

    import s3fs.core

    if os.getpid() == parent_pid:
        raise SystemExit(3)
    asked: list[object] = []

    def sync(*args: object, **kwargs: object) -> None:  # what s3fs's finalizer closes with
        asked.append(args)

    s3fs.core.sync = sync
    parents = weakref.ref(storage._backend._fs)
    storage._backend._fs = None  # the child's only reference to the parent's file system
    gc.collect()
    if asked:
        raise SystemExit(6)  # the child tried to close the parent's session
    if parents() is None:
        raise SystemExit(7)  # collected here: aiohttp logs the parent's session as unclosed


def test_threads_share_one_client(moto_storage, monkeypatch):
    made: list[int] = []
    make = S3Reader._make_client

    def counting(self):
        made.append(1)
        time.sleep(0.05)  # widen the window in which other threads ask for the client
        return make(self)

    monkeypatch.setattr(S3Reader, "_make_client", counting)
    moto_storage.close()
    starts = list(range(0, 250_000, 10_000))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda s: moto_storage.read("x.bin", ByteRange(s, s + 30_000)), starts))
    assert got == [DATA[s : s + 30_000] for s in starts]
    assert made == [1]


def _run_child(method: str, target, *args) -> None:
    process = multiprocessing.get_context(method).Process(target=target, args=args)
    process.start()
    process.join(timeout=120)
    assert process.exitcode == 0


def _child_reads(storage: Storage, parent_pid: int, close_first: bool) -> None:
    """In a child: never use or close the parent's client; make one and read with it."""
    if os.getpid() == parent_pid:
        raise SystemExit(3)
    inherited = storage._s3._client
    if inherited is not None:

        def refuse() -> None:
            raise SystemExit(4)  # closing the parent's client in a child

        inherited.close = refuse
        inherited.get_object = refuse
    if close_first:
        storage.close()  # must leave the parent's client alone
    data = storage.read("x.bin", ByteRange(2000, 3000))
    if storage._s3._client is None or storage._s3._client is inherited or storage._s3._pid != os.getpid():
        raise SystemExit(5)
    storage.write("child.bin", data)
    storage.close()


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data, self.closed = data, False

    def read(self) -> bytes:
        return self.data

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("status", [200, 206])
def test_read_into_cuts_only_a_whole_object_body(monkeypatch, status):
    """A 206 body is the range, also when it carries a ContentEncoding (as aws-chunked
    objects do): only a 200 (the server ignored Range) is cut, as ``read`` cuts it."""
    data = bytes(range(256)) * 40
    rng = ByteRange(4000, 5000)
    body = data if status == 200 else data[rng.start : rng.end]
    reader = S3Reader({})

    def get(bucket, key, rng_, size):
        meta = {"HTTPStatusCode": status}
        return {
            "Body": _Body(body),
            "ContentLength": len(body),
            "ContentEncoding": "aws-chunked",
            "ResponseMetadata": meta,
        }

    monkeypatch.setattr(reader, "_get", get)
    out = bytearray(rng.length)
    assert reader.read_into("b", "k", rng, memoryview(out), size=None) == rng.length
    assert bytes(out) == data[rng.start : rng.end]
    assert reader.read("b", "k", rng) == data[rng.start : rng.end]
