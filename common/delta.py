"""Delta helpers every layer uses: create-if-missing with a fixed schema, idempotent writes,
commit metadata."""
from __future__ import annotations

import logging
from contextlib import contextmanager

from delta.tables import DeltaTable

from common.catalog import register_table
from common.config import Config
from common.internals import (api_moved, delta_column_names, delta_file_count, delta_properties,
                              delta_version)
from common.lineage import USER_METADATA_CONF, to_user_metadata
from common.raw_bytes import migrate as migrate_raw_bytes
from common.storage import remove_uncommitted_log

logger = logging.getLogger(__name__)


def retention_properties(cfg: Config) -> dict[str, str]:
    """Delta properties every lakehouse table carries, from conf maintenance.*: small files are
    compacted after the commit that makes too many, and the log and removed files are kept at
    least as long as the audit must prove old versions."""
    m = cfg.maintenance
    return {
        "delta.autoOptimize.autoCompact": str(m.auto_compact).lower(),
        "delta.logRetentionDuration": _interval(m.log_retention),
        "delta.deletedFileRetentionDuration": _interval(m.audit_horizon),
        "delta.checkpointInterval": str(m.checkpoint_interval),
    }


def change_feed(on: bool) -> dict[str, str]:
    """The table property of Delta's change data feed. A table that turns it on records
    inserts, updates and deletes from that version on (a MERGE also writes the changed rows'
    pre- and post-images beside its data files)."""
    return {"delta.enableChangeDataFeed": str(on).lower()}


def skipping_stats(columns: list[str]) -> dict[str, str]:
    """The table property that keeps Delta's per-file statistics (min, max, null count) for
    these columns only: a file skipped by a filter on another column is never skipped anyway,
    and collecting them for every column cost a 200,000-row append a third of its time."""
    return {"delta.dataSkippingStatsColumns": ",".join(columns)}


def _interval(duration) -> str:
    return f"interval {int(duration.seconds)} seconds"


def table_properties(spark, path: str) -> dict[str, str]:
    """The table's properties from its cached snapshot: DESCRIBE DETAIL or SHOW TBLPROPERTIES
    run a job (about 2 s each, on every start, for every table)."""
    try:
        return delta_properties(spark, path)
    except api_moved():     # an internal API: if a Delta upgrade moves it, pay for the job
        return dict(DeltaTable.forPath(spark, path).detail().first()["properties"] or {})


def table_version(spark, path: str) -> int:
    """The table's latest version, from its cached snapshot (DESCRIBE HISTORY runs a job: about
    0.3 s, on every silver batch that pins its dimension)."""
    try:
        return delta_version(spark, path)
    except api_moved():
        return DeltaTable.forPath(spark, path).history(1).first().version


def live_files(spark, path: str) -> int:
    """How many files the table's latest snapshot holds, from the cached snapshot (no job)."""
    try:
        return delta_file_count(spark, path)
    except api_moved():
        return int(DeltaTable.forPath(spark, path).detail().first()["numFiles"])


def align_properties(spark, path: str, wanted: dict[str, str]) -> dict[str, str]:
    """Set the properties that differ; returns them. A metadata commit: concurrent writers of
    the table would fail theirs, so only a process that holds the table's writers (a starting
    pipeline) calls this."""
    have = table_properties(spark, path)
    changed = {k: v for k, v in wanted.items() if have.get(k) != v}
    if changed:
        pairs = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(changed.items()))
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")
    return changed


CONSTRAINT = "delta.constraints."      # how Delta keeps a CHECK constraint in the table's metadata


def align_constraints(spark, path: str, wanted: dict[str, str]) -> list[str]:
    """Add the CHECK constraints (name -> expression) the table lacks, and replace those whose
    expression changed; constraints of other names (added by hand) are left alone. Adding one
    checks every row the table holds, so a table that breaks it fails here, naming it. Returns
    the names added or replaced. A metadata commit each, made at start-up like align_properties."""
    have = {k: v for k, v in table_properties(spark, path).items() if k.startswith(CONSTRAINT)}
    done = []
    for name, sql in wanted.items():
        key = CONSTRAINT + name.lower()          # Delta folds the name to lower case
        if have.get(key) == sql:
            continue
        if key in have:
            spark.sql(f"ALTER TABLE delta.`{path}` DROP CONSTRAINT `{name}`")
        spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT `{name}` CHECK ({sql})")
        done.append(name)
    return done


def add_missing_columns(spark, path: str, schema) -> list[str]:
    """Add the columns of `schema` the table lacks (a table made by an older version of the
    code); returns their names. Like align_properties, a metadata commit made at start-up by the
    process that holds the table's writers, once per new column: appends need no mergeSchema,
    so no batch ever pays for a schema change or races another writer's append with one."""
    try:
        have = delta_column_names(spark, path)
    except api_moved():     # an internal API: if a Delta upgrade moves it, read the schema
        have = DeltaTable.forPath(spark, path).toDF().columns
    have = {name.lower() for name in have}          # Delta column names are case-insensitive
    missing = [f for f in schema.fields if f.name.lower() not in have]
    required = [f.name for f in missing if not f.nullable]
    if required:
        raise ValueError(f"Delta table {path} lacks the non-nullable column(s) {required}: existing rows "
                         f"have no value for them; add them by hand or recreate the table")
    if missing:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
    return [f.name for f in missing]


def ensure_table(spark, cfg: Config, layer: str, table: str, schema, partition_by=(),
                 properties: dict[str, str] | None = None, constraints: dict[str, str] | None = None) -> str:
    """Create the table if missing, with its CHECK `constraints` (name -> expression) in its
    first commit; an existing one gets the properties conf now asks for (retention changed in
    conf applies at the next start, not only to new tables), the constraints it lacks and the
    nullable columns the schema gained since it was created. Safe against another application
    doing the same at the same time."""
    # run-silver and run-gold started at once both create or align the ops tables: Delta lets
    # one commit win, and the other's conflict (ProtocolChangedException on a create) sends it
    # to look again, when it finds the table made or aligned.
    return retry_on_conflict(lambda: _ensure_table(spark, cfg, layer, table, schema, partition_by,
                                                   properties, constraints))


def _ensure_table(spark, cfg: Config, layer: str, table: str, schema, partition_by,
                  properties: dict[str, str] | None, constraints: dict[str, str] | None) -> str:
    path = cfg.table_path(layer, table)
    wanted = {**retention_properties(cfg), **(properties or {})}
    if DeltaTable.isDeltaTable(spark, path):
        align_properties(spark, path, wanted)
        added = add_missing_columns(spark, path, schema)
        align_constraints(spark, path, constraints or {})
        # Rows written before a raw_bytes column existed hold their bytes in the text column,
        # valid UTF-8 or not: moved once, so every Delta reader can read the table.
        from common.lineage import PIPELINE

        for text in migrate_raw_bytes(spark, path, added, {"pipeline": PIPELINE}):
            logger.warning(f"{layer}.{table}: moved {text} values that are not UTF-8 to its new binary column")
    else:
        if remove_uncommitted_log(path):
            logger.warning(f"{layer}.{table}: a run was killed while creating it, before its first "
                           "commit; created again")
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        for key, value in {**wanted, **{CONSTRAINT + n.lower(): e for n, e in (constraints or {}).items()}}.items():
            builder = builder.property(key, value)
        builder.execute()
    register_table(spark, cfg, layer, table)
    return path


TXN = "txn"          # the user-metadata key of an idempotent append: {"app": app id, "version": n}


def idempotent_append(df, path: str, app_id: str, version: int, metadata: dict | None = None,
                      replay: bool = True) -> bool:
    """Append once per (app_id, version); False when an earlier attempt already committed it.
    `metadata` (the batch's lineage) is stored as the commit's user metadata, with the key.

    Only a replayed micro-batch can find its own earlier commit (`replay`: its offsets were
    logged before this run started; see MicroBatch). Any other batch appends blind. Delta's own
    check, txnAppId, looks the app up in the table's state, which Delta 4.4 rebuilds for every
    new version (3 Spark jobs, 0.35 s of a 0.5-s one-row append); a replay looks for the key in
    the commits since the batch before it, and appends with txnAppId too, so commits made
    before the key was in the metadata are still recognised."""
    tagged = {**(metadata or {}), TXN: {"app": app_id, "version": version}}
    writer = df.write.format("delta").mode("append").option("userMetadata", to_user_metadata(tagged))
    if replay:
        query_id = (metadata or {}).get("query_id")
        if appended(df.sparkSession, path, app_id, version, query_id):
            return False
        writer = writer.option("txnAppId", app_id).option("txnVersion", version)
    writer.save(path)
    return True


def append_key(user_metadata: str | dict | None) -> dict:
    """The append key ({"app", "version"}) of a commit's user metadata, {} when it has none."""
    import json

    meta = user_metadata
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return {}
    key = meta.get(TXN) if isinstance(meta, dict) else None
    return key if isinstance(key, dict) else {}


def appended(spark, path: str, app_id: str, version: int, query_id: str | None = None,
             page: int = 32) -> bool:
    """Whether a commit of `path` carries the append key (app_id, version). Reads the history
    newest first and stops at the first commit of the same app, or of the same query (lineage
    query_id), made by an earlier batch: everything a later batch wrote is newer than it."""
    import json

    table = DeltaTable.forPath(spark, path)
    while True:
        rows = table.history(page).select("userMetadata").collect()
        for row in rows:
            try:
                meta = json.loads(row.userMetadata) if row.userMetadata else None
            except ValueError:
                meta = None
            if not isinstance(meta, dict):
                continue
            txn = append_key(meta)
            if txn.get("app") == app_id:
                if txn.get("version") == version:
                    return True
                if isinstance(txn.get("version"), int) and txn["version"] < version:
                    return False
            if (query_id is not None and meta.get("query_id") == query_id
                    and isinstance(meta.get("batch_id"), int) and meta["batch_id"] < version):
                return False
        if len(rows) < page:
            return False
        page *= 8


# Commits that change no row of a table.
NO_ROW_CHANGE = ("CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES",
                 "UNSET TBLPROPERTIES", "ADD COLUMNS", "CHANGE COLUMN", "UPGRADE PROTOCOL",
                 "ADD CONSTRAINT", "DROP CONSTRAINT")


def last_lineage(spark, path: str, page: int = 16) -> tuple[dict | None, list[tuple[int, str]]]:
    """The lineage of the table's newest commit made by a micro-batch (None if no batch ever
    wrote it), and the (version, operation) of every commit after it that changed rows
    without one: a RESTORE, a DELETE or an append made by hand."""
    from common.lineage import parse

    table = DeltaTable.forPath(spark, path)
    while True:
        rows = table.history(page).select("version", "operation", "userMetadata").collect()
        outside = []
        for row in rows:
            lineage = parse(row.userMetadata)
            if lineage is not None and "backfill" in lineage:
                continue     # gold/backfill.py: the pipeline's, between two batches
            if lineage is not None:
                return lineage, outside
            if row.operation not in NO_ROW_CHANGE:
                outside.append((row.version, row.operation))
        if len(rows) < page:
            return None, outside
        page *= 8


CONFLICT_RETRIES = 3


def retry_on_conflict(action, retries: int = CONFLICT_RETRIES):
    """Run `action`; when a concurrent commit conflicts with it (table maintenance compacting
    files a MERGE read, say), run it again on the new snapshot. `action` must rebuild its
    DeltaTable and plan each time, and be safe to repeat: a failed commit wrote nothing."""
    import time

    for attempt in range(1, retries):
        try:
            return action()
        except conflicts():
            time.sleep(0.5 * attempt)
    return action()


def conflicts() -> tuple[type, ...]:
    """Delta's commit-conflict exceptions. The classes pyspark raises (delta.exceptions.captured)
    derive from each concrete base class, not from DeltaConcurrentModificationException."""
    import delta.exceptions as E

    return (E.DeltaConcurrentModificationException, E.ConcurrentWriteException, E.ConcurrentAppendException,
            E.ConcurrentDeleteReadException, E.ConcurrentDeleteDeleteException,
            E.ConcurrentTransactionException, E.MetadataChangedException, E.ProtocolChangedException)


# How Delta's MERGE keeps its source stable between its two passes (finding the touched files,
# then writing): "auto" copies any source that is not a plain Delta scan into a local checkpoint.
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


@contextmanager
def sources_pinned(session):
    """MERGEs made inside take their source as it is: the caller's source is a local checkpoint
    already (BatchContext.pin), so Delta's own would be a second copy, one more Spark job per
    MERGE. Reading it twice gives the same rows; a lost block fails the MERGE, and the batch is
    replayed. (Session-wide, like commit_metadata: pass the micro-batch's own session.)"""
    session.conf.set(MATERIALIZE_SOURCE, "none")
    try:
        yield
    finally:
        session.conf.unset(MATERIALIZE_SOURCE)


@contextmanager
def commit_metadata(session, metadata: dict):
    """Commits made inside (MERGE has no writer option) carry `metadata` as user metadata.

    Pass the micro-batch's own session (batch_df.sparkSession): each streaming query runs on a
    clone of the job's session, so concurrent queries do not see each other's setting."""
    session.conf.set(USER_METADATA_CONF, to_user_metadata(metadata))
    try:
        yield
    finally:
        session.conf.unset(USER_METADATA_CONF)
