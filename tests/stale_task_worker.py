"""A worker for workflow tasks only, with one poll and no cache, for ``tests/test_stale_workflow_task.py``: frozen
(SIGSTOP) while its one poll waits at the server, it is handed the next workflow task and holds it, unanswered,
until it is thawed. It answers nothing else: no activity poll (``no_remote_activities``), no sticky queue.

Run as ``python tests/stale_task_worker.py`` with the worker's environment (``S3BATCH_TASK_QUEUE``, Temporal's and
S3's variables); it logs ``worker polling`` when it polls, and runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal

from temporalio.worker import PollerBehaviorSimpleMaximum, Worker

from s3batch.config import Settings, connect
from s3batch.plugin import S3BatchPlugin


async def main() -> None:
    settings = Settings()
    plugin = S3BatchPlugin.from_settings(settings)
    client = await connect([plugin])
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        no_remote_activities=True,
        max_cached_workflows=0,
        workflow_task_poller_behavior=PollerBehaviorSimpleMaximum(1),
    )
    async with worker:
        print("worker polling (workflow tasks only, one poll)", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
