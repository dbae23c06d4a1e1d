"""Issue 19 point 10, deploy hardening and supply chain: the containers of the s3batch image run with
a read-only root filesystem, no capabilities and no privilege gain; the worker refuses to start on
the example secrets; the Kubernetes example mounts no API token and limits egress to DNS, Temporal
and S3; the image's dependencies are locked with hashes, and the lock is what the tests run on."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from s3batch.worker import PLACEHOLDER_MARKS, placeholder_secrets

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
K8S = ROOT / "deploy" / "k8s" / "worker-deployment.yaml"
LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
DOCKERFILE = ROOT / "Dockerfile"


def compose_services() -> dict[str, Any]:
    return YAML(typ="safe").load(COMPOSE.read_text())["services"]


def example_env() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip().strip("'\"")
    return values


def image_health_file() -> str:
    match = re.search(r"S3BATCH_HEALTH_FILE=(\S+)", DOCKERFILE.read_text())
    assert match, "the image sets S3BATCH_HEALTH_FILE"
    return match.group(1)


def locked(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``{name: (version, [sha256 hashes])}`` of a pip-compile lock file; fails on an entry that is
    not pinned with ``==`` or has no hash."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)\s*$", line)
        assert match, f"{path.name}: not pinned with hashes: {line[:100]!r}"
        name = match.group(1).lower().replace("_", "-")
        entries[name] = (match.group(2), re.findall(r"sha256:([0-9a-f]{64})", match.group(3)))
    return entries


# ------------------------------------------------------------------------------ compose


def test_every_container_of_the_s3batch_image_is_read_only_without_capabilities() -> None:
    services = {name: s for name, s in compose_services().items() if "build" in s}
    assert {"worker", "create-buckets", "demo"} <= set(services)
    health_dir = str(Path(image_health_file()).parent)
    for name, service in services.items():
        assert service.get("read_only") is True, f"{name}: read_only"
        assert service.get("cap_drop") == ["ALL"], f"{name}: cap_drop"
        assert "no-new-privileges:true" in service.get("security_opt", []), f"{name}: no-new-privileges"
        # The one place the worker writes (its heartbeat file) is a small tmpfs.
        mounts = [str(t).split(":")[0] for t in service.get("tmpfs", [])]
        assert health_dir in mounts, f"{name}: tmpfs for {health_dir} (the health file)"
        assert all("size=" in str(t) for t in service["tmpfs"]), f"{name}: bounded tmpfs"
        assert not service.get("privileged"), name
        assert "cap_add" not in service, name


# ------------------------------------------------------------------------------ placeholder secrets


def test_placeholder_secrets_are_named_never_shown() -> None:
    assert placeholder_secrets({"AWS_SECRET_ACCESS_KEY": "change-me-s3-secret-key"}) == ["AWS_SECRET_ACCESS_KEY"]
    assert placeholder_secrets({"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "TEMPORAL_API_KEY": "ChangeMe"}) == [
        "AWS_ACCESS_KEY_ID",
        "TEMPORAL_API_KEY",
    ]
    assert placeholder_secrets({"AWS_SECRET_ACCESS_KEY": os.urandom(20).hex(), "S3_SECRET_KEY": "change-me"}) == []
    assert placeholder_secrets({}) == []


def test_every_example_secret_is_a_placeholder() -> None:
    # The example file's secrets are all recognisable, so a copy left unchanged cannot run.
    secrets = {k: v for k, v in example_env().items() if re.search(r"PASSWORD|SECRET", k)}
    assert secrets, ".env.example should hold example secrets"
    for name, value in secrets.items():
        assert any(mark in value.lower() for mark in PLACEHOLDER_MARKS), f"{name}={value!r} is not a placeholder"


def test_the_worker_refuses_to_start_with_the_example_secrets() -> None:
    """The compose worker's S3 secret comes from S3_SECRET_KEY: left as in .env.example, the worker
    exits at once with a line naming the variable, before it connects to anything."""
    worker = compose_services()["worker"]
    assert worker["environment"]["AWS_SECRET_ACCESS_KEY"].startswith("${S3_SECRET_KEY")
    example = example_env()["S3_SECRET_KEY"]
    env = {
        **os.environ,
        "AWS_SECRET_ACCESS_KEY": example,
        "TEMPORAL_ADDRESS": "127.0.0.1:9",  # never reached: the check comes first
        "PYTHONUNBUFFERED": "1",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "worker.py")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done
    assert "AWS_SECRET_ACCESS_KEY" in done.stderr and ".env" in done.stderr, done.stderr
    assert example not in done.stderr + done.stdout, "the secret's value was printed"
    assert "Traceback" not in done.stderr, done.stderr


# ------------------------------------------------------------------------------ Kubernetes


def k8s_documents() -> dict[str, Any]:
    return {doc["kind"]: doc for doc in YAML(typ="safe").load_all(K8S.read_text()) if doc}


def test_k8s_worker_mounts_no_api_token_and_may_reach_dns_temporal_and_s3_only() -> None:
    docs = k8s_documents()
    assert docs["ServiceAccount"]["automountServiceAccountToken"] is False
    pod = docs["Deployment"]["spec"]["template"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    container = pod["spec"]["containers"][0]["securityContext"]
    assert container["readOnlyRootFilesystem"] is True and container["allowPrivilegeEscalation"] is False

    policy = docs["NetworkPolicy"]["spec"]
    # Every build's pods (one Deployment per build ID): the policy selects them by name alone.
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert "app.kubernetes.io/version" not in policy["podSelector"]["matchLabels"]
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == [], "nothing connects to a worker"
    allowed = {(p["protocol"], p["port"]) for rule in policy["egress"] for p in rule["ports"]}
    assert allowed == {("UDP", 53), ("TCP", 53), ("TCP", 7233), ("TCP", 443)}
    assert all(rule.get("ports") for rule in policy["egress"]), "an egress rule without ports allows every port"
    [dns] = [r for r in policy["egress"] if {p["port"] for p in r["ports"]} == {53}]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    [https] = [r for r in policy["egress"] if {p["port"] for p in r["ports"]} == {443}]
    assert "169.254.169.254/32" in https["to"][0]["ipBlock"]["except"], "the instance metadata service"


# ------------------------------------------------------------------------------ locked dependencies


def test_the_runtime_lock_pins_every_dependency_with_hashes_as_pyproject_does() -> None:
    lock = locked(LOCK)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name, _, version = requirement.partition("==")
        assert version, f"pyproject.toml pins {requirement!r} exactly"
        assert lock[name.lower()][0] == version, f"{name}: lock {lock[name.lower()][0]} vs pyproject {version}"
    assert "temporalio" in lock and "botocore" in lock  # transitive ones too
    for text in (LOCK.read_text(), DEV_LOCK.read_text()):
        assert "file:" not in text and " @ " not in text, "no local paths or unhashed URLs"


def test_the_dev_lock_holds_the_runtime_lock_and_the_venv_runs_exactly_it() -> None:
    """The tests run on the versions the image installs: the venv matches both lock files."""
    runtime, dev = locked(LOCK), locked(DEV_LOCK)
    for name, (version, hashes) in runtime.items():
        assert dev[name] == (version, hashes), f"{name}: the two lock files differ"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["optional-dependencies"]["dev"] + project["optional-dependencies"]["stack"]:
        name, _, version = requirement.partition("==")
        if version:
            assert dev[name.lower()][0] == version, name
    mismatched = {}
    for name, (version, _) in dev.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            mismatched[name] = (version, installed)
    assert not mismatched, f"locked vs installed: {mismatched} (regenerate the locks, see docs/explanation/security.md)"


def test_the_lock_installs_with_require_hashes() -> None:
    """pip checks every artifact against the lock's hashes (a dry run: nothing is installed). Skipped
    only when the package index cannot be reached; a hash mismatch always fails."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--require-hashes", "--no-deps",
         "-r", str(LOCK)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    if done.returncode != 0:
        assert "DO NOT MATCH THE HASHES" not in done.stderr, done.stderr
        if re.search(r"connection|resolve|network|timed out|No matching distribution", done.stderr, re.I):
            pytest.skip(f"the package index cannot be reached: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr


def test_the_image_installs_the_lock_with_require_hashes() -> None:
    text = DOCKERFILE.read_text()
    assert "requirements.lock" in text and "--require-hashes" in text
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text()
