"""ops.batch_accounting: one row per micro-batch per layer, written before the batch commits.

A row joins two views of the batch. foreachBatch knows what it wrote (events written or
quarantined); the query's own execution knows what Spark dropped before foreachBatch saw the
rows (duplicates, rows behind the watermark) and what was observed upstream (records in).
Spark only publishes the latter in the query progress, after the batch has committed, so a
process killed between the commit and that report would lose the batch's drops for good: the
batch is never replayed. Instead foreachBatch reads the same metrics from the batch's executed
plan once it has evaluated the batch, and appends the row keyed by (app id, batch id) before
returning. A replay of an uncommitted batch re-runs it with the same offsets and state, and
finds the first append's key (common.delta.idempotent_append).
"""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone

from common.errors import LakehouseError
from common.config import Config
from common.delta import ensure_table, idempotent_append
from common.literal_frame import local_frame
from common.internals import running_execution
from common.lineage import checkpoint_query_id
from common.schemas import BATCH_ACCOUNTING

log = logging.getLogger(__name__)


class AccountingError(LakehouseError, RuntimeError):
    """The running batch's execution could not be read; the batch fails instead of committing
    without its accounting row."""


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


def active_query(spark, query_name: str):
    found = [q for q in spark.streams.active if q.name == query_name]
    if len(found) != 1:
        raise AccountingError(f"{len(found)} active queries named {query_name!r}, expected 1")
    return found[0]


def running_batch(spark, query_name: str, batch_id: int) -> dict:
    """The running batch's metrics, shaped like its future progress report (stateOperators,
    observedMetrics, durationMs.triggerExecution so far). Call it from foreachBatch after the
    batch DataFrame has been evaluated in full: the metrics are Spark's own SQL metrics of the
    batch's executed plan, the ones the progress report will be built from."""
    execution = running_execution(spark, active_query(spark, query_name))
    if execution.batch_id != batch_id:
        raise AccountingError(f"{query_name}: execution context is batch {execution.batch_id}, "
                              f"foreachBatch got {batch_id}")
    elapsed = int(time.time() * 1000) - execution.trigger_start_ms
    return {"name": query_name, "batchId": batch_id, "stateOperators": execution.state_operators,
            "observedMetrics": execution.observed, "durationMs": {"triggerExecution": elapsed}}


class Accounting:
    """Per-query accounting; foreachBatch calls `record` as its last step."""

    def __init__(self, spark, cfg: Config, layer: str, checkpoint: str, from_progress):
        self.spark, self.cfg, self.layer = spark, cfg, layer
        self.checkpoint, self.from_progress = checkpoint, from_progress
        self.path = ensure_accounting(spark, cfg)
        self._app_id = None

    def record(self, query_name: str, batch_id: int, lineage: dict | None = None, replay: bool = True,
               **written) -> None:
        """Append the batch's row: `written` (foreachBatch's own counts) plus Spark's metrics,
        with the batch's lineage as commit metadata (the audit reads the lineage of batches that
        committed nothing else from here). batch_ms is the trigger up to this point; only the
        commit-log write comes after it."""
        progress = running_batch(self.spark, query_name, batch_id)
        counts = {**written, **self.from_progress(progress)}
        counts["batch_ms"] = progress["durationMs"]["triggerExecution"]
        self._write(query_name, batch_id, counts, lineage, replay)
        if counts.get("late_dropped"):
            log.info(self.late_line(query_name, batch_id, counts["late_dropped"]))

    def late_line(self, query_name: str, batch_id: int, late: int) -> str:
        """What a batch that kept late events says: a backlog arriving behind the watermark (a
        camera back online) is otherwise only a row count that does not reach the next layer."""
        from common.late import folded_by

        return (f"{query_name} batch {batch_id}: {late:,} late event{'s' if late != 1 else ''}, behind "
                f"{self.layer}'s watermark, kept in silver.late_events; {folded_by(self.cfg)}")

    def late_dropped(self, query_name: str, batch_id: int) -> int:
        """Rows Spark's stateful operators have dropped as late in the running batch so far (all
        of them once the batch has been evaluated)."""
        return state_drops(running_batch(self.spark, query_name, batch_id))["late_dropped"]

    def _write(self, query_name: str, batch_id: int, counts: dict, lineage: dict | None,
               replay: bool = True) -> None:
        unknown = set(counts) - set(BATCH_ACCOUNTING.fieldNames())
        if unknown:
            raise KeyError(f"unknown accounting columns {sorted(unknown)}")
        row = {f: None for f in BATCH_ACCOUNTING.fieldNames()}
        row.update(counts, layer=self.layer, query=query_name, batch_id=batch_id,
                   recorded_at=datetime.now(timezone.utc), query_id=(lineage or {}).get("query_id"))
        df = local_frame(self.spark, [tuple(row[f] for f in BATCH_ACCOUNTING.fieldNames())],
                         BATCH_ACCOUNTING)
        if self._app_id is None:      # the checkpoint's id is fixed while the query runs
            self._app_id = f"accounting-{query_name}-{checkpoint_query_id(self.checkpoint)}"
        idempotent_append(df, self.path, self._app_id, batch_id, lineage, replay)
