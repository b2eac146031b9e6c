"""S3 servers on 127.0.0.1 for tests, benchmarks and the demo.

``MotoServer`` runs moto's S3 in this process on a free port. Credentials are dummies;
the servers listen on loopback only.
"""

from __future__ import annotations

__all__ = ["ACCESS_KEY", "SECRET_KEY", "MotoServer"]

ACCESS_KEY = "shardstream-test"
SECRET_KEY = "shardstream-test-secret"


class MotoServer:
    """moto's S3 server, in a thread of this process, on 127.0.0.1 and a free port."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""

    def start(self) -> None:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()

    def env(self) -> dict[str, str]:
        """Variables that point boto3/s3fs (also in subprocesses) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def storage_options(self) -> dict:
        return {"endpoint_url": self.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}

    def create_bucket(self, bucket: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=bucket)

