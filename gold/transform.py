"""Gold transforms over silver.camera_events. Pure DataFrame functions, batch or streaming."""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from silver.transform import FRONTIER


def late(delay_seconds: float) -> Column:
    """An event more than `delay` behind the event-time frontier silver had reached when it
    arrived (silver's FRONTIER column). Decided from the row alone: counting late events keeps
    no per-event state, and whether an event is late does not depend on how gold's
    micro-batches were cut."""
    threshold = F.col(FRONTIER) - F.make_dt_interval(secs=F.lit(delay_seconds))
    return F.col(FRONTIER).isNotNull() & (F.col("event_time") <= threshold)


def on_time(events: DataFrame, watermark) -> DataFrame:
    """Drop late events (see `late`) and attach the event-time watermark (`watermark`: a
    Duration) that finalizes windows and closes sessions.

    Gold's own watermark is its latest event time minus the same delay, which never passes the
    frontier of rows it has yet to read, so the aggregations drop nothing more: gold's state is
    its open windows and sessions, and late events are counted in events, by the caller."""
    if watermark is None:
        # No watermark (gold.watermark: null): nothing is ever late and no window is final.
        return events
    return events.where(~late(watermark.seconds)).withWatermark("event_time", watermark.spark())


def windowed_aggregate(events: DataFrame, group, window: str, slide: str | None, measures) -> DataFrame:
    """Measures (Spark SQL aggregate expressions) per group per window: tumbling, or sliding by
    `slide`. Columns: window_start, window_end, the group columns, the measures in order.
    Nest's hourly sightings per zip code (Databricks' nest-camera-stats) is one of these."""
    w = F.window("event_time", window, slide) if slide else F.window("event_time", window)
    return (events.groupBy(w.alias("w"), *group)
            .agg(*[F.expr(expression).alias(name) for name, expression in measures])
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    *group, *[name for name, _ in measures]))


def with_finalized(windows: DataFrame, watermark_ms: int) -> DataFrame:
    """A window is final once its end is at or behind the watermark: no later event can reach it."""
    return windows.withColumn("finalized", _final(watermark_ms))


def finalizing(table: DataFrame, watermark_ms: int) -> DataFrame:
    """Rows of a windowed gold table that the watermark has made final but that are not marked
    so yet, marked: batches that only move the watermark write nothing, so the next MERGE does."""
    return table.where(~F.col("finalized") & _final(watermark_ms)).withColumn("finalized", F.lit(True))


def _final(watermark_ms: int):
    return F.col("window_end") <= F.timestamp_millis(F.lit(watermark_ms))


def quality_view(df: DataFrame, dimension=None) -> DataFrame:
    """Columns the gold suite checks that are derived, not stored: window_seconds, and for each
    column of the profile's dimension join the table carries, `<column>_null_without_flag`
    (true where it is NULL although the dimension flag says the join matched)."""
    if "window_end" in df.columns:
        df = df.withColumn("window_seconds",
                           F.col("window_end").cast("long") - F.col("window_start").cast("long"))
    if dimension is not None and dimension.flag in df.columns:
        for col in dimension.columns:
            if col in df.columns:
                df = df.withColumn(f"{col}_null_without_flag",
                                   F.col(col).isNull() & ~F.col(dimension.flag))
    return df


def stats_kafka_records(updates: DataFrame, key_columns, value: str) -> DataFrame:
    """Rows for the compacted stats topic: key = key columns + window (JSON), value = the measure
    (nest: zip code + hour -> sightings)."""
    key = F.to_json(F.struct(
        *key_columns,
        F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
        F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end")),
        # Keep e.g. "zip_code": null for unknown devices: every key has the same fields.
        {"ignoreNullFields": "false"})
    return updates.select(key.alias("key"), F.col(value).cast("string").alias("value"))

