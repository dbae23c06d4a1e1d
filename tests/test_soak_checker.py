"""The soak's checker catches a broken guarantee (issue 34): a short soak on a deliberately broken build, whose
workers commit the part of chunk 1 of every file with its checkpoint but without its records
(``S3BATCH_SOAK_BREAK=empty-part``, read only by ``scripts/soak/handlers.py``), must fail, printing the seed, the
faults' timeline and the first record that breaks the books. Nothing in s3batch notices such a part (it exists,
of the file's version and options, and the file's counts come from its handler): only a check from first
principles does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import unmeasured

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.servers, pytest.mark.slow, pytest.mark.xdist_group("soak")]


def soak(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``python -m scripts.soak`` with ``args``, its folder under ``tmp_path``; its output and summary."""
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.soak", "--root", str(tmp_path / "soak"), *args],
        cwd=ROOT, env=unmeasured(**env), capture_output=True, text=True, timeout=600,
    )
    summary_file = tmp_path / "soak" / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return proc, summary


@pytest.mark.timeout(660)
def test_a_build_that_commits_a_part_without_its_records_fails_the_soak(tmp_path: Path) -> None:
    proc, summary = soak(
        tmp_path, "--minutes", "0.3", "--seed", "4242", "--faults-per-minute", "0", "--jobs", "2",
        "--kinds", "jsonl-gz,big-split", "--scale", "0.3", "--drain-minutes", "4",
        S3BATCH_SOAK_BREAK="empty-part",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-6000:]
    assert "BROKEN BUILD S3BATCH_SOAK_BREAK=empty-part" in out
    assert "FAILED: replay with  make soak SOAK_SEED=4242" in out
    assert "the faults' timeline" in out
    # The first violation names a record of chunk 1 of a file reported succeeded, missing from its output.
    first = re.search(r"first violation: (.*)", out)
    assert first, out[-6000:]
    assert re.search(r"\((succeeded|cancelled|failed) in soak-4242-\d+-[a-z-]+\)", first.group(1)), first.group(1)
    assert re.search(r"record soak-4242-\d+-[a-z-]+:[a-z0-9]+:v0:\d+ \(line \d+\)", first.group(1)) or \
        "the output holds" in first.group(1), first.group(1)
    assert summary["violations"] and summary["faults"] == 0
