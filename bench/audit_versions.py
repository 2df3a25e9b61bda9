"""How long `make audit` takes on a gold table with many versions.

    python -m bench.audit_versions [--versions 50]        (make bench-audit VERSIONS=50)

Builds a lakehouse whose gold.zip_hourly_sightings has the requested number of versions, made by
the real gold streaming query over a silver table of small commits, some of them with late
events, then times the audit of that table.
Results go to bench-results/audit-<timestamp>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from common.delta import idempotent_append, table_version

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
DEVICES = [f"cam-{i:04d}" for i in range(1, 9)]


def silver_commit(spark, cfg, schema, step: int, per_step: int = 12) -> None:
    """One silver commit: events in the step's hour, plus every third step an event 130 minutes
    old, more than gold's one-hour watermark behind the frontier silver had reached (late).
    Each step moves the watermark past the previous hour, so the next step's MERGE finalizes
    that window: one gold version per silver commit."""
    times = [T0 + timedelta(minutes=60 * step + 5 * i) for i in range(per_step)]
    if step % 3 == 2:
        times.append(T0 + timedelta(minutes=60 * step - 130))
    # What silver would stamp: the latest event time of the commits before this one.
    frontier = T0 + timedelta(minutes=60 * (step - 1) + 5 * (per_step - 1)) if step else None
    rows = []
    for i, t in enumerate(times):
        device = DEVICES[(step + i) % len(DEVICES)]
        d = {f.name: None for f in schema.fields}
        d.update(event_id=f"e{step:04d}-{i:03d}", device_id=device, name=f"cam {device}",
                 is_online=True, has_sound=False, has_motion=i % 2 == 0, has_person=i % 3 == 0,
                 start_time=t, end_time=t, duration_seconds=0.0, event_time=t, event_date=t.date(),
                 zip_code=f"9410{i % 4}", unknown_device=False, bronze_source="file",
                 bronze_file_path="file:/landing/bench.json", bronze_line_number=i + 1,
                 bronze_ingest_time=t, silver_batch_id=step, silver_frontier_time=frontier)
        rows.append(tuple(d[f.name] for f in schema.fields))
    # Keyed by the step, as silver keys its commits by batch: the audit places each row by it.
    idempotent_append(spark.createDataFrame(rows, schema).coalesce(1), cfg.table_path("silver", "camera_events"),
                      "bench-events", step, replay=False)


def gold_versions(spark, path: str) -> int:
    return table_version(spark, path) + 1


def bench_config(root: Path):
    """The lakehouse under `root`, its gold query reading one silver commit (one file) per
    micro-batch in an available-now run: a gold version per silver commit, and batches that
    follow each other at once instead of waiting on a trigger and a no-data batch each."""
    from common.config import load_config

    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE__")}
    env.update(LAKEHOUSE_ROOT=str(root / "lakehouse"), TRIGGER="available-now",
               LAKEHOUSE__GOLD__MAX_FILES_PER_TRIGGER="1")
    return load_config(env=env)


def build(spark, cfg, versions: int) -> int:
    """Feed silver until gold.zip_hourly_sightings has at least `versions` versions; returns how
    many silver commits that took. `cfg` comes from bench_config. Each batch's watermark is the
    one a processing-time run would give it: the latest event time of the batches before it."""
    from pipeline.runner import start
    from silver.job import ensure_tables

    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text("device_id,zip_code,city,state\n"
                                 + "".join(f"{d},9410{i % 4},San Francisco,CA\n" for i, d in enumerate(DEVICES)))
    ensure_tables(spark, cfg)
    schema = spark.read.format("delta").load(cfg.table_path("silver", "camera_events")).schema
    gold = cfg.table_path("gold", "zip_hourly_sightings")
    commits = 0
    while True:
        # (The gold table's CREATE is a version too; each commit adds one MERGE.) The first run
        # reads one commit: a query's first batches cut the snapshot it starts from by files,
        # not by versions, which the audit could not recompute.
        have = gold_versions(spark, gold) if commits else 1
        if have >= versions:
            return commits
        for _ in range(versions - have if commits else 1):
            silver_commit(spark, cfg, schema, commits)
            commits += 1
        query, = start(spark, cfg, "gold", only={"sightings"}, suites={})
        query.awaitTermination()


def main(argv=None, prog: str = "bench.audit_versions") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=50)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="audit-bench-"))
    from audit.__main__ import run_audit
    from common.spark import build_spark, stop

    cfg = bench_config(root)
    spark = build_spark(cfg, "bench-audit")
    try:
        started = time.monotonic()
        commits = build(spark, cfg, args.versions)
        build_s = time.monotonic() - started
        started = time.monotonic()
        report = run_audit(spark, cfg, "gold.zip_hourly_sightings")
        audit_s = time.monotonic() - started
    finally:
        stop(spark)
    checks = report["tables"][0]["prefix"]
    result = {"versions": len(checks), "silver_commits": commits, "build_s": round(build_s, 1),
              "audit_s": round(audit_s, 1), "per_version_s": round(audit_s / len(checks), 2),
              "pass": sum(c["status"] == "PASS" for c in checks), "ok": report["ok"],
              "cpus": os.cpu_count(), "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = Path(__file__).resolve().parent.parent / "bench-results"
    out.mkdir(exist_ok=True)
    (out / f"audit-{result['at'].replace(':', '')}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"audit of a {len(checks)}-version gold table: {audit_s:.1f} s "
          f"({audit_s / len(checks):.2f} s per version), {result['pass']} PASS")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
