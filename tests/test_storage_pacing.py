"""NOTE [ Paced start ] and NOTE [ Throttled tries ]: the token bucket that paces a
process's first requests (on an injected clock), Retry-After, and the error that counts
throttled tries."""

from __future__ import annotations

import email.utils
import errno
import math
import pickle
import random
import types

import aiohttp
import pytest
from botocore.exceptions import ClientError

from shardstream.dataset.config import DatasetConfig
from shardstream.dataset.options import ReadOptions
from shardstream.errors import TransientStorageError, UsageError
from shardstream.storage import RetryPolicy, Storage
from shardstream.storage import pacing as pacing_module
from shardstream.storage import retry as retry_module
from shardstream.storage.pacing import DEFAULT_START_RATE, StartGate, StartPacing, TokenBucket
from shardstream.storage.retry import call_with_retry, parse_retry_after, retry_after, throttle_of

# -- the token bucket ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def admissions(processes: int, rate: float, requests: int, *, seed: int = 0) -> list[float]:
    """When each of ``processes`` readers, all asking at once at time 0, sends each of its
    first ``requests`` requests: each reader's bucket gets its share of the job's ``rate``."""
    clock = Clock()
    times = []
    for p in range(processes):
        bucket = TokenBucket(rate / processes, clock=clock, rng=random.Random(seed * 100_003 + p).random)
        times += [bucket.reserve() for _ in range(requests)]
    return sorted(times)


def most_in_a_window(times: list[float], width: float) -> int:
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - width:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


@pytest.mark.parametrize(("processes", "rate"), [(64, 400.0), (500, 3500.0), (7, 50.0)])
def test_many_readers_starting_together_stay_under_the_jobs_rate(processes, rate):
    requests = 9
    times = admissions(processes, rate, requests)
    assert len(times) == processes * requests
    interval = processes / rate  # one reader's
    # Each reader sends its k-th request in the k-th interval: a job sends exactly one per
    # reader in every interval, `rate` per second on average...
    for k in range(requests):
        assert sum(k * interval <= t < (k + 1) * interval for t in times) == processes
    # ...and in any second at most what one second of tokens holds, plus one per reader
    # whose phase puts an extra token inside the window.
    assert most_in_a_window(times, 1.0) <= rate + processes
    # Without the jitter every reader would send its first request at once.
    assert most_in_a_window(times, interval / 8) < processes


def test_the_jitter_is_bounded_by_one_interval():
    clock = Clock()
    for draw in (0.0, 0.25, 0.999999):
        bucket = TokenBucket(4.0, clock=clock, rng=lambda draw=draw: draw)
        first = bucket.reserve()
        assert first == pytest.approx(draw * 0.25)
        assert 0.0 <= first < 0.25
        # then one token per interval, whatever the phase
        assert [bucket.reserve() - first for _ in range(3)] == pytest.approx([0.25, 0.5, 0.75])
    # a generator of the OS: phases differ, all inside the first interval
    firsts = {TokenBucket(4.0, clock=clock).reserve() for _ in range(50)}
    assert len(firsts) > 1
    assert all(0.0 <= f < 0.25 for f in firsts)


def test_an_idle_bucket_holds_at_most_its_burst():
    clock = Clock()
    bucket = TokenBucket(10.0, burst=3, clock=clock, rng=lambda: 0.0)
    assert bucket.reserve() == 0.0
    clock.now = 100.0  # idle for a long time: three tokens, not a thousand
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    with pytest.raises(UsageError):
        TokenBucket(0.0)
    with pytest.raises(UsageError):
        TokenBucket(1.0, burst=0.5)


def test_a_gate_paces_only_the_first_requests():
    clock, slept = Clock(), []
    gate = StartGate(TokenBucket(2.0, clock=clock, rng=lambda: 0.5), 3, sleep=slept.append)
    waits = [gate.admit() for _ in range(5)]
    assert waits == pytest.approx([0.25, 0.75, 1.25, 0.0, 0.0])
    assert slept == pytest.approx([0.25, 0.75, 1.25])
    assert gate.open


def test_pacing_is_checked_and_shared_by_the_process():
    with pytest.raises(UsageError, match="start_rate"):
        StartPacing(0)
    with pytest.raises(UsageError, match="start_rate"):
        StartPacing(math.inf)
    with pytest.raises(UsageError, match="start_rate"):
        StartPacing("fast")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        StartPacing(100.0, processes=0)
    assert StartPacing(3500.0, processes=7).per_process == pytest.approx(500.0)
    pacing = StartPacing(123.0, processes=3, requests=2)
    assert pacing_module.gate(pacing) is pacing_module.gate(StartPacing(123.0, processes=3, requests=2))
    assert pacing_module.gate(pacing) is not pacing_module.gate(StartPacing(123.0, processes=4, requests=2))


def test_storage_paces_its_first_remote_reads_not_local_ones(tmp_path):
    pacing = StartPacing(1e6, processes=1, requests=3)  # a rate no test waits for
    remote = Storage("memory://pacing-test", pacing=pacing)
    remote.write("a.bin", b"0123456789")
    gate = pacing_module.gate(pacing)
    assert gate.left == 3
    remote.read("a.bin")
    assert remote.size("a.bin") == 10
    assert gate.left == 1
    remote.read("a.bin")
    remote.read("a.bin")
    assert gate.left == 0
    assert gate.open
    assert pickle.loads(pickle.dumps(remote)).pacing == pacing
    assert Storage(str(tmp_path), pacing=pacing).pacing is None  # local files are never paced


def test_start_rate_is_a_read_option_sized_by_the_topology(monkeypatch):
    url = "s3://bucket/data"
    config = DatasetConfig.build(url, {"start_rate": 250})
    assert config.read.start_rate == 250
    assert DatasetConfig.build(url, {}).read.start_rate == DEFAULT_START_RATE
    assert DatasetConfig.build(url, {"start_rate": None}, owner="MapDataset").read.start_rate is None
    for bad in (0, -1, math.nan, "x"):
        with pytest.raises(UsageError, match=r"start_rate.*s3://bucket/data"):
            DatasetConfig.build(url, {"start_rate": bad})
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    assert ReadOptions(start_rate=1000.0).start_pacing() == StartPacing(1000.0, processes=4)
    assert ReadOptions(start_rate=None).start_pacing() is None


def test_a_dataloader_worker_takes_its_share(monkeypatch):
    import torch.utils.data

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    info = types.SimpleNamespace(id=1, num_workers=8)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
    assert ReadOptions(start_rate=1600.0).start_pacing() == StartPacing(1600.0, processes=16)


# -- Retry-After --------------------------------------------------------------------------


def _throttle(status: int, code: str, headers: dict[str, str] | None = None) -> ClientError:
    meta = {"HTTPStatusCode": status, "HTTPHeaders": headers or {}}
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": meta}, "GetObject")  # type: ignore[arg-type]


def test_retry_after_in_seconds_or_as_an_http_date():
    now = 1_700_000_000.0
    assert parse_retry_after("3", now) == 3.0
    assert parse_retry_after(" 0 ", now) == 0.0
    assert parse_retry_after("1.5", now) == 1.5
    assert parse_retry_after(email.utils.formatdate(now + 12, usegmt=True), now) == pytest.approx(12.0)
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0  # already past
    for bad in ("-1", "soon", "", "inf", "nan", "Wed, 99 Foo 2015 07:28:00 GMT"):
        assert parse_retry_after(bad, now) is None


def test_retry_after_is_found_on_every_client_path():
    lean = _throttle(503, "SlowDown", {"Retry-After": "2"})  # urllib3's names, as sent
    boto = _throttle(429, "429", {"retry-after": "4"})  # botocore's, lowercased
    assert retry_after(lean) == 2.0
    assert retry_after(boto) == 4.0
    s3fs = OSError(errno.EBUSY, "Please reduce your request rate")
    s3fs.__cause__ = lean  # as s3fs's translate_boto_error raises it
    assert retry_after(s3fs) == 2.0
    info = types.SimpleNamespace(real_url="http://x")
    aio = aiohttp.ClientResponseError(info, (), status=429, headers={"Retry-After": "7"})  # type: ignore[arg-type]
    assert retry_after(aio) == 7.0
    assert retry_after(_throttle(503, "SlowDown")) is None
    assert retry_after(ConnectionResetError()) is None


def test_throttles_are_named_by_status_and_code():
    assert throttle_of(_throttle(503, "SlowDown")) == "503 SlowDown"
    assert throttle_of(_throttle(429, "429")) == "429 Too Many Requests"
    assert throttle_of(_throttle(400, "SlowDown")) == "400 SlowDown"
    wrapped = OSError(errno.EBUSY, "busy")
    wrapped.__cause__ = _throttle(503, "SlowDown")
    assert throttle_of(wrapped) == "503 SlowDown"
    assert throttle_of(_throttle(500, "InternalError")) is None
    assert throttle_of(TimeoutError()) is None


def _failing(*errors: BaseException, then: object = b"ok"):
    left = list(errors)

    def operation():
        if left:
            raise left.pop(0)
        return then

    return operation


def test_a_retry_waits_what_the_store_asked_and_its_jitter():
    policy = RetryPolicy(base_delay=0.1, max_delay=0.4, max_retry_after=5.0)
    waits: list[float] = []
    operation = _failing(
        _throttle(503, "SlowDown", {"Retry-After": "2"}),
        _throttle(429, "429", {"Retry-After": "60"}),  # more than max_retry_after
        _throttle(503, "SlowDown"),  # no Retry-After: backoff alone
    )
    assert call_with_retry(operation, policy, what="read", url="u", sleep=waits.append) == b"ok"
    assert 2.0 <= waits[0] <= 2.1
    assert 5.0 <= waits[1] <= 5.2
    assert 0.0 <= waits[2] <= 0.4
    with pytest.raises(UsageError):
        RetryPolicy(max_retry_after=-1)


def test_giving_up_counts_the_throttled_tries():
    errors = [_throttle(503, "SlowDown")] * 5 + [_throttle(429, "429")] * 2 + [ConnectionResetError("reset")]
    with pytest.raises(TransientStorageError) as info:
        call_with_retry(
            _failing(*errors), RetryPolicy(attempts=8), what="read", url="s3://b/x", sleep=lambda s: None
        )
    message = str(info.value)
    assert "failed after 8 tries in " in message
    assert ", 5 of them 503 SlowDown and 2 429 Too Many Requests: ConnectionResetError" in message
    with pytest.raises(TransientStorageError) as info:
        call_with_retry(
            _failing(ConnectionResetError(), ConnectionResetError()),
            RetryPolicy(attempts=2),
            what="read",
            url="u",
            sleep=lambda s: None,
        )
    assert "of them" not in str(info.value)


def test_a_retry_after_past_the_reads_bound_ends_its_tries(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(retry_module, "_clock", lambda: now[0])
    waits: list[float] = []
    with pytest.raises(TransientStorageError) as info:
        call_with_retry(
            _failing(_throttle(503, "SlowDown", {"Retry-After": "20"})),
            RetryPolicy(timeout=10.0),
            what="read",
            url="u",
            sleep=waits.append,
        )
    assert waits == []  # not a wait of 20 s that the bound would cut anyway
    assert "failed after 1 tries" in str(info.value)
    assert "asked to wait 20.0 s, Retry-After, past RetryPolicy.timeout 10 s" in str(info.value)


def test_pace_runs_before_each_try_and_outside_the_bound(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(retry_module, "_clock", lambda: now[0])
    paced: list[float] = []

    def pace() -> None:
        paced.append(now[0])
        now[0] += 30.0  # a long wait for the first token: not counted in the 60 s bound

    operation = _failing(_throttle(503, "SlowDown"))
    result = call_with_retry(
        operation, RetryPolicy(timeout=60.0), what="read", url="u", sleep=lambda s: None, pace=pace
    )
    assert result == b"ok"
    assert paced == [0.0, 30.0]
