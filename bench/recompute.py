"""From-scratch batch recompute of every layer over all landing files, with the pipeline's own
pure transforms in batch: what an incremental run is measured against.

    python -m bench.recompute --out DIR       (LAKEHOUSE_ROOT: the lakehouse to recompute)

Each layer is written to Delta under DIR and read back by the next, as a batch pipeline would.
Not included: the quality gates and ops tables (so the recompute is, if anything, cheaper than
the streaming run it replaces). Prints one JSON line with each layer's seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

from audit.prefix import ARRIVAL
from bronze.job import BINARY_FILE_SCHEMA
from bronze.transform import lines_from_files
from common.config import load_config
from common.errors import JobError, command
from common.spark import build_spark, stop
from gold.tables import gold_tables
from silver import transform as S


def recompute(spark, cfg, out: Path) -> dict:
    timings = {}

    def write(df, name: str) -> str:
        path = str(out / name)
        df.write.format("delta").mode("overwrite").save(path)
        return path

    t = time.monotonic()
    files = spark.read.format("binaryFile").schema(BINARY_FILE_SCHEMA).load(str(cfg.landing))
    bronze = spark.read.format("delta").load(write(lines_from_files(files), "bronze/events"))
    timings["bronze_s"] = time.monotonic() - t

    t = time.monotonic()
    profile = cfg.profile
    parsed = S.deduplicate(S.parse_events(bronze, cfg.silver.min_event_time, cfg.silver.max_future.seconds, profile,
                                          cfg.silver.max_record_bytes),
                           cfg.silver.dedup_watermark.spark(), profile).persist()
    dim = profile.dimension
    locations = (spark.read.format("delta").load(cfg.table_path("silver", dim.table)) if dim else None)
    fetch = parsed.agg(*S.fetch_window(~S.is_accepted())).first()
    write(S.to_quarantine(S.with_record_bytes(S.rejected(parsed), bronze, profile, *fetch), 0, profile),
          "silver/quarantine")
    silver = spark.read.format("delta").load(
        write(S.to_silver(S.join_dimension(S.accepted(parsed), locations, profile), 0, profile),
              f"silver/{profile.silver_table}"))
    parsed.unpersist()
    timings["silver_s"] = time.monotonic() - t

    t = time.monotonic()
    # The batch sees everything at once: no event is late, the watermark is the newest event
    # time less gold's delay, and sessions fold in a single arrival batch.
    events = silver.dropDuplicates(["event_id"]).withColumn(ARRIVAL, F.lit(0)).persist()
    newest = events.agg(F.max("event_time")).first()[0]
    watermark_ms = int(newest.timestamp() * 1000 - cfg.gold.watermark.seconds * 1000) if newest else 0
    for spec in gold_tables(cfg):
        write(spec.expected(events, ARRIVAL, watermark_ms), f"gold/{spec.table}")
    events.unpersist()
    timings["gold_s"] = time.monotonic() - t
    return {k: round(v, 2) for k, v in timings.items()}


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench.recompute", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the recomputed tables")
    args = parser.parse_args(argv)
    cfg = load_config()
    if not cfg.landing.is_dir():
        raise JobError(f"landing folder {cfg.landing} does not exist")
    spark = build_spark(cfg, "bench-recompute")
    try:
        print("RECOMPUTE " + json.dumps(recompute(spark, cfg, args.out)), flush=True)
    finally:
        stop(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
