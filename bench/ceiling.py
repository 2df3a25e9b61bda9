"""The bare engine ceiling: what Spark alone does with the landing files on this machine.

The same binaryFile read and line split as bronze, the same explicit JSON schema and explode
as silver (the profile's: nest's cameras map by default), every declared field projected, into
the `noop` sink: no Delta, no typing, no dedup, no quality gate, no MERGE. Whatever the
pipeline does beyond this is its own cost.
"""
from __future__ import annotations

import time

from pyspark.sql import functions as F

from bronze.job import BINARY_FILE_SCHEMA
from bronze.transform import lines_from_files
from silver.transform import explodes_map, raw_schema


def raw_events(spark, landing: str, profile):
    files = spark.read.format("binaryFile").schema(BINARY_FILE_SCHEMA).load(landing)
    lines = lines_from_files(files)
    parsed = lines.select("file_path", "line_number", F.from_json("raw", raw_schema(profile)).alias("j"))
    if profile.explode_path:
        at = F.col("j." + ".".join(profile.explode_path))
        element = (F.explode_outer(at).alias("element_key", "el") if explodes_map(profile)
                   else F.explode_outer(at).alias("el"))
        parsed = parsed.select("*", element)
        root = "el"
    else:
        root = "j"
    # Every declared leaf is projected so the noop sink cannot prune the parse away.
    leaves = [F.col(".".join((root, *f.path))).alias(f.name) for f in profile.fields if f.type != "present"]
    return parsed.select("file_path", "line_number", *leaves)


def measure(spark, landing: str, events: int, profile) -> dict:
    """Time the noop write of every landing file; events/s is over the generated events."""
    started = time.monotonic()
    raw_events(spark, landing, profile).write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - started
    return {"seconds": round(seconds, 2), "events_per_s": round(events / seconds)}
