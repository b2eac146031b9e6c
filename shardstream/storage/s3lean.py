"""GetObject without a botocore client: signed here, sent on a urllib3 pool (NOTE [ Lean GETs ]).

# NOTE [ Lean GETs ]
# A botocore S3 client is slow to make (it loads S3's service model and endpoint rules),
# most of the time to a dataset's first sample, and costs CPU per ``get_object``. An object
# read needs none of that: ``LeanClient`` builds the path-style GET, signs it with SigV4
# (the signing key derived once a day), sends it on a urllib3 pool and reads the status and
# headers itself. Only where it does what the botocore client would; else ``create`` gives
# None and a botocore client is made (NOTE [ S3 reads without s3fs ] in s3read.py):
# - An endpoint is named (``endpoint_url``, client_kwargs or AWS_ENDPOINT_URL[_S3]), with no
#   path and no proxy, so botocore would address path-style. AWS itself (virtual hosts,
#   region redirects), ``addressing_style="virtual"``, other ``s3`` settings, proxies and
#   client certificates stay on botocore.
# - Endpoint, credentials, region, timeouts and pool size come from s3read's
#   ``client_arguments`` (one definition for both clients); credentials and region resolve
#   as botocore resolves them, once per process; ``anon``: unsigned requests.
# - Every option that changes the request goes to botocore: requester_pays, a GetObject key
#   of s3_additional_kwargs (SSE-C, ExpectedBucketOwner, VersionId...), a signature other
#   than s3v4, an unlisted config_kwargs or client_kwargs key, retries other than one try.
# - One try, no redirects: Storage's RetryPolicy is the only retry layer; timeouts and pool
#   size as botocore's (NOTE [ Connections kept ] in s3read.py).
# - Responses read as botocore's: the same keys from ``get_object``, the body undecoded
#   with its Content-Length enforced, a status of 300 or more raised as botocore's
#   ``ClientError`` with the XML error body's fields, so s3read's and retry.py's mappings
#   apply unchanged. Only ``ERROR_BODY`` bytes of an error body are read (an endless one
#   must not fill memory). Shard bytes are checked against the manifest's checksums, so
#   botocore's checksum mode is not asked for. One pool per process, as s3read's clients.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["GET_OBJECT_PARAMETERS", "LeanClient"]

# GetObject's parameters (botocore's model): an s3_additional_kwargs key among them
# changes the request, so only the botocore client honours it (a test keeps this list
# equal to the model's).
GET_OBJECT_PARAMETERS = frozenset(
    {
        "Bucket",
        "ChecksumMode",
        "ExpectedBucketOwner",
        "IfMatch",
        "IfModifiedSince",
        "IfNoneMatch",
        "IfUnmodifiedSince",
        "Key",
        "PartNumber",
        "Range",
        "RequestPayer",
        "ResponseCacheControl",
        "ResponseContentDisposition",
        "ResponseContentEncoding",
        "ResponseContentLanguage",
        "ResponseContentType",
        "ResponseExpires",
        "SSECustomerAlgorithm",
        "SSECustomerKey",
        "SSECustomerKeyMD5",
        "VersionId",
    }
)
# config_kwargs that a lean GET honours (timeouts, pool, region) or that do not change it.
_CONFIG_KEYS = frozenset(
    {
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "region_name",
        "retries",
        "signature_version",
        "s3",
        "user_agent",
        "user_agent_extra",
        "user_agent_appid",
        "parameter_validation",
        "request_checksum_calculation",
        "response_checksum_validation",
    }
)
_CLIENT_KEYS = frozenset(
    {
        "endpoint_url",
        "region_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "verify",
    }
)
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ERROR_BODY = 1 << 16  # bytes of an error response read at most, for its XML fields
_SUCCESS = (200, 206)


def _one_try(retries: Any) -> bool:
    retries = dict(retries or {})
    return retries.get("total_max_attempts") == 1 or retries.get("max_attempts") == 0


def _path_style(s3: Any) -> bool:
    return not set(s3 or {}) - {"addressing_style"} and (s3 or {}).get("addressing_style", "auto") in (
        "auto",
        "path",
    )


def _static_ok(options: Mapping[str, Any]) -> bool:
    """Whether these options (after ``s3_options``) leave a GetObject as a lean one sends it."""
    config = options.get("config_kwargs") or {}
    client = options.get("client_kwargs") or {}
    extras = options.get("s3_additional_kwargs") or {}
    return not (
        options.get("requester_pays")
        or set(extras) & GET_OBJECT_PARAMETERS
        or set(config) - _CONFIG_KEYS
        or set(client) - _CLIENT_KEYS
        or not _one_try(config.get("retries"))
        or config.get("signature_version") not in (None, "s3v4")
        or not _path_style(config.get("s3"))
    )


class _Body:
    """A response body as botocore's StreamingBody shows it to s3read: ``read`` all of it
    (urllib3 enforces its Content-Length), or its ``_raw_stream`` to ``readinto``."""

    __slots__ = ("_raw_stream", "_response")

    def __init__(self, response: Any) -> None:
        import http.client  # loaded with urllib3 already

        self._response = response
        fp = getattr(response, "_fp", None)
        direct = isinstance(fp, http.client.HTTPResponse) and not response.headers.get("content-encoding")
        self._raw_stream = _Stream(response, fp) if direct else response

    def read(self) -> bytes:
        return bytes(self._response.read())

    def shutdown(self) -> None:
        """Cut the body off: a read blocked on it wakes (NOTE [ Deadlines on bodies ])."""
        self._response.shutdown()

    def close(self) -> None:
        self._raw_stream.close()


class _Stream:
    """A body read straight into the caller's buffer by http.client: urllib3's
    ``readinto`` reads each chunk into a new bytes object and copies it over (NOTE [ Reads
    in parts ] reads 1 MB samples this way). The connection goes back to urllib3's pool
    once the body is read to its end, as urllib3 does itself; a body that ends before its
    Content-Length raises IncompleteRead (transient), as urllib3's would."""

    __slots__ = ("_fp", "_response")

    def __init__(self, response: Any, fp: Any) -> None:  # fp: an http.client.HTTPResponse
        self._response, self._fp = response, fp

    def readinto(self, buffer: Any) -> int:
        fp = self._fp
        got = fp.readinto(buffer)
        if fp.isclosed():  # http.client let go of the socket: the body ended
            if not got and fp.length:  # before its Content-Length
                import http.client

                self._response.close()
                raise http.client.IncompleteRead(b"", fp.length)
            self._response.release_conn()
        return got

    def close(self) -> None:
        if self._fp.isclosed() and not self._fp.length:
            self._response.release_conn()
        self._response.close()


class LeanClient:
    """``get_object`` (Bucket, Key, Range) for one process, as NOTE [ Lean GETs ] says."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        credentials: Any,
        pool: Any,
        netloc: str,
        connect: float,
        read: float,
    ) -> None:
        self.endpoint, self.region, self.credentials = endpoint, region, credentials
        self.pool, self.host, self.timeouts = pool, netloc, (connect, read)
        self._keys: dict[tuple[str, str], bytes] = {}  # (secret, date) -> signing key

    @classmethod
    def create(
        cls, options: Mapping[str, Any], arguments: Mapping[str, Any], config: Mapping[str, Any]
    ) -> LeanClient | None:
        """A client for these options (as ``s3_options`` gives them), or None where only
        botocore does what they ask; ``arguments`` and ``config``: the botocore client's
        (s3read's ``client_arguments``), whose endpoint, credentials, region, timeouts and
        pool size it takes as that client would."""
        endpoint = arguments.get("endpoint_url")
        if not endpoint or not _static_ok(options):
            return None
        parts = urlsplit(endpoint)
        if (
            parts.scheme not in ("http", "https")
            or parts.path.strip("/")
            or parts.query
            or parts.username
            or not parts.hostname
        ):
            return None
        import botocore.session
        import botocore.utils

        if botocore.utils.get_environ_proxies(endpoint):
            return None
        session = botocore.session.Session(profile=options.get("profile"))
        if not _path_style(session.get_scoped_config().get("s3")):
            return None
        region = (
            arguments.get("region_name") or config.get("region_name") or session.get_config_variable("region")
        )
        credentials = None if options.get("anon") else _credentials(arguments, session)
        if credentials is False:
            return None
        connect, read = float(config["connect_timeout"]), float(config["read_timeout"])
        size = int(config["max_pool_connections"])  # client_arguments' default, as the timeouts
        pool = _pool(parts, arguments.get("verify"), session, size, connect, read)
        # The Host header as botocore signs it: no port where it is the scheme's own.
        netloc = parts.netloc
        if parts.port in (None, {"http": 80, "https": 443}[parts.scheme]):
            netloc = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return cls(endpoint, region or "us-east-1", credentials, pool, netloc.lower(), connect, read)

    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        """The response as botocore's ``get_object`` gives it (the body unread), or its
        ``ClientError`` for a status of 300 or more."""
        path = "/" + quote(Bucket, safe="~") + "/" + quote(Key, safe="/~")
        headers = {"Host": self.host}
        if Range is not None:
            headers["Range"] = Range
        self._sign(path, headers)
        response = self.pool.urlopen(
            "GET",
            path,
            headers=headers,
            retries=False,
            redirect=False,
            preload_content=False,
            decode_content=False,
            assert_same_host=False,
        )
        status = response.status
        if status not in _SUCCESS:
            raise _client_error(response)
        found = response.headers
        length = found.get("content-length")
        return {
            "Body": _Body(response),
            "ContentLength": int(length) if length is not None else None,
            "ContentRange": found.get("content-range"),
            "ContentEncoding": found.get("content-encoding"),
            "ResponseMetadata": {"HTTPStatusCode": status},
        }

    def _sign(self, path: str, headers: dict[str, str]) -> None:
        """Add SigV4 headers (as botocore's S3SigV4Auth signs a GET over http)."""
        if self.credentials is None:  # anon: unsigned, as botocore's UNSIGNED sends it
            return
        headers["X-Amz-Content-SHA256"] = _EMPTY_SHA256
        frozen = self.credentials.get_frozen_credentials()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers["X-Amz-Date"] = stamp
        if frozen.token:
            headers["X-Amz-Security-Token"] = frozen.token
        headers["Authorization"] = signature(frozen, self.region, path, headers, stamp, self._keys)

    def close(self) -> None:
        self.pool.close()


def signature(frozen: Any, region: str, path: str, headers: Mapping[str, str], stamp: str, keys: dict) -> str:
    """The Authorization header of a GET of ``path`` with ``headers`` (each signed) at
    ``stamp``; ``keys`` caches the signing key per secret and day."""
    lower = {name.lower(): value for name, value in headers.items()}
    names = sorted(lower)
    signed = ";".join(names)
    canonical = "".join(f"{name}:{' '.join(lower[name].split())}\n" for name in names)
    request = f"GET\n{path}\n\n{canonical}\n{signed}\n{lower['x-amz-content-sha256']}"
    day = stamp[:8]
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(request.encode()).hexdigest()}"
    key = keys.get((frozen.secret_key, day))
    if key is None:
        key = ("AWS4" + frozen.secret_key).encode()
        for part in (day, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        keys.clear()
        keys[(frozen.secret_key, day)] = key
    mac = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={frozen.access_key}/{scope}, SignedHeaders={signed}, Signature={mac}"


def _credentials(arguments: Mapping[str, Any], session: Any) -> Any:
    """The credentials botocore's client would sign with, given its ``arguments``; False
    where only it can tell (a key without its secret)."""
    import botocore.credentials

    access, secret = arguments.get("aws_access_key_id"), arguments.get("aws_secret_access_key")
    token = arguments.get("aws_session_token")
    if access or secret:
        if not (access and secret):
            return False
        return botocore.credentials.Credentials(access, secret, token)
    from_env = _environment_credentials(session)
    if from_env is not None:
        return from_env
    return session.get_credentials()  # None: get_object raises NoCredentialsError, as botocore's


# NOTE [ Credentials from the environment ]
# botocore's credential chain takes AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY first where
# no profile is named, but building the chain makes every provider, the container one with
# an SSL context of its own: work for each process's client, and in a DataLoader worker
# forked while a parent thread held one of OpenSSL's locks (OpenSSL 3 has no fork
# handlers), a call that never returns. Where the chain would take the environment's
# keys, they are taken here without it.
def _environment_credentials(session: Any) -> Any:
    import botocore.credentials

    if session.profile is not None or os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE"):
        return None
    access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not (access and secret):
        return None
    token = os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_SECURITY_TOKEN")
    return botocore.credentials.Credentials(access, secret, token, method="env")


def _pool(parts: Any, verify: Any, session: Any, size: int, connect: float, read: float) -> Any:
    import urllib3

    timeout = urllib3.Timeout(connect=connect, read=read)
    common: dict[str, Any] = {"maxsize": size, "block": False, "timeout": timeout, "retries": False}
    if parts.scheme == "http":
        return urllib3.HTTPConnectionPool(parts.hostname, parts.port or 80, **common)
    if verify is None:
        verify = session.get_config_variable("ca_bundle") or True
    if verify is False:
        return urllib3.HTTPSConnectionPool(parts.hostname, parts.port or 443, cert_reqs="CERT_NONE", **common)
    if verify is True:
        import botocore.httpsession

        verify = botocore.httpsession.get_cert_path(True)
    return urllib3.HTTPSConnectionPool(parts.hostname, parts.port or 443, ca_certs=verify, **common)


def _client_error(response: Any) -> Exception:
    """botocore's ClientError for an error response, from its XML body (read here)."""
    from botocore.exceptions import ClientError

    try:
        body = bytes(response.read(ERROR_BODY))
    except Exception:  # the status says enough; the connection is not reused
        response.close()
        body = b""
    if len(body) >= ERROR_BODY:  # not an S3 error body (a few hundred bytes): the rest stays unread
        response.close()
    error = {"Code": str(response.status), "Message": response.reason or ""}
    if body.lstrip().startswith(b"<"):
        import xml.etree.ElementTree as ElementTree

        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            root = None
        if root is not None:
            error.update({child.tag.rpartition("}")[2]: child.text or "" for child in root})
    meta = {"HTTPStatusCode": response.status, "HTTPHeaders": dict(response.headers)}
    return ClientError({"Error": error, "ResponseMetadata": meta}, "GetObject")
