"""The previous s3batch release, built from git, for the upgrade tests and the history recorder
(``scripts/record_histories.py``). It needs a git checkout of s3batch (with its tags).

``build_release(ref)`` exports the commit ``ref`` names (``git archive``: no worktree to clean up)
and installs it, not editable, into a virtual environment of its own with ``python -m venv`` and
``pip install <dir>``; the release's pyproject pins every dependency. The result is cached outside the
checkout (:data:`CACHE`, one folder per commit and interpreter), so only the first run on a machine pays for
the install, not every fresh clone of CI.
``ReleaseWorker`` runs that release's ``worker.py`` as a real process against the local stack, as
``s3batch.dev.workers.WorkerProcess`` runs the current one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
"""The checkout this package lives in (an editable install of s3batch)."""

PREVIOUS_RELEASE = os.environ.get("S3BATCH_PREVIOUS_RELEASE", "v0.1.0")
"""The last release whose workers may still be running jobs when this code is deployed. Move it to
the new tag at each release."""

KNOWN_RELEASES = {"v0.1.0": "282dc19592fd6dcad109bcb583bcddba6092a3c5"}
"""Release tags and the commits they name, for a clone that has the history but not the tags (the tag is
used where it exists)."""

CACHE = Path(
    os.environ.get("S3BATCH_RELEASE_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "s3batch-releases"
)
"""Where built releases are kept (``S3BATCH_RELEASE_CACHE``, default ``~/.cache/s3batch-releases``): a release
is a commit, so its build never goes stale; it is keyed by the interpreter too (the venv links to it)."""


class ReleaseUnavailable(Exception):
    """git, or the release's tag, is not there (a source tarball, a shallow clone without tags)."""


@dataclass(frozen=True)
class Release:
    ref: str
    commit: str
    src: Path
    """The release's files, as committed."""
    python: Path
    """The interpreter of the release's own virtual environment."""
    build_seconds: float
    """Time this call took: the whole build the first time, a cache check afterwards."""

    @property
    def worker_py(self) -> Path:
        return self.src / "worker.py"


def resolve(ref: str) -> str:
    """The full commit hash ``ref`` names in this repository."""
    git = shutil.which("git")
    if git is None:
        raise ReleaseUnavailable("git is not installed: it is needed to build the previous release")
    inside = subprocess.run([git, "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True, check=False)
    if inside.returncode != 0:
        raise ReleaseUnavailable(f"{ROOT.name} is not a git checkout (a source archive?): no history to build from")
    for name in (ref, KNOWN_RELEASES.get(ref)):
        if name is None:
            continue
        result = subprocess.run(
            [git, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            return result.stdout.strip()
    raise ReleaseUnavailable(
        f"git knows no {ref!r} in {ROOT.name}: clone with tags (`git fetch --tags`) and full history, or set "
        "S3BATCH_PREVIOUS_RELEASE to the last release's tag or commit"
    )


def build_release(ref: str = PREVIOUS_RELEASE, *, cache: Path = CACHE) -> Release:
    """The release ``ref``, exported and installed in a virtual environment of its own (cached).

    Raises:
        ReleaseUnavailable: git or ``ref`` is missing.
        subprocess.CalledProcessError: the export or the install failed (a real failure).
    """
    started = time.monotonic()
    commit = resolve(ref)
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    interpreter = hashlib.sha256(str(base).encode()).hexdigest()[:8]
    home = cache / f"{commit[:12]}-py{'.'.join(map(str, sys.version_info[:3]))}-{interpreter}"
    done = home / "complete"
    home.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time per release (parallel test runs), and never a half-built one: a build that
    # was interrupted has no "complete" marker and is redone from scratch.
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done.exists() and (home / "venv" / "bin" / "python").resolve().exists()):
            shutil.rmtree(home, ignore_errors=True)
            src, venv = home / "src", home / "venv"
            src.mkdir(parents=True)
            _export(commit, src)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
            install = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(src)],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if install.returncode != 0:
                raise subprocess.CalledProcessError(
                    install.returncode, install.args, install.stdout, install.stderr[-4000:]
                )
            done.write_text(f"{ref} {commit}\n")
    return Release(
        ref=ref,
        commit=commit,
        src=home / "src",
        python=home / "venv" / "bin" / "python",
        build_seconds=time.monotonic() - started,
    )


def _export(commit: str, dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "release.tar"
        subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit], cwd=ROOT, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")


class ReleaseWorker(WorkerProcess):
    """The release's ``worker.py`` in a subprocess of the release's own Python, with the stack's
    environment (the current process's) and a log file.

    It imports the release as installed in its environment, never from its files: a release whose
    ``workflows/`` and ``activities/`` folders are installed as ``s3batch.workflows`` and
    ``s3batch.activities`` has a ``s3batch/`` folder without them, which would shadow the installed
    package if the script's folder came first on ``sys.path`` (``PYTHONSAFEPATH``). Its ``tests`` package
    alone is importable, from its files, so ``S3BATCH_HANDLER_MODULES=tests.slow_handlers`` loads that
    release's own test handlers, never the current ones.
    """

    what = "release worker"
    ready_timeout = 60

    def __init__(self, release: Release, task_queue: str, log_dir: Path, name: str, **env: str) -> None:
        self.release = release
        tests_only = release.src.parent / "tests-path"
        tests_only.mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made by another worker of the same release
            (tests_only / "tests").symlink_to(release.src / "tests", target_is_directory=True)
        super().__init__(
            task_queue,
            log_dir,
            name,
            python=release.python,
            script=release.worker_py,
            cwd=release.src,
            drop_env=("PYTHONPATH", "VIRTUAL_ENV"),
            env={"PYTHONSAFEPATH": "1", "PYTHONPATH": str(tests_only), **env},
        )

    def terminate(self, timeout: float = 60) -> int:
        return super().terminate(timeout)

    def stop(self, timeout: float = 10) -> None:
        # A release worker is not measured by coverage: no need to let it drain first.
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout)
