"""An S3 API stand-in on 127.0.0.1: ``moto`` in server mode (pinned in the dev extras), for the object-store
tier. No S3-compatible server installs from this machine's registries; moto answers the S3 calls Hadoop's S3A
connector and delta-rs make (buckets, objects, multipart uploads, listings, conditional puts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from phases._internal.errors import SetupError
from phases._internal.runtime.local_kafka import free_port

ACCESS_KEY = "phases-test"
SECRET_KEY = "phases-test-secret"
REGION = "us-east-1"


class LocalS3:
    def __init__(self, log_file: str | os.PathLike):
        self.port = free_port()
        self.log_file = Path(log_file)
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> LocalS3:
        server = Path(sys.executable).parent / "moto_server"
        if not server.exists():
            raise SetupError(f"{server} is missing: install the dev extras (`make setup`), which pin moto[server]")
        out = open(self.log_file, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(self.port)], stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SetupError(f"moto_server exited with code {self.process.returncode}; see {self.log_file}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise SetupError(f"moto_server did not answer on {self.endpoint} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        self.process = None

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        ).create_bucket(Bucket=name)  # fmt: skip

    def spark_conf(self, bucket: str) -> dict[str, str]:
        """Hadoop S3A settings for ``bucket`` on this endpoint (per-bucket keys: other buckets are untouched)."""
        prefix = f"fs.s3a.bucket.{bucket}."
        return {
            prefix + "endpoint": self.endpoint,
            prefix + "endpoint.region": REGION,
            prefix + "path.style.access": "true",
            prefix + "connection.ssl.enabled": "false",
            prefix + "access.key": ACCESS_KEY,
            prefix + "secret.key": SECRET_KEY,
            # The state store uploads RocksDB snapshots (SST files) with copyFromLocalFile; S3A's optimized form
            # (a PutObject from the file) gets moto's bare "100 Continue" back as the final status and fails. The
            # generic form streams the file like any other write. Real S3 needs neither.
            prefix + "optimized.copy.from.local.enabled": "false",
        }

    def environment(self) -> dict[str, str]:
        """The AWS SDK's variables, which delta-rs (the sensors' log reads) takes its store settings from."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }
