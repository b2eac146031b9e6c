"""Retries: what counts as transient, backoff, and reads through a fault-injecting proxy."""

from __future__ import annotations

import errno
import http.client
import random

import aiohttp
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from shardstream.errors import StorageError, TransientStorageError, UsageError
from shardstream.storage import RetryPolicy, Storage, is_transient
from shardstream.storage import retry as retry_module
from shardstream.types import ByteRange
from tests.faultproxy import FaultProxy

DATA = random.Random(3).randbytes(200_000)


def _client_error(status: int, code: str) -> ClientError:
    response = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetObject")  # type: ignore[arg-type]


def _wrapped(error: BaseException, outer: BaseException) -> BaseException:
    outer.__cause__ = error  # as s3fs's translate_boto_error does
    return outer


@pytest.mark.parametrize(
    "error",
    [
        _client_error(503, "SlowDown"),
        _client_error(500, "InternalError"),
        _client_error(429, "TooManyRequests"),
        _wrapped(_client_error(503, "SlowDown"), OSError(errno.EBUSY, "Please reduce your request rate")),
        _wrapped(_client_error(502, "BadGateway"), OSError(errno.EIO, "Bad Gateway")),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        ConnectionAbortedError(),
        TimeoutError(),
        http.client.IncompleteRead(b"abc", 10),
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ServerDisconnectedError(),
        ConnectionClosedError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        TransientStorageError("short read"),
    ],
    ids=repr,
)
def test_transient_errors(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        _client_error(404, "NoSuchKey"),
        _client_error(403, "AccessDenied"),
        _client_error(400, "InvalidRequest"),
        _wrapped(_client_error(404, "NoSuchKey"), FileNotFoundError("x")),
        _wrapped(_client_error(403, "AccessDenied"), PermissionError("x")),
        FileNotFoundError("x"),
        PermissionError("x"),
        StorageError("not found"),
        ValueError("bad"),
        KeyError("x"),
    ],
    ids=repr,
)
def test_permanent_errors(error):
    assert not is_transient(error)


def test_policy_validates_and_backs_off_with_capped_full_jitter():
    with pytest.raises(UsageError):
        RetryPolicy(attempts=0)
    with pytest.raises(UsageError):
        RetryPolicy(base_delay=-1)
    policy = RetryPolicy(base_delay=0.5, max_delay=3.0)
    for failures in range(1, 20):
        cap = min(3.0, 0.5 * 2 ** (failures - 1))
        assert all(0.0 <= policy.delay(failures) <= cap for _ in range(50))


def test_call_with_retry_counts_tries_and_names_the_range():
    calls = []
    waits: list[float] = []

    def flaky() -> bytes:
        calls.append(1)
        raise ConnectionResetError("reset")

    with pytest.raises(TransientStorageError, match=r"bytes \[10, 20\)") as info:
        retry_module.call_with_retry(
            flaky,
            RetryPolicy(attempts=4),
            what="read",
            url="s3://b/x",
            rng=ByteRange(10, 20),
            sleep=waits.append,
        )
    assert len(calls) == 4
    assert len(waits) == 3
    assert info.value.url == "s3://b/x"
    assert info.value.offset == 10
    assert "s3://b/x" in str(info.value)


def test_call_with_retry_recovers():
    outcomes = [TimeoutError(), _client_error(503, "SlowDown"), b"ok"]

    def op() -> bytes:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert (
        retry_module.call_with_retry(op, RetryPolicy(), what="read", url="u", sleep=lambda s: None) == b"ok"
    )


@pytest.mark.s3
def test_reads_through_faults_return_the_right_bytes(s3, moto_server):
    # A fixed bucket name: the proxy's choices hang on the request path, so they repeat run to run.
    options = s3[1]
    base = "s3://faults-fixed"
    moto_server.create_bucket(base.removeprefix("s3://"))
    Storage(base, options).write("shard.bin", DATA)
    with FaultProxy(
        moto_server.endpoint, seed=11, error_rate=0.2, reset_rate=0.1, truncate_rate=0.1
    ) as proxy:
        policy = RetryPolicy(attempts=25, base_delay=0.001, max_delay=0.005)
        storage = Storage(base, dict(options, endpoint_url=proxy.endpoint), retry=policy)
        rng = random.Random(5)
        for _ in range(30):
            start = rng.randrange(0, len(DATA) - 1)
            end = rng.randrange(start + 1, min(len(DATA), start + 50_000) + 1)
            assert storage.read("shard.bin", ByteRange(start, end)) == DATA[start:end]
        assert storage.read("shard.bin") == DATA
        with storage.open("shard.bin") as f:
            assert f.read() == DATA
        assert storage.list_files() == ["shard.bin"]
        storage.close()
    assert proxy.stats["error"] > 0
    assert proxy.stats["reset"] > 0
    assert proxy.stats["truncate"] > 0


@pytest.mark.s3
def test_out_of_tries_is_transient_error_naming_url_and_range(s3, moto_server):
    base, options = s3
    Storage(base, options).write("shard.bin", DATA)
    with FaultProxy(moto_server.endpoint, seed=0, error_rate=1.0, reset_rate=0.0, truncate_rate=0.0) as proxy:
        storage = Storage(
            base, dict(options, endpoint_url=proxy.endpoint), retry=RetryPolicy(attempts=3, base_delay=0)
        )
        with pytest.raises(TransientStorageError) as info:
            storage.read("shard.bin", ByteRange(100, 200))
        storage.close()
    assert info.value.url == f"{base}/shard.bin"
    assert "bytes [100, 200)" in str(info.value)
    # One retry layer: s3fs and botocore below us try once each, so 3 tries = 3 GETs.
    assert proxy.stats["error"] == 3


@pytest.mark.s3
def test_truncated_bodies_alone_are_retried(s3, moto_server):
    # A fixed bucket name: the proxy's choices hang on the request path, so they repeat run to run.
    options = s3[1]
    base = "s3://truncations-fixed"
    moto_server.create_bucket(base.removeprefix("s3://"))
    Storage(base, options).write("shard.bin", DATA)
    with FaultProxy(moto_server.endpoint, seed=2, error_rate=0.0, reset_rate=0.0, truncate_rate=0.5) as proxy:
        storage = Storage(
            base, dict(options, endpoint_url=proxy.endpoint), retry=RetryPolicy(attempts=16, base_delay=0.001)
        )
        for start in range(0, 150_000, 20_000):
            assert storage.read("shard.bin", ByteRange(start, start + 40_000)) == DATA[start : start + 40_000]
        storage.close()
    assert proxy.stats["truncate"] > 0


@pytest.mark.s3
def test_writes_pass_through_the_proxy(s3, moto_server):
    base, options = s3
    with FaultProxy(moto_server.endpoint, seed=4) as proxy:
        storage = Storage(
            base, dict(options, endpoint_url=proxy.endpoint), retry=RetryPolicy(base_delay=0.001)
        )
        storage.write("a.bin", DATA[:5000])
        with storage.writer("b.bin") as f:
            f.write(DATA[5000:9000])
        storage.close()
    assert proxy.stats["PUT"] >= 2
    direct = Storage(base, options)
    assert direct.read("a.bin") == DATA[:5000]
    assert direct.read("b.bin") == DATA[5000:9000]
    direct.close()
