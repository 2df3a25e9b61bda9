"""The bare engine ceiling: what Spark alone does with the landing files on this machine.

The same binaryFile read and line split as bronze, the same explicit JSON schema and cameras
explode as silver, into the `noop` sink: no Delta, no dedup, no quality gate, no MERGE.
Whatever the pipeline does beyond this is its own cost.
"""
from __future__ import annotations

import time

from pyspark.sql import functions as F

from bronze.job import BINARY_FILE_SCHEMA
from bronze.transform import lines_from_files
from silver.transform import NEST_SCHEMA


def raw_events(spark, landing: str):
    files = spark.read.format("binaryFile").schema(BINARY_FILE_SCHEMA).load(landing)
    lines = lines_from_files(files)
    parsed = lines.select("file_path", "line_number", F.from_json("raw", NEST_SCHEMA).alias("j"))
    cams = parsed.select("file_path", "line_number",
                         F.explode_outer("j.devices.cameras").alias("camera_key", "cam"))
    le = F.col("cam.last_event")
    # Every leaf is projected so the noop sink cannot prune the parse away.
    return cams.select("file_path", "line_number", "camera_key", "cam.device_id", "cam.name",
                       "cam.is_online", le.has_sound, le.has_motion, le.has_person,
                       le.start_time, le.end_time)


def measure(spark, landing: str, events: int) -> dict:
    """Time the noop write of every landing file; events/s is over the generated events."""
    started = time.monotonic()
    raw_events(spark, landing).write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - started
    return {"seconds": round(seconds, 2), "events_per_s": round(events / seconds)}
