"""A streaming query's state, read from its checkpoint with Spark's state data sources.

`state-metadata` lists a checkpoint's stateful operators (id, name, partitions, batches kept);
`statestore` reads one operator's key-value rows as of the latest committed batch. Both are batch
reads of the checkpoint's files: they take no lock and change nothing, so they work beside the
running query. What the rows mean belongs to the operator's owner (gold.sessions decodes its
sessions, silver.transform its dedup keys); this module only finds and reads them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Operator:
    id: int
    name: str                # Spark's operator name: dedupeWithinWatermark, applyInPandasWithState...
    store: str
    partitions: int
    batch: int               # the latest committed batch whose state it holds


def operators(spark, checkpoint: str) -> list[Operator]:
    """The checkpoint's stateful operators that hold state; [] when it has none (or does not
    exist). An operator of a query that never committed a batch (killed in its first one) is
    described in the checkpoint but holds nothing yet: its latest batch is -1, which no state
    read accepts, and its restart starts it from nothing anyway."""
    from common.internals import has_state_folder

    if not has_state_folder(checkpoint):
        return []
    rows = spark.read.format("state-metadata").load(checkpoint).collect()
    return [Operator(r.operatorId, r.operatorName, r.stateStoreName, r.numPartitions, r.maxBatchId)
            for r in sorted(rows, key=lambda r: r.operatorId) if r.maxBatchId >= 0]


def rows(spark, checkpoint: str, op: Operator):
    """The operator's state as of its latest batch: columns key, value (structs), partition_id."""
    # Loading a store asks the driver's state store coordinator, which the session starts
    # with its streaming query manager: in a session that has run no query, asking for it does.
    spark.streams.active
    return (spark.read.format("statestore").option("operatorId", op.id).option("storeName", op.store)
            .option("batchId", op.batch).load(checkpoint))


def counts(spark, checkpoint: str) -> dict[str, int]:
    """Operator name -> keys it holds now."""
    return {op.name: rows(spark, checkpoint, op).count() for op in operators(spark, checkpoint)}
