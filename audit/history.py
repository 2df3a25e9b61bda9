"""Per-version history of a Delta table: operation, rows added and removed, lineage."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.lineage import parse


@dataclass
class Version:
    version: int
    timestamp: object                 # datetime
    operation: str
    rows_added: int | None
    rows_removed: int | None
    lineage: dict | None              # the micro-batch that made it, None for other commits
    parameters: dict = field(default_factory=dict)
    tool: str = ""                    # a pipeline command that is not a stream (seed-locations)
    backfill: str | None = None       # the id of the backfill that made it (gold/backfill.py)

    @property
    def upstream(self) -> str:
        # Bronze reads files or a topic, not a table: its batches have no upstream version.
        up = (self.lineage or {}).get("upstream")
        if not up:
            return ""
        version = "partial" if up["version"] is None else up["version"]
        return f"{up['table']}@{version}"

    @property
    def made_by(self) -> str:
        if self.lineage:
            return f"{self.lineage['query']}#{self.lineage['batch_id']}"
        if self.tool:
            return self.tool
        return "" if self.operation == "CREATE TABLE" else "outside the pipeline"

    def as_dict(self) -> dict:
        return {"version": self.version, "timestamp": str(self.timestamp),
                "operation": self.operation, "rows_added": self.rows_added,
                "rows_removed": self.rows_removed, "made_by": self.made_by or None,
                "upstream": (self.lineage or {}).get("upstream"),
                "lineage": self.lineage}


def _int(metrics: dict, *keys: str) -> int:
    return sum(int(metrics.get(k) or 0) for k in keys)


def row_changes(operation: str, metrics: dict) -> tuple[int | None, int | None]:
    """Rows added and removed by one commit, from its operation metrics. An updated row counts as
    one removed and one added; rows a rewrite merely copies count as neither. None when the
    operation has no row metrics (RESTORE, ...): the caller diffs the versions instead."""
    if operation in ("CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES",
                     "ADD CONSTRAINT", "DROP CONSTRAINT"):
        return 0, 0
    if operation in ("WRITE", "STREAMING UPDATE", "CREATE TABLE AS SELECT") and "numOutputRows" in metrics:
        return _int(metrics, "numOutputRows"), 0
    if operation == "MERGE":
        return (_int(metrics, "numTargetRowsInserted", "numTargetRowsUpdated"),
                _int(metrics, "numTargetRowsUpdated", "numTargetRowsDeleted"))
    if operation == "DELETE" and "numDeletedRows" in metrics:
        return 0, _int(metrics, "numDeletedRows")
    if operation == "UPDATE" and "numUpdatedRows" in metrics:
        n = _int(metrics, "numUpdatedRows")
        return n, n
    return None, None


def read_version(spark, path: str, version: int):
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def table_history(spark, path: str) -> list[Version]:
    from delta.tables import DeltaTable

    rows = (DeltaTable.forPath(spark, path).history()
            .select("version", "timestamp", "operation", "operationParameters",
                    "operationMetrics", "userMetadata")
            .orderBy("version").collect())
    history = []
    for r in rows:
        metrics = dict(r.operationMetrics or {})
        added, removed = row_changes(r.operation, metrics)
        if added is None and r.version > 0:
            # Overwrites, RESTORE and the like: count the multiset difference itself.
            before, after = read_version(spark, path, r.version - 1), read_version(spark, path, r.version)
            # A column the commit added (schema evolution: a refresh's new field) is no row change.
            common = [c for c in after.columns if c in set(before.columns)]
            before, after = before.select(*common), after.select(*common)
            added, removed = after.exceptAll(before).count(), before.exceptAll(after).count()
        tagged = parse(r.userMetadata) or {}
        history.append(Version(r.version, r.timestamp, r.operation, added, removed,
                               tagged if made_by_batch(tagged) else None,
                               dict(r.operationParameters or {}), _tool(tagged),
                               (tagged.get("backfill") or {}).get("id")))
    return history


def made_by_batch(tagged: dict) -> bool:
    """Whether the pipeline's commit was made by a micro-batch: silver and gold batches record
    their upstream table too, bronze's the query, the batch and its source's offset."""
    return "query" in tagged and isinstance(tagged.get("batch_id"), int)


def _tool(tagged: dict) -> str:
    if "migration" in tagged:       # common.raw_bytes: the pipeline moving bytes at start-up
        return f"migration ({tagged['migration']})"
    return tagged.get("made_by", "")
