"""GETs without a botocore client (NOTE [ Lean GETs ] in shardstream/storage/s3lean.py).

The signature is checked against botocore's own signer, the choice between the lean and
the botocore client against every option that only botocore honours, and the error
mapping against moto and SeaweedFS (which checks signatures) over HTTP.
"""

from __future__ import annotations

import datetime
import http.client
import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest

from shardstream.errors import StorageError
from shardstream.storage import RetryPolicy, Storage
from shardstream.storage.expect import Expected
from shardstream.storage.s3lean import ERROR_BODY, GET_OBJECT_PARAMETERS, LeanClient, _client_error, signature
from shardstream.storage.s3read import POOL_CONNECTIONS, S3Reader, client_arguments, s3_options
from shardstream.types import ByteRange
from tests.faultproxy import FaultProxy

DATA = random.Random(5).randbytes(200_000)
FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)
ENDPOINT = "http://127.0.0.1:9"
# Keys whose path must be percent-encoded as botocore encodes it, or the signature differs.
ODD_KEYS = ["a b+c.tar", "dir/x=1&y~z.tar", "ünï/çødé.tar", "semi;colon,comma'quote(1).tar"]


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """A clean AWS environment: credentials in variables, no profile, no proxy."""
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return tmp_path


def _lean(options: dict) -> LeanClient | None:
    """The LeanClient that S3Reader would make for these storage options, or None."""
    resolved = s3_options(options)
    return LeanClient.create(resolved, *client_arguments(resolved))


# -- the signature -----------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "session-token"])
@pytest.mark.parametrize("key", ["plain/shard-000001.tar", *ODD_KEYS])
def test_the_signature_is_botocores(monkeypatch, key, token):
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    now = datetime.datetime(2026, 3, 4, 5, 6, 7)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now)
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    client = LeanClient(ENDPOINT, "eu-west-3", credentials, None, "127.0.0.1:9", 5, 15)
    monkeypatch.setattr("time.gmtime", lambda *_: now.timetuple())
    path = "/bkt/" + quote(key, safe="/~")  # as botocore encodes a key
    ours = {"Host": "127.0.0.1:9", "Range": "bytes=10-99"}
    client._sign(path, ours)

    theirs = AWSRequest(method="GET", url=ENDPOINT + path, headers={"Range": "bytes=10-99"})
    botocore.auth.S3SigV4Auth(credentials, "s3", "eu-west-3").add_auth(theirs)
    assert ours["Authorization"] == theirs.headers["Authorization"]
    assert ours["X-Amz-Date"] == theirs.headers["X-Amz-Date"]
    assert ours.get("X-Amz-Security-Token") == theirs.headers.get("X-Amz-Security-Token")


def test_the_signing_key_is_made_once_a_day():
    from botocore.credentials import Credentials

    keys: dict = {}
    frozen = Credentials("a", "s").get_frozen_credentials()
    headers = {"host": "h", "x-amz-content-sha256": "x", "x-amz-date": "20260101T000000Z"}
    first = signature(frozen, "us-east-1", "/b/k", headers, "20260101T000000Z", keys)
    assert len(keys) == 1
    assert signature(frozen, "us-east-1", "/b/k", headers, "20260101T000000Z", keys) == first
    signature(frozen, "us-east-1", "/b/k", headers, "20260102T000000Z", keys)
    assert list(keys) == [("s", "20260102")]  # yesterday's key is dropped


def test_get_object_parameters_are_botocores():
    import botocore.session

    client = botocore.session.Session().create_client("s3", region_name="us-east-1")
    members = set(client.meta.service_model.operation_model("GetObject").input_shape.members)
    assert members == GET_OBJECT_PARAMETERS


# -- lean where it can, botocore where it must -------------------------------------------


def _client_for(options: dict):
    reader = S3Reader.create(options)
    assert reader is not None
    client = reader.client
    reader.close()
    return client


@pytest.mark.parametrize(
    "options",
    [
        {"requester_pays": True},
        {"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}},
        {"s3_additional_kwargs": {"ExpectedBucketOwner": "123456789012"}},
        {"s3_additional_kwargs": {"VersionId": "v1"}},
        {"config_kwargs": {"s3": {"addressing_style": "virtual"}}},
        {"config_kwargs": {"s3": {"use_accelerate_endpoint": True}}},
        {"config_kwargs": {"retries": {"total_max_attempts": 3}}},
        {"config_kwargs": {"signature_version": "s3"}},
        {"config_kwargs": {"proxies": {"http": "http://127.0.0.1:3128"}}},
        {"config_kwargs": {"client_cert": "/nonexistent/cert.pem"}},
        {"client_kwargs": {"api_version": "2006-03-01"}},
        {"endpoint_url": ENDPOINT + "/prefix"},
        {"endpoint_url": None},
        {"key": "only-a-key"},
    ],
    ids=[
        "requester_pays",
        "sse_c",
        "expected_owner",
        "version_id",
        "virtual_hosts",
        "accelerate",
        "retries",
        "sigv2",
        "proxies",
        "client_cert",
        "api_version",
        "endpoint_path",
        "aws_itself",
        "partial_credentials",
    ],
)
def test_options_it_cannot_honour_fall_back_to_botocore(aws_env, options):
    options = {"endpoint_url": ENDPOINT, **options}
    if options["endpoint_url"] is None:
        del options["endpoint_url"]
    assert _lean(options) is None
    if options.get("key") == "only-a-key":
        return  # botocore refuses partial credentials itself, when it makes its client
    client = _client_for(options)
    assert not isinstance(client, LeanClient)
    assert hasattr(client, "meta")  # a botocore client


def test_a_proxy_in_the_environment_falls_back(aws_env, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    assert _lean({"endpoint_url": "http://minio.example:9000"}) is None
    monkeypatch.setenv("NO_PROXY", "minio.example")
    assert _lean({"endpoint_url": "http://minio.example:9000"}) is not None


def test_virtual_hosts_in_the_profile_fall_back(aws_env):
    (aws_env / "config").write_text("[profile team]\ns3 =\n    addressing_style = virtual\n")
    assert _lean({"endpoint_url": ENDPOINT, "profile": "team"}) is None
    assert _lean({"endpoint_url": ENDPOINT}) is not None


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"s3_additional_kwargs": {"ACL": "private", "ServerSideEncryption": "AES256"}},  # writes only
        {"config_kwargs": {"s3": {"addressing_style": "path"}, "connect_timeout": 2, "read_timeout": 3}},
        {"config_kwargs": {"retries": {"max_attempts": 0}, "region_name": "eu-north-1"}},
        {"client_kwargs": {"region_name": "ap-south-1", "verify": False}},
        {"anon": True},
        {"default_block_size": 2**20, "use_ssl": False},
    ],
    ids=["plain", "write_kwargs", "path_style", "no_retries", "client_region", "anon", "fs_only"],
)
def test_options_it_honours_keep_it_lean(aws_env, options):
    client = _client_for({"endpoint_url": ENDPOINT, **options})
    assert isinstance(client, LeanClient)


def test_region_and_credentials_come_as_botocore_takes_them(aws_env, monkeypatch):
    def lean(**options):
        client = _lean({"endpoint_url": ENDPOINT, **options})
        assert client is not None
        return client.region, client.credentials and client.credentials.access_key

    assert lean() == ("us-east-1", "env-key")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert lean() == ("eu-west-1", "env-key")
    assert lean(config_kwargs={"region_name": "eu-west-2"}) == ("eu-west-2", "env-key")
    assert (
        lean(client_kwargs={"region_name": "eu-west-3"}, config_kwargs={"region_name": "x"})[0] == "eu-west-3"
    )
    assert lean(key="k", secret="s")[1] == "k"
    assert lean(key="k", secret="s", client_kwargs={"aws_access_key_id": "ck"})[1] == "ck"
    assert lean(key="ignored", secret="ignored", anon=True)[1] is None
    hosts = {
        "https://s3.example:443": "s3.example",
        "http://[::1]:80": "[::1]",
        "http://[::1]:9000": "[::1]:9000",
    }
    for endpoint, host in hosts.items():  # as botocore signs Host: no port where it is the scheme's
        assert _lean({"endpoint_url": endpoint}).host == host
    assert _lean({"endpoint_url": "http://user:pw@minio:9000"}) is None


# -- against moto --------------------------------------------------------------------------


@pytest.fixture
def moto_store(s3):
    base, options = s3
    storage = Storage(base + "/ds", options, retry=FAST)
    storage.write("shard.bin", DATA)
    yield storage
    storage.close()


def test_moto_reads_through_the_lean_client(moto_store):
    assert moto_store.read("shard.bin") == DATA
    assert moto_store.read("shard.bin", ByteRange(1000, 150_000)) == DATA[1000:150_000]
    assert isinstance(moto_store._s3.client, LeanClient)
    for key in ODD_KEYS:
        moto_store.write(key, key.encode())
        assert moto_store.read(key) == key.encode()


def test_moto_errors_map_as_on_the_botocore_path(moto_store, s3):
    url = moto_store.url
    with pytest.raises(StorageError, match="not found") as info:
        moto_store.read("missing.bin", ByteRange(0, 10))
    assert f"{url}/missing.bin" in str(info.value)
    with pytest.raises(StorageError, match="past the end") as info:
        moto_store.read("shard.bin", ByteRange(len(DATA), len(DATA) + 10))
    assert f"{url}/shard.bin" in str(info.value)
    with pytest.raises(StorageError, match="changed since the manifest"):
        moto_store.read("shard.bin", ByteRange(0, 10), expect=Expected(len(DATA) + 1))
    with pytest.raises(StorageError, match="changed since the manifest"):
        moto_store.read("shard.bin", expect=Expected(len(DATA) - 1))
    no_bucket = Storage("s3://no-such-bucket-" + uuid.uuid4().hex[:6] + "/ds", s3[1], retry=FAST)
    with pytest.raises(StorageError, match="not found"):
        no_bucket.read("shard.bin")
    assert isinstance(no_bucket._s3.client, LeanClient)
    no_bucket.close()
    assert isinstance(moto_store._s3.client, LeanClient)


def test_moto_through_faults_counts_each_try(moto_store, moto_server, s3):
    with FaultProxy(moto_server.endpoint, seed=3, error_rate=1.0, reset_rate=0.0, truncate_rate=0.0) as proxy:
        storage = Storage(moto_store.url, dict(s3[1], endpoint_url=proxy.endpoint), retry=FAST)
        with pytest.raises(StorageError, match=r"failed after 3 tries") as info:
            storage.read("shard.bin", ByteRange(0, 100))
        assert isinstance(storage._s3.client, LeanClient)
        storage.close()
    assert info.value.url == moto_store.url + "/shard.bin"
    assert proxy.stats["GET"] == 3  # no retries below the policy


# -- against SeaweedFS (signatures checked) -------------------------------------------------


@pytest.mark.s3
def test_seaweedfs_accepts_lean_signatures_and_maps_errors(seaweedfs):
    bucket = "lean-" + uuid.uuid4().hex[:8]
    seaweedfs.create_bucket(bucket)
    options = seaweedfs.storage_options()
    storage = Storage(f"s3://{bucket}/ds", options, retry=FAST)
    storage.write("shard.bin", DATA)
    assert storage.read("shard.bin", ByteRange(77, 123_456)) == DATA[77:123_456]
    assert storage.read("shard.bin", expect=Expected(len(DATA))) == DATA
    assert isinstance(storage._s3.client, LeanClient)
    for key in ODD_KEYS:
        storage.write(key, key.encode())
        assert storage.read(key) == key.encode()
    with pytest.raises(StorageError, match="not found"):
        storage.read("missing.bin", ByteRange(0, 10))
    with pytest.raises(StorageError, match="past the end"):
        storage.read("shard.bin", ByteRange(len(DATA), len(DATA) + 1))
    with pytest.raises(StorageError, match="changed since the manifest"):
        storage.read("shard.bin", ByteRange(0, 10), expect=Expected(len(DATA) + 5))
    storage.close()
    wrong = Storage(f"s3://{bucket}/ds", dict(options, secret="not-the-secret"), retry=FAST)
    with pytest.raises(StorageError, match="access denied") as info:
        wrong.read("shard.bin", ByteRange(0, 10))
    assert f"s3://{bucket}/ds/shard.bin" in str(info.value)
    assert isinstance(wrong._s3.client, LeanClient)
    wrong.close()


def _stream_all(reader: S3Reader, bucket: str, key: str, rng: ByteRange) -> bytes:
    body = reader.stream(bucket, key, rng, size=len(DATA))
    out = bytearray(rng.length)
    view, got = memoryview(out), 0
    try:
        while got < len(out) and (n := body.readinto(view[got:])):
            got += n
    finally:
        body.close()
    return bytes(out[:got])


def test_streamed_bodies_give_their_connection_back(moto_store):
    reader = moto_store._s3
    bucket, _, prefix = moto_store._fspath("shard.bin").partition("/")
    for start in range(0, 100_000, 20_000):
        assert (
            _stream_all(reader, bucket, prefix, ByteRange(start, start + 30_000))
            == DATA[start : start + 30_000]
        )
    assert reader.client.pool.num_connections == 1  # each GET's connection went back to the pool


def test_a_streamed_body_that_ends_early_raises(moto_store, moto_server, s3):
    with FaultProxy(moto_server.endpoint, seed=1, error_rate=0.0, reset_rate=0.0, truncate_rate=1.0) as proxy:
        storage = Storage(moto_store.url, dict(s3[1], endpoint_url=proxy.endpoint), retry=FAST)
        bucket, _, key = storage._fspath("shard.bin").partition("/")
        with pytest.raises(http.client.IncompleteRead):
            _stream_all(storage._s3, bucket, key, ByteRange(1000, 101_000))
        storage.close()
    assert proxy.stats["truncate"] == 1


class _HugeErrorResponse:
    """An error response whose body never ends, as a hostile or broken endpoint may send."""

    status, reason, headers = 500, "Internal Server Error", {"content-type": "text/plain"}

    def __init__(self) -> None:
        self.asked: list[int | None] = []
        self.closed = False

    def read(self, amt: int | None = None) -> bytes:
        self.asked.append(amt)
        return b"x" * (amt if amt is not None else 1 << 30)

    def close(self) -> None:
        self.closed = True


def test_an_error_body_is_read_only_as_far_as_an_s3_error_goes():
    response = _HugeErrorResponse()
    error = _client_error(response)
    assert response.asked == [ERROR_BODY]
    assert response.closed  # the rest unread: the connection is not reused
    assert error.response["Error"]["Code"] == "500"


@pytest.mark.parametrize("requester_pays", [False, True], ids=["lean", "botocore"])
def test_requests_in_flight_past_botocores_ten_open_no_new_connections(
    s3, moto_server, monkeypatch, requester_pays
):
    """NOTE [ Connections kept ]: a worker keeps ~16-24 GETs in flight; a pool that kept
    10 connected anew for each GET past the tenth, every round (4 rounds: 20 -> 38
    connections against SeaweedFS). Both clients keep as many as were in flight."""
    import urllib3.connection

    from shardstream.testing import WanProxy

    base, options = s3
    Storage(base + "/pool", options, retry=FAST).write("shard.bin", DATA)
    opened: list[int] = []
    connect = urllib3.connection.HTTPConnection.connect

    def counted(self):  # type: ignore[no-untyped-def]
        opened.append(1)
        return connect(self)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", counted)
    with WanProxy(moto_server.endpoint, latency=0.05, bandwidth=0) as proxy:  # so that 16 overlap
        through = dict(options, endpoint_url=proxy.endpoint, requester_pays=requester_pays)
        storage = Storage(base + "/pool", through, retry=FAST)
        counts = []
        with ThreadPoolExecutor(16) as pool:
            for _ in range(4):
                reads = pool.map(
                    lambda i: storage.read("shard.bin", ByteRange(i * 100, i * 100 + 50)), range(16)
                )
                assert [bytes(r) for r in reads] == [DATA[i * 100 : i * 100 + 50] for i in range(16)]
                counts.append(len(opened))
        assert proxy.stats.peak_in_flight > 10
        assert isinstance(storage._s3.client, LeanClient) is not requester_pays
        storage.close()
    # never more connections than GETs were ever at once (16 threads); a round whose GETs did
    # not all overlap on a loaded machine may leave the last one to a later round
    assert counts[-1] <= 16, counts
    assert client_arguments({})[1]["max_pool_connections"] == POOL_CONNECTIONS
    assert client_arguments({"config_kwargs": {"max_pool_connections": 4}})[1]["max_pool_connections"] == 4
