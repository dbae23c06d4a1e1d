"""``s3batch-stack``: the command that runs the local stack of :mod:`s3batch.dev.stack`.

    s3batch-stack up [--workers N]  # start both servers in the background (state under .stack/), and N workers
    s3batch-stack env               # print the variables that point a worker or client at it
    s3batch-stack worker            # one worker in the foreground (Ctrl-C stops it), as `make worker`
    s3batch-stack status            # the servers and background workers, and whether they run
    s3batch-stack down              # stop the background workers, both servers and the local PostgreSQL
    s3batch-stack postgres [up|down|status] [--pg-port P] [--connection NAME]
                                    # a local PostgreSQL 15 for the sink: prints its DSN and the variable
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from s3batch.dev.postgres import LOCAL_CONNECTION, LOCAL_PORT, local_down, local_lines, local_state, local_up
from s3batch.dev.stack import Stack, StackConfig, binary, port_free
from s3batch.sinks.spec import CONNECTION_NAME, postgres_variable


def _state_file(root: Path) -> Path:
    return root / "stack.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="s3batch-stack", description="The local stack: a real Temporal dev server and a real SeaweedFS S3 server."
    )
    parser.add_argument("command", choices=["up", "down", "env", "status", "worker", "postgres"])
    parser.add_argument("step", nargs="?", choices=["up", "down", "status"], help="postgres: what to do (default: up)")
    parser.add_argument("--root", default=os.environ.get("S3BATCH_STACK_DIR", ".stack"), help="state directory")
    parser.add_argument(
        "--workers", type=int, default=0, metavar="N", help="up: also start N background workers (down stops them)",
    )
    for name, variable in PORT_FLAGS.items():
        parser.add_argument(f"--{name}", type=int, metavar="PORT", help=f"up: instead of {variable}")
    parser.add_argument("--pg-port", type=int, metavar="PORT", help=f"postgres up: its port (default {LOCAL_PORT})")
    parser.add_argument(
        "--connection", default=LOCAL_CONNECTION, metavar="NAME",
        help=f"postgres up: the sink's connection name, S3BATCH_POSTGRES_<NAME>_DSN (default {LOCAL_CONNECTION})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.step is not None and args.command != "postgres":
        parser.error(f"{args.command} takes no {args.step!r}")
    for name, variable in PORT_FLAGS.items():
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            os.environ[variable] = str(value)
    root = Path(args.root).resolve()
    state = _state_file(root)
    if args.command == "up":
        _up(root, state)
        if args.workers:
            start_workers(_saved_config(root, state), state, args.workers)
        return
    if args.command == "postgres":
        _postgres(root, args.step or "up", args.pg_port, args.connection)
        return
    commands = {"down": _down, "env": _env, "status": _status, "worker": _worker}
    commands[args.command](root, state)


def _postgres(root: Path, step: str, port: int | None, connection: str) -> None:
    """``s3batch-stack postgres up|down|status``: the local PostgreSQL of the stack folder."""
    if step == "up":
        if not re.fullmatch(CONNECTION_NAME, connection):
            sys.exit(f"--connection {connection!r}: a name of letters, digits and _ (it names the variable)")
        root.mkdir(parents=True, exist_ok=True)
        try:
            found = local_up(root, port, connection)
        except RuntimeError as err:
            sys.exit(f"postgres: {err}")
        print("\n".join(local_lines(found)))
        workers = json.loads(_state_file(root).read_text()).get("workers", {}) if _state_file(root).exists() else {}
        if any(pid_alive(pid) for pid in workers.values()):
            print("# the background workers started before it lack this connection: `s3batch-stack down`, then "
                  "`s3batch-stack postgres up` and `s3batch-stack up --workers N` start them with it")
    elif step == "down":
        print("stopped postgres (its data stays)" if local_down(root) else "no postgres running")
    else:
        state = local_state(root)
        print(f"postgres: {json.loads(state.read_text())['dsn']}" if state.exists() else "no postgres running")


PORT_FLAGS = {
    "temporal-port": "S3BATCH_TEMPORAL_PORT",
    "ui-port": "S3BATCH_UI_PORT",
    "s3-port": "S3BATCH_S3_PORT",
    "weed-base-port": "S3BATCH_WEED_BASE_PORT",
}
"""``s3batch-stack up`` flags and the variables they stand for."""


def _saved_config(root: Path, state: Path) -> StackConfig:
    """The config of the stack recorded in ``state``, else the one the environment describes."""
    if not state.exists():
        return StackConfig.from_env(root)
    cfg = json.loads(state.read_text())["config"]
    cfg["root"] = Path(cfg["root"])
    return StackConfig(**cfg)


def start_workers(config: StackConfig, state: Path, count: int) -> list[int]:
    """Start ``count`` workers (``s3batch-worker``) in the background against the stack, logging to
    ``worker-N.log`` in its folder; recorded in ``state`` so that ``down`` stops them. Their pids."""
    saved = json.loads(state.read_text())
    workers: dict[str, int] = saved.setdefault("workers", {})
    workers = {name: pid for name, pid in workers.items() if pid_alive(pid)}
    started = []
    n = 0
    for _ in range(count):
        n += 1
        while f"worker-{n}" in workers:
            n += 1
        with open(config.root / f"worker-{n}.log", "ab") as log:
            proc = subprocess.Popen(
                [binary("s3batch-worker")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_worker_env(config),
                start_new_session=True,  # a Ctrl-C in the terminal that started it does not stop it
            )
        workers[f"worker-{n}"] = proc.pid
        started.append(proc.pid)
    saved["workers"] = workers
    state.write_text(json.dumps(saved))
    print(f"workers          {len(workers)} running (pids {', '.join(map(str, workers.values()))}; logs "
          f"{config.root}/worker-N.log); `s3batch-stack down` stops them")
    return started


def _worker(root: Path, state: Path) -> None:
    """One worker in the foreground, pointed at the stack (``make worker``)."""
    if not state.exists():
        sys.exit("no stack running: start it with `make stack-up` (or `s3batch-stack up`) first")
    config = _saved_config(root, state)
    print(f"worker on Temporal {config.temporal_address}, S3 {config.s3_endpoint} (Ctrl-C stops it)", flush=True)
    os.execve(binary("s3batch-worker"), ["s3batch-worker"], _worker_env(config))


def _worker_env(config: StackConfig) -> dict[str, str]:
    """A dev worker's environment: the stack's (with the local PostgreSQL's connection, when it runs), and one
    worker process (``--workers N`` means N processes; set ``S3BATCH_WORKER_PROCESSES`` to run a supervisor of
    several, as a container does by default)."""
    return {"S3BATCH_WORKER_PROCESSES": "1", **os.environ, **config.env(), **_postgres_env(config.root)}


def _postgres_env(root: Path) -> dict[str, str]:
    """The variable of the local PostgreSQL's DSN, when ``s3batch-stack postgres up`` started one."""
    state = local_state(root)
    if not state.exists():
        return {}
    found = json.loads(state.read_text())
    return {postgres_variable(found["connection"], "DSN"): found["dsn"]}


def _up(root: Path, state: Path) -> None:
    if state.exists():
        saved = json.loads(state.read_text())
        if all(pid_alive(p) for p in saved["pids"].values()):
            print(f"stack already running (state in {root})")
            return
    config = StackConfig.from_env(root)
    for port in (config.temporal_port, config.ui_port, config.s3_port):
        if not port_free(port):
            sys.exit(f"port {port} on 127.0.0.1 is in use: set S3BATCH_TEMPORAL_PORT/S3BATCH_UI_PORT/"
                     "S3BATCH_S3_PORT/S3BATCH_WEED_BASE_PORT to free ports")
    stack = Stack(config)
    try:
        stack.start()
    except Exception:
        stack.stop()
        raise
    cfg = asdict(config)
    cfg["root"] = str(root)
    state.write_text(json.dumps({"config": cfg, "pids": {n: p.pid for n, p in stack.procs.items()}}))
    print(f"Temporal server  {config.temporal_address}   Web UI {config.ui_url}")
    print(f"S3 (SeaweedFS)   {config.s3_endpoint}   data in {root / 's3data'}")


def _down(root: Path, state: Path) -> None:
    if local_down(root):
        print("stopped postgres (its data stays)")
    if not state.exists():
        print("no stack running")
        return
    saved = json.loads(state.read_text())
    # Workers first (SIGTERM: each hands its file back at a chunk boundary, within its 30 s grace).
    for name, pid in [*saved.get("workers", {}).items(), *saved["pids"].items()]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        for _ in range(450 if name.startswith("worker") else 100):
            if not pid_alive(pid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        print(f"stopped {name}")
    state.unlink()


def _env(root: Path, state: Path) -> None:
    config = _saved_config(root, state)
    for key, value in {**config.env(), **_postgres_env(root)}.items():
        print(f"export {key}={value}")
    # So that `s3batch`, `s3batch-worker` and `temporal` run as the README writes them.
    print(f'export PATH="{Path(sys.executable).parent}:$PATH"')


def _status(root: Path, state: Path) -> None:
    _postgres(root, "status", None, LOCAL_CONNECTION)
    if not state.exists():
        print("no stack running")
        return
    saved = json.loads(state.read_text())
    for name, pid in [*saved["pids"].items(), *saved.get("workers", {}).items()]:
        print(f"{name}: pid {pid} {'running' if pid_alive(pid) else 'dead'}")
    if not any(pid_alive(pid) for pid in saved.get("workers", {}).values()):
        print("no background worker: jobs wait until one runs (`make worker`, or `s3batch-stack up --workers 2`)")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); look at its state.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    return True


if __name__ == "__main__":
    main()
