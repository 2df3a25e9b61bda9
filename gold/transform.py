"""Gold transforms over silver.camera_events. Pure DataFrame functions, batch or streaming."""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def on_time(events: DataFrame, watermark: str) -> DataFrame:
    """Attach the event-time watermark and drop events behind it.

    Dedup on event_id is a no-op on silver (already unique) but makes this the first stateful
    operator: it drops late *events* and counts them (numRowsDroppedByWatermark) in event units.
    An aggregation would count late partial-aggregate rows instead. Events at or after the
    watermark always fall in windows ending after it, so the aggregations drop nothing more.
    """
    return events.withWatermark("event_time", watermark).dropDuplicatesWithinWatermark(["event_id"])


def hourly_sightings(events: DataFrame, window: str) -> DataFrame:
    """Person sightings per zip code per tumbling window (Databricks' nest-camera-stats)."""
    return (events
            .groupBy(F.window("event_time", window).alias("w"), "zip_code", "unknown_device")
            .agg(F.sum(F.col("has_person").cast("long")).alias("sightings"),
                 F.count(F.lit(1)).alias("events"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "zip_code", "unknown_device", "sightings", "events"))


def device_activity(events: DataFrame, window: str, slide: str) -> DataFrame:
    """Per device, sliding windows of event, motion, sound and person counts."""
    return (events
            .groupBy(F.window("event_time", window, slide).alias("w"), "device_id")
            .agg(F.count(F.lit(1)).alias("events"),
                 F.sum(F.col("has_motion").cast("long")).alias("motion_events"),
                 F.sum(F.col("has_sound").cast("long")).alias("sound_events"),
                 F.sum(F.col("has_person").cast("long")).alias("person_events"),
                 # The latest event's location, deterministically (last() depends on row order).
                 F.max_by("zip_code", "event_time").alias("zip_code"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "device_id", "zip_code", "events", "motion_events", "sound_events",
                    "person_events"))


def with_finalized(windows: DataFrame, watermark_ms: int) -> DataFrame:
    """A window is final once its end is at or behind the watermark: no later event can reach it."""
    wm = F.timestamp_millis(F.lit(watermark_ms))
    return windows.withColumn("finalized", F.col("window_end") <= wm)


def quality_view(table: str, df: DataFrame) -> DataFrame:
    """Columns the gold suite checks that are derived, not stored."""
    if "window_end" in df.columns:
        df = df.withColumn("window_seconds",
                           F.col("window_end").cast("long") - F.col("window_start").cast("long"))
    if "unknown_device" in df.columns:
        df = df.withColumn("zip_null_without_flag", F.col("zip_code").isNull() & ~F.col("unknown_device"))
    return df


def sightings_kafka_records(updates: DataFrame) -> DataFrame:
    """Rows for the compacted nest-camera-stats topic: key = zip + window (JSON), value = count."""
    key = F.to_json(F.struct(
        "zip_code",
        F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
        F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end")),
        # Keep "zip_code": null for unknown devices: every key has the same three fields.
        {"ignoreNullFields": "false"})
    return updates.select(key.alias("key"), F.col("sightings").cast("string").alias("value"))
