"""``make upgrade-demo-compose``: the upgrade of ``make upgrade-demo`` with the workers as compose services,
``worker-v1`` and ``worker-v2`` of docker-compose.yml (profile ``upgrade``): two builds of one Worker Deployment.

1. A Docker engine (``scripts/container/engine.sh``: the one running, or Debian's docker.io started here),
   compose (``docker compose``, else ``docker-compose``; Debian's installed with apt-get where neither is), and
   the worker image built from this tree (the Dockerfile, ``GIT_COMMIT`` the checkout's commit; the base from
   ``scripts/container/base-image.sh`` unless ``S3BATCH_BASE_IMAGE``), tagged for both services.
2. Temporal and S3 on ports of their own: the compose stack's (PostgreSQL, Temporal server, SeaweedFS; project
   ``s3batch-upgrade-demo``, fresh secrets) where its pinned images are in the engine or can be pulled; else
   (no registry) a local stack on free ports, the workers on the host network
   (``deploy/compose/upgrade-local.yml``). ``--infra compose|local`` chooses.
3. ``up -d worker-v1``, ``s3batch deploy promote v1``; jobs ``wide`` (two files at once) and ``long`` (thirty
   files one at a time, four a run) start on v1.
4. ``up -d worker-v2``, ``s3batch deploy promote v2``; job ``new`` starts, on v2. ``wide`` finishes on v1,
   ``long`` moves to v2 at its next file end.
5. Once ``s3batch deploy status`` shows no run pinned to v1: ``stop worker-v1`` (SIGTERM: it drains, exit 0).
6. Removes everything it started: containers, volumes, the images, the local stack, the engine if it started
   it (the base image stays cached).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from s3batch import TASK_QUEUE  # noqa: E402
from s3batch.cli.deploy import print_run_versions  # noqa: E402
from s3batch.client import connect  # noqa: E402
from s3batch.client.deployments import describe_deployment, run_versions  # noqa: E402
from s3batch.dev.sample_data import customers_csv, upload_chunks  # noqa: E402
from s3batch.dev.stack import ACCESS_KEY, SECRET_KEY, Stack, StackConfig, ensure_buckets, free_port_block  # noqa: E402
from s3batch.dev.stack import s3_client as stack_s3_client  # noqa: E402
from scripts.upgrade_demo import OUTPUT_BUCKET, SOURCE_BUCKET, console, start  # noqa: E402

PROJECT = "s3batch-upgrade-demo"
DEPLOYMENT = "s3batch"
IMAGES = {"v1": "s3batch-worker:0.1.0-v1", "v2": "s3batch-worker:0.1.0-v2"}
"""The images docker-compose.yml names for worker-v1 and worker-v2."""
INFRA = ["postgresql", "temporal-schema", "temporal", "temporal-namespace", "seaweedfs", "create-buckets"]
FILES, ROWS, COPIES = 10, 150_000, 3
"""``long`` reads ``FILES`` files of ``ROWS`` rows ``COPIES`` times over (server-side copies): long enough to
be running when v2's container has started (about 20 s here on the vfs storage driver, which copies the image for
each container)."""
CONTAINER = ROOT / "scripts" / "container"
RUN_DIR = Path(os.environ.get("S3BATCH_CONTAINER_RUN", "/run/s3batch-container"))


def sh(*cmd: str, env: dict[str, str] | None = None, show: bool = True, check: bool = True,
       timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (printed as ``$ ...`` when ``show``), its output captured; raise with it on failure."""
    if show:
        console.print(f"  [dim]$ {' '.join(cmd)}[/dim]")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return done


def engine() -> bool:
    """Point DOCKER_HOST at an engine; whether this call started it (then it is stopped at the end)."""
    ours = not (RUN_DIR / "started-here").exists()
    line = sh("bash", str(CONTAINER / "engine.sh"), "start", show=False).stdout.strip().splitlines()[-1]
    os.environ["DOCKER_HOST"] = line.split("=", 1)[1]
    return ours and (RUN_DIR / "started-here").exists()


def compose_command() -> list[str]:
    """``docker compose`` (v2), else ``docker-compose``; Debian's docker-compose installed where neither is."""
    if sh("docker", "compose", "version", show=False, check=False).returncode == 0:
        return ["docker", "compose"]
    if sh("docker-compose", "version", show=False, check=False).returncode != 0:
        console.print("  compose missing: installing Debian's docker-compose with apt-get")
        sh("bash", "-c", f". {CONTAINER / 'lib.sh'} && apt_install docker-compose", show=False)
    return ["docker-compose"]


def build_images() -> None:
    """The worker image, built once with BuildKit (as make test-container builds it) and tagged for both
    services: the same code under two build IDs, as in make upgrade-demo."""
    base = os.environ.get("S3BATCH_BASE_IMAGE") or sh("bash", str(CONTAINER / "base-image.sh"), show=False).stdout
    base = base.strip()
    client = ["docker"]
    if sh("docker", "buildx", "version", show=False, check=False).returncode != 0:
        listed = sh("dpkg", "-L", "docker.io", show=False, check=False).stdout.splitlines()
        client = [p for p in listed if p.endswith("/bin/docker")][:1] or client
    commit = sh("git", "rev-parse", "HEAD", show=False).stdout.strip()
    args = ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"GIT_COMMIT={commit}"]
    index = os.environ.get("PIP_INDEX_URL") or sh(sys.executable, "-m", "pip", "config", "get", "global.index-url",
                                                   show=False, check=False).stdout.strip()
    if index.startswith(("http://", "https://")):
        args += ["--build-arg", f"PIP_INDEX_URL={index}"]
    started = time.monotonic()
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    sh(*client, "build", "--network", "host", *args, "-t", IMAGES["v1"], ".", env=env, show=False)
    sh("docker", "tag", IMAGES["v1"], IMAGES["v2"], show=False)
    console.print(f"  {IMAGES['v1']} and {IMAGES['v2']} built from {commit[:12]} in {time.monotonic() - started:.0f} s")


def compose_env() -> dict[str, str]:
    """What compose reads: fresh secrets (never the example ones) and free ports for the published ones."""
    port = free_port_block([0, 1, 2])
    return {**os.environ, "POSTGRES_PASSWORD": secrets.token_hex(16), "S3_ACCESS_KEY": "upgrade-demo",
            "S3_SECRET_KEY": secrets.token_hex(16), "TEMPORAL_PORT": str(port), "TEMPORAL_UI_PORT": str(port + 1),
            "S3_PORT": str(port + 2)}


def choose_infra(choice: str, compose: list[str], env: dict[str, str]) -> str:
    if choice != "auto":
        return choice
    pulled = sh(*compose, "-p", PROJECT, "-f", "docker-compose.yml", "pull", *INFRA[:-1], env=env, show=False,
                check=False, timeout=600)
    if pulled.returncode == 0:
        return "compose"
    last = ((pulled.stdout + pulled.stderr).strip().splitlines() or ["?"])[-1]
    console.print(f"  the stack's pinned images cannot be pulled here ({last.rsplit(': ', 1)[-1][:120]}):")
    console.print("  Temporal and S3 run as a local stack on ports of its own, the workers on the host network")
    return "local"


class Demo:
    def __init__(self, infra: str, compose: list[str], env: dict[str, str], root: Path) -> None:
        self.infra, self.env, self.root = infra, env, root
        files = ["-f", "docker-compose.yml"] + (["-f", "deploy/compose/upgrade-local.yml"] if infra == "local" else [])
        self.compose = [*compose, "-p", PROJECT, *files]
        self.stack: Stack | None = None

    def up_infra(self) -> None:
        if self.infra == "local":
            self.stack = Stack(StackConfig.random_ports(self.root / "stack"))
            self.stack.start()
            config = self.stack.config
            self.env.update(UPGRADE_TEMPORAL_ADDRESS=config.temporal_address, UPGRADE_S3_ENDPOINT=config.s3_endpoint,
                            S3_ACCESS_KEY=ACCESS_KEY, S3_SECRET_KEY=SECRET_KEY)
            os.environ.update(config.env())
            ensure_buckets(stack_s3_client(config), SOURCE_BUCKET, OUTPUT_BUCKET)
            console.print(f"  local stack: Temporal {config.temporal_address}, S3 {config.s3_endpoint}")
        else:
            self.sh("up", "-d", *INFRA)
            for one_shot in ("temporal-namespace", "create-buckets"):  # they exit 0 once the servers are ready
                self.wait_exited(one_shot)
            os.environ.update(
                TEMPORAL_ADDRESS=f"127.0.0.1:{self.env['TEMPORAL_PORT']}", AWS_REGION="us-east-1",
                AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{self.env['S3_PORT']}",
                AWS_ACCESS_KEY_ID=self.env["S3_ACCESS_KEY"], AWS_SECRET_ACCESS_KEY=self.env["S3_SECRET_KEY"],
            )
            console.print(f"  compose stack: Temporal 127.0.0.1:{self.env['TEMPORAL_PORT']}, S3 "
                          f"127.0.0.1:{self.env['S3_PORT']}")

    def sh(self, *args: str, show: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh(*self.compose, *args, env=self.env, show=show, check=check)

    def wait_exited(self, service: str, timeout: float = 300) -> None:
        label = ["--filter", f"label=com.docker.compose.project={PROJECT}"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = sh("docker", "ps", "-aq", *label, "--filter", f"label=com.docker.compose.service={service}",
                     show=False).stdout.split()  # fmt: skip
            state = sh("docker", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", *ids[:1],
                       show=False).stdout.strip() if ids else ""  # fmt: skip
            if state == "exited 0":
                return
            if state.startswith("exited"):
                raise RuntimeError(f"{service} {state}:\n{self.sh('logs', service, show=False, check=False).stdout}")
            time.sleep(1)
        raise TimeoutError(f"{service} did not complete in {timeout:g} s")

    def up_worker(self, build: str, healthy: bool = True) -> float:
        """``up -d worker-<build>``; with ``healthy``, wait until its health check says so. When it started."""
        started = time.monotonic()
        self.sh("up", "-d", *(["--no-deps"] if self.infra == "local" else []), f"worker-{build}")
        if not healthy:
            return started
        container = self.sh("ps", "-q", f"worker-{build}", show=False).stdout.strip()
        while (state := sh("docker", "inspect", "--format", "{{.State.Health.Status}}", container,
                           show=False).stdout.strip()) != "healthy":
            if time.monotonic() - started > 180:
                logs = self.sh("logs", f"worker-{build}", show=False, check=False).stdout
                raise TimeoutError(f"worker-{build} is {state} after 180 s:\n{logs[-3000:]}")
            time.sleep(1)
        console.print(f"  worker-{build} ({IMAGES[build]}): healthy {time.monotonic() - started:.0f} s after `up`")
        return started

    def stop_worker(self, build: str) -> None:
        container = self.sh("ps", "-q", f"worker-{build}", show=False).stdout.strip()
        started = time.monotonic()
        self.sh("stop", "-t", "45", f"worker-{build}")
        code = sh("docker", "inspect", "--format", "{{.State.ExitCode}}", container, show=False).stdout.strip()
        console.print(f"  worker-{build} stopped in {time.monotonic() - started:.1f} s, exit code {code}")

    def down(self) -> None:
        self.sh("down", "-v", "--remove-orphans", show=False, check=False)
        if self.stack is not None:
            self.stack.stop()


def cli(*args: str) -> None:
    """An ``s3batch`` command, shown with its output."""
    console.print(f"  [dim]$ s3batch {' '.join(args)}[/dim]")
    done = sh(str(Path(sys.executable).parent / "s3batch"), *args, env={**os.environ, "COLUMNS": "100"}, show=False)
    for line in (done.stdout + done.stderr).rstrip().splitlines():
        console.print(f"  {line}")


async def jobs(demo: Demo) -> None:
    s3 = boto3.client("s3") if demo.stack is None else stack_s3_client(demo.stack.config)  # compose: os.environ's
    for i in range(FILES):
        upload_chunks(s3, SOURCE_BUCKET, f"upgrade-demo/long/{i:02d}.csv", customers_csv(ROWS, seed=i))
        for copy in range(1, COPIES):
            source = {"Bucket": SOURCE_BUCKET, "Key": f"upgrade-demo/long/{i:02d}.csv"}
            s3.copy_object(Bucket=SOURCE_BUCKET, Key=f"upgrade-demo/long/{copy * FILES + i:02d}.csv", CopySource=source)
    for i in range(2):
        upload_chunks(s3, SOURCE_BUCKET, f"upgrade-demo/wide/{i:02d}.csv", customers_csv(ROWS, seed=100 + i))
    console.print(f"  {FILES * COPIES} + 2 files of {ROWS:,} rows under s3://{SOURCE_BUCKET}/upgrade-demo/")
    client = await connect()
    stamp = time.strftime("%H%M%S")
    console.rule("[bold]3. worker-v1 up, v1 current, two jobs on it")
    demo.up_worker("v1")
    cli("deploy", "promote", "v1", "--deployment-name", DEPLOYMENT)
    wide = await start(client, TASK_QUEUE, "wide", "upgrade-demo/wide/", stamp, concurrency=2)
    long = await start(client, TASK_QUEUE, "long", "upgrade-demo/long/", stamp, concurrency=1, files_per_run=4)
    console.rule("[bold]4. worker-v2 up beside it, v2 current, a new job")
    up = demo.up_worker("v2", healthy=False)  # promote waits until a v2 worker has polled
    cli("deploy", "promote", "v2", "--deployment-name", DEPLOYMENT)
    done = (await long.query("progress", result_type=dict))["files_succeeded"]
    console.print(f"  v2 current {time.monotonic() - up:.0f} s after `up`; long: {done} of {FILES * COPIES} files done")
    new = await start(client, TASK_QUEUE, "new", "upgrade-demo/wide/", stamp, concurrency=2)
    for handle in (wide, long, new):
        result = await handle.result()
        console.print(f"  {handle.id}: {result.status}, {result.totals.records_written:,} records")
        print_run_versions(await run_versions(client, handle.id))
    console.rule("[bold]5. v1 drained: worker-v1 stopped")
    while (await describe_deployment(client, DEPLOYMENT)).version("v1").running:  # type: ignore[union-attr]
        await asyncio.sleep(1)
    cli("deploy", "status", "--deployment-name", DEPLOYMENT)
    demo.stop_worker("v1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--infra", choices=["auto", "compose", "local"], default="auto",
                        help="where Temporal and S3 run (auto: compose where its images can be had, else local)")
    args = parser.parse_args(argv)
    begun = time.monotonic()
    console.rule("[bold]1. Engine, compose, worker image")
    started_engine = engine()
    compose = compose_command()
    version = sh(*compose, "version", show=False).stdout.splitlines()[0]
    console.print(f"  engine {os.environ['DOCKER_HOST']}, compose: {version}")
    demo: Demo | None = None
    with tempfile.TemporaryDirectory(prefix="s3batch-upgrade-compose-") as tmp:
        try:
            build_images()
            console.rule("[bold]2. Temporal and S3")
            env = compose_env()
            demo = Demo(choose_infra(args.infra, compose, env), compose, env, Path(tmp))
            demo.up_infra()
            asyncio.run(jobs(demo))
        finally:
            console.rule("[bold]6. Clean up")
            if demo is not None:
                demo.down()
            sh("docker", "rmi", "-f", *IMAGES.values(), show=False, check=False)
            if started_engine:
                sh("docker", "builder", "prune", "-af", show=False, check=False)
                sh("bash", str(CONTAINER / "engine.sh"), "stop", show=False, check=False)
            console.print(f"  make upgrade-demo-compose: {time.monotonic() - begun:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
