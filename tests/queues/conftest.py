"""S3 fixtures: moto's S3 server on 127.0.0.1 (a random port, its own process, stopped at the end)
and fresh buckets with a :class:`Lake` on them (tests/queues/test_s3.py)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cues_platform.queues import Lake

SERVER = Path(__file__).with_name("moto_s3.py")


@dataclass
class S3Server:
    """A running moto S3 server (tests/queues/moto_s3.py)."""

    process: subprocess.Popen[str]
    endpoint: str

    def options(self, **extra: str) -> dict[str, str]:
        """delta-rs storage options for this endpoint (moto accepts any credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            **extra,
        }

    def create_bucket(self) -> str:
        name = f"cues-{uuid.uuid4().hex[:16]}"
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
        return name

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_s3(conditional: str = "atomic") -> S3Server:
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--conditional", conditional],
        stdout=subprocess.PIPE, text=True,
    )
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("PORT "):
        process.kill()
        raise RuntimeError(f"moto's S3 server did not start (it printed {line!r})")
    return S3Server(process, f"http://127.0.0.1:{int(line.split()[1])}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = start_s3()
    yield server
    server.stop()


@pytest.fixture
def s3_lake(s3_server: S3Server) -> Callable[..., Lake]:
    """Factory: ``s3_lake(**extra_options)`` is a Lake at ``s3://<fresh bucket>/lake``."""

    def make(**extra: str) -> Lake:
        bucket = s3_server.create_bucket()
        return Lake(root=f"s3://{bucket}/lake", storage_options=s3_server.options(**extra))

    return make
