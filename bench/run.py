"""Benchmark: generate N events, run bronze, silver and gold as the user would (separate jobs,
available-now), and report throughput, per-batch time and the quality gate's share.

    python -m bench.run -n 1000000 [--keep]      (make bench BENCH_N=...)

Wall times include each job's Spark start-up, reported separately as `spark_startup_s`.
Results go to bench-results/<timestamp>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench-results"


def timed(cmd: list[str], env: dict) -> float:
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.monotonic() - started


def accounting(env: dict) -> list[dict]:
    code = ("import json; from common.config import load_config; from common.spark import build_spark;"
            "s = build_spark(load_config());"
            "rows = s.sql(\"SELECT layer, query, count(*) AS batches, sum(rows_in) AS rows_in, "
            "sum(records_in) AS records_in, sum(events_parsed) AS events_parsed, "
            "sum(events_written) AS events_written, sum(rows_written) AS rows_written, "
            "sum(batch_ms) AS batch_ms, sum(quality_ms) AS quality_ms "
            "FROM ops.batch_accounting GROUP BY layer, query\").collect();"
            "print('JSON' + json.dumps([r.asDict() for r in rows]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("JSON")), None)
    if line is None:
        sys.exit(f"reading ops.batch_accounting failed:\n{out.stderr[-3000:]}")
    return json.loads(line[4:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark lakehouse")
    args = parser.parse_args(argv)

    root = OUT / f"lakehouse-{args.events}"
    shutil.rmtree(root, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR")}
    env.update(LAKEHOUSE_ROOT=str(root), TRIGGER="available-now", SOURCE="files")
    py = sys.executable
    manifest = root / "manifest.json"
    root.mkdir(parents=True)

    result = {"events": args.events, "seed": args.seed, "cores": os.cpu_count(),
              "started": datetime.now(timezone.utc).isoformat()}
    result["spark_startup_s"] = timed([py, "-c", "from common.config import load_config;"
                                       "from common.spark import build_spark; build_spark(load_config()).stop()"], env)
    result["generate_s"] = timed([py, "-m", "bronze.generator", "-n", str(args.events),
                                  "--seed", str(args.seed), "--manifest", str(manifest)], env)
    m = json.loads(manifest.read_text())
    result["records"] = m["records"]
    for layer in ("bronze", "silver", "gold"):
        result[f"{layer}_wall_s"] = timed([py, "-m", f"{layer}.job"], env)
    books = accounting(env)
    result["accounting"] = books

    silver = [b for b in books if b["layer"] == "silver"]
    gold = [b for b in books if b["layer"] == "gold"]
    s_batch = sum(b["batch_ms"] or 0 for b in silver)
    s_quality = sum(b["quality_ms"] or 0 for b in silver)
    total = result["bronze_wall_s"] + result["silver_wall_s"] + result["gold_wall_s"]
    result["summary"] = {
        "bronze_records_per_s_wall": round(m["records"] / result["bronze_wall_s"]),
        "silver_events_per_s_wall": round(m["events"] / result["silver_wall_s"]),
        "silver_events_per_s_batches": round(m["events"] / (s_batch / 1000)) if s_batch else None,
        "silver_quality_share": round(s_quality / s_batch, 3) if s_batch else None,
        "gold_batch_s_by_query": {b["query"]: round((b["batch_ms"] or 0) / 1000, 1) for b in gold},
        "gold_quality_share": round(sum(b["quality_ms"] or 0 for b in gold)
                                    / max(1, sum(b["batch_ms"] or 0 for b in gold)), 3),
        "end_to_end_s": round(total, 1),
        "end_to_end_events_per_s": round(m["events"] / total),
    }
    OUT.mkdir(exist_ok=True)
    path = OUT / f"bench-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{args.events}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "accounting"}, indent=2, default=str))
    print(f"results: {path}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
