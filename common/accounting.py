"""ops.batch_accounting: one row per micro-batch per layer.

A row joins two views of the batch. foreachBatch knows what it wrote (events written or
quarantined) and leaves those counts in `stash`; only the query's progress, available once the
batch has committed, knows what Spark dropped before foreachBatch saw the rows (duplicates,
rows behind the watermark) and what was observed upstream (records in). The driver thread
writes the joined row as a Delta append keyed by (txnAppId, batch id), so it is written once.
If the process dies between a batch's commit and its accounting row, the row is written on
the next run from progress alone; foreachBatch's columns are then left NULL, never guessed.
"""
from __future__ import annotations

import json
import threading
from datetime import datetime, timezone

from common.config import Config
from common.delta import ensure_table, idempotent_append
from common.lineage import batch_lineage, checkpoint_query_id
from common.schemas import BATCH_ACCOUNTING


def ensure_accounting(spark, cfg: Config) -> str:
    return ensure_table(spark, cfg, "ops", "batch_accounting", BATCH_ACCOUNTING)


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


def observed(progress: dict, name: str) -> dict:
    seen = (progress.get("observedMetrics") or {}).get(name) or {}
    return seen.asDict() if hasattr(seen, "asDict") else dict(seen)


class Accounting:
    """Per-query accounting: foreachBatch calls `stash`, the driver loop calls the instance."""

    def __init__(self, spark, cfg: Config, layer: str, checkpoint: str, from_progress,
                 upstream: str | None = None):
        self.spark, self.cfg, self.layer, self.upstream = spark, cfg, layer, upstream
        self.checkpoint, self.from_progress = checkpoint, from_progress
        self.path = ensure_accounting(spark, cfg)
        self._stash: dict[int, dict] = {}
        self._lock = threading.Lock()
        self._recorded: set[int] = set()

    def stash(self, batch_id: int, **counts) -> None:
        with self._lock:
            self._stash[batch_id] = counts

    def __call__(self, query) -> None:
        for p in executed_batches(query):
            batch_id = p["batchId"]
            if batch_id in self._recorded:
                continue
            with self._lock:
                counts = self._stash.pop(batch_id, {})
            counts.update(self.from_progress(p))
            counts["batch_ms"] = int((p.get("durationMs") or {}).get("triggerExecution") or 0)
            self._write(p["name"], batch_id, counts)
            self._recorded.add(batch_id)

    def _write(self, query_name: str, batch_id: int, counts: dict) -> None:
        unknown = set(counts) - set(BATCH_ACCOUNTING.fieldNames())
        if unknown:
            raise KeyError(f"unknown accounting columns {sorted(unknown)}")
        row = {f: None for f in BATCH_ACCOUNTING.fieldNames()}
        row.update(counts, layer=self.layer, query=query_name, batch_id=batch_id,
                   recorded_at=datetime.now(timezone.utc))
        df = self.spark.createDataFrame([tuple(row[f] for f in BATCH_ACCOUNTING.fieldNames())],
                                        BATCH_ACCOUNTING)
        app_id = f"accounting-{query_name}-{checkpoint_query_id(self.checkpoint)}"
        idempotent_append(df, self.path, app_id, batch_id, metadata=self._lineage(query_name, batch_id))

    def _lineage(self, query_name: str, batch_id: int) -> dict | None:
        """The batch's lineage (the accounting audit needs the upstream prefix of the last batch,
        which may have written nothing else). None once offset retention has purged the batch."""
        if self.upstream is None:
            return None
        try:
            return batch_lineage(self.checkpoint, query_name, batch_id, self.upstream)
        except FileNotFoundError:
            return None
