"""A fault-injecting HTTP proxy in front of an S3 server, for retry tests.

``FaultProxy(upstream, seed=...)`` listens on 127.0.0.1 (free port, ``.endpoint``) and
forwards every request to ``upstream``. For a deterministic pseudo-random fraction of
GET requests it instead answers ``503 SlowDown`` (with S3's XML error body), resets the
connection, or sends the headers and only part of the body before closing. Whether a
request is hit depends only on ``seed``, the request (method, path, Range) and how often
that same request was seen before, not on thread timing. ``.stats`` counts what it did.

Headers are forwarded unchanged (``Host`` included) so SigV4 signatures made for the
proxy's address stay valid; ``Range`` reaches the server as sent.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import http.client
import http.server
import socket
import struct
import threading
import urllib.parse

__all__ = ["FaultProxy"]

# Per RFC 9110 these describe one hop and are not forwarded.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>faultproxy</RequestId><HostId>faultproxy</HostId></Error>"
)


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 that injects S3-style faults into GETs."""

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
        parsed = urllib.parse.urlsplit(upstream_endpoint)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.seed = seed
        self.rates = (error_rate, reset_rate, truncate_rate)
        # The draws hang on the request path (a test's random bucket name too): a cap on
        # the faults one request meets in a row keeps a test with fewer retries than that
        # from failing by chance, while every fault kind still happens.
        self.max_faults_in_a_row = max_faults_in_a_row
        self.stats: collections.Counter[str] = collections.Counter()
        self.endpoint = ""
        self._seen: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self._server = server
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:  # wake handler threads blocked on keep-alive reads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner._connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # reset or truncated on purpose
            super().finish()
        with self.owner._lock:
            self.owner._connections.discard(self.connection)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        body = self._request_body()
        action = self.owner.decide(self.command, self.path, self.headers.get("Range", ""))
        if action == "error":
            self._send(503, [("Content-Type", "application/xml")], _SLOWDOWN)
            return
        if action == "reset":
            self._reset()
            return
        status, headers, payload = self._forward(body)
        if action == "truncate" and len(payload) > 1:
            self._send(status, headers, payload[: len(payload) // 2], declared=len(payload))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(status, headers, payload)

    def _request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    upstream.putheader(name, value)  # Host included: it is signed
            if body or self.command in ("PUT", "POST"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            payload = response.read()
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command != "HEAD":
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            return response.status, headers, payload
        finally:
            upstream.close()

    def _send(
        self, status: int, headers: list[tuple[str, str]], payload: bytes, declared: int | None = None
    ) -> None:
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD" or not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(declared if declared is not None else len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()
