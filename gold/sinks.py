"""Where a gold batch's rows go: each table, by MERGE (its kind's clauses) or, into an empty
table, by an idempotent append; and the compacted stats topic."""
from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame

from common.batch import BatchContext
from common.delta import idempotent_append, live_files, retry_on_conflict
from gold import transform as T
from gold.kinds import GoldTable


def merge(spark, path: str, spec: GoldTable, rows: DataFrame, watermark_ms: int, ctx: BatchContext,
          hint: str | None = None, stale_behind: bool = False) -> None:
    """MERGE the batch's updated rows into a table (the kind's clauses). A conflict with a
    concurrent compaction (make maintain, the runner's maintenance) replans and retries: the
    rows are computed already, and compaction does not change the table's rows.

    Into an empty table (a fresh lakehouse's first batch, the whole of a first available-now
    run) every row is an insert, so an append keyed by the batch does the MERGE's work without
    its joins. The commit's metadata (lineage and key) is the batch's session conf, set by the
    caller for every table at once: MERGE has no writer option, and one session conf set per
    table by concurrent writes would race."""
    if live_files(spark, path) == 0:
        idempotent_append(spec.live(rows), path, batch_key(ctx), ctx.batch_id, ctx.lineage, ctx.replay)
        return
    retry_on_conflict(lambda: spec.merge(DeltaTable.forPath(spark, path), rows, watermark_ms, hint, stale_behind))


def batch_key(ctx: BatchContext) -> str:
    """The key of the batch's commit to each gold table (with the batch id as its version):
    one commit per table per batch, so the table's history tells whether the batch wrote it."""
    return f"{ctx.app_id}-gold"


def publish_stats(cfg, spec: GoldTable, updates: DataFrame) -> None:
    """Updated window values to the compacted stats topic. A replayed batch re-sends the same
    key with the same value, which compaction collapses."""
    (T.stats_kafka_records(updates, *spec.publish).write.format("kafka")
     .option("kafka.bootstrap.servers", cfg.kafka.bootstrap_servers)
     .option("topic", cfg.kafka.topics.stats).save())
