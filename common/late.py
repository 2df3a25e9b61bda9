"""Late events, kept: silver.late_events, written by the layer whose watermark they missed.

- late for gold: an event more than gold's watermark behind silver's frontier when it arrived
  (gold.transform.late) can no longer change a window or session the watermark has finalized,
  so gold's aggregates skip it. It stays in silver, and the gold batch that skipped it appends
  a copy of its silver row.
- late for silver: an event behind silver's dedup watermark is dropped by Spark's deduplication
  operator (its id may have been forgotten, so it cannot be deduplicated), before silver's
  batch sees it. The silver batch that Spark says dropped some finds them again in the batch's
  own input and appends their silver rows (silver/job.py): it never reaches silver.<events>,
  and a backfill deduplicates it against silver before folding it into gold.

Either way with the batch that found it late: the late events are a table anyone can query
(which cameras upload backlogs, how late), not only a count, and a backfill reads them from
there.

Through the gold query's plan a late row travels as one JSON text column (null for every
on-time event): the stateful operator's input carries every column of the shared shuffle, and a
null text costs it next to nothing, where the silver row's columns would ride along each event.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from common.delta import change_feed, ensure_table

TABLE = "late_events"            # under the silver layer: copies of silver rows
LATE = "_late"                   # the late row's silver columns as JSON; null for on-time rows
OUTPUT = "late events"           # the gold batch's output name (gold/sinks.py)
KEY = "late"                     # its append key's suffix

# Microseconds survive the round trip (to_json writes milliseconds by default).
_JSON = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}

FOUND = [StructField("late_for", StringType(), False),        # whose watermark it missed: gold, silver
         StructField("found_by_query", StringType(), False),
         StructField("found_in_batch", LongType(), False),
         StructField("found_watermark", TimestampType(), True),
         StructField("backfilled_by", StringType(), True),     # the backfill that folded it into gold
         StructField("backfilled_at", TimestampType(), True)]


def folded_by(cfg) -> str:
    """What folds kept late events into gold under cfg (gold.backfill), as the run and status say it."""
    gold = cfg.gold
    if gold.backfill == "auto":
        return f"gold folds them in {gold.backfill_delay} after it found them (gold.backfill: auto)"
    return "`lakehouse backfill` (make backfill) folds them into gold"


def pending(spark, cfg) -> dict | None:
    """The kept late events no backfill has folded in yet: how many, per watermark they missed,
    and their event-time span; None when there are none (or no table yet)."""
    from common.storage import is_delta_table

    path = cfg.table_path("silver", TABLE)
    if not is_delta_table(path):
        return None
    rows = (spark.read.format("delta").load(path).where("backfilled_by IS NULL").groupBy("late_for")
            .agg(F.count(F.lit(1)).alias("n"), F.min("event_time").alias("first"),
                 F.max("event_time").alias("last")).collect())
    if not rows:
        return None
    return {"events": sum(r.n for r in rows), "late_for": {r.late_for: r.n for r in rows},
            "first_event_time": min(r.first for r in rows), "last_event_time": max(r.last for r in rows)}


def schema(silver_schema: StructType) -> StructType:
    return StructType([*silver_schema.fields, *FOUND])


def row(silver_columns: list[str], is_late: Column) -> Column:
    """The LATE column: a late row's silver columns as JSON text, null when on time."""
    return F.when(is_late, F.to_json(F.struct(*silver_columns), _JSON))


def rows(batch: DataFrame, silver_schema: StructType, query: str, batch_id: int,
         watermark_ms: int) -> DataFrame:
    """silver.late_events rows of a gold batch: its late rows' silver columns, and who found them."""
    return found(batch.where(F.col(LATE).isNotNull())
                 .select(F.from_json(LATE, silver_schema, _JSON).alias("r")).select("r.*"),
                 "gold", query, batch_id, watermark_ms)


def found(silver_rows: DataFrame, late_for: str, query: str, batch_id: int, watermark_ms: int) -> DataFrame:
    """silver.late_events rows: silver rows late for `late_for`, and the batch that found them."""
    return (silver_rows
            .withColumn("late_for", F.lit(late_for))
            .withColumn("found_by_query", F.lit(query))
            .withColumn("found_in_batch", F.lit(batch_id).cast("long"))
            .withColumn("found_watermark", F.timestamp_millis(F.lit(watermark_ms)))
            .withColumn("backfilled_by", F.lit(None).cast("string"))
            .withColumn("backfilled_at", F.lit(None).cast("timestamp")))


def ensure(spark, cfg, silver_schema: StructType) -> str:
    return ensure_table(spark, cfg, "silver", TABLE, schema(silver_schema), (),
                        change_feed(cfg.silver.change_feed))
