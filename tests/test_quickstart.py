"""The README's Quick start, walked through as a newcomer would (issue 12): its commands, as written
in README.md, run one after the other in one shell (plain subprocesses: ``bash``), on a local stack of
their own (free ports, a fresh stack folder), with none of the test session's Temporal or S3 settings
in the environment: only what the README says to do points the commands at the stack.

``make test`` is left out (it is this suite), and the demo's job ID replaces the README's example ID.
Each ``make`` target gets ``-o .venv/.installed`` (the venv this test runs in is installed already:
the install step is not under test here, and may not reinstall it while other tests use it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from s3batch.dev.stack import StackConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ID = re.compile(r"demo-\d{8}-\d{6}")
SESSION_VARIABLES = ("TEMPORAL_", "AWS_", "S3BATCH_")
"""The test session points these at its own stack: a newcomer's shell has none of them."""


def quick_start_commands(readme: str) -> list[str]:
    """The ``$ `` commands of the Quick start section's console blocks, in order, comments dropped."""
    section = readme.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                command = re.sub(r"\s+#[^\"']*$", "", line[2:]).strip()
                if command != "make test":
                    commands.append(command)
    return commands


def walk(commands: list[str], tmp: Path) -> list[tuple[str, int, str]]:
    """Run ``commands`` in one bash session from the repository (the demo's job ID replaces the
    README's); each command's (text, exit code, output)."""
    config = StackConfig.random_ports(tmp / "stack")
    env = {k: v for k, v in os.environ.items() if not k.startswith(SESSION_VARIABLES)}
    venv_bin = Path(sys.executable).parent  # only the README's eval puts it on PATH
    env.update(
        PATH=os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != venv_bin),
        COLUMNS="100",
        S3BATCH_STACK_DIR=str(config.root),
        S3BATCH_TEMPORAL_PORT=str(config.temporal_port),
        S3BATCH_UI_PORT=str(config.ui_port),
        S3BATCH_S3_PORT=str(config.s3_port),
        S3BATCH_WEED_BASE_PORT=str(config.weed_base),
    )
    results: list[tuple[str, int, str]] = []
    script = []
    for n, command in enumerate(commands):
        if command.startswith("make "):
            command += " -o .venv/.installed"
        # The demo's job ID is known once the demo ran: a shell variable stands for it.
        command = EXAMPLE_ID.sub("$DEMO_ID", command)
        out = tmp / f"out-{n}.txt"
        script.append(f"{command} > {out} 2>&1; echo $? > {tmp / f'rc-{n}.txt'}")
        if n == 0:
            script.append(f"DEMO_ID=$(grep -o -m1 'demo-[0-9]\\{{8\\}}-[0-9]\\{{6\\}}' {out})")
    try:
        subprocess.run(["bash", "-c", "\n".join(script)], cwd=ROOT, env=env, timeout=600, check=False)
    finally:
        # Whatever happened, nothing of this stack is left running.
        subprocess.run([sys.executable, "-m", "s3batch.dev.stack_cli", "down", "--root", str(config.root)],
                       env=env, capture_output=True, timeout=120, check=False)  # fmt: skip
    for n, command in enumerate(commands):
        rc_file, out_file = tmp / f"rc-{n}.txt", tmp / f"out-{n}.txt"
        rc = int(rc_file.read_text()) if rc_file.exists() else -1
        results.append((command, rc, out_file.read_text() if out_file.exists() else ""))
    return results


@pytest.mark.servers  # starts servers or builds of its own
def test_the_quick_start_runs_as_written(tmp_path: Path):
    commands = quick_start_commands((ROOT / "README.md").read_text())
    assert commands[0] == "make demo" and commands[-1] == "make stack-down", commands
    assert any(c.startswith('eval "$(.venv/bin/s3batch-stack env)"') for c in commands), commands
    results = walk(commands, tmp_path)
    for command, rc, output in results:
        assert rc == 0, f"`{command}` exited {rc}:\n{output[-3000:]}"
        assert "Traceback" not in output, f"`{command}`:\n{output[-3000:]}"
    outputs = {command: output for command, _, output in results}
    demo = outputs["make demo"]
    assert "Job succeeded" in demo and "the stack and 2 workers keep running" in demo, demo[-3000:]
    job_id = EXAMPLE_ID.search(demo)
    assert job_id is not None, demo
    for command, _, output in results[1:]:
        if command.startswith("s3batch status"):
            assert f"{job_id[0]}: succeeded" in output, output
        elif command.startswith("s3batch report"):
            assert f"{job_id[0]}: succeeded" in output and "demo/customers/customers.csv" in output, output
        elif command.startswith("s3batch start"):
            assert "no worker" not in output and "Job succeeded" in output, output
        elif command == "make stack-down":
            assert all(f"stopped {name}" in output for name in ("worker-1", "worker-2", "temporal", "s3")), output
