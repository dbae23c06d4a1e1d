"""Issue 33: a local PostgreSQL in one command, ``s3batch-stack postgres up``: PostgreSQL 15 on 127.0.0.1 with
its data in the stack's folder, the DSN and the variable to export printed (every other line a shell comment, so
``eval "$(s3batch-stack postgres up)"`` works), given to the workers the stack starts, stopped by ``down``."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from s3batch.dev.postgres import server_bindir
from s3batch.dev.stack import free_port_block
from tests.helpers import BIN

pytestmark = pytest.mark.servers


def stack(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "s3batch-stack"), *argv, "--root", str(root)], capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )  # fmt: skip


@pytest.fixture
def root() -> Iterator[Path]:
    """A stack folder (as root, the server runs as the postgres user: pytest's tmp_path is closed to it)."""
    if server_bindir() is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: pg_config --bindir, /usr/lib/postgresql")
    folder = Path(tempfile.mkdtemp(prefix="s3batch-stack-"))
    folder.chmod(0o755)
    yield folder / "stack"
    stack(folder / "stack", "postgres", "down")  # whatever the test did
    shutil.rmtree(folder, ignore_errors=True)


def test_postgres_up_prints_a_dsn_that_works_and_down_stops_it(root: Path) -> None:
    port = free_port_block([0])
    up = stack(root, "postgres", "up", "--pg-port", str(port), "--connection", "trial")
    assert up.returncode == 0, up
    dsn = f"postgresql://app@127.0.0.1:{port}/postgres"
    assert f"export S3BATCH_POSTGRES_TRIAL_DSN={dsn}\n" in up.stdout, up.stdout
    assert all(line.startswith(("#", "export ")) for line in up.stdout.splitlines()), up.stdout  # eval-able
    command = f"{shlex.quote(str(BIN / 's3batch-stack'))} postgres up --root {shlex.quote(str(root))}"
    exported = subprocess.run(
        ["bash", "-c", f'eval "$({command})" && printf %s "$S3BATCH_POSTGRES_TRIAL_DSN"'],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert exported.stdout == dsn, exported  # the second `up` finds it running, and says the same
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SHOW server_version").fetchone()[0].startswith("15"), "PostgreSQL 15"
        conn.execute("CREATE TABLE kept (id int)")
    assert f"export S3BATCH_POSTGRES_TRIAL_DSN={dsn}" in stack(root, "env").stdout  # beside the stack's variables
    assert f"postgres: {dsn}" in stack(root, "postgres", "status").stdout

    down = stack(root, "postgres", "down")
    assert down.returncode == 0 and "stopped postgres" in down.stdout, down
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=3)
    assert "no postgres running" in stack(root, "postgres", "status").stdout

    again = stack(root, "postgres", "up", "--pg-port", str(port), "--connection", "trial")  # the data stays
    assert again.returncode == 0, again
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    assert "stopped postgres" in stack(root, "down").stdout  # the whole stack's down stops it too


def test_postgres_refuses_a_connection_name_that_names_no_variable(root: Path) -> None:
    bad = stack(root, "postgres", "up", "--connection", "my-db")
    assert bad.returncode != 0 and "--connection 'my-db'" in bad.stderr, bad
    other = stack(root, "status", "up")
    assert other.returncode == 2 and "status takes no 'up'" in other.stderr, other
