"""Storage against SeaweedFS, a real S3 server in Go, over HTTP with SigV4 auth."""

from __future__ import annotations

import random
import uuid

import pytest

from shardstream.errors import StorageError
from shardstream.storage import Storage
from shardstream.types import ByteRange
from tests.faultproxy import FaultProxy

DATA = random.Random(9).randbytes(300_000)


@pytest.mark.s3
def test_write_ranged_read_list_on_seaweedfs(seaweedfs):
    bucket = "ss-" + uuid.uuid4().hex[:8]
    seaweedfs.create_bucket(bucket)
    storage = Storage(f"s3://{bucket}/corpus", seaweedfs.storage_options())
    storage.write("shard-000000.tar", DATA)
    with storage.writer("idx/shard-000000.idx") as f:
        f.write(b"index bytes")
    assert storage.read("shard-000000.tar", ByteRange(123_456, 223_456)) == DATA[123_456:223_456]
    assert storage.size("shard-000000.tar") == len(DATA)
    assert storage.list_files() == ["idx/shard-000000.idx", "shard-000000.tar"]
    with pytest.raises(StorageError, match="not found"):
        storage.read("shard-000001.tar", ByteRange(0, 10))
    # SigV4 signs the Host header: the proxy must forward it untouched for auth to pass
    with FaultProxy(seaweedfs.endpoint, seed=3, error_rate=0.2, reset_rate=0.0, truncate_rate=0.2) as proxy:
        proxied = Storage(
            f"s3://{bucket}/corpus", dict(seaweedfs.storage_options(), endpoint_url=proxy.endpoint)
        )
        for start in range(0, 250_000, 50_000):
            assert (
                proxied.read("shard-000000.tar", ByteRange(start, start + 50_000))
                == DATA[start : start + 50_000]
            )
        proxied.close()
    assert proxy.stats["GET"] >= 5
    storage.close()
