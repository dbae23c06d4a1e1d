"""Worker Versioning from the client side: the versions of a Worker Deployment, and moving new work
between them (``s3batch deploy status|promote|rollback``).

Thin over Temporal's Worker Deployment API (the workflow service's ``DescribeWorkerDeployment``,
``SetWorkerDeploymentCurrentVersion``, ``SetWorkerDeploymentRampingVersion``), which the ``temporal
worker deployment`` commands call too. The current version takes every new job and every continue-as-new
successor; a ramping version a share of them; a version that is neither keeps the runs pinned to it until
they end (draining), then is drained: its workers may stop. See :mod:`s3batch.versioning`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.deployment.v1 import WorkerDeploymentInfo
from temporalio.api.enums.v1 import VersioningBehavior, WorkerDeploymentVersionStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from s3batch.client.errors import ClientError, InvalidRequest, WrongJobState

PROMOTE_WAIT_SECONDS = 60.0
"""How long ``promote`` retries while the server does not know the version yet: it does once a
worker of that build has polled, a few seconds after it starts."""

MAX_RUNS_SHOWN = 100
"""``run_versions`` describes each run: the last this many of a longer job."""

_NOT_YET = (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION)

_STATUS = {
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_INACTIVE: "inactive",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT: "current",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_RAMPING: "ramping",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINING: "draining",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINED: "drained",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CREATED: "created",
}


class DeploymentNotFound(ClientError):
    """No worker of this deployment (or of this build of it) has polled yet."""


@dataclass(frozen=True)
class VersionView:
    """One version (build) of a Worker Deployment."""

    build_id: str
    status: str
    """``current``, ``ramping``, ``draining`` (runs are still pinned to it: keep its workers), ``drained``
    (none: its workers may stop), ``inactive`` (never current), or ``created``."""
    running: int | None
    """Runs of jobs pinned to this version and still running (None: the server's visibility cannot say)."""
    created: datetime | None
    last_current: datetime | None
    """When it was last the current version (the latest such one is where ``rollback`` goes back to)."""


@dataclass(frozen=True)
class DeploymentView:
    """A Worker Deployment: which build is current, which ramps, and each version's state."""

    name: str
    current: str | None
    """Build ID of the current version; None: unversioned workers take new jobs."""
    ramping: str | None
    ramp_percentage: float
    versions: list[VersionView]

    def version(self, build_id: str) -> VersionView | None:
        return next((v for v in self.versions if v.build_id == build_id), None)


def _time(stamp: Timestamp, present: bool) -> datetime | None:
    return stamp.ToDatetime().astimezone() if present and stamp.seconds else None


async def describe_deployment(client: Client, name: str) -> DeploymentView:
    """The deployment ``name`` as the server sees it, with the running runs of each version.

    Raises:
        DeploymentNotFound: No worker of the deployment has polled yet.
    """
    try:
        response = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=name)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise DeploymentNotFound(
                f"no worker deployment {name!r} in namespace {client.namespace}: no worker started with "
                f"--deployment-name {name} (S3BATCH_DEPLOYMENT_NAME) has polled yet"
            ) from None
        raise
    return await _view(client, response.worker_deployment_info)


async def _view(client: Client, info: WorkerDeploymentInfo) -> DeploymentView:
    routing = info.routing_config
    versions = []
    for summary in info.version_summaries:
        build = summary.deployment_version.build_id
        versions.append(
            VersionView(
                build_id=build,
                status=_STATUS.get(summary.status, "unknown"),
                running=await running_runs(client, info.name, build),
                created=_time(summary.create_time, summary.HasField("create_time")),
                last_current=_time(summary.last_current_time, summary.HasField("last_current_time")),
            )
        )
    versions.sort(key=lambda v: v.created.timestamp() if v.created else 0.0)
    current = routing.current_deployment_version.build_id or None
    ramping = routing.ramping_deployment_version.build_id or None
    return DeploymentView(info.name, current, ramping, routing.ramping_version_percentage, versions)


async def running_runs(client: Client, deployment: str, build_id: str) -> int | None:
    """Runs still running on the version (the server's ``TemporalWorkerDeploymentVersion`` search
    attribute); None when the namespace's visibility cannot answer the query."""
    query = f"TemporalWorkerDeploymentVersion = '{deployment}:{build_id}' AND ExecutionStatus = 'Running'"
    try:
        return (await client.count_workflows(query)).count
    except RPCError:
        return None


async def promote(
    client: Client, name: str, build_id: str, ramp: float | None = None, wait: float = PROMOTE_WAIT_SECONDS
) -> DeploymentView:
    """Make ``build_id`` the current version of deployment ``name`` (new jobs and every continue-as-new
    successor start on it; runs pinned to other versions finish there), or, with ``ramp`` (0-100), the
    ramping version taking that share of them. Retries for ``wait`` seconds while no worker of the build
    has polled yet.

    Raises:
        InvalidRequest: ``ramp`` is out of range.
        DeploymentNotFound: No worker of the build polled within ``wait`` seconds.
    """
    if ramp is not None and not 0 <= ramp <= 100:
        raise InvalidRequest(f"--ramp must be a percentage from 0 to 100, got {ramp:g}")
    identity = client.identity
    if ramp is None:
        request: object = SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace, deployment_name=name, build_id=build_id, identity=identity
        )
        call = client.workflow_service.set_worker_deployment_current_version
    else:
        request = SetWorkerDeploymentRampingVersionRequest(
            namespace=client.namespace, deployment_name=name, build_id=build_id, percentage=ramp, identity=identity
        )
        call = client.workflow_service.set_worker_deployment_ramping_version  # type: ignore[assignment]
    deadline = time.monotonic() + wait
    while True:
        try:
            await call(request)  # type: ignore[arg-type]
            return await describe_deployment(client, name)
        except RPCError as err:
            if err.status not in _NOT_YET:
                raise
            if time.monotonic() >= deadline:
                role = "current" if ramp is None else "ramping"
                raise DeploymentNotFound(
                    f"build {build_id!r} of deployment {name!r} cannot be made {role} ({err.message}): "
                    f"start its workers first (s3batch worker --deployment-name {name} "
                    f"--build-id {build_id}) and wait until they poll"
                ) from None
        await asyncio.sleep(0.5)


async def rollback(client: Client, name: str, wait: float = PROMOTE_WAIT_SECONDS) -> tuple[str, DeploymentView]:
    """Undo the last promotion: stop a ramp in progress (the current version takes all new work again),
    or else make the version that was current before the current one current again. Returns what was
    done, in words, and the deployment after it.

    Raises:
        DeploymentNotFound: No such deployment.
        WrongJobState: Nothing to go back to (no ramp, and no version was current before).
    """
    view = await describe_deployment(client, name)
    if view.ramping is not None:
        await client.workflow_service.set_worker_deployment_ramping_version(
            SetWorkerDeploymentRampingVersionRequest(
                namespace=client.namespace, deployment_name=name, build_id="", percentage=0, identity=client.identity
            )
        )
        return f"stopped the ramp of {view.ramping}: {view.current or 'unversioned workers'} takes all new work", (
            await describe_deployment(client, name)
        )
    earlier = [v for v in view.versions if v.build_id != view.current and v.last_current is not None]
    if not earlier:
        raise WrongJobState(
            f"deployment {name!r} has no version that was current before {view.current!r}: nothing to roll back to"
        )
    previous = max(earlier, key=lambda v: v.last_current or datetime.min.astimezone())
    after = await promote(client, name, previous.build_id, wait=wait)
    return f"made {previous.build_id} current again (was {view.current})", after


@dataclass(frozen=True)
class RunVersion:
    """The worker version one run of a job ran on."""

    run: int
    """0 for the job's first run, then one more for each continue-as-new."""
    run_id: str
    version: str | None
    """``deployment:build``; None: unversioned workers ran it."""
    behavior: str
    """``pinned``, ``auto_upgrade``, or empty (unversioned)."""


_BEHAVIOR = {VersioningBehavior.VERSIONING_BEHAVIOR_PINNED: "pinned",
             VersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE: "auto_upgrade"}


async def run_versions(client: Client, workflow_id: str, limit: int = MAX_RUNS_SHOWN) -> list[RunVersion]:
    """The version each run of a job ran on, first run first (the last ``limit`` runs of a longer job)."""
    runs = sorted([r async for r in client.list_workflows(f"WorkflowId = '{workflow_id}'")], key=lambda r: r.start_time)
    found = []
    for index, run in list(enumerate(runs))[-limit:]:
        desc = await client.get_workflow_handle(workflow_id, run_id=run.run_id).describe()
        info = desc.raw_description.workflow_execution_info.versioning_info
        v = info.deployment_version
        found.append(RunVersion(index, run.run_id, f"{v.deployment_name}:{v.build_id}" if v.build_id else None,
                                _BEHAVIOR.get(info.behavior, "")))
    return found
