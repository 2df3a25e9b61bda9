"""Figure (d)'s plain counterpart: bench/baseline.py's layers as processing-time queries of one
SparkSession, fed as (d) feeds the pipeline (same generator, seed, rate, span and length), and
each landed file's latency to the first silver commit holding its events.

    python -m bench.baseline_stream --seconds 300 --rate 5000 --seed 7 --span-seconds 36000
    (LAKEHOUSE_ROOT: a fresh folder)

It answers what (d) alone cannot: how far this machine lets plain Structured Streaming go at that
rate. Gold's queries run too (append mode, gold's watermark), so the cores carry the whole
pipeline's work, but only landing -> silver is timed: an append-mode window is written only once
the watermark has passed it, so the plain gold's latency is the watermark's, by design.

Prints one line `BASELINE_STREAM {json}`: files, p50_s, p95_s, max_s (bench/latency.summarize,
files still not in silver at the end counted with the time they had waited) and how busy the
cores were during the feed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyspark.sql import functions as F

from bench.baseline import gold, run, silver
from bench.contention import busy_share, cpu_ticks
from bench.feeder import Feeder, stream_params
from bench.latency import delta_commits, summarize
from common.config import load_config
from common.spark import NO_DATA_BATCHES, build_spark
from tools.generator.events import Params, write_locations

FILE = "landing_file"


def first_visible(spark, table: str) -> dict[str, float]:
    """Landing file name -> when silver first committed one of its events."""
    added = {path: c["ts"] for c in delta_commits(table) for path in c["adds"]}
    rows = (spark.read.format("delta").load(table)
            .select(FILE, F.col("_metadata.file_name").alias("part")).distinct().collect())
    seen: dict[str, float] = {}
    for r in rows:
        ts = added.get(r.part)
        if ts is not None:
            seen[r[FILE]] = min(seen.get(r[FILE], ts), ts)
    return seen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.baseline_stream", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, required=True, help="how long to feed")
    p.add_argument("--rate", type=int, required=True, help="events per second")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--span-seconds", type=float, required=True, help="event time the feed spans")
    p.add_argument("--warmup-seconds", type=float, default=15, help="files landed before this are not counted")
    p.add_argument("--drain-seconds", type=float, default=300, help="at most this long for silver to catch up")
    args = p.parse_args(argv)

    # Processing-time, so the session gets the JIT and GC a processing-time pipeline gets.
    cfg = load_config(env={**os.environ, "TRIGGER": "processing-time"})
    params = stream_params(Params.from_config(cfg.generator), args.span_seconds)
    feeder = Feeder(cfg.landing, params, args.seed, args.rate, args.seconds)
    write_locations(cfg.locations_csv, params.devices, cfg.silver.min_event_time)
    cfg.landing.mkdir(parents=True, exist_ok=True)
    spark = build_spark(cfg, "bench-baseline-stream", extra={NO_DATA_BATCHES: "true"})
    bronze_path, silver_path = str(cfg.root / "bronze/events"), str(cfg.root / f"silver/{cfg.silver_table}")

    # Each layer's table exists before the layer reading it starts (the pipeline's runner does
    # the same): a Delta stream cannot start on a folder without a log.
    lines = spark.readStream.format("text").load(str(cfg.landing))
    spark.createDataFrame([], f"value STRING, {FILE} STRING").write.format("delta").save(bronze_path)
    queries = [run(lines.select("value", F.col("_metadata.file_name").alias(FILE)),
                   "bronze/events", cfg, "bronze", "bronze")]
    stream = silver(spark, cfg, spark.readStream.format("delta").load(bronze_path), keep=(FILE,))
    spark.createDataFrame([], stream.schema).write.format("delta").save(silver_path)
    queries.append(run(stream, f"silver/{cfg.silver_table}", cfg, "silver", "silver"))
    queries += [run(s, f"gold/{table}", cfg, table, "gold") for table, s in gold(spark, cfg, silver_path).items()]

    try:
        feeder.start()
        ticks = cpu_ticks()
        feeder.join()
        busy = busy_share(ticks, cpu_ticks())
        deadline = time.time() + args.drain_seconds
        while True:
            failed = [q for q in queries if not q.isActive]
            if failed:   # a dead query would leave its files waiting: report it, not a latency
                raise RuntimeError(f"query {failed[0].name or failed[0].id} stopped: {failed[0].exception()}")
            seen = first_visible(spark, silver_path)
            observed_until = time.time()
            if all(name in seen for name in feeder.landed) or observed_until > deadline:
                break
            time.sleep(2)
    finally:
        for q in queries:
            q.stop()
    warm = feeder.started_at + args.warmup_seconds
    rows = [{"landed": t, "silver": seen[name] - t if name in seen else None}
            for name, t in feeder.landed.items() if t >= warm]
    out = {**summarize(rows, "silver", observed_until), "cores_busy_during_feed": busy}
    spark.stop()
    print("BASELINE_STREAM " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
