"""Silver's dimension columns proven: every silver row carries what the point-in-time join of its
event against the dimension version its batch pinned gives (silver/job.py pins it in the batch's
lineage, `dimensions`). Gold's prefix audit recomputes gold from silver's rows as they are; this
check proves those rows' zip codes, with the same join (silver.transform.join_dimension) over the
same dimension version (`VERSION AS OF`) the batch read.

One join per pinned dimension version (a load makes one; few in all) over the rows of the batches
that pinned it. Rows of batches without a pin (a lakehouse from before the pins) are counted,
not checked.
"""
from __future__ import annotations

from pyspark.sql import functions as F

from silver.transform import join_dimension

SAMPLE = 5


def pins(silver_history) -> dict[int, int]:
    """silver_batch_id -> the dimension version its committed write joined."""
    out = {}
    for v in silver_history:
        refresh = (v.lineage or {}).get("refresh") or {}
        if refresh.get("layer") == "silver":     # every row replaced: the rebuild's batches' pins
            out = {int(b): version for b, version in (refresh.get("pins") or {}).items()}
            continue
        dims = (v.lineage or {}).get("dimensions")
        if dims and v.lineage.get("batch_id") is not None:
            out[v.lineage["batch_id"]] = next(iter(dims.values()))
    return out


def check_attribution(spark, cfg, silver_path: str, silver_history) -> dict:
    dim = cfg.profile.dimension
    dim_path = cfg.table_path("silver", dim.table)
    by_batch = pins(silver_history)
    silver = spark.read.format("delta").load(silver_path)
    was = [F.col(c).alias(f"_was_{c}") for c in (*dim.columns, dim.flag)]
    rows = silver.select(dim.key, "event_time", "silver_batch_id", *was)
    differ, checked, sample = 0, 0, []
    for version in sorted(set(by_batch.values())):
        batches = [b for b, v in by_batch.items() if v == version]
        mine = rows.where(F.col("silver_batch_id").isin(batches))
        history = spark.read.format("delta").option("versionAsOf", version).load(dim_path)
        joined = join_dimension(mine, history, cfg.profile)
        same = F.lit(True)
        for c in (*dim.columns, dim.flag):
            same = same & F.col(c).eqNullSafe(F.col(f"_was_{c}"))
        counts = joined.agg(F.count(F.lit(1)).alias("n"), F.count(F.when(~same, 1)).alias("bad")).first()
        checked, differ = checked + counts.n, differ + counts.bad
        if counts.bad and len(sample) < SAMPLE:
            sample += [{**r.asDict(), "dimension_version": version} for r in
                       joined.where(~same).limit(SAMPLE - len(sample)).collect()]
    unpinned = silver.where(~F.col("silver_batch_id").isin(list(by_batch)) if by_batch else F.lit(True)).count()
    return {"table": f"silver.{dim.table}", "rows_checked": checked, "rows_differ": differ,
            "rows_unpinned": unpinned, "dimension_versions": sorted(set(by_batch.values())),
            "status": "FAIL" if differ else "PASS", "sample": [{k: str(v) for k, v in s.items()} for s in sample]}
