"""The compose form of the upgrade (``make upgrade-demo-compose``, issue 32), checked without Docker: worker-v1
and worker-v2 of docker-compose.yml are the worker service, one replica each, of one Worker Deployment under
two build IDs, kept out of a plain ``docker compose up`` (profile ``upgrade``); the published ports move with
variables (the demo runs a stack of its own beside the default one); the override for engines without a
registry puts both on the host network and validates; the script names the same services and images as the
compose file and docs/how-to/upgrade.md. The demo itself runs on a Docker engine (minutes: image builds), not here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
LOCAL = ROOT / "deploy" / "compose" / "upgrade-local.yml"
SCRIPT = ROOT / "scripts" / "upgrade_demo_compose.py"
BUILDS = ("v1", "v2")


def services(path: Path = COMPOSE) -> dict[str, Any]:
    return YAML(typ="safe").load(path.read_text())["services"]


def test_two_builds_of_one_deployment_beside_the_worker_service() -> None:
    all_ = services()
    worker = all_["worker"]
    names = set()
    for build in BUILDS:
        service = all_[f"worker-{build}"]
        assert service["profiles"] == ["upgrade"], "a plain `docker compose up` must not start it"
        env = service["environment"]
        names.add(env["S3BATCH_DEPLOYMENT_NAME"])
        assert env["S3BATCH_BUILD_ID"] == f"${{S3BATCH_{build.upper()}_BUILD_ID-{build}}}", env
        # The worker service's environment, hardening, health check, drain and dependencies, one replica.
        assert {k: v for k, v in env.items() if not k.startswith("S3BATCH_DEPLOYMENT")
                and k != "S3BATCH_BUILD_ID"} == worker["environment"]  # fmt: skip
        for key in ("read_only", "cap_drop", "security_opt", "tmpfs", "healthcheck", "stop_grace_period",
                    "depends_on", "stop_signal"):  # fmt: skip
            assert service[key] == worker[key], (build, key)
        assert service["deploy"]["replicas"] == 1
        assert service["build"]["args"] == {"GIT_COMMIT": "${GIT_COMMIT:-}"}
        assert service["image"] == f"s3batch-worker:0.1.0-{build}"
    assert names == {"${S3BATCH_DEPLOYMENT_NAME:-s3batch}"}
    assert "S3BATCH_DEPLOYMENT_NAME" not in worker["environment"], "the plain worker stays unversioned"


def test_published_ports_move_with_variables() -> None:
    ports = {name: s.get("ports", []) for name, s in services().items() if s.get("ports")}
    assert ports == {
        "temporal": ["127.0.0.1:${TEMPORAL_PORT:-7233}:7233"],
        "temporal-ui": ["127.0.0.1:${TEMPORAL_UI_PORT:-8080}:8080"],
        "seaweedfs": ["127.0.0.1:${S3_PORT:-8333}:8333"],
    }


def test_the_override_for_an_engine_without_a_registry() -> None:
    local = services(LOCAL)
    assert set(local) == {f"worker-{b}" for b in BUILDS}
    for service in local.values():
        assert service["network_mode"] == "host"
        assert set(service["environment"]) == {"TEMPORAL_ADDRESS", "AWS_ENDPOINT_URL_S3"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(LOCAL)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_script_the_make_target_and_the_readme_name_the_same_services() -> None:
    script = SCRIPT.read_text()
    for build in BUILDS:
        assert f'"{build}": "s3batch-worker:0.1.0-{build}"' in script
    assert "deploy/compose/upgrade-local.yml" in script and '"docker-compose.yml"' in script
    makefile = (ROOT / "Makefile").read_text()
    assert "upgrade-demo-compose: $(STAMP)\n\t$(BIN)/python scripts/upgrade_demo_compose.py" in makefile
    test_target = re.search(r"^test: (.*)$", makefile, re.M)
    assert test_target and "upgrade" not in test_target.group(1), "not part of make test"
    page = (ROOT / "docs" / "how-to" / "upgrade.md").read_text()
    assert "make upgrade-demo-compose" in page
    for name in ("worker-v1", "worker-v2"):
        assert name in page, name
