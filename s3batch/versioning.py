"""Worker Versioning: which version of s3batch a worker is, as Temporal's Worker Deployments know it.

A versioned worker declares a deployment name and a build ID (a Worker Deployment Version). Each run
of a job is pinned to the version it started on: the server sends its workflow and activity tasks to
workers of that version only, so a run never meets code it did not start with. Its continue-as-new
successor starts on the deployment's current version (``ContinueAsNewVersioningBehavior.AUTO_UPGRADE``),
and a run that learns a newer version became current hands its files over to that successor at their
next chunk boundary (``s3batch.workflows.schedule.run_is_full``). Workers of two versions then run side
by side on one task queue: an upgrade is "start the new version, make it current, stop the old one once
it has drained", and a rollback is making the old version current again (``s3batch deploy``,
:mod:`s3batch.client.deployments`).

Versioning is off (the worker polls unversioned, as before) unless a deployment name or a build ID is
configured: ``S3BATCH_DEPLOYMENT_NAME`` / ``S3BATCH_BUILD_ID``, or ``TEMPORAL_DEPLOYMENT_NAME`` /
``TEMPORAL_WORKER_BUILD_ID`` (what the Temporal Worker Controller injects), or ``s3batch worker
--deployment-name/--build-id``. The name defaults to :data:`DEFAULT_DEPLOYMENT_NAME`, the build ID to
:func:`default_build_id`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from temporalio.common import WorkerDeploymentVersion

from s3batch import DEFAULT_DEPLOYMENT_NAME as DEFAULT_DEPLOYMENT_NAME  # re-exported: where it was
from s3batch import __version__

COMMIT_ENV = "S3BATCH_GIT_COMMIT"
"""The git commit the worker image was built from (the Dockerfile's ``GIT_COMMIT`` build argument)."""

MAX_LENGTH = 255
"""Longest deployment name or build ID the server takes."""

_CHECKOUT = Path(__file__).resolve().parent.parent


def default_build_id(environ: dict[str, str] | None = None) -> str:
    """The build ID of a worker that was given none: the package version and the git commit, such as
    ``0.1.0-1a2b3c4d5e6f``. The commit is the one baked into the image (:data:`COMMIT_ENV`), else that
    of the checkout this code runs from; without either, the version alone (two builds of one version
    then share a build ID: give ``S3BATCH_BUILD_ID`` explicitly)."""
    env = os.environ if environ is None else environ
    commit = env.get(COMMIT_ENV, "").strip() or _checkout_commit()
    commit = re.sub(r"[^0-9A-Za-z]", "", commit)[:12]
    return f"{__version__}-{commit}" if commit else __version__


def _checkout_commit() -> str:
    git = shutil.which("git")
    if git is None or not (_CHECKOUT / ".git").exists():
        return ""
    try:
        done = subprocess.run(
            [git, "rev-parse", "HEAD"], cwd=_CHECKOUT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def worker_version(deployment_name: str, build_id: str) -> WorkerDeploymentVersion | None:
    """The version a worker declares: None (versioning off) when neither is given; else the deployment
    name (default :data:`DEFAULT_DEPLOYMENT_NAME`) and the build ID (default :func:`default_build_id`).

    Raises:
        ValueError: The deployment name holds a dot, or either is too long.
    """
    name, build = deployment_name.strip(), build_id.strip()
    if not name and not build:
        return None
    version = WorkerDeploymentVersion(name or DEFAULT_DEPLOYMENT_NAME, build or default_build_id())
    check_version(version)
    return version


def check_version(version: WorkerDeploymentVersion) -> None:
    """Raises ValueError, saying what to change, when the server would refuse ``version``."""
    if "." in version.deployment_name:
        raise ValueError(
            f"deployment name {version.deployment_name!r} contains a dot, which Temporal does not allow: "
            "use another separator, such as '-'"
        )
    for what, value in (("deployment name", version.deployment_name), ("build ID", version.build_id)):
        if len(value) > MAX_LENGTH:
            raise ValueError(f"the {what} is {len(value)} characters long: at most {MAX_LENGTH}")


def describe(version: WorkerDeploymentVersion | None) -> str:
    """How a worker's log names its version."""
    if version is None:
        return "unversioned (no deployment name or build ID: Worker Versioning off)"
    return f"deployment {version.deployment_name!r} build {version.build_id!r}"
