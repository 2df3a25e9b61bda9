"""How a streaming query starts reading a Delta table.

Started without an offset, Delta's source reads the table's current snapshot first: it lists the
snapshot's files in Spark jobs (a sort of every file by time and path), cached for the query. On a
fresh lakehouse that listing was the longest part of silver's and gold's first batch before any
row was read (latestOffset 1.4 s and 0.6 s of a 20,000-event `run-all`, on a JVM still cold).

A table whose whole history is still in its log as appends (no commit removed or rewrote a file,
the schema is its creation's) holds exactly the files those commits added, in commit order. Read
from version 0 (`startingVersion`), the source takes them from the commit files, which Delta's
snapshot has just read anyway (the table has no log checkpoint yet), and plans no job for it: the
same rows, fewer jobs. Any other history keeps Delta's default, the snapshot: a file removed
(OPTIMIZE, DELETE, RESTORE, an overwrite such as `lakehouse refresh`'s switch) could be gone from
storage after VACUUM, or would make the source fail on a deleted row; a schema changed on the way
would make it stop at the change; a log with a checkpoint may have lost its first commits.
"""
from __future__ import annotations

import json
import re

from common.lineage import last_logged_batch
from common.storage import location

COMMIT = re.compile(r"^(\d{20})\.json$")
# Actions that neither add nor remove rows nor change the table's shape.
NEUTRAL = {"commitInfo", "txn", "domainMetadata"}


def delta_stream(spark, table_path: str, checkpoint: str, max_files: int):
    """The streaming read of the Delta table at `table_path` by the query whose checkpoint is
    `checkpoint`, `max_files` of the table's files per micro-batch at most."""
    return (spark.readStream.format("delta").option("maxFilesPerTrigger", max_files)
            .options(**start_options(checkpoint, table_path)).load(table_path))


def start_options(checkpoint: str, table_path: str) -> dict[str, str]:
    """Reader options for the streaming read of the Delta table at `table_path` by the query
    whose checkpoint is `checkpoint`: `startingVersion` 0 when the query has not started yet and
    the table's history is appends only (see the module); otherwise none (Delta's default, or
    where the checkpoint's offsets say, which ignore the option anyway)."""
    if last_logged_batch(checkpoint) >= 0:
        return {}
    return {"startingVersion": "0"} if appends_only(table_path) else {}


def appends_only(table_path: str) -> bool:
    """Whether the table's log holds every commit since its creation, none with a log checkpoint,
    and each after the creation only adds files (as new data) with no change to its metadata."""
    log = location(table_path) / "_delta_log"
    try:
        names = [p.name for p in log.iterdir()]
    except FileNotFoundError:
        return False
    if any(n == "_last_checkpoint" or ".checkpoint" in n for n in names):
        return False
    versions = sorted(int(m.group(1)) for m in map(COMMIT.match, names) if m)
    if not versions or versions != list(range(len(versions))):
        return False
    for version in versions:
        try:
            text = (log / f"{version:020d}.json").read_text()
        except FileNotFoundError:          # cleaned up after we listed it: the snapshot decides
            return False
        for line in text.splitlines():
            if line.strip() and not _appends(json.loads(line), version):
                return False
    return True


def _appends(action: dict, version: int) -> bool:
    if len(action) != 1:
        return False
    (kind, body), = action.items()
    if kind in NEUTRAL:
        return True
    if kind in ("protocol", "metaData"):
        return version == 0
    if kind == "add":
        return body.get("dataChange", True) and not body.get("deletionVector")
    return False                           # remove, cdc and anything newer
