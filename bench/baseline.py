"""Figure (g): the same bronze -> silver -> gold written as plain Structured Streaming, the way
a user following the Databricks examples would write it instead of using this project.

    python -m bench.baseline      (LAKEHOUSE_ROOT: a fresh folder; LANDING, REFERENCE_DIR: the bench's)

One SparkSession (common.spark.build_spark: same Delta, jars and Spark conf as the jobs), three
layers one after another, each available-now into Delta in append mode, awaited before the
next starts. No quality gates, accounting, lineage or MERGE; malformed lines are just dropped.

  bronze  text files -> one row per line
  silver  from_json (the profile's raw schema) + explode, typed; event-time watermark and
          dropDuplicatesWithinWatermark on event_id; stream-static join with device_locations
  gold    with gold's watermark: the profile's windowed aggregations (nest: hourly sightings per
          zip, 10-minute activity sliding 5 minutes per device) and session_window sessions

Prints one line `BASELINE {json}` with each layer's seconds and the session build's.
"""
from __future__ import annotations

import json
import sys
import time

from pyspark.sql import functions as F

from common.config import load_config
from common.spark import NO_DATA_BATCHES, build_spark
from common.streaming import interval
from gold.transform import windowed_aggregate
from silver.locations import current, load
from silver.transform import explodes_map, join_dimension, raw_schema


def run(stream, table: str, cfg, query: str, layer: str | None = None):
    """Start an append of `stream` into the Delta table at $root/<table>: available-now, or with
    `layer`, processing-time at that layer's interval (conf streaming.<layer>_interval)."""
    when = {"availableNow": True} if layer is None else {"processingTime": interval(cfg, layer).spark()}
    return (stream.writeStream.format("delta").outputMode("append")
            .option("checkpointLocation", str(cfg.root / "_checkpoints" / query))
            .trigger(**when).start(str(cfg.root / table)))


def events(lines, profile, keep: tuple[str, ...] = ()):
    """JSON lines -> one typed row per element of the explode path, with an event_id; `keep`:
    columns of `lines` carried to every row."""
    j = F.from_json("value", raw_schema(profile)).alias("j")
    df, root = lines.select(*keep, j), "j"
    if profile.explode_path:
        at = F.col("j." + ".".join(profile.explode_path))
        df = df.select(*keep, F.explode(at).alias("_key", "el") if explodes_map(profile)
                       else F.explode(at).alias("el"))
        root = "el"
    typed = df.select(*keep, *(F.col(".".join((root, *f.path))).try_cast("string" if f.type == "json" else f.type)
                               .alias(f.name) for f in profile.fields if f.type != "present"))
    for name, expression in profile.derived:
        typed = typed.withColumn(name, F.expr(expression))
    keys = profile.dedup or [f.name for f in profile.fields if f.type != "present"]
    return (typed.withColumn("event_time", F.col(profile.event_time))
            .where(F.col("event_time").isNotNull())
            .withColumn("event_id", F.sha2(F.concat_ws("|", *(F.col(k).cast("string") for k in keys)), 256)))


def silver(spark, cfg, bronze, keep: tuple[str, ...] = ()):
    """bronze rows -> the silver stream: parsed, deduplicated within the watermark, joined."""
    profile = cfg.profile
    out = (events(bronze, profile, keep)
           .withWatermark("event_time", cfg.silver.dedup_watermark.spark())
           .dropDuplicatesWithinWatermark(["event_id"]))
    if profile.dimension:
        load(spark, cfg)   # the generator's CSV -> silver.<dimension>, as the silver job does
        # The plain stream-static join: today's location by key (silver joins at the event's time).
        static = current(spark.read.format("delta").load(cfg.table_path("silver", profile.dimension.table)))
        out = join_dimension(out, static, profile, at=None)   # broadcast left join, sets the flag
    return out


def gold(spark, cfg, silver_path: str) -> dict:
    """Gold table name -> its stream over the silver table, in append mode with gold's watermark."""
    profile = cfg.profile

    def gold_input():
        return (spark.readStream.format("delta").load(silver_path)
                .withWatermark("event_time", cfg.gold.watermark.spark()))
    tables = {}
    for agg in profile.aggregations:
        slide = cfg.duration(agg.slide).spark() if agg.slide else None
        tables[agg.table] = windowed_aggregate(gold_input(), agg.group, cfg.duration(agg.window).spark(),
                                               slide, agg.measures)
    if profile.sessions:
        s = profile.sessions
        w = F.session_window("event_time", cfg.duration(s.gap).spark())
        tables[s.table] = (gold_input().groupBy(w.alias("session"), s.key)
                           .agg(F.count(F.lit(1)).alias("events"),
                                *(F.sum(F.expr(e).cast("long")).alias(m) for m, e in s.measures),
                                *(F.max_by(c, "event_time").alias(c) for c in s.latest))
                           .select(F.col("session.start").alias("session_start"),
                                   F.col("session.end").alias("session_end"), "*").drop("session"))
    return tables


def main() -> int:
    started = time.monotonic()
    cfg = load_config()
    marks = {}
    # Spark's default, as the pipeline's (streaming.no_data_batches): in append mode a window
    # or session is written only by a batch whose watermark has passed it, so the run's last
    # ones come out of the watermark-only batch after the last batch with rows.
    spark = build_spark(cfg, "bench-baseline", extra={NO_DATA_BATCHES: "true"})
    marks["session_s"] = time.monotonic() - started

    t = time.monotonic()
    lines = spark.readStream.format("text").load(str(cfg.landing))
    run(lines.select("value", F.current_timestamp().alias("ingest_time")),
        "bronze/events", cfg, "bronze").awaitTermination()
    marks["bronze_s"] = time.monotonic() - t

    t = time.monotonic()
    silver_table = f"silver/{cfg.silver_table}"
    run(silver(spark, cfg, spark.readStream.format("delta").load(str(cfg.root / "bronze/events"))),
        silver_table, cfg, "silver").awaitTermination()
    marks["silver_s"] = time.monotonic() - t

    t = time.monotonic()
    queries = [run(stream, f"gold/{table}", cfg, table)
               for table, stream in gold(spark, cfg, str(cfg.root / silver_table)).items()]
    for q in queries:   # the gold queries run side by side, as the gold job runs them
        q.awaitTermination()
    marks["gold_s"] = time.monotonic() - t

    t = time.monotonic()
    spark.stop()
    marks["stop_s"] = time.monotonic() - t
    print("BASELINE " + json.dumps({k: round(v, 2) for k, v in marks.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
