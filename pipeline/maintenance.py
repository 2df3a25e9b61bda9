"""Table maintenance: compact small files, VACUUM what the audit horizon no longer needs, and drop
monitoring rows past their retention. Safe beside running queries.

    python -m pipeline.maintenance [--table layer.table ...] [--no-vacuum] [--json]   (make maintain)

Why it is safe beside the pipeline: OPTIMIZE commits with dataChange=false, so the Delta streaming
sources downstream skip it and blind appends (bronze, silver, quarantine, ops) never conflict
with it. Gold's MERGE can: whichever commits second sees a ConcurrentModificationException. Gold
retries its MERGE (gold.job.merge); here a table that stays busy is skipped until the next round.
VACUUM removes only files removed from the table longer ago than conf maintenance.audit_horizon,
so every version the audit must prove stays readable.

Processing-time runs call `maintain` every conf maintenance.interval from the runner, in the
`maintenance` FAIR pool (pipeline.runner.Maintainer).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

from common.errors import JobError, command
from common.delta import (CONFLICT_RETRIES, conflicts, live_files, retention_properties, retry_on_conflict,
                          table_properties)
from common.storage import location, walk_files

# Monitoring tables and the column that dates a row. ops.batch_accounting is not here: the
# audit's accounting identities sum it from the first batch, so its rows are kept.
OPS_TIME = {("ops", "query_progress"): "timestamp", ("ops", "dq_results"): "evaluated_at"}


@dataclass
class Maintained:
    table: str
    files: int = 0             # files in the table's snapshot before compaction
    compacted: int = 0         # small files OPTIMIZE replaced ...
    into: int = 0              # ... by this many
    on_disk_before: int = 0    # data files in the folder, live or waiting for VACUUM
    on_disk_after: int = 0
    vacuumed: str = ""         # "full" or "lite" when VACUUM ran
    ops_rows_deleted: int = 0
    seconds: float = 0.0
    note: str = ""             # "busy: ..." when a concurrent writer won every attempt


def files_on_disk(path) -> int:
    """Data files in the table's folder, live or waiting for VACUUM (hidden ones are temp files)."""
    return sum(1 for rel, _ in walk_files(location(path))
               if not rel.startswith("_delta_log/") and rel.endswith(".parquet")
               and not rel.rsplit("/", 1)[-1].startswith("."))


VACUUM_MODES = ("full", "lite")


def maintain_table(spark, cfg, layer: str, table: str, path: str, vacuum: str | None = "full") -> Maintained:
    """Ops retention, then OPTIMIZE once the table holds maintenance.compact_min_files files, then
    VACUUM: "full" lists the table's folder (and so also removes files a killed batch left
    behind), "lite" only the files the log says were removed, a fraction of the cost."""
    from delta.tables import DeltaTable

    started = time.monotonic()
    result = Maintained(f"{layer}.{table}", on_disk_before=files_on_disk(path), files=live_files(spark, path))
    try:
        column = OPS_TIME.get((layer, table))
        if column:
            cutoff = time.time() - cfg.maintenance.ops_retention.seconds
            cond = f"`{column}` < timestamp_seconds({int(cutoff)})"
            # Checked first: a DELETE that matches nothing would still add a version every round.
            if not DeltaTable.forPath(spark, path).toDF().where(cond).isEmpty():
                retry_on_conflict(lambda: DeltaTable.forPath(spark, path).delete(cond))
                result.ops_rows_deleted = _deleted_rows(spark, path)
        # Below the threshold a rewrite buys little and costs an OPTIMIZE's jobs (seconds on 2
        # cores, per table, every round) and a chance of conflicting with gold's MERGE.
        if result.files >= cfg.maintenance.compact_min_files:
            metrics = retry_on_conflict(lambda: DeltaTable.forPath(spark, path).optimize().executeCompaction()
                                        .first()["metrics"])
            result.compacted, result.into = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
    except conflicts() as e:
        result.note = f"busy: {type(e).__name__} {CONFLICT_RETRIES} times, left for the next round"
    if vacuum:
        # Delta 4 vacuums by the table's delta.deletedFileRetentionDuration, whatever retention
        # is passed. The pipeline sets it from maintenance.audit_horizon when it starts; changing
        # it here would be a metadata commit that fails the running writers' commits.
        key = "delta.deletedFileRetentionDuration"
        want, have = retention_properties(cfg)[key], table_properties(spark, path).get(key)
        if have != want:
            result.note = (result.note + "; " if result.note else "") + (
                f"VACUUM kept {have or 'the default 7 days'}, not the audit horizon "
                f"{cfg.maintenance.audit_horizon}: a changed horizon applies at the pipeline's next start")
        # Delta's check refuses a table retention under 7 days; the table's is the audit horizon
        # from conf, which is the authority (nothing in the lakehouse reads older versions).
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        result.vacuumed = _vacuum(spark, path, vacuum)
    result.on_disk_after = files_on_disk(path)
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _vacuum(spark, path: str, mode: str) -> str:
    """VACUUM in `mode`; returns the mode that ran. LITE needs the log entries since the last
    VACUUM: once log cleanup has passed them Delta refuses it, and a FULL one runs instead."""
    from pyspark.errors import PySparkException

    from common.errors import spark_condition
    from common.internals import quiet_console

    with quiet_console(spark):       # Delta prints each VACUUM's count; the caller reports it
        if mode == "lite":
            try:
                spark.sql(f"VACUUM delta.`{path}` LITE")
                return "lite"
            except PySparkException as e:
                if spark_condition(e) != "DELTA_CANNOT_VACUUM_LITE":
                    raise
        spark.sql(f"VACUUM delta.`{path}` FULL")
        return "full"


def _deleted_rows(spark, path: str) -> int:
    """Rows the last DELETE removed."""
    from delta.tables import DeltaTable

    last = DeltaTable.forPath(spark, path).history(1).first()
    if last is None or last["operation"] != "DELETE":
        return 0
    return int((last["operationMetrics"] or {}).get("numDeletedRows", 0))


def tables_of(cfg, layers=None) -> list[tuple[str, str, str]]:
    from common.catalog import existing_tables

    return [t for t in existing_tables(cfg) if layers is None or t[0] in layers]


def maintain(spark, cfg, tables=None, vacuum: str | None = "full") -> list[Maintained]:
    """Maintain every existing lakehouse table (or `tables`: (layer, table, path) triples)."""
    return [maintain_table(spark, cfg, layer, table, path, vacuum)
            for layer, table, path in (tables_of(cfg) if tables is None else tables)]


def summary(results: list[Maintained], seconds: float) -> str:
    busy = [r.table for r in results if r.note.startswith("busy")]
    return (f"maintenance: {len(results)} tables, compacted {sum(r.compacted for r in results)} files into "
            f"{sum(r.into for r in results)}, data files on disk {sum(r.on_disk_before for r in results)} -> "
            f"{sum(r.on_disk_after for r in results)}"
            + "".join(f" (vacuumed, {m})" for m in VACUUM_MODES if any(r.vacuumed == m for r in results))
            + f", {seconds:.1f} s"
            + (f"; busy, skipped: {', '.join(busy)}" if busy else ""))


@command
def main(argv=None, prog: str = "make maintain") -> int:
    from common.config import load_config

    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", action="append", help="layer.table to maintain (repeatable; default: all)")
    p.add_argument("--no-vacuum", action="store_true", help="compact only")
    p.add_argument("--lite", action="store_true",
                   help="VACUUM LITE: only files the log says were removed (fast; the pipeline's own rounds use it); "
                        "the default FULL also removes files a killed batch left behind")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = p.parse_args(argv)
    cfg = load_config()
    from common.checkpoint_lock import live_leases

    running = live_leases(cfg)
    if running:
        # Delta's S3 log store allows one writing driver per table (docs/object-stores.md).
        raise JobError(f"a pipeline holds checkpoints under {cfg.checkpoint_root}: {', '.join(running)}. On object "
                       f"storage only that process may write its tables (it runs maintenance itself in processing-time "
                       f"mode); stop it before `make maintain`, or configure Delta's DynamoDB log store")
    chosen = tables_of(cfg)
    if args.table:
        known = {f"{l}.{t}" for l, t, _ in chosen}
        missing = [t for t in args.table if t not in known]
        if missing:
            raise JobError(f"no such table under {cfg.root}: {', '.join(missing)} "
                           f"(existing: {', '.join(sorted(known)) or 'none'})")
        chosen = [t for t in chosen if f"{t[0]}.{t[1]}" in args.table]
    if not chosen:
        print(f"nothing to maintain: no table under {cfg.root}")
        return 0
    from common.spark import build_spark

    spark = build_spark(cfg, f"{cfg.spark.app_name}:maintain")
    try:
        started = time.monotonic()
        results = maintain(spark, cfg, chosen, vacuum=None if args.no_vacuum else "lite" if args.lite else "full")
        took = time.monotonic() - started
    finally:
        from common.spark import stop as stop_spark

        stop_spark(spark)
    if args.json:
        print(json.dumps({"tables": [asdict(r) for r in results], "seconds": round(took, 2),
                          "audit_horizon": str(cfg.maintenance.audit_horizon)}, indent=2))
    else:
        width = max(len(r.table) for r in results)
        print(f"{'table':<{width}}  files  compacted  files on disk  ops rows deleted  seconds")
        for r in results:
            print(f"{r.table:<{width}}  {r.files:>5}  {r.compacted:>4} -> {r.into:<3} {r.on_disk_before:>5} -> {r.on_disk_after:<5}"
                  f"  {r.ops_rows_deleted:>16}  {r.seconds:>7.1f}" + (f"  {r.note}" if r.note else ""))
        print(summary(results, took) + f" (VACUUM keeps {cfg.maintenance.audit_horizon} of history: the audit horizon)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
