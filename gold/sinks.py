"""Where a gold batch's rows go, declared (common/outputs.py): each table by MERGE with its
kind's clauses (into an empty table, an idempotent append keyed by the batch), what a batch
without events closes by an UPDATE of the table in place, and the updated rows of a table that
publishes to the compacted stats topic."""
from __future__ import annotations

from functools import partial

from pyspark.sql import DataFrame

from common.outputs import Changed, Merge, Publish, Update
from gold import transform as T
from gold.kinds import GoldTable

# The key suffix of a batch's commit to each gold table (with the batch id as its version): one
# commit per table per batch, so the table's history tells whether the batch wrote it.
KEY = "gold"


def outputs(cfg, spec: GoldTable) -> tuple:
    """A table's outputs: its MERGE by key, its closing UPDATE, and its stats when the table
    publishes them."""
    path = cfg.table_path("gold", spec.table)
    declared = (Merge(spec.table, path, spec.keys, spec.merge, spec.live, KEY, pinned=True),
                Update(closing(spec), path, spec.close))
    if spec.publish and cfg.gold.stats_to_kafka:
        return (*declared, Publish(stats(spec), partial(publish_stats, cfg, spec)))
    return declared


def stats(spec: GoldTable) -> str:
    """The name of a table's stats output."""
    return f"{spec.table} stats"


def closing(spec: GoldTable) -> str:
    """The name of a table's closing UPDATE output."""
    return f"{spec.table} closing"


def merge(spark, path: str, spec: GoldTable, rows: DataFrame, watermark_ms: int, ctx,
          hint: str | None = None) -> None:
    """One table's MERGE as a batch makes it, alone (tests and the bench time it)."""
    out = Merge(spec.table, path, spec.keys, spec.merge, spec.live, KEY)
    out.writer(Changed(rows, dict(watermark_ms=watermark_ms, hint=hint)), ctx)()


def publish_stats(cfg, spec: GoldTable, updates: DataFrame) -> None:
    """Updated window values to the compacted stats topic. A replayed batch re-sends the same
    key with the same value, which compaction collapses."""
    (T.stats_kafka_records(updates, *spec.publish).write.format("kafka")
     .option("kafka.bootstrap.servers", cfg.kafka.bootstrap_servers)
     .option("topic", cfg.kafka.topics.stats).save())
