"""ops.batch_accounting: one row per micro-batch per layer, written in two halves.

foreachBatch knows what it wrote (events written / quarantined, rows written); only the
query's progress knows what Spark dropped before foreachBatch saw the rows (duplicates, rows
behind the watermark) and what was observed upstream (records in). Both halves MERGE into the
same (layer, query, batch_id) row, each setting only its own columns, so either may land first
and a retried batch rewrites the same values.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from common.config import Config
from common.delta import OPS_LOCK, ensure_table
from common.schemas import BATCH_ACCOUNTING

KEYS = ("layer", "query", "batch_id")


def ensure_accounting(spark, cfg: Config) -> str:
    return ensure_table(spark, cfg, "ops", "batch_accounting", BATCH_ACCOUNTING)


def record(spark, cfg: Config, layer: str, query: str, batch_id: int, **counts) -> None:
    unknown = set(counts) - set(BATCH_ACCOUNTING.fieldNames())
    if unknown:
        raise KeyError(f"unknown accounting columns {sorted(unknown)}")
    row = {f: None for f in BATCH_ACCOUNTING.fieldNames()}
    row.update(layer=layer, query=query, batch_id=batch_id,
               recorded_at=datetime.now(timezone.utc), **counts)
    df = spark.createDataFrame([tuple(row[f] for f in BATCH_ACCOUNTING.fieldNames())], BATCH_ACCOUNTING)
    setters = {c: F.col(f"s.{c}") for c in ("recorded_at", *counts)}
    with OPS_LOCK:
        (DeltaTable.forPath(spark, cfg.table_path("ops", "batch_accounting")).alias("t")
         .merge(df.alias("s"), " AND ".join(f"t.{k} = s.{k}" for k in KEYS))
         .whenMatchedUpdate(set=setters)
         .whenNotMatchedInsertAll()
         .execute())


def executed_batches(query) -> list[dict]:
    """Progress reports, as dicts, of micro-batches that ran (idle heartbeats have no addBatch)."""
    reports = [p if isinstance(p, dict) else json.loads(p.json) for p in query.recentProgress]
    return [p for p in reports if "addBatch" in (p.get("durationMs") or {})]


def state_drops(progress: dict) -> dict[str, int]:
    """Rows Spark's stateful operators dropped in this batch, summed over operators."""
    late = dups = 0
    for op in progress.get("stateOperators") or []:
        late += int(op.get("numRowsDroppedByWatermark") or 0)
        dups += int((op.get("customMetrics") or {}).get("numDroppedDuplicateRows") or 0)
    return {"late_dropped": late, "duplicates_dropped": dups}


class ProgressRecorder:
    """Called on the driver thread between waits; records each executed batch's progress once."""

    def __init__(self, spark, cfg: Config, layer: str, to_counts):
        self.spark, self.cfg, self.layer, self.to_counts = spark, cfg, layer, to_counts
        self.seen: set[tuple[str, int]] = set()

    def __call__(self, query) -> None:
        for p in executed_batches(query):
            key = (p["name"], p["batchId"])
            if key in self.seen:
                continue
            record(self.spark, self.cfg, self.layer, p["name"], p["batchId"], **self.to_counts(p))
            self.seen.add(key)
