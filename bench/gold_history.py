"""What a gold batch's fold and MERGE cost once a windowed table holds a long history: the
pipeline's bounded read and MERGE against the unbounded ones they replaced, on the same table.

    python -m bench.gold_history [-n 2000000] [--rounds 3] [--dir /tmp/gold-history]

Builds an hourly-sightings table of N finalized windows (1,000 zip codes an hour, 8 files) and
2,000 open ones (one file), then folds one batch of 2,000 windows into it (1,000 open ones
updated, 1,000 new) the way a gold batch does (`combine`, the sizes job, `merge`), alternately:
  bounded    the fold reads `transform.open_or_after` and the MERGE bounds t.window_start
  unbounded  the fold full-joins the whole table and the MERGE joins every file
each on its own copy of the table. Prints one line per fold and a JSON summary (medians).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from common.config import load_config
from common.spark import build_spark, stop
from gold import transform as T
from gold.kinds import LITERAL_TS
from gold.sinks import merge
from gold.tables import for_config

ZIPS = 1000


def windows(spark, lo: int, hi: int, final: bool, sightings: int = 1):
    """Hourly sightings rows numbered lo..hi: ZIPS zip codes an hour, from 2020-01-01."""
    return spark.sql(f"""SELECT
        timestamp'2020-01-01 00:00:00' + make_interval(0, 0, 0, 0, CAST(id DIV {ZIPS} AS INT), 0, 0) AS window_start,
        timestamp'2020-01-01 01:00:00' + make_interval(0, 0, 0, 0, CAST(id DIV {ZIPS} AS INT), 0, 0) AS window_end,
        CAST(id % {ZIPS} AS STRING) AS zip_code, false AS unknown_device, {sightings}L AS sightings,
        10L AS events, {str(final).lower()} AS finalized FROM range({lo}, {hi})""")


def fold(spark, cfg, spec, path: str, part, earliest: str, watermark_ms: int, bounded: bool) -> tuple[float, float]:
    """One batch's fold (plan, read, join, the sizes job) and MERGE; their seconds."""
    started = time.monotonic()
    current = DeltaTable.forPath(spark, path).toDF()
    if bounded:
        current = T.open_or_after(current, earliest)
    rows = T.with_finalized(T.combine(part, current, spec.keys, spec.measures, watermark_ms), watermark_ms).persist()
    first = rows.agg(F.count(F.lit(1)), F.date_format(F.min("window_start"), LITERAL_TS).alias("first")).first()["first"]
    folded = time.monotonic() - started
    started = time.monotonic()
    merge(spark, path, spec, rows.drop(T.CLOSING), watermark_ms, None, hint=first if bounded else None)
    merged = time.monotonic() - started
    rows.unpersist()
    return folded, merged


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gold_history", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--windows", type=int, default=2_000_000, help="finalized windows (default 2,000,000)")
    p.add_argument("--rounds", type=int, default=3, help="alternated bounded/unbounded pairs (default 3)")
    p.add_argument("--dir", default="/tmp/gold-history", help="scratch folder, emptied first")
    args = p.parse_args(argv)
    cfg = load_config()
    spark = build_spark(cfg, "bench-gold-history")
    spec = next((t for t in for_config(cfg) if t.key == "sightings"), None)
    if spec is None:
        p.error(f"profile {cfg.profile.name} has no `sightings` aggregation (this bench builds nest's hourly sightings)")
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    seed = str(root / "seed")
    windows(spark, 0, args.windows, True).repartition(8).write.format("delta").save(seed)
    windows(spark, args.windows, args.windows + 2 * ZIPS, False).coalesce(1).write.format("delta").mode("append").save(seed)
    part = windows(spark, args.windows + ZIPS, args.windows + 3 * ZIPS, False, 2).drop("finalized").cache()
    part.count()
    earliest = part.select(F.date_format(F.min("window_start"), LITERAL_TS)).first()[0]
    watermark_ms = spark.sql(f"SELECT unix_millis(TIMESTAMP '{earliest}')").first()[0] - 1
    times: dict[str, list[tuple[float, float]]] = {"bounded": [], "unbounded": []}
    for i in range(args.rounds):
        for name in ("bounded", "unbounded"):
            path = str(root / f"{name}-{i}")
            shutil.copytree(seed, path)
            f, m = fold(spark, cfg, spec, path, part, earliest, watermark_ms, name == "bounded")
            times[name].append((f, m))
            print(f"{name:9s} fold {f:5.2f} s  merge {m:5.2f} s", flush=True)
    summary = {name: {"fold_s": round(statistics.median(f for f, _ in t), 2),
                      "merge_s": round(statistics.median(m for _, m in t), 2)} for name, t in times.items()}
    print("GOLD_HISTORY " + json.dumps({"finalized_windows": args.windows, **summary}))
    stop(spark)
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
