"""Lineage of a streaming commit: which upstream prefix a micro-batch consumed.

Every silver and gold commit made by a micro-batch carries, as Delta commit user metadata, the
query, its checkpoint id, the batch id, the upstream table and the last upstream version the
batch had fully read, plus the watermarks it ran with. The values come from the query's offset
log, which Spark writes before the batch runs, so a replayed batch records the same lineage.

A reader of any table version can then rebuild the input prefix that produced it:
`VERSION AS OF <upstream.version>` of the upstream table (see audit/).
"""
from __future__ import annotations

import json

from common.storage import location

# Marks the commits this pipeline made, whatever the feed. Tables written before the mark was
# renamed carry "nest-lakehouse": their lineage is read the same.
PIPELINE = "lakehouse"
_MARKS = (PIPELINE, "nest-lakehouse")
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

# Delta source offsets (DeltaSourceOffset): index -1 (and the metadata-change markers below it)
# sit before the first file of `reservoirVersion`; END_INDEX sits after its last file.
_END_INDEX = 2**63 - 1 - 100


def checkpoint_query_id(checkpoint: str) -> str:
    """The id Spark keeps in the checkpoint: stable across restarts, new if the checkpoint is
    deleted. Keying appends on it means a fresh checkpoint never collides with the
    batch versions an old one already wrote."""
    return json.loads((location(checkpoint) / "metadata").read_text())["id"]


def last_logged_batch(checkpoint: str) -> int:
    """The highest batch id in the checkpoint's offset log; -1 without one."""
    folder = location(checkpoint) / "offsets"
    if not folder.is_dir():
        return -1
    return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=-1)


def offset_entry(checkpoint: str, batch_id: int) -> tuple[dict, list]:
    """(batch metadata, source offsets) of one batch from the offset log.

    The file is "v1", a JSON line of batch metadata (watermark, timestamp, conf), then one line
    per source: its end offset as JSON, or "-" when the source had none yet."""
    lines = (location(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    meta = json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}
    sources = [json.loads(line) if line.startswith("{") else None for line in lines[2:]]
    return meta, sources


def batch_watermark_ms(checkpoint: str, batch_id: int) -> int:
    """The event-time watermark this batch evicted state and timed out groups with."""
    meta, _ = offset_entry(checkpoint, batch_id)
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
        return offset_entry(checkpoint, batch_id)[1] == offset_entry(checkpoint, batch_id - 1)[1]
    except FileNotFoundError:  # offsets retention purged the one before: assume it read
        return False


def consumed_version(offset: dict | None) -> int | None:
    """Last upstream version a Delta source offset has read completely (-1: none); None when the
    batch stopped inside a version, so no snapshot equals what it read."""
    if offset is None:
        return -1
    version, index = int(offset["reservoirVersion"]), int(offset["index"])
    if index >= _END_INDEX:
        return version
    if index < 0:
        # A query's first batches read the table's snapshot at reservoirVersion
        # (isStartingVersion); before its first file nothing at all has been read.
        return -1 if offset.get("isStartingVersion") else version - 1
    return None


def batch_lineage(checkpoint: str, query: str, batch_id: int, upstream: str) -> dict:
    """Lineage of one micro-batch of a query with a single Delta source named `upstream`."""
    meta, sources = offset_entry(checkpoint, batch_id)
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


def to_user_metadata(lineage: dict) -> str:
    return json.dumps(lineage, sort_keys=True, separators=(",", ":"))


def parse(user_metadata: str | None) -> dict | None:
    """The lineage in a commit's user metadata, or None for commits the pipeline did not make."""
    if not user_metadata:
        return None
    try:
        value = json.loads(user_metadata)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("pipeline") in _MARKS else None
