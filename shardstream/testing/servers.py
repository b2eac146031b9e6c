"""S3 servers on 127.0.0.1: moto in this process, SeaweedFS as a child (see the package)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import IO

ACCESS_KEY = "shardstream-test"
SECRET_KEY = "shardstream-test-secret"


class _LoopbackS3:
    """What every S3 server here offers once started: its endpoint and how to reach it."""

    endpoint = ""

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
        self._client().create_bucket(Bucket=bucket)

    def _client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )


class MotoServer(_LoopbackS3):
    """moto's S3 server, in a thread of this process, on 127.0.0.1 and a free port."""

    def __init__(self, port: int = 0) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.endpoint = ""

    def start(self) -> None:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()


# NOTE [ SeaweedFS in tests ]
# ``weed mini`` runs master, volume, filer and S3 in one process. Its S3 port is ours to
# choose (a free one), but its master/volume/filer/admin ports are fixed, so two copies
# on one machine collide: ``start`` first takes an exclusive lock on a file in the temp
# dir and holds it until ``stop``. S3 auth is on: ``weed mini`` makes an admin identity
# from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its environment and rejects other keys
# (InvalidAccessKeyId), so the same dummy credentials as moto's work.
_SEAWEED_LOCK = "seaweedfs-tests.lock"  # not "shardstream*": the leak check watches those


def _free_ports(count: int) -> list[int]:
    """Ports free now on 127.0.0.1, each <= 55535 (weed adds 10000 for its gRPC ports)."""
    import socket

    found: list[int] = []
    sockets = []
    try:
        while len(found) < count:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port <= 55535:
                found.append(port)
    finally:
        for s in sockets:
            s.close()
    return found


class SeaweedFS(_LoopbackS3):
    """SeaweedFS (``weed mini``) serving S3 on 127.0.0.1 and a free port, data in a temp dir."""

    def __init__(self, *, startup_timeout: float = 90.0, lock_timeout: float = 600.0) -> None:
        self.endpoint = ""
        self.pid = 0
        self._startup_timeout = startup_timeout
        self._lock_timeout = lock_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = ""
        self._lock_file: IO[str] | None = None

    def start(self) -> None:
        import shutil
        import tempfile

        weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
        self._lock()
        try:
            self._dir = tempfile.mkdtemp(prefix="seaweedfs-")
            s3_port, grpc_port = _free_ports(2)
            self.endpoint = f"http://127.0.0.1:{s3_port}"
            args = [
                weed,
                "mini",
                f"-dir={self._dir}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                f"-s3.port={s3_port}",
                f"-s3.port.grpc={grpc_port}",
                f"-s3.localSocket={self._dir}/s3.sock",
                f"-filer.localSocket={self._dir}/filer.sock",
                "-webdav=false",
                "-admin.ui=false",
            ]
            env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
            env.pop("AWS_ENDPOINT_URL", None)
            with open(os.path.join(self._dir, "weed.log"), "wb") as log:
                self._proc = subprocess.Popen(
                    args,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            self.pid = self._proc.pid
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _lock(self) -> None:
        import fcntl
        import tempfile

        # The machine-wide temp dir, not a test session's private one (tests/conftest.py):
        # SeaweedFS's fixed admin ports are shared by every session on the machine.
        lock_dir = os.environ.get("SHARDSTREAM_MACHINE_TMP") or tempfile.gettempdir()
        lock_file = self._lock_file = open(os.path.join(lock_dir, _SEAWEED_LOCK), "w")  # noqa: SIM115
        deadline = time.monotonic() + self._lock_timeout
        while True:
            try:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock_file.close()
                    self._lock_file = None
                    raise RuntimeError("another SeaweedFS test server held the lock too long") from None
                time.sleep(0.5)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise RuntimeError(f"weed mini exited early:\n{self.log_tail()}")
            try:
                self._client().list_buckets()
                return
            except Exception as error:  # not up yet
                last = error
                time.sleep(0.25)
        raise RuntimeError(
            f"SeaweedFS S3 did not answer in {self._startup_timeout}s ({last}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(os.path.join(self._dir, "weed.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        import shutil
        import signal

        proc, self._proc = self._proc, None
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None
