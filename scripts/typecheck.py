"""Type-check the installed namespace ``s3batch`` as it is installed.

The repository keeps the prescribed top-level ``workflows/`` and ``activities/`` folders, which
install as ``s3batch.workflows`` and ``s3batch.activities`` (setuptools ``package-dir``). Type
checkers know nothing of that mapping, so this script lays the namespace out as the wheel does,
with symbolic links into the working tree (``.stack/typecheck/s3batch``), runs mypy over it and
prints every path as the file you edit (``workflows/batch.py``, not the link).

    python scripts/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".stack" / "typecheck"
# Where each part of the installed namespace lives in the repository (as in pyproject.toml).
MAPPING = {"s3batch": "s3batch", "s3batch/workflows": "workflows", "s3batch/activities": "activities"}


def link_tree() -> None:
    shutil.rmtree(TREE, ignore_errors=True)
    for installed, source in MAPPING.items():
        for path in (ROOT / source).rglob("*.py"):
            target = TREE / installed / path.relative_to(ROOT / source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    (TREE / "s3batch" / "py.typed").touch()


def main(argv: list[str]) -> int:
    link_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "s3batch", *argv]
    done = subprocess.run(cmd, cwd=TREE, capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(TREE)})
    # Longest mapping first, so s3batch/workflows/ maps to workflows/ rather than staying s3batch/.
    pattern = re.compile(r"^(" + "|".join(sorted(map(re.escape, MAPPING), key=len, reverse=True)) + r")/", re.M)
    out = pattern.sub(lambda m: MAPPING[m.group(1)] + "/", done.stdout)
    sys.stdout.write(out)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
