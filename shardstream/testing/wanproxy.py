"""An HTTP proxy on 127.0.0.1 that makes a loopback S3 server look like one over a network.

``WanProxy(upstream, latency=0.03, bandwidth=40e6)`` listens on a free port (``.endpoint``)
and forwards every request to ``upstream``: it waits ``latency`` seconds before forwarding
each request (the time to first byte of object storage over a WAN) and streams each
response body at no more than ``bandwidth`` bytes/s, in paced writes of 5 ms each
(one connection's share of a link; NOTE [ A cheap proxy ]). Concurrent requests are not
slowed by each other, as on S3: the cap is per response. ``.stats`` counts requests, GETs, body bytes and the peak
number of requests in flight at once.

One thread per client connection, HTTP/1.1 keep-alive on both sides. Headers are
forwarded unchanged (``Host`` included) so SigV4 signatures made for the proxy's address
stay valid. ``stop`` (or leaving the ``with`` block) ends every thread it started.

``ForwardingProxy`` is the plain forwarder underneath, for proxies that do something else
to requests (tests/faultproxy.py injects faults). Run one alone (a benchmark does, so the
proxy does not share the client's GIL)::

    python -m shardstream.testing.wanproxy http://127.0.0.1:9000 --latency 0.03 --bandwidth 40e6

It prints ``endpoint=URL`` and serves until stdin closes. ``GET /__wanproxy__/stats``
answers the counters as JSON, with ``cpu_seconds`` (this process's CPU time since the
last reset), and ``POST /__wanproxy__/reset`` zeroes them (no bucket can be named so: S3
bucket names have no underscores).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import json
import socket
import threading
import time
import urllib.parse

# Per RFC 9110 these describe one hop and are not forwarded.
HOP_BY_HOP = frozenset(
    {
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
)
CONTROL_PREFIX = "/__wanproxy__/"
# NOTE [ A cheap proxy ]
# Every contender of tools/bench_wan.py reads through one proxy on the same few cores, so
# whatever CPU the proxy spends per byte is taken from the contenders and compresses their
# figures toward its own ceiling. A body is copied with ``readinto`` into one buffer per
# connection and ``sendall`` from it (no bytes object per piece), in pieces of
# ``PACE_STEP`` seconds at the response's bandwidth (``CHUNK_MIN`` to ``CHUNK_MAX``
# bytes): few wake-ups per response, where small fixed pieces cost the proxy much more CPU
# per byte (tools/bench_wan.py prints what the proxy and the server spent in each run).
CHUNK_MIN = 64 * 1024
CHUNK_MAX = 1 << 20
PACE_STEP = 0.005  # seconds of a paced response per write


@dataclasses.dataclass
class ProxyStats:
    """What a proxy saw. ``peak_in_flight``: most requests between their headers arriving
    and their response's last byte being written, at one moment."""

    requests: int = 0
    gets: int = 0
    bytes_out: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0


class ForwardingProxy:
    """A threaded HTTP forward proxy on 127.0.0.1 in front of one S3 endpoint."""

    def __init__(self, upstream_endpoint: str) -> None:
        parsed = urllib.parse.urlsplit(upstream_endpoint)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.endpoint = ""
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._cpu_at_reset = time.process_time()
        self._connections: set[socket.socket] = set()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> ForwardingProxy:
        proxy = self

        class Handler(ProxyHandler):
            owner = proxy

        server = _Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = False  # server_close joins them: none outlives stop()
        server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self._server = server
        self._stopping.clear()
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(
            target=server.serve_forever, name=type(self).__name__.lower(), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()  # wakes handlers waiting out a latency or a pacing delay
        server.shutdown()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:  # wake handler threads blocked on keep-alive reads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ForwardingProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- counters -----------------------------------------------------------------------------

    def begin(self, method: str) -> None:
        with self._lock:
            self.stats.requests += 1
            self.stats.gets += method == "GET"
            self.stats.in_flight += 1
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)

    def end(self, body_bytes: int) -> None:
        with self._lock:
            self.stats.in_flight -= 1
            self.stats.bytes_out += body_bytes

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = ProxyStats(in_flight=self.stats.in_flight)
            self._cpu_at_reset = time.process_time()

    # -- what happens to a request (subclasses change these) ----------------------------------

    def respond(self, handler: ProxyHandler, body: bytes) -> int:
        """Answer one request; returns the body bytes sent."""
        return handler.forward_streaming(body)

    def write_body(self, handler: ProxyHandler, response: http.client.HTTPResponse) -> int:
        """Copy an upstream response's body to the client."""
        view, sent = handler.buffer(CHUNK_MAX), 0
        while got := response.readinto(view):
            handler.wfile.write(view[:got])
            sent += got
        return sent


class WanProxy(ForwardingProxy):
    """A forward proxy that adds ``latency`` seconds before each request and caps each
    response body at ``bandwidth`` bytes/s (0: no cap)."""

    def __init__(self, upstream_endpoint: str, *, latency: float = 0.03, bandwidth: float = 40e6) -> None:
        if latency < 0 or bandwidth < 0:
            raise ValueError("latency and bandwidth must be >= 0")
        super().__init__(upstream_endpoint)
        self.latency = latency
        self.bandwidth = bandwidth

    def __enter__(self) -> WanProxy:
        self.start()
        return self

    def respond(self, handler: ProxyHandler, body: bytes) -> int:
        if self.latency and self._stopping.wait(self.latency):
            raise ConnectionAbortedError("proxy stopping")
        return handler.forward_streaming(body)

    def write_body(self, handler: ProxyHandler, response: http.client.HTTPResponse) -> int:
        if not self.bandwidth:
            return super().write_body(handler, response)
        # Paced against the body's start, not chunk by chunk: the sleeps' overshoot does not
        # add up, and the rate over any prefix stays <= bandwidth (give or take one chunk).
        view = handler.buffer(int(min(max(self.bandwidth * PACE_STEP, CHUNK_MIN), CHUNK_MAX)))
        started, sent = time.monotonic(), 0
        while got := response.readinto(view):
            handler.wfile.write(view[:got])
            sent += got
            delay = started + sent / self.bandwidth - time.monotonic()
            if delay > 0 and self._stopping.wait(delay):
                raise ConnectionAbortedError("proxy stopping")
        return sent


class _Server(http.server.ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a client opening a pool's connections at once had
    # some of them refused until the kernel's SYN retry, about a second later, a stall that
    # no real store makes and that every figure behind the proxy would carry
    request_queue_size = 128


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    owner: ForwardingProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
    # headers and a small body are separate writes: with Nagle's algorithm the body waited
    # for the client's delayed ACK (~40 ms), a delay on every small GET that no store adds
    disable_nagle_algorithm = True
    _upstream: http.client.HTTPConnection | None = None
    _buffer: memoryview | None = None

    def buffer(self, size: int) -> memoryview:
        """``size`` bytes to copy a body through, kept for this connection's next response."""
        if self._buffer is None or len(self._buffer) < size:
            self._buffer = memoryview(bytearray(size))
        return self._buffer[:size]

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner._connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # reset or truncated on purpose
            super().finish()
        if self._upstream is not None:
            self._upstream.close()
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
        body = self.request_body()
        if self.path.startswith(CONTROL_PREFIX):
            self._control()
            return
        self.owner.begin(self.command)
        sent = 0
        try:
            sent = self.owner.respond(self, body)
            self.wfile.flush()
        except (OSError, ValueError, http.client.HTTPException):  # client gone, or stop()
            self.close_connection = True
        finally:
            self.owner.end(sent)

    def _control(self) -> None:
        if self.path == CONTROL_PREFIX + "reset" and self.command == "POST":
            self.owner.reset_stats()
        with self.owner._lock:
            answer = dict(dataclasses.asdict(self.owner.stats))
            answer["cpu_seconds"] = time.process_time() - self.owner._cpu_at_reset
        payload = json.dumps(answer).encode()
        self.send_whole(200, [("Content-Type", "application/json")], payload)

    def request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
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

    def _send_upstream(self, body: bytes) -> http.client.HTTPResponse:
        """Send this request upstream on this connection's kept-alive upstream connection
        (a new one if the server closed it) and return the response, body unread."""
        for attempt in (1, 2):
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
            upstream = self._upstream
            try:
                upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        upstream.putheader(name, value)  # Host included: it is signed
                if body or self.command in ("PUT", "POST"):
                    upstream.putheader("Content-Length", str(len(body)))
                upstream.endheaders(body or None)
                return upstream.getresponse()
            except (OSError, http.client.HTTPException):
                upstream.close()
                self._upstream = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _response_headers(self, response: http.client.HTTPResponse) -> list[tuple[str, str]]:
        return [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]

    def forward_streaming(self, body: bytes) -> int:
        """Forward the request; stream the response back through ``owner.write_body``."""
        response = self._send_upstream(body)
        headers = self._response_headers(response)
        if self.command == "HEAD" or response.getheader("Content-Length") is None:
            payload = response.read()  # chunked upstream: buffered, sent with a length
            if self.command != "HEAD":
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                headers.append(("Content-Length", str(len(payload))))
            self._send_head(response.status, headers)
            if self.command == "HEAD":
                return 0
            return self.owner.write_body(self, _Buffered(payload))  # type: ignore[arg-type]
        self._send_head(response.status, headers)
        sent = self.owner.write_body(self, response)
        if response.will_close:
            response.close()
            if self._upstream is not None:
                self._upstream.close()
                self._upstream = None
        return sent

    def forward_buffered(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Forward the request; return the whole response (status, headers without
        Content-Length unless HEAD, body)."""
        response = self._send_upstream(body)
        payload = response.read()
        headers = self._response_headers(response)
        if self.command != "HEAD":
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        if response.will_close and self._upstream is not None:
            self._upstream.close()
            self._upstream = None
        return response.status, headers, payload

    def _send_head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    def send_whole(
        self, status: int, headers: list[tuple[str, str]], payload: bytes, declared: int | None = None
    ) -> None:
        """Send a response held whole; ``declared`` is a Content-Length to claim instead."""
        if self.command != "HEAD" or not any(k.lower() == "content-length" for k, _ in headers):
            headers = [*headers, ("Content-Length", str(declared if declared is not None else len(payload)))]
        self._send_head(status, headers)
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()


class _Buffered:
    """A body already read, offered in pieces as ``HTTPResponse.readinto`` would."""

    def __init__(self, payload: bytes) -> None:
        self._view, self._at = memoryview(payload), 0

    def readinto(self, out: memoryview) -> int:
        got = len(self._view[self._at : self._at + len(out)])
        out[:got] = self._view[self._at : self._at + got]
        self._at += got
        return got


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="A WAN-shaped proxy in front of an S3 endpoint.")
    parser.add_argument("upstream", help="the S3 endpoint, e.g. http://127.0.0.1:9000")
    parser.add_argument("--latency", type=float, default=0.03, help="seconds before each request")
    parser.add_argument("--bandwidth", type=float, default=40e6, help="bytes/s per response (0: none)")
    args = parser.parse_args(argv)
    with WanProxy(args.upstream, latency=args.latency, bandwidth=args.bandwidth) as proxy:
        print(f"endpoint={proxy.endpoint}", flush=True)
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
