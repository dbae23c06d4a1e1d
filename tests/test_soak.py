"""The soak in CI (issue 34): about two minutes of jobs of every kind under combined faults (``make soak`` runs
ten by default), its books checked from first principles at the end. The seed comes from a fixed list, rotated by
day, so a failure is replayed with the seed it prints (``make soak SOAK_SEED=... SOAK_MINUTES=1.5``);
``S3BATCH_SOAK_CI_SEED`` picks one by hand. It runs alone in its xdist group (with the test of the checker), on a
stack of its own within its worker's ports, not traced by coverage (``tests.helpers.unmeasured``).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import unmeasured

ROOT = Path(__file__).resolve().parent.parent
SEEDS = (11, 23, 37, 41, 53, 67, 79, 83, 97, 101)
"""The CI seeds: one a day, in turn."""

pytestmark = [pytest.mark.servers, pytest.mark.slow, pytest.mark.xdist_group("soak")]


def ci_seed() -> int:
    chosen = os.environ.get("S3BATCH_SOAK_CI_SEED")
    return int(chosen) if chosen else SEEDS[datetime.date.today().toordinal() % len(SEEDS)]


@pytest.mark.timeout(720)
def test_two_minutes_of_jobs_under_combined_faults_keep_their_books(tmp_path: Path) -> None:
    seed = ci_seed()
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.soak", "--minutes", "1.5", "--seed", str(seed), "--jobs", "4",
         "--scale", "0.3", "--faults-per-minute", "14", "--drain-minutes", "5", "--root", str(tmp_path / "soak")],
        cwd=ROOT, env=unmeasured(), capture_output=True, text=True, timeout=700,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the soak of seed {seed} failed:\n{out[-12000:]}"
    summary = json.loads((tmp_path / "soak" / "summary.json").read_text())
    assert summary["violations"] == []
    assert summary["faults"] >= 10, summary["faults_by_kind"]
    assert summary["checked"]["records_written"] > 0
