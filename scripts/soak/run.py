"""The soak, start to end: ``python -m scripts.soak [--minutes 10] [--seed N]`` (``make soak``: ``SOAK_MINUTES``,
``SOAK_SEED``).

1. Starts its own stack under ``--root`` (default a fresh folder under the system's temporary folder) on ports
   of its own (``--port-range``, else ``S3BATCH_PORT_RANGE``, else 22700-22750, clear of the test suite's
   10000-22000 and the container test's 22000-22700): the Temporal dev server, SeaweedFS, PostgreSQL when its
   binaries are there, the S3 fault proxy, and ``--workers`` worker slots (one of them a supervisor of two
   processes), on build ``b1`` of the Worker Deployment ``soak``.
2. For ``--minutes``, keeps ``--jobs`` jobs running (new ones as others end) while the nemesis injects faults,
   ``--faults-per-minute`` on average; everything is drawn from the seed, printed first.
3. Heals everything, waits for the jobs still running (``--drain-minutes``), checks the books, prints the
   figures (and with a violation the seed, the faults' timeline and the first record that breaks the books),
   writes ``summary.json`` (and ``--json``) and exits 1 on any violation.

The root keeps the timeline (``timeline.jsonl``), the servers' and workers' logs and the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from s3batch.dev.stack import PORT_RANGE_ENV, s3_client  # noqa: E402
from scripts.soak.checker import Checker, Violation, reprocessed  # noqa: E402
from scripts.soak.cluster import DEPLOYMENT, Cluster  # noqa: E402
from scripts.soak.driver import Generator, retry_sync  # noqa: E402
from scripts.soak.handlers import BREAK_ENV  # noqa: E402
from scripts.soak.kinds import JobPlan  # noqa: E402
from scripts.soak.nemesis import Nemesis, schedule  # noqa: E402
from scripts.soak.timeline import Timeline  # noqa: E402

DEFAULT_PORTS = "22700-22750"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.soak", description=__doc__.split("\n\n")[0])
    env = os.environ
    parser.add_argument("--minutes", type=float, default=float(env.get("SOAK_MINUTES") or 10),
                        help="how long jobs are started and faults injected (SOAK_MINUTES, default 10)")
    parser.add_argument("--seed", type=int, default=int(env["SOAK_SEED"]) if env.get("SOAK_SEED") else None,
                        help="the seed of the jobs and the faults (SOAK_SEED; default: a new one, printed)")
    parser.add_argument("--faults-per-minute", type=float, default=10.0)
    parser.add_argument("--jobs", type=int, default=5, help="jobs running at once")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the files and records of each job")
    parser.add_argument("--workers", type=int, default=3, help="worker slots (at least 3)")
    parser.add_argument("--kinds", default="", help="only jobs of these kinds, comma-separated (default: every kind; "
                                                    "see scripts/soak/kinds.py)")
    parser.add_argument("--drain-minutes", type=float, default=None,
                        help="how long to wait for the jobs still running at the end (default: 6, or half the soak)")
    parser.add_argument("--port-range", default=None, help=f"LOW-HIGH base ports (default {PORT_RANGE_ENV} or "
                                                           f"{DEFAULT_PORTS})")
    parser.add_argument("--root", type=Path, default=None, help="the soak's folder (default: a new temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    if args.workers < 3:
        parser.error("--workers: at least 3")
    from scripts.soak.kinds import KINDS

    unknown = [k for k in args.kinds.split(",") if k and k not in KINDS]
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; the kinds: {', '.join(KINDS)}")
    return args


async def soak(cluster: Cluster, args: argparse.Namespace, seed: int, timeline: Timeline) -> dict[str, Any]:
    from temporalio.client import Client
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    from s3batch.client.deployments import promote
    from s3batch.plugin import S3BatchPlugin
    from s3batch.s3io import make_client

    # The client's retries while the nemesis has the server down are expected: its own log of them is not printed.
    quiet = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(TelemetryFilter("ERROR", "ERROR"))))
    client = await Client.connect(cluster.stack.config.temporal_address, plugins=[S3BatchPlugin(make_client())],
                                  runtime=quiet)
    await promote(client, DEPLOYMENT, "b1", wait=120)
    s3 = s3_client(cluster.stack.config)
    seconds = args.minutes * 60
    kinds = tuple(k for k in args.kinds.split(",") if k)
    generator = Generator(cluster, client, s3, timeline, seed=seed, scale=args.scale, concurrency=args.jobs,
                          kinds=kinds)
    generator.early_check = lambda plan, rec: Checker(s3, cluster.pg).early(plan, rec)
    faults = schedule(seed, seconds, args.faults_per_minute, len(cluster.slots), cluster.pg is not None)
    nemesis = Nemesis(cluster, client, timeline)
    injecting = asyncio.create_task(nemesis.run(faults))
    keeping = asyncio.create_task(nemesis.keep())
    await generator.run(until=seconds)
    timeline.add("soak", f"{args.minutes:g} min over: no new job, no new fault; healing, then waiting for the jobs")
    await nemesis.heal()
    await injecting
    await keeping
    await asyncio.to_thread(cluster.heal_servers)
    drain = args.drain_minutes if args.drain_minutes is not None else max(6.0, args.minutes / 2)
    await generator.drain(drain * 60)
    timeline.add("soak", "jobs ended; checking the books")
    checker = Checker(s3, cluster.pg)
    violations = await asyncio.to_thread(retry_sync, lambda: checker.check_all(generator.plans), "check the books")
    lines = cluster.count_file.read_text().splitlines() if cluster.count_file.exists() else []
    return figures(seed, args, generator.plans, timeline, checker, violations, reprocessed(lines), cluster.notes)


def figures(seed: int, args: argparse.Namespace, plans: list[JobPlan], timeline: Timeline, checker: Checker,
            violations: list[Violation], again: Any, notes: list[str]) -> dict[str, Any]:
    versions = [v for p in plans for f in p.files.values() for v in f.versions]
    ended = Counter(rec.status for p in plans for rec in p.records)
    return {
        "seed": seed,
        "minutes": args.minutes,
        "jobs": len(plans),
        "jobs_by_kind": dict(sorted(Counter(p.kind for p in plans).items())),
        "workflows": sum(len(p.records) for p in plans),
        "workflows_ended": dict(sorted(ended.items())),
        "redrives": sum(1 for p in plans for rec in p.records if rec.role == "redrive"),
        "files": len(versions),
        "records": sum(len(v.records) for v in versions),
        "checked": {"files": checker.counts.files, "records_written": checker.counts.records_written,
                    "rejected": checker.counts.rejected},
        "faults": sum(timeline.faults().values()),
        "faults_by_kind": dict(sorted(timeline.faults().items())),
        "faults_skipped": sum(1 for e in timeline.events if e.skipped),
        "nemesis_errors": [e.what for e in timeline.events if e.kind == "nemesis-error"],
        "handled_by_soak_count": again.handled,
        "records_processed_again": again.again,
        "chunks_processed_again": again.chunks_again,
        "violations": [str(v) for v in violations],
        "notes": notes,
        "seconds": timeline.now(),
    }


def render(summary: dict[str, Any], timeline: Timeline, root: Path) -> str:
    s = summary
    kinds = ", ".join(f"{k} {n}" for k, n in s["jobs_by_kind"].items())
    faults = ", ".join(f"{k} {n}" for k, n in s["faults_by_kind"].items())
    share = s["records_processed_again"] / s["handled_by_soak_count"] if s["handled_by_soak_count"] else 0.0
    out = [
        f"soak seed {s['seed']}: {s['minutes']:g} min of jobs and faults, {s['seconds']:.0f} s in all",
        f"  jobs        {s['jobs']} ({kinds}); {s['workflows']} workflows ({s['redrives']} redrives), ended: "
        + ", ".join(f"{k} {n}" for k, n in s["workflows_ended"].items()),
        f"  sources     {s['files']:,} file versions, {s['records']:,} records",
        f"  checked     {s['checked']['files']:,} files reported, {s['checked']['records_written']:,} records in "
        f"outputs, {s['checked']['rejected']:,} rejects",
        f"  faults      {s['faults']} injected ({faults}); {s['faults_skipped']} skipped (target busy)",
        f"  again       {s['records_processed_again']:,} records handled again after faults, of "
        f"{s['handled_by_soak_count']:,} handled by soak_count ({share:.1%}; {s['chunks_processed_again']} chunks)",
        f"  violations  {len(s['violations'])}",
    ]
    out += [f"  note        {n}" for n in s["notes"] + s["nemesis_errors"][:10]]
    if s["violations"]:
        out += ["", f"FAILED: replay with  make soak SOAK_SEED={s['seed']} SOAK_MINUTES={s['minutes']:g}",
                "the faults' timeline (and the first violation's job):", *_timeline(timeline, s["violations"][0]),
                "", f"first violation: {s['violations'][0]}",
                *(f"  then: {v}" for v in s["violations"][1:20])]
        if len(s["violations"]) > 20:
            out.append(f"  ... {len(s['violations']) - 20} more in {root / 'summary.json'}")
    out.append(f"  folder      {root} (timeline.jsonl, summary.json, logs)")
    return "\n".join(out)


def _timeline(timeline: Timeline, first: str) -> list[str]:
    job = first.split(":", 1)[0]
    return [line for e, line in zip(timeline.events, timeline.lines(), strict=True) if e.kind != "job" or job in e.what]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    os.environ[PORT_RANGE_ENV] = args.port_range or os.environ.get(PORT_RANGE_ENV) or DEFAULT_PORTS
    root = (args.root or Path(tempfile.mkdtemp(prefix=f"s3batch-soak-{seed}-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    broken = os.environ.get(BREAK_ENV)
    print(f"soak: seed {seed} ({args.minutes:g} min, {args.faults_per_minute:g} faults a minute, {args.jobs} jobs at "
          f"once; replay: make soak SOAK_SEED={seed} SOAK_MINUTES={args.minutes:g}); folder {root}"
          + (f"; BROKEN BUILD {BREAK_ENV}={broken}" if broken else ""), flush=True)
    cluster = Cluster(root, slots=args.workers, break_mode=broken)
    started = time.monotonic()
    try:
        cluster.start()
        os.environ.update(cluster.env())
        timeline = Timeline(root / "timeline.jsonl")
        summary = asyncio.run(soak(cluster, args, seed, timeline))
    finally:
        cluster.stop()
    summary["wall_seconds"] = round(time.monotonic() - started)
    text = json.dumps(summary, indent=2)
    (root / "summary.json").write_text(text)
    if args.json:
        args.json.write_text(text)
    print(render(summary, timeline, root), flush=True)
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
