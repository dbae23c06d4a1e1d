"""The tutorials of the documentation site, run as written (issue 33): each page's commands in one shell, its
Python blocks, its files, its workers in the background, on the test session's stack, as a reader would on
theirs; the output a page shows must be in what its step printed. How a page becomes steps, and how a block
is marked as not run or run in the background: ``tests/helpers/tutorials.py``.

The shell starts as a reader's does, with none of the session's Temporal, AWS or s3batch variables: only
what the page says (``eval "$(.venv/bin/s3batch-stack env)"``) points it at the stack. Its folder is a fresh
one whose ``.venv`` is this suite's virtual environment, and ``s3batch-stack`` finds the session's stack
through the state file ``make stack-up`` writes (``S3BATCH_STACK_DIR``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from s3batch.dev.postgres import server_bindir
from s3batch.dev.stack import Stack
from tests.helpers.tutorials import Page, missing_lines, parse, script

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "docs" / "tutorials"
PAGES = ["first-job.md", "own-handler.md", "child-workflow.md", "postgres.md", "deploy.md"]
SESSION_VARIABLES = ("TEMPORAL_", "AWS_", "S3BATCH_")
"""The test session points these at its own stack: a reader's shell has none of them."""


def test_every_tutorial_is_run() -> None:
    pages = sorted(p.name for p in TUTORIALS.glob("*.md") if p.name != "index.md")
    assert pages == sorted(PAGES), "a tutorial page no test runs"


def test_a_page_becomes_its_steps() -> None:
    page = parse(
        "<!-- test: skip (a server) -->\n```console\n$ make stack-up\nstarted\n```\n\n"
        "```console\n$ s3batch start --bucket b \\\n      --wait\nJob succeeded\n```\n"
        '```python title="pkg/mod.py"\nX = 1\n```\n```python\nprint(2)\n```\n\nIt prints:\n\n```text\n2\n```\n'
        "<!-- test: background -->\n```console\n$ s3batch-worker\n```\n"
        "<!-- test: not compared -->\n```text\nanything\n```\n"
    )
    assert page.skipped == 1
    assert [(s.kind, s.text.strip(), s.path, s.expected) for s in page.steps] == [
        ("run", "s3batch start --bucket b --wait", "", ["Job succeeded"]),
        ("file", "X = 1", "pkg/mod.py", []),
        ("python", "print(2)", "", ["2"]),
        ("background", "s3batch-worker", "", []),
    ]
    assert missing_lines(["Job  succeeded", "files 2"], "...\nJob succeeded\n  files    2 done") == []


def _stack_state(stack: Stack) -> Path:
    """A stack folder whose state file describes the session's stack, as ``make stack-up`` writes it. Outside
    pytest's own folders (readable by root only): run as root, ``s3batch-stack postgres up`` puts its data here
    for the ``postgres`` user."""
    config = asdict(stack.config)
    config["root"] = str(stack.config.root)
    folder = Path(tempfile.mkdtemp(prefix="s3batch-tutorial-"))
    folder.chmod(0o755)
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    (folder / "stack.json").write_text(json.dumps({"config": config, "pids": pids}))
    return folder


def _stop(pids: Path) -> None:
    """Stop the page's background processes (SIGTERM to each session, then SIGKILL after a drain's time)."""
    started = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    for pid in started:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 40
    for pid in started:
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def run_page(page: Page, stack: Stack, tmp: Path) -> list[tuple[int, str]]:
    """Run ``page`` in a fresh folder against the session's stack; each step's (exit code, output)."""
    home, out = tmp / "project", tmp / "out"
    home.mkdir()
    out.mkdir()
    (home / ".venv").symlink_to(Path(sys.executable).parent.parent)
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(SESSION_VARIABLES)}
    stack_dir = _stack_state(stack)
    env.update(
        PATH=os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != venv_bin),
        COLUMNS="100",
        S3BATCH_STACK_DIR=str(stack_dir),
    )
    try:
        subprocess.run(["bash", "-c", script(page, out)], cwd=home, env=env, timeout=240, check=False)
    finally:
        _stop(out / "pids")
        # A page that started the local PostgreSQL and failed before its `postgres down` leaves nothing running.
        if (stack_dir / "postgres").exists():
            subprocess.run([str(venv_bin / "s3batch-stack"), "postgres", "down"], env=env, capture_output=True,
                           timeout=120, check=False)  # fmt: skip
        shutil.rmtree(stack_dir, ignore_errors=True)
    results = []
    for n in range(len(page.steps)):
        rc, log = out / f"{n}.rc", out / f"{n}.txt"
        results.append((int(rc.read_text()) if rc.exists() else -1, log.read_text() if log.exists() else ""))
    return results


@pytest.mark.servers
@pytest.mark.parametrize("name", PAGES)
def test_the_tutorial_runs_as_written(name: str, stack: Stack, tmp_path: Path) -> None:
    if name == "postgres.md" and server_bindir() is None:
        pytest.skip("PostgreSQL's server binaries are not installed (Debian/Ubuntu: apt-get install postgresql)")
    page = parse((TUTORIALS / name).read_text())
    assert page.steps and page.skipped <= 3, "a tutorial is run, all but a few blocks"
    results = run_page(page, stack, tmp_path)
    for step, (rc, output) in zip(page.steps, results, strict=True):
        where = f"{name} line {step.line}: `{step.text.strip()[:200]}`"
        assert rc != -1, f"{where}: not reached"
        assert rc == step.exits, f"{where} exited {rc}, not {step.exits}:\n{output[-3000:]}"
        if step.kind != "background":  # a worker's log may hold the SDK's traceback of a file the page makes fail
            assert "Traceback" not in output, f"{where}:\n{output[-3000:]}"
        missing = missing_lines(step.expected, output)
        assert not missing, f"{where}: the page shows {missing}, the step printed:\n{output[-3000:]}"
