"""Retries with backoff, and the line between transient and permanent storage errors.

# NOTE [ One retry layer ]
# s3fs retries some errors itself (5 tries) and botocore retries others below it (legacy
# mode, up to 5 tries with sleeps of up to seconds). Stacked under our own loop that is
# up to 8 x 5 x 5 requests per read and unbounded waits, and ``RetryPolicy.attempts``
# would mean nothing. So ``Storage`` turns both lower layers down to one try (unless the
# user's storage_options say otherwise) and this module is the only place that retries:
# every operation is tried ``attempts`` times in all, with exponential backoff and full
# jitter, and a short or truncated body counts as a failed try like a 503 does.
# (s3fs still sleeps 0.1 s after its one failed try before handing us the error; that
# only adds to our backoff.)
#
# NOTE [ Bounded waits ]
# Each try is bounded by the client's connect and read timeouts (botocore and s3fs:
# ``storage_options={"config_kwargs": {"connect_timeout": 5, "read_timeout": 15}}``, the
# defaults); a read, all its tries and the bodies they read, by ``RetryPolicy.timeout``:
# no new try starts once that many seconds have passed since the first (or would pass
# during the backoff), and a body still arriving then is cut off (NOTE [ Deadlines on
# bodies ] in deadline.py), so an endpoint that accepts connections and never answers,
# or answers one byte at a time, fails one read in about ``timeout``, not attempts x
# read_timeout (nor never). A long transfer on a slow link would be cut by the same
# bound, so ``RetryPolicy.min_rate`` (bytes/s) lets a read of n bytes take up to
# n / min_rate seconds instead where that is longer: a minimum rate rather than a
# fixed time. The error names the bounds. Uploads are not bounded by ``timeout``: a
# shard upload may take longer than it in every try, and cutting its retries would fail
# a pack that a slow link completes; each of its tries is still bounded by the client's
# timeouts.
#
# NOTE [ Throttled tries ]
# A 503 SlowDown or a 429 says the store is over its request rate: the try is retried as
# any transient error is, with full jitter, and where the response says how long to wait
# (``Retry-After``, in seconds or as an HTTP date) no retry comes sooner: the wait is
# that time plus the jitter draw, so readers told the same moment still come back
# spread. A Retry-After beyond ``RetryPolicy.max_retry_after`` is waited that long only
# (a store or proxy asking for an hour would stall a job), and one that would pass a
# read's bound ends its tries there (NOTE [ Bounded waits ]). When the tries run out the
# error counts the throttled ones by kind ("7 of them 503 SlowDown"), so a storm reads as
# a storm and not as a broken object. A reader's first requests are paced besides (NOTE
# [ Paced start ] in pacing.py): ``call_with_retry`` calls ``pace`` before each try.
"""

from __future__ import annotations

import collections
import email.utils
import errno
import http
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from shardstream.errors import ShardstreamError, StorageError, TransientStorageError, UsageError
from shardstream.storage import deadline
from shardstream.types import ByteRange

__all__ = ["RetryPolicy", "call_with_retry", "is_not_found", "is_transient", "retry_after", "throttle_of"]

R = TypeVar("R")
_sleep = time.sleep  # looked up at each call, so tests can count the waits
_clock = time.monotonic  # and so tests can run the clock of NOTE [ Bounded waits ]
_now = time.time  # the wall clock an HTTP-date Retry-After is counted from

# Error codes that say "over the request rate" whatever their status.
_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
    }
)
# S3 error codes (and HTTP statuses) that say "try again later": the throttles and these.
_TRANSIENT_CODES = _THROTTLE_CODES | {
    "BandwidthLimitExceeded",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "IncompleteBody",
    "XAmzContentSHA256Mismatch",
}
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EBUSY,  # s3fs maps 503 SlowDown / ServiceUnavailable to EBUSY
        getattr(errno, "EREMOTEIO", errno.EIO),  # s3fs maps 500 InternalError here
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.EPIPE,
        errno.EAGAIN,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    }
)
_TRANSIENT_TEXT = ("SlowDown", "reduce your request rate", "Service Unavailable", "(503)", "timed out")
_TRANSIENT_NAMES = frozenset(
    {
        # botocore
        "HTTPClientError",
        "ConnectionClosedError",
        "EndpointConnectionError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "IncompleteReadError",
        "ResponseStreamingError",
        "ResponseParserError",
        # aiohttp
        "ClientPayloadError",
        "ClientConnectionError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        # urllib3 / requests
        "ProtocolError",
        "ChunkedEncodingError",
    }
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently one storage operation is tried.

    ``attempts`` counts all tries (1 = no retry). Between tries the wait is drawn
    uniformly from ``[0, min(max_delay, base_delay * 2**n)]`` ("full jitter"), so many
    ranks that failed together do not come back together. ``timeout``: seconds
    within which a read ends, all its tries and the bodies they read (None: no bound);
    ``min_rate``: bytes/s at which a read of n bytes may take n / min_rate seconds where
    that is longer than ``timeout`` (None: ``timeout`` alone); see NOTE [ Bounded waits ].
    A throttled try's ``Retry-After`` is waited before the jitter, up to
    ``max_retry_after`` seconds (NOTE [ Throttled tries ]).
    """

    attempts: int = 8
    base_delay: float = 0.05
    max_delay: float = 4.0
    timeout: float | None = 60.0
    min_rate: float | None = None
    max_retry_after: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"RetryPolicy.attempts must be at least 1, not {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise UsageError(f"RetryPolicy delays must be >= 0, not {self.base_delay}, {self.max_delay}")
        if self.timeout is not None and not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise UsageError(f"RetryPolicy.timeout must be > 0 seconds or None, not {self.timeout}")
        if self.min_rate is not None and not (self.min_rate > 0 and math.isfinite(self.min_rate)):
            raise UsageError(f"RetryPolicy.min_rate must be > 0 bytes/s or None, not {self.min_rate}")
        if not (self.max_retry_after >= 0 and math.isfinite(self.max_retry_after)):
            raise UsageError(f"RetryPolicy.max_retry_after must be >= 0 seconds, not {self.max_retry_after}")

    def budget(self, length: int | None) -> float | None:
        """Seconds a read of ``length`` bytes (None: unknown) may take in all (None: no bound)."""
        if self.timeout is None:
            return None
        if self.min_rate is None or length is None:
            return self.timeout
        return max(self.timeout, length / self.min_rate)

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed try (1-based), whose response
        asked for ``retry_after`` seconds (None: it did not; NOTE [ Throttled tries ])."""
        cap = min(self.max_delay, self.base_delay * 2 ** min(failures - 1, 62))
        # Jitter only decides when a retry happens, never what is read, so an unkeyed
        # generator is right here (the keyed-generator rule is about data order).
        jitter = random.uniform(0.0, cap)
        if retry_after is None:
            return jitter
        return min(max(retry_after, 0.0), self.max_retry_after) + jitter


def _chain(error: BaseException) -> list[BaseException]:
    """The error, then its causes and contexts, each once."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo and len(seen) < 16:
        current = todo.pop(0)
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        todo += [current.__cause__, current.__context__]
    return seen


def _classify_one(error: BaseException) -> bool | None:
    """True: transient, False: permanent, None: this link of the chain does not say."""
    if isinstance(error, TransientStorageError):
        return True
    if isinstance(error, ShardstreamError):
        return False
    if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
        return False
    answered = _response_of(error)  # botocore's ClientError, aiohttp's ClientResponseError
    if answered is not None:
        status, code, _ = answered
        return code in _TRANSIENT_CODES or status >= 500 or status in (408, 429)
    import http.client  # here, not at the top: only an error pays for its import

    if isinstance(
        error, TimeoutError | ConnectionError | http.client.IncompleteRead | http.client.BadStatusLine
    ):
        return True
    if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(error).__mro__):
        return True
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    return None


def is_transient(error: BaseException) -> bool:
    """Whether retrying the operation that raised ``error`` may succeed.

    Transient: timeouts, HTTP 5xx (503 SlowDown included), 408/429, connection resets
    and aborts, short or truncated bodies, and the botocore/aiohttp errors for these.
    Not transient: missing objects (404), denied access (403), bad requests (400), and
    anything unknown.
    """
    for link in _chain(error):
        verdict = _classify_one(link)
        if verdict is not None:
            return verdict
    text = str(error)
    return isinstance(error, OSError) and any(t in text for t in _TRANSIENT_TEXT)


def is_not_found(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the object does not exist."""
    return any(isinstance(link, FileNotFoundError) for link in _chain(error))


def _response_of(error: BaseException) -> tuple[int, str, Mapping[str, Any] | None] | None:
    """(HTTP status, error code, response headers) of an error an HTTP response raised
    (botocore's ClientError, aiohttp's ClientResponseError), else None."""
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:  # botocore (and the lean client)
        meta = response.get("ResponseMetadata", {}) or {}
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        return status, str(response.get("Error", {}).get("Code", "") or ""), meta.get("HTTPHeaders")
    http_status = getattr(error, "status", None)
    if type(error).__name__ == "ClientResponseError" and isinstance(http_status, int):  # aiohttp
        return http_status, "", getattr(error, "headers", None)
    return None


def throttle_of(error: BaseException) -> str | None:
    """What throttled the try that raised ``error`` ("503 SlowDown", "429 Too Many
    Requests"), or None where it was not a 503/429 or a throttling code."""
    for link in _chain(error):
        found = _response_of(link)
        if found is None:
            continue
        status, code, _ = found
        if status in (429, 503) or code in _THROTTLE_CODES:
            if code and code != str(status):
                return f"{status} {code}" if status else code
            try:
                return f"{status} {http.HTTPStatus(status).phrase}"
            except ValueError:
                return str(status)
    return None


def parse_retry_after(value: str, now: float) -> float | None:
    """Seconds a ``Retry-After`` header's value asks to wait: delay-seconds, or an HTTP
    date counted from ``now`` (seconds since the epoch); None where it is neither."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110: an HTTP date is GMT
            return None
        return max(0.0, when.timestamp() - now)
    return seconds if seconds >= 0 and math.isfinite(seconds) else None


def retry_after(error: BaseException, now: float | None = None) -> float | None:
    """Seconds the response that raised ``error`` (or caused it) asked to wait before a
    retry (its ``Retry-After``), or None where it said nothing."""
    for link in _chain(error):
        found = _response_of(link)
        headers = found[2] if found is not None else None
        if not headers:
            continue
        value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
        if value is not None:
            return parse_retry_after(str(value), _now() if now is None else now)
    return None


def _where(rng: ByteRange | None) -> str:
    return f" bytes [{rng.start}, {rng.end})" if rng is not None else ""


def permanent_error(
    error: BaseException, what: str, url: str, rng: ByteRange | None = None
) -> ShardstreamError:
    """The ShardstreamError to raise for a permanent failure of ``what`` on ``url``."""
    if isinstance(error, ShardstreamError):
        return error
    offset = rng.start if rng is not None else None
    if is_not_found(error):
        return StorageError(f"not found ({what}{_where(rng)})", url=url, offset=offset)
    if any(isinstance(link, PermissionError) for link in _chain(error)):
        return StorageError(f"access denied: {what}{_where(rng)} failed: {error}", url=url, offset=offset)
    return StorageError(
        f"{what}{_where(rng)} failed: {type(error).__name__}: {error}", url=url, offset=offset
    )


def call_with_retry(
    operation: Callable[[], R],
    policy: RetryPolicy,
    *,
    what: str,
    url: str,
    rng: ByteRange | None = None,
    sleep: Callable[[float], object] | None = None,
    timeouts: str | Callable[[], str] = "",
    bounded: bool = True,
    pace: Callable[[], object] | None = None,
) -> R:
    """Run ``operation`` until it succeeds, retrying transient errors per ``policy``.

    A permanent error fails at once as a ``StorageError``; running out of tries (or of
    ``policy.timeout``) raises ``TransientStorageError``, counting the throttled tries
    (NOTE [ Throttled tries ]); both name ``url`` and the byte range. ``timeouts``
    describes each try's own bounds (or makes that text, asked only for the error after a
    timeout). ``bounded=False``: ``policy.timeout`` does not apply (uploads: see NOTE
    [ Bounded waits ]). ``pace()`` runs before each try (NOTE [ Paced start ] in
    pacing.py); its wait before the first try is not counted in ``policy.timeout``.
    """
    wait = sleep if sleep is not None else _sleep
    if pace is not None:
        pace()
    started = _clock()
    budget = policy.budget(None if rng is None else rng.length) if bounded else None
    ends = None if budget is None else started + budget
    last: BaseException | None = None
    throttled: collections.Counter[str] = collections.Counter()
    asked: float | None = None  # a Retry-After that the read's bound cut short
    tries = 0
    for tries in range(1, policy.attempts + 1):
        if pace is not None and tries > 1:
            pace()
        previous = deadline.enter(ends, lambda: _limits(policy, budget))
        try:
            return operation()
        except Exception as error:
            if not is_transient(error):
                raise permanent_error(error, what, url, rng) from error
            last = error
            label = throttle_of(error)
            if label is not None:
                throttled[label] += 1
            if tries == policy.attempts:
                break
            after = retry_after(error)
            delay = policy.delay(tries, after)
            if ends is not None and _clock() + delay > ends:
                asked = after
                break  # NOTE [ Bounded waits ]
            wait(delay)
        finally:
            deadline.leave(previous)
    raise TransientStorageError(
        f"{what}{_where(rng)} failed after {tries} tries in {_clock() - started:.1f} s"
        f"{_throttled(throttled)}: {type(last).__name__}: {last}"
        + _bounds(last, policy, timeouts, budget)
        + _asked(asked, policy, budget),
        url=url,
        offset=rng.start if rng is not None else None,
    ) from last


def _throttled(counts: collections.Counter[str]) -> str:
    """The throttled tries in words: ", 7 of them 503 SlowDown" (NOTE [ Throttled tries ])."""
    if not counts:
        return ""
    (label, n), *rest = counts.most_common()
    return f", {n} of them {label}" + "".join(f" and {m} {other}" for other, m in rest)


def _asked(after: float | None, policy: RetryPolicy, budget: float | None) -> str:
    """The wait the store asked for, said where it would have passed the read's bound."""
    if after is None:
        return ""
    waited = min(after, policy.max_retry_after)
    return f" (the store asked to wait {waited:.1f} s, Retry-After, past {_limits(policy, budget)})"


def _limits(policy: RetryPolicy, budget: float | None) -> str:
    """The bound of a read's tries in words: the timeout, or the time its min_rate gives."""
    if budget is None or policy.timeout is None or budget <= policy.timeout:
        return f"RetryPolicy.timeout {policy.timeout:g} s" if budget is not None else "no bound"
    return f"{budget:.1f} s at RetryPolicy.min_rate {policy.min_rate:g} bytes/s"


def _bounds(
    error: BaseException | None, policy: RetryPolicy, timeouts: str | Callable[[], str], budget: float | None
) -> str:
    """What bounded the waits, said where a try timed out (NOTE [ Bounded waits ])."""
    timed_out = error is not None and any(
        isinstance(link, TimeoutError) or "timeout" in type(link).__name__.lower() or "timed out" in str(link)
        for link in _chain(error)
    )
    if not timed_out:
        return ""
    if callable(timeouts):
        timeouts = timeouts()
    each = f"each try: {timeouts}; " if timeouts else ""
    return f" (timed out; {each}all tries: {_limits(policy, budget)})"
