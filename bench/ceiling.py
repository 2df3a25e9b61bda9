"""The bare engine ceiling: what Spark alone does with the landing files on this machine.

Two ways to get the lines, each with the same explicit JSON schema and explode as silver (the
profile's: nest's cameras map by default), every declared field projected, into the `noop`
sink: no Delta, no typing, no dedup, no quality gate, no MERGE.

  text         spark.read.text: Spark's own line reader (what a plain user would write)
  binary_file  bronze's binaryFile read and lossless line split (bronze/transform.py)

Each is run twice in the same session and its faster run kept (the first pays JIT and
code generation); the faster method is the ceiling. Whatever the pipeline does beyond this is
its own cost.
"""
from __future__ import annotations

import time

from pyspark.sql import functions as F

from bronze.job import BINARY_FILE_SCHEMA
from bronze.transform import lines_from_files
from silver.transform import explodes_map, raw_schema

RUNS = 2


def parse(lines, profile, *keep: str):
    """Lines (`raw`) -> one row per element, every declared leaf projected, plus `keep` columns."""
    parsed = lines.select(*keep, F.from_json("raw", raw_schema(profile)).alias("j"))
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
    return parsed.select(*keep, *leaves)


def text_events(spark, landing: str, profile):
    return parse(spark.read.text(landing).withColumnRenamed("value", "raw"), profile)


def binary_file_events(spark, landing: str, profile):
    files = spark.read.format("binaryFile").schema(BINARY_FILE_SCHEMA).load(landing)
    return parse(lines_from_files(files), profile, "file_path", "line_number")


METHODS = {"text": text_events, "binary_file": binary_file_events}


def measure(spark, landing: str, events: int, profile) -> dict:
    """Time the noop write of every landing file by each method; events/s is over the generated
    events. The top-level seconds and events_per_s are the faster method's."""
    methods = {}
    for name, build in METHODS.items():
        runs = []
        for _ in range(RUNS):
            started = time.monotonic()
            build(spark, landing, profile).write.format("noop").mode("overwrite").save()
            runs.append(time.monotonic() - started)
        best = min(runs)
        methods[name] = {"seconds": round(best, 2), "events_per_s": round(events / best),
                         "runs_s": [round(r, 2) for r in runs]}
    fastest = max(methods, key=lambda m: methods[m]["events_per_s"])
    return {"method": fastest, "seconds": methods[fastest]["seconds"],
            "events_per_s": methods[fastest]["events_per_s"], "methods": methods}
