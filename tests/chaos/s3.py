"""An S3 endpoint the chaos matrix can stop and start: moto's server on loopback.

Its state lives in moto's in-process backends, so stopping and starting it on the
same port is an outage, not a wipe. Only the fake credentials it needs are put in
the environment (which the worker inherits), and only for the matrix run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lazarus.domain.ports import free_port

BUCKET = "lazarus-chaos"
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class ChaosS3:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: Any = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._server = server

    def stop(self) -> None:
        """Refuse connections from now on, as a dead endpoint does."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        if server._server is not None:
            server._server.server_close()

    def durable_uri(self, job: str) -> str:
        return f"s3://{BUCKET}/{job}"


@contextmanager
def chaos_s3() -> Iterator[ChaosS3]:
    """A running endpoint with the bucket made, and fake credentials in the
    environment; everything put back on exit."""
    saved = {name: os.environ.get(name) for name in FAKE_CREDENTIALS}
    os.environ.update(FAKE_CREDENTIALS)
    s3 = ChaosS3()
    s3.start()
    try:
        import boto3

        boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1").create_bucket(
            Bucket=BUCKET
        )
        yield s3
    finally:
        s3.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
