"""S3 reads with a synchronous client (lean or botocore): the fast path of ``Storage.read`` on s3://.

# NOTE [ S3 reads without s3fs ]
# s3fs reads through aiobotocore and aiohttp on an event loop in another thread: a body
# arrives in small chunks handed across threads and joined, well below the throughput of a
# plain botocore ``get_object(...)["Body"].read()``. So object reads (GetObject, whole or
# ranged) use a synchronous client: a ``LeanClient`` (s3lean.py, NOTE [ Lean GETs ]) where
# it does what a botocore client would with these options, else a plain botocore client;
# writes, listing and HEAD stay on s3fs. The rules, for both clients:
# - Same configuration as s3fs: the client is made from the same storage_options
#   (``s3_options``) and the standard AWS environment and config-file chain. Options only
#   s3fs can honour (an aiobotocore ``session``, aiohttp ``connector_args``,
#   ``version_aware``, unknown keys) keep reads on s3fs: ``S3Reader.create`` gives None.
# - One client per process, made on first use under a lock. A fork child makes its own and
#   never uses or closes the parent's: its pooled sockets belong to the parent (NOTE
#   [ Storage across processes ] in core.py). The client is never pickled; a Storage
#   pickles its options.
# - One try per GET (botocore's ``retries={"total_max_attempts": 1}`` unless the user says
#   otherwise), so Storage's RetryPolicy is the only retry layer (NOTE [ One retry layer ]).
# - A body shorter than its Content-Length is a transient error. 404 and 403 become
#   FileNotFoundError and PermissionError (as s3fs translates them), so Storage reports
#   them the same way on every path; 416 (range past the end) reads as no bytes, which
#   Storage turns into its "past the end of the object" error.
# - Given the manifest's size, every response's total is checked against it (NOTE [ Reads
#   check the manifest ] in expect.py); every body is read under its read's deadline (NOTE
#   [ Deadlines on bodies ] in deadline.py).
"""

from __future__ import annotations

import errno
import functools
import inspect
import io
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, cast

from shardstream.errors import TransientStorageError
from shardstream.lifecycle import after_fork_in_child, this_process
from shardstream.storage import deadline
from shardstream.storage.expect import SizeChanged
from shardstream.storage.s3lean import LeanClient
from shardstream.storage.streams import Body
from shardstream.types import ByteRange

__all__ = [
    "ANSWERS",
    "POOL_CONNECTIONS",
    "SMALL_ANSWER",
    "S3Reader",
    "client_arguments",
    "s3_options",
    "timeouts_of",
]

ANSWERS = 8  # the last GETs whose time to headers ``S3Reader.latency`` goes by
SMALL_ANSWER = 2**20  # bytes: a GET of at most this many is one of them (a sidecar, a manifest)

# s3fs options that do not change how one object is read: the fast path ignores them.
_FS_ONLY = frozenset(
    {
        "default_block_size",
        "default_fill_cache",
        "default_cache_type",
        "cache_regions",  # botocore follows region redirects itself
        "max_concurrency",
        "fixed_upload_size",
        "local_expiry_check",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "asynchronous",
    }
)
_READ_OPTIONS = frozenset(
    {
        "anon",
        "endpoint_url",
        "key",
        "secret",
        "token",
        "username",
        "password",
        "use_ssl",
        "client_kwargs",
        "config_kwargs",
        "requester_pays",
        "s3_additional_kwargs",
        "profile",
        "version_aware",  # only False is supported (checked in ``supported``)
    }
)
# s3fs's own timeouts (class attributes of S3FileSystem), used unless config_kwargs say otherwise.
_CONNECT_TIMEOUT = 5
_READ_TIMEOUT = 15

# NOTE [ Connections kept ]
# botocore keeps at most ``max_pool_connections`` (10) idle connections per client and
# opens a new one for every request beyond that many in flight, closing it when the
# request ends. A worker keeps more in flight than that: its window's reads in
# ``read_concurrency`` threads, the parts of long reads in as many more (NOTE [ Reads in
# parts ]) and the sidecars of windows fetched ahead. So every round of reads would connect
# again, and on a remote HTTPS store each connect is a TCP and TLS handshake, two or three
# round trips before the request's own. The reader's clients keep up to
# ``POOL_CONNECTIONS`` unless the user's ``config_kwargs`` say otherwise: as many as are in
# flight at once, none opened twice. The pool only bounds what is kept; it never opens a
# connection that no request asks for. s3fs's own client (listings, writes, the fsspec read
# path) keeps its own pool settings.
POOL_CONNECTIONS = 64
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "403"})

_lock = threading.Lock()  # guards client creation; replaced in a fork child (it may be held at fork)
_ABANDONED: list[Any] = []  # clients made by a parent process: never used or closed in a child
_LOADERS: dict[Any, Any] = {}  # botocore model loaders by data path, see ``_loader``
# endpoint -> seconds to the headers of this process's last small GETs (``S3Reader.latency``)
_ANSWERS: dict[str, list[float]] = {}
_STREAMING: list[None] = []  # one per body of a stream open in this process (``_Guarded``)
after_fork_in_child(_STREAMING.clear)  # a parent's bodies are not a child's


def _answered(where: str, seconds: float) -> None:
    """Keep a small GET's time to headers; appends and trims are each one step under the GIL."""
    answers = _ANSWERS.setdefault(where, [])
    answers.append(seconds)
    if len(answers) > 2 * ANSWERS:
        del answers[:-ANSWERS]


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()


after_fork_in_child(_new_lock_in_child)


def s3_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as both s3fs and the botocore client get them.

    The endpoint comes from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL when no option names
    one (older s3fs/aiobotocore ignore those variables), and botocore tries each request
    once unless ``config_kwargs["retries"]`` says otherwise.
    """
    result = dict(options)
    client_kwargs = result.get("client_kwargs") or {}
    if not result.get("endpoint_url") and not client_kwargs.get("endpoint_url"):
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if env:
            result["endpoint_url"] = env
    config = dict(result.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1})  # NOTE [ One retry layer ]
    result["config_kwargs"] = config
    return result


def timeouts_of(options: Mapping[str, Any]) -> str:
    """Each try's timeouts, in words for errors (NOTE [ Bounded waits ] in retry.py)."""
    config = options.get("config_kwargs") or {}
    connect = config.get("connect_timeout", _CONNECT_TIMEOUT)
    read = config.get("read_timeout", _READ_TIMEOUT)
    return f"connect_timeout {connect} s, read_timeout {read} s (storage_options config_kwargs)"


def _supported(options: Mapping[str, Any]) -> bool:
    """Whether a botocore client can honour every option (else reads stay on s3fs)."""
    import botocore.config

    if set(options) - _READ_OPTIONS - _FS_ONLY or options.get("version_aware"):
        return False
    if options.get("asynchronous") or (options.get("key") and options.get("username")):
        return False
    config_keys = set(options.get("config_kwargs") or {})
    if config_keys - set(botocore.config.Config.OPTION_DEFAULTS):
        return False  # aiohttp settings (connector_args, http_session_cls...)
    return not set(options.get("client_kwargs") or {}) - _client_parameters()


@functools.cache
def _client_parameters() -> frozenset[str]:
    import botocore.session

    return frozenset(inspect.signature(botocore.session.Session.create_client).parameters) - {
        "self",
        "service_name",
        "config",
    }


def client_arguments(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(create_client keyword arguments, Config keyword arguments)``, as s3fs builds them."""
    client_kwargs = dict(options.get("client_kwargs") or {})
    credentials = {
        "aws_access_key_id": options.get("key") or options.get("username"),
        "aws_secret_access_key": options.get("secret") or options.get("password"),
        "aws_session_token": options.get("token"),
        "endpoint_url": options.get("endpoint_url"),
    }
    arguments = {k: v for k, v in credentials.items() if v is not None and k not in client_kwargs}
    arguments.setdefault("use_ssl", options.get("use_ssl", True))
    arguments.update(client_kwargs)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", _CONNECT_TIMEOUT)
    config.setdefault("read_timeout", _READ_TIMEOUT)
    config.setdefault("max_pool_connections", POOL_CONNECTIONS)  # NOTE [ Connections kept ]
    if options.get("anon"):
        from botocore import UNSIGNED

        for name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
            arguments.pop(name, None)
        config["signature_version"] = UNSIGNED
    return arguments, config


def _request_extras(options: Mapping[str, Any], client: Any) -> dict[str, Any]:
    """What s3fs adds to every GetObject: s3_additional_kwargs and RequestPayer, filtered."""
    extras = dict(options.get("s3_additional_kwargs") or {})
    if options.get("requester_pays"):
        extras["RequestPayer"] = "requester"
    members = client.meta.service_model.operation_model("GetObject").input_shape.members
    return {k: v for k, v in extras.items() if k in members and k not in ("Bucket", "Key", "Range")}


class S3Reader:
    """GetObject for one Storage, with one client per process (made on first use): a
    ``LeanClient`` where the options allow it, else a botocore client."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = dict(options)
        self._client: Any = None
        self._pid = -1
        self._extras: dict[str, Any] = {}
        resolved = s3_options(self._options)  # the endpoint as the client will take it
        where = resolved.get("endpoint_url") or (resolved.get("client_kwargs") or {}).get("endpoint_url")
        self._where = str(where or "")  # whose small GETs' answers ``latency`` goes by

    @classmethod
    def create(cls, options: Mapping[str, Any]) -> S3Reader | None:
        """A reader for these storage_options, or None where only s3fs can honour them."""
        return cls(options) if _supported(options) else None

    def __reduce__(self):  # configuration only, never the client
        return (S3Reader, (self._options,))

    @property
    def client(self) -> Any:
        """This process's S3 client, lean or botocore (made on first use, remade after fork)."""
        client, pid = self._client, this_process()
        if client is not None and self._pid == pid:
            return client
        with _lock:
            if self._client is not None and self._pid == pid:  # another thread made it
                return self._client
            if self._client is not None:
                _ABANDONED.append(self._client)
            client, extras = self._make_client()
            # Threads read these without the lock: the client is published last, so one
            # that sees it also sees its request extras and pid.
            self._extras, self._pid, self._client = extras, pid, client
            return client

    def _make_client(self) -> tuple[Any, dict[str, Any]]:
        import botocore.config
        import botocore.session

        options = s3_options(self._options)
        arguments, config = client_arguments(options)
        lean = LeanClient.create(options, arguments, config)  # NOTE [ Lean GETs ] in s3lean.py
        if lean is not None:
            return lean, {}
        session = botocore.session.Session(profile=options.get("profile"))
        session.register_component("data_loader", _loader(session.get_config_variable("data_path")))
        client = session.create_client("s3", config=botocore.config.Config(**config), **arguments)
        return client, _request_extras(options, client)

    def read(self, bucket: str, key: str, rng: ByteRange | None, *, size: int | None = None) -> bytes:
        """The object, or the bytes of ``rng`` (fewer only where the object ends first).

        ``size``: the object's expected total size; another raises ``SizeChanged``.
        """
        response = self._get(bucket, key, rng, size)
        return b"" if response is None else _body(response, rng)

    def read_into(self, bucket: str, key: str, rng: ByteRange, out: memoryview, *, size: int | None) -> int:
        """``read`` of ``rng`` straight into ``out`` (its length): the body is read into
        it, not into a new bytes object copied there (NOTE [ Reads in parts ]). The
        bytes written."""
        body = self.stream(bucket, key, rng, size=size)
        try:
            got = 0
            while got < len(out) and (n := body.readinto(out[got:])):
                got += n
        finally:
            body.close()
        return got

    def stream(self, bucket: str, key: str, rng: ByteRange | None, *, size: int | None) -> Body:
        """The body of a GetObject of ``rng`` (None: the whole object, no Range) to read
        in order with ``readinto``, then close: the HTTP stream itself where the body is
        the bytes asked for as they are (a 206, or a 200 of a whole GET, not encoded),
        else the bytes ``read`` gives. A body that ends early raises (urllib3 checks its
        Content-Length; a LeanClient's stream checks it the same way)."""
        response = self._get(bucket, key, rng, size)
        if response is None:
            return io.BytesIO()
        raw = getattr(response["Body"], "_raw_stream", None)
        status = response["ResponseMetadata"].get("HTTPStatusCode")
        plain = status == (200 if rng is None else 206) and not response.get("ContentEncoding")
        if raw is None or not plain or not hasattr(raw, "readinto"):
            return io.BytesIO(_body(response, rng))
        return _Guarded(cast(Body, raw), _cut(response))

    def _get(self, bucket: str, key: str, rng: ByteRange | None, size: int | None) -> Any:
        """The GetObject response (its body unread), or None for a range past the end."""
        from botocore.exceptions import ClientError

        client = self.client
        request = dict(self._extras, Bucket=bucket, Key=key)
        if rng is not None:
            request["Range"] = f"bytes={rng.start}-{rng.end - 1}"
        # a GET sent beside this process's streams may wait behind them at a busy server
        busy, started = bool(_STREAMING), time.monotonic()
        try:
            response = client.get_object(**request)
        except ClientError as error:
            if _status(error) == 416:  # the range starts at or past the end: no bytes
                _check_total(error.response.get("Error", {}).get("ActualObjectSize"), size)
                return None
            raise _translated(error) from error
        length = response.get("ContentLength")
        if length is not None and length <= SMALL_ANSWER and not busy:
            _answered(self._where, time.monotonic() - started)
        if size is not None:
            _check_total(_total_size(response), size)
        return response

    def latency(self) -> float | None:
        """The least time to the headers of this process's last ``ANSWERS`` GETs of at most
        ``SMALL_ANSWER`` bytes from this reader's endpoint, each sent while no stream of
        the process was open (None before any; a fork child keeps its parent's, which
        measured the same link): the link's round trip, with as little of a busy server's
        wait as was seen (NOTE [ A link's latency before its reads ] in cuts.py)."""
        answers = _ANSWERS.get(self._where)
        recent = answers[-ANSWERS:] if answers else None  # a slice: one step under the GIL
        return min(recent) if recent else None

    def close(self) -> None:
        """Close this process's client (a parent's is left alone); it is remade on use."""
        with _lock:
            client, self._client = self._client, None
            if client is None:
                return
            if self._pid != this_process():
                _ABANDONED.append(client)
                return
        client.close()


def _loader(data_path: Any) -> Any:
    """This process's botocore model loader for ``data_path`` (call with ``_lock`` held).

    A fresh session parses the S3 model again (slow, for every client); the parsed models are
    plain data, so sessions share one loader, forked children included. Sessions stay
    separate: each resolves its own credentials, as s3fs's do.
    """
    import botocore.loaders

    loader = _LOADERS.get(data_path)
    if loader is None:
        loader = _LOADERS[data_path] = botocore.loaders.create_loader(data_path)
    return loader


def _total_size(response: Mapping[str, Any]) -> int | None:
    """The object's total size: from ``Content-Range`` (``bytes a-b/TOTAL``) of a ranged
    response, else ``Content-Length`` of a whole one; None where the server does not say."""
    content_range = response.get("ContentRange")
    if content_range:
        total = str(content_range).rpartition("/")[2].strip()
        return int(total) if total.isdigit() else None
    if response["ResponseMetadata"].get("HTTPStatusCode") == 200:
        length = response.get("ContentLength")
        return int(length) if length is not None else None
    return None


def _body(response: Any, rng: ByteRange | None) -> bytes:
    """The body of a GetObject response, read whole and its length checked: the bytes of
    ``rng``, cut out here only where the server ignored Range and sent the whole object
    (status 200; a 206 body is the range, whatever its ``ContentEncoding``)."""
    body = response["Body"]
    try:
        with deadline.reading(_cut(response)):
            data = body.read()
    finally:
        body.close()
    _check_length(response, len(data))
    if rng is not None and response["ResponseMetadata"].get("HTTPStatusCode") == 200:
        data = data[rng.start : rng.end]
    return data


def _cut(response: Mapping[str, Any]) -> Any:
    """What cuts a response's body off, waking a read blocked on it: urllib3's
    ``shutdown`` of its socket (None where the body has none)."""
    body = response["Body"]
    return getattr(body, "shutdown", None) or getattr(getattr(body, "_raw_stream", None), "shutdown", None)


class _Guarded:
    """A body read under its read's deadline (NOTE [ Deadlines on bodies ] in deadline.py)."""

    __slots__ = ("_body", "_cut", "_open")

    def __init__(self, body: Body, cut: Any) -> None:
        self._body, self._cut, self._open = body, cut, True
        _STREAMING.append(None)

    def readinto(self, buffer: memoryview, /) -> int | None:
        with deadline.reading(self._cut):
            return self._body.readinto(buffer)

    def close(self) -> None:
        if self._open:
            self._open = False
            if _STREAMING:  # emptied in a fork child
                _STREAMING.pop()
        self._body.close()


def _check_length(response: Mapping[str, Any], got: int) -> None:
    declared = response.get("ContentLength")
    if declared is not None and got != declared:
        raise TransientStorageError(f"truncated body: {got} of {declared} bytes")


def _check_total(total: Any, size: int | None) -> None:
    if size is not None and total is not None and str(total).isdigit() and int(total) != size:
        raise SizeChanged(int(total))


def _status(error: Any) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _translated(error: Any) -> Exception:
    """404 and 403 as the OSErrors s3fs raises for them; anything else unchanged."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    message = f"{code}: {error.response.get('Error', {}).get('Message', '')}"
    status = _status(error)
    if status == 404 or code in _NOT_FOUND_CODES:
        return FileNotFoundError(errno.ENOENT, message)
    if status == 403 or code in _DENIED_CODES:
        return PermissionError(errno.EACCES, message)
    return error
