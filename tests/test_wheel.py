"""What gets installed is one namespace: the wheel holds ``s3batch/`` alone, and ``S3BatchPlugin``
works in a Temporal project laid out as Temporal's samples teach, with its own ``workflows/``,
``activities/`` and ``worker.py`` (before, that project's ``workflows`` package shadowed ours and
``s3batch.plugin`` failed at import)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

import s3batch
from s3batch.dev.stack import Stack
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.output import read_jsonl

ROOT = Path(__file__).resolve().parent.parent

PROJECT = {
    "workflows/__init__.py": "",
    "workflows/hello.py": '''
        from datetime import timedelta

        from temporalio import workflow

        with workflow.unsafe.imports_passed_through():
            from activities.greet import greet


        @workflow.defn
        class Hello:
            @workflow.run
            async def run(self, name: str) -> str:
                return await workflow.execute_activity(greet, name, start_to_close_timeout=timedelta(seconds=30))
    ''',
    "activities/__init__.py": "",
    "activities/greet.py": '''
        from temporalio import activity


        @activity.defn
        async def greet(name: str) -> str:
            return f"hello {name}"
    ''',
    "worker.py": '''
        """The project's own worker: its workflow and activity, plus s3batch through the plugin."""
        import asyncio
        import os
        import signal

        from temporalio.client import Client
        from temporalio.worker import Worker

        from activities.greet import greet
        from s3batch import S3BatchPlugin
        from workflows.hello import Hello


        async def main() -> None:
            client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[S3BatchPlugin()])
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            queue = os.environ["PROJECT_TASK_QUEUE"]
            async with Worker(client, task_queue=queue, workflows=[Hello], activities=[greet]):
                print("project worker polling", flush=True)
                await stop.wait()


        asyncio.run(main())
    ''',
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    [built] = out.glob("s3batch-*.whl")
    return built


@pytest.mark.servers  # starts servers or builds of its own
def test_the_wheel_holds_the_s3batch_namespace_alone(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"s3batch", f"s3batch-{s3batch.__version__}.dist-info"}
    for module in ("s3batch/workflows/batch.py", "s3batch/activities/s3_activities.py", "s3batch/worker.py"):
        assert module in names, module
    entry_points = zipfile.ZipFile(wheel).read(f"s3batch-{s3batch.__version__}.dist-info/entry_points.txt").decode()
    assert "s3batch-worker = s3batch.worker:main" in entry_points


@pytest.mark.slow
async def test_the_plugin_runs_in_a_project_with_its_own_workflows_package(
    wheel: Path, tmp_path: Path, stack: Stack, client: Client, s3: Any, buckets: tuple[str, str]
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=600)
    project = tmp_path / "project"
    for name, text in PROJECT.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(textwrap.dedent(text).lstrip())
    check = subprocess.run(
        [str(python), "-c", "import s3batch, workflows; print(s3batch.S3BatchPlugin.__module__, workflows.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert check.stdout.split() == ["s3batch.plugin", str(project / "workflows" / "__init__.py")], check.stdout

    task_queue = f"project-{uuid.uuid4().hex[:8]}"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("COVERAGE", "PYTHON", "VIRTUAL_ENV")) and key != "S3BATCH_HANDLER_MODULES"
    }
    log = tmp_path / "project-worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(python), "worker.py"],
            cwd=project,
            env={**env, "PROJECT_TASK_QUEUE": task_queue},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        await wait_for(
            lambda: "project worker polling" in log.read_text() or proc.poll() is not None,
            60,
            "the project's worker to poll",
        )
        assert proc.poll() is None, log.read_text()
        greeting = await client.execute_workflow("Hello", "s3batch", id=f"hello-{task_queue}", task_queue=task_queue)
        assert greeting == "hello s3batch"

        src, out_bucket = buckets
        s3.put_object(Bucket=src, Key="in/a.jsonl", Body=b'{"n": 1}\n{"n": 2}\n')
        result = await client.execute_workflow(
            "S3BatchWorkflow",
            S3BatchInput(bucket=src, output_bucket=out_bucket, output_prefix="o/"),
            id=f"job-{task_queue}",
            task_queue=task_queue,
            result_type=S3BatchResult,
        )
        assert result.status == "succeeded" and result.totals.records_written == 2
        assert read_jsonl(s3, out_bucket, "o/in/a.jsonl/") == [{"n": 1}, {"n": 2}]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
