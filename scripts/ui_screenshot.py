"""Drive headless Chromium (Debian's ``chromium``, through Playwright; no browser download) to the
Temporal Web UI page of a running s3batch job: save screenshots and return the page text.

    .venv/bin/python scripts/ui_screenshot.py        # own stack + slow job -> docs/images/ui-*.png

The test ``tests/test_web_ui.py`` uses :func:`capture` against the test stack.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ARGS = [
    # As root in a sandbox with a closed network: no sandbox, no background connections.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    """Path of a Chromium binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def capture(
    ui_url: str, workflow_id: str, run_id: str, key: str, out_dir: Path | None = None, timeout: float = 60
) -> dict[str, str]:
    """Open the job's workflow page (timeline) and its user-metadata page (static summary and
    current details), wait until the file ``key`` and the progress text are shown, and return the
    text of each page (the details are rendered in iframes: their markdown is read from the iframe
    ``src``). With ``out_dir``, saves ``ui-timeline.png`` and ``ui-details.png`` there."""
    from playwright.sync_api import sync_playwright

    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium not found: install Debian's chromium package")
    base = f"{ui_url}/namespaces/default/workflows/{urllib.parse.quote(workflow_id)}/{run_id}"
    texts: dict[str, str] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, args=_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/timeline")
            page.get_by_text(key).first.wait_for(timeout=timeout * 1000)
            if out_dir:
                page.screenshot(path=out_dir / "ui-timeline.png")
            texts["timeline"] = page.inner_text("body")

            page.goto(f"{base}/user-metadata")
            frames = page.locator("iframe[title=output]")
            deadline = time.monotonic() + timeout
            while True:
                sources = [
                    urllib.parse.unquote(frames.nth(i).get_attribute("src") or "") for i in range(frames.count())
                ]
                if any("records:" in src for src in sources) or time.monotonic() > deadline:
                    break
                page.wait_for_timeout(250)
            page.wait_for_timeout(500)  # let the iframes paint before the screenshot
            if out_dir:
                page.screenshot(path=out_dir / "ui-details.png")
            texts["details"] = page.inner_text("body") + "\n" + "\n".join(sources)
        finally:
            browser.close()
    return texts


async def _main() -> None:
    sys.path.insert(0, str(ROOT))
    from s3batch.workflows.batch import S3BatchWorkflow
    from temporalio.client import Client

    from s3batch.dev.stack import Stack, StackConfig, ensure_buckets, s3_client
    from s3batch.dev.workers import WorkerProcess
    from s3batch.models import S3BatchInput
    from s3batch.plugin import S3BatchPlugin

    out_dir = ROOT / "docs" / "images"
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(StackConfig.random_ports(Path(tmp)))
        stack.start()
        os.environ.update(stack.config.env())
        worker = None
        try:
            s3 = s3_client(stack.config)
            ensure_buckets(s3, "incoming", "processed")
            rows = "".join(f"{i},customer-{i}@example.com,Name {i}\n" for i in range(60_000))
            s3.put_object(Bucket="incoming", Key="customers/2026-11-30.csv", Body=f"id,email,name\n{rows}".encode())
            worker = WorkerProcess(
                "s3-batch",
                Path(tmp),
                "ui",
                cwd=ROOT,
                env={"S3BATCH_HANDLER_MODULES": "tests.slow_handlers", "S3BATCH_TEST_HANDLER_DELAY": "3.0"},
            )
            worker.wait_ready()
            client = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin()])
            job_id = f"import-{uuid.uuid4().hex[:6]}"
            handle = await client.start_workflow(
                S3BatchWorkflow.run,
                S3BatchInput(
                    bucket="incoming",
                    prefix="customers/",
                    output_bucket="processed",
                    output_prefix="runs/1/",
                    handler="slow_passthrough",
                    chunk_records=2_000,
                    heartbeat_timeout_seconds=5,
                ),
                id=job_id,
                task_queue="s3-batch",
                static_summary="s3://incoming/customers/ -> s3://processed/runs/1/",
            )
            await asyncio.sleep(8)  # let a few chunks commit and a heartbeat reach the server
            key = "customers/2026-11-30.csv"
            run_id = handle.result_run_id or ""
            pages = await asyncio.to_thread(capture, stack.config.ui_url, job_id, run_id, key, out_dir)
            print({name: len(text) for name, text in pages.items()})
            await handle.cancel()
        finally:
            if worker:
                worker.stop()
            stack.stop()


if __name__ == "__main__":
    asyncio.run(_main())
