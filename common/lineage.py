"""Lineage of a streaming commit: which upstream prefix a micro-batch consumed.

Every silver and gold commit made by a micro-batch carries, as Delta commit user metadata, the
query, its checkpoint id, the batch id, the upstream table and the last upstream version the
batch had fully read, plus the watermarks it ran with; bronze's carry the source (files or
Kafka) and the offsets the batch read instead of a table. The values come from the query's offset
log, which Spark writes before the batch runs, so a replayed batch records the same lineage.

A reader of any table version can then rebuild the input prefix that produced it:
`VERSION AS OF <upstream.version>` of the upstream table (see audit/).
"""
from __future__ import annotations

import json

from common.internals import checkpoint_id, logged_batches, offset_log_entry
from common.internals import delta_offset_read_through as consumed_version

# Marks the commits this pipeline made, whatever the feed. Tables written before the mark was
# renamed carry "nest-lakehouse": their lineage is read the same.
PIPELINE = "lakehouse"
_MARKS = (PIPELINE, "nest-lakehouse")
# A gold batch's closing watermark (gold/job.py closing_watermark): what its rows are final or
# closed by. Commits made before it existed closed by their batch's own watermark_ms.
CLOSES = "closes_ms"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def checkpoint_query_id(checkpoint: str) -> str:
    """The id Spark keeps in the checkpoint: stable across restarts, new if the checkpoint is
    deleted. Keying appends on it means a fresh checkpoint never collides with the
    batch versions an old one already wrote."""
    found = checkpoint_id(checkpoint)
    if found is None:
        raise FileNotFoundError(f"{checkpoint}: no query has started on this checkpoint (no id yet)")
    return found


def last_logged_batch(checkpoint: str) -> int:
    """The highest batch id in the checkpoint's offset log; -1 without one."""
    return max(logged_batches(checkpoint), default=-1)


def batch_watermark_ms(checkpoint: str, batch_id: int) -> int:
    """The event-time watermark this batch evicted state and timed out groups with."""
    meta, _ = offset_log_entry(checkpoint, batch_id)
    return int(meta.get("batchWatermarkMs") or 0)


def late_watermark_ms(checkpoint: str, batch_id: int) -> int:
    """The watermark this batch filtered late input rows with: Spark drops a row as too late
    against the previous batch's watermark, not the one computed for this batch."""
    if batch_id == 0:
        return 0
    try:
        return batch_watermark_ms(checkpoint, batch_id - 1)
    except FileNotFoundError:  # offsets retention purged it; the batch itself is still there
        return batch_watermark_ms(checkpoint, batch_id)


def read_nothing(checkpoint: str, batch_id: int) -> bool:
    """Whether the batch is a no-data batch: its source offsets are those of the batch before
    (Spark runs one only to move the watermark: evict state, finalize, time out). Decided from
    the offset log, so a replay answers the same. Such a batch drops no input row, so it has no
    count to book; what it changes in a table is in that commit's own lineage."""
    if batch_id == 0:
        return False
    try:
        return offset_log_entry(checkpoint, batch_id)[1] == offset_log_entry(checkpoint, batch_id - 1)[1]
    except FileNotFoundError:  # offsets retention purged the one before: assume it read
        return False


def batch_lineage(checkpoint: str, query: str, batch_id: int, upstream: str) -> dict:
    """Lineage of one micro-batch of a query with a single Delta source named `upstream`."""
    meta, sources = offset_log_entry(checkpoint, batch_id)
    offset = sources[0] if sources else None
    lineage = {
        "pipeline": PIPELINE, "query": query, "query_id": checkpoint_query_id(checkpoint),
        "batch_id": batch_id,
        "upstream": {"table": upstream, "version": consumed_version(offset),
                     "offset": None if offset is None else
                     {k: offset.get(k) for k in ("reservoirVersion", "index", "isStartingVersion")}},
        "watermark_ms": int(meta.get("batchWatermarkMs") or 0),
        "late_watermark_ms": late_watermark_ms(checkpoint, batch_id),
    }
    return lineage


def source_lineage(checkpoint: str, query: str, batch_id: int, source: str) -> dict:
    """Lineage of one micro-batch of a query reading outside the lakehouse (bronze: landing files
    or a Kafka topic): the source and the end offset the offset log holds for the batch (the
    file source's log entry, or the topic's offset per partition), which a replay reads the
    same. There is no upstream table, so no `upstream`: the audit names no version for it."""
    _, sources = offset_log_entry(checkpoint, batch_id)
    return {"pipeline": PIPELINE, "query": query, "query_id": checkpoint_query_id(checkpoint),
            "batch_id": batch_id, "source": {"kind": source, "offset": sources[0] if sources else None}}


def to_user_metadata(lineage: dict) -> str:
    return json.dumps(lineage, sort_keys=True, separators=(",", ":"))


def closes_ms(lineage: dict) -> int:
    """The watermark a gold batch's rows are final or closed by."""
    return int(lineage.get(CLOSES, lineage["watermark_ms"]))


def parse(user_metadata: str | None) -> dict | None:
    """The lineage in a commit's user metadata, or None for commits the pipeline did not make."""
    if not user_metadata:
        return None
    try:
        value = json.loads(user_metadata)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("pipeline") in _MARKS else None
