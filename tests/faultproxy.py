"""A fault-injecting HTTP proxy in front of an S3 server, for retry tests.

``FaultProxy(upstream, seed=...)`` listens on 127.0.0.1 (free port, ``.endpoint``) and
forwards every request to ``upstream`` (``shardstream.testing.ForwardingProxy`` does the
forwarding, threads and shutdown). For a deterministic pseudo-random fraction of GET
requests it instead answers ``503 SlowDown`` (with S3's XML error body), resets the
connection, or sends the headers and only part of the body before closing. Whether a
request is hit depends only on ``seed``, the request (method, path, Range) and how often
that same request was seen before, not on thread timing. ``.stats`` counts what it did.

``RateLimitProxy(upstream, rate=..., burst=...)`` forwards requests while the request rate
stays under ``rate`` (a token bucket of ``burst``), and answers the rest as a throttled
store does: ``503 SlowDown`` (S3's XML body) or ``429 Too Many Requests`` (no body), by
turns, each with a ``Retry-After`` (seconds, or an HTTP date when ``http_date``).

Headers are forwarded unchanged (``Host`` included) so SigV4 signatures made for the
proxy's address stay valid; ``Range`` reaches the server as sent.
"""

from __future__ import annotations

import collections
import email.utils
import hashlib
import socket
import struct
import time

from shardstream.testing.wanproxy import ForwardingProxy, ProxyHandler

__all__ = ["FaultProxy", "RateLimitProxy"]

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>faultproxy</RequestId><HostId>faultproxy</HostId></Error>"
)


class FaultProxy(ForwardingProxy):
    """A threaded HTTP proxy on 127.0.0.1 that injects S3-style faults into GETs (the
    forwarding, threads and shutdown are shardstream.testing's ``ForwardingProxy``)."""

    def __init__(
        self,
        upstream_endpoint: str,
        *,
        seed: int,
        error_rate: float = 0.2,
        reset_rate: float = 0.1,
        truncate_rate: float = 0.1,
        max_faults_in_a_row: int = 4,
    ) -> None:
        if error_rate + reset_rate + truncate_rate > 1:
            raise ValueError("fault rates add up to more than 1")
        super().__init__(upstream_endpoint)
        self.seed = seed
        self.rates = (error_rate, reset_rate, truncate_rate)
        # The draws hang on the request path (a test's random bucket name too): a cap on
        # the faults one request meets in a row keeps a test with fewer retries than that
        # from failing by chance, while every fault kind still happens.
        self.max_faults_in_a_row = max_faults_in_a_row
        self.stats: collections.Counter[str] = collections.Counter()  # type: ignore[assignment]
        self._seen: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def begin(self, method: str) -> None:
        pass  # decide() counts

    def end(self, body_bytes: int) -> None:
        pass

    def respond(self, handler: ProxyHandler, body: bytes) -> int:
        action = self.decide(handler.command, handler.path, handler.headers.get("Range", ""))
        if action == "error":
            handler.send_whole(503, [("Content-Type", "application/xml")], _SLOWDOWN)
            return len(_SLOWDOWN)
        if action == "reset":
            # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.close_connection = True
            handler.connection.close()
            return 0
        status, headers, payload = handler.forward_buffered(body)
        if action == "truncate" and len(payload) > 1:
            handler.send_whole(status, headers, payload[: len(payload) // 2], declared=len(payload))
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return len(payload) // 2
        handler.send_whole(status, headers, payload)
        return len(payload)

    def decide(self, method: str, path: str, byte_range: str) -> str:
        """What to do with this request: 'error', 'reset', 'truncate' or 'forward'."""
        with self._lock:
            self.stats["requests"] += 1
            self.stats[method] += 1
            if method != "GET":
                self.stats["forward"] += 1
                return "forward"
            key = (method, path, byte_range)
            occurrence = self._seen[key]
            self._seen[key] += 1
            digest = hashlib.sha256(
                f"{self.seed}|{method}|{path}|{byte_range}|{occurrence}".encode()
            ).digest()
            u = int.from_bytes(digest[:8], "big") / 2**64
            error, reset, truncate = self.rates
            if occurrence >= self.max_faults_in_a_row:
                action = "forward"
            elif u < error:
                action = "error"
            elif u < error + reset:
                action = "reset"
            elif u < error + reset + truncate:
                action = "truncate"
            else:
                action = "forward"
            self.stats[action] += 1
            return action

    def faults(self) -> int:
        """How many faults were injected so far."""
        return self.stats["error"] + self.stats["reset"] + self.stats["truncate"]


class RateLimitProxy(ForwardingProxy):
    """A threaded HTTP proxy on 127.0.0.1 that forwards at most ``rate`` requests per
    second (after a ``burst``) and throttles the rest: 503 SlowDown and 429 by turns, each
    with ``Retry-After: retry_after`` (or as an HTTP date that far ahead, ``http_date``).
    ``.stats`` counts the requests, those forwarded, and the throttled ones by status."""

    def __init__(
        self,
        upstream_endpoint: str,
        *,
        rate: float,
        burst: float = 1.0,
        retry_after: int = 1,
        http_date: bool = False,
    ) -> None:
        if rate <= 0 or burst < 1 or retry_after < 0:
            raise ValueError("rate must be > 0, burst >= 1 and retry_after >= 0")
        super().__init__(upstream_endpoint)
        self.rate, self.burst = rate, float(burst)
        self.retry_after, self.http_date = retry_after, http_date
        self.stats: collections.Counter[str] = collections.Counter()  # type: ignore[assignment]
        self._tokens, self._stamp = self.burst, time.monotonic()

    def __enter__(self) -> RateLimitProxy:
        self.start()
        return self

    def begin(self, method: str) -> None:
        pass  # admit() counts

    def end(self, body_bytes: int) -> None:
        pass

    def throttled(self) -> int:
        """How many requests were answered 503 or 429 so far."""
        return self.stats["503"] + self.stats["429"]

    def admit(self) -> int | None:
        """None: forward this request; else the status to throttle it with."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self.stats["requests"] += 1
            if self._tokens >= 1:
                self._tokens -= 1
                self.stats["forward"] += 1
                return None
            status = 503 if self.throttled() % 2 == 0 else 429
            self.stats[str(status)] += 1
            return status

    def respond(self, handler: ProxyHandler, body: bytes) -> int:
        status = self.admit()
        if status is None:
            return handler.forward_streaming(body)
        after = (
            email.utils.formatdate(time.time() + self.retry_after, usegmt=True)
            if self.http_date
            else str(self.retry_after)
        )
        payload = _SLOWDOWN if status == 503 else b""
        headers = [("Retry-After", after)]
        if payload:
            headers.append(("Content-Type", "application/xml"))
        handler.send_whole(status, headers, payload)
        return len(payload)
