"""make audit: history, prefix integrity and accounting of every lakehouse table.

    python -m audit [--table gold.zip_hourly_sightings] [--json]

For each table: one line per Delta version (time, operation, rows added and removed, the
micro-batch that made it and the upstream version it had consumed). For each gold table, every
version is recomputed in batch from the silver snapshot its batch had consumed, with the
stream's own transforms and its late-row drops, and compared with the table at that version:
PASS, or FAIL with a sample of the rows that differ. Silver's dimension columns are joined again
at each row's event time with the dimension version its batch pinned (audit/attribution.py).
Accounting checks that every parsed
bronze row is in silver or quarantine or was counted as a duplicate or too late, and that every
silver event gold read was consumed or counted late. Exit status 1 when any check fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from pyspark.errors import PySparkException

from audit import books as B
from audit import prefix as P
from audit.attribution import check_attribution
from audit.history import table_history
from audit.report import render
from audit.tables import TableError, existing, resolve
from common.batch import EXPRESSIONS, together
from common.errors import command
from common.internals import java_errors
from common.spark import session
from common.config import load_config

def run_audit(spark, cfg, only: str | None = None) -> dict:
    """The audit's report; `only`: one table. The session's expression mode is as it was after."""
    before = spark.conf.get(EXPRESSIONS, None)
    try:
        return _run_audit(spark, cfg, only)
    finally:
        if before is None:
            spark.conf.unset(EXPRESSIONS)
        else:
            spark.conf.set(EXPRESSIONS, before)


def _silver_rows(history) -> int | None:
    """Rows silver holds, from its commits' metrics since its creation (None when a commit does
    not say, or the log no longer holds the first ones)."""
    if not history or history[0].version != 0 or any(v.rows_added is None or v.rows_removed is None
                                                      for v in history[1:]):
        return None
    return sum((v.rows_added or 0) - (v.rows_removed or 0) for v in history)


def _run_audit(spark, cfg, only: str | None) -> dict:
    from gold.tables import by_table, logic_hash

    BY_TABLE = by_table(cfg)
    silver_name = f"silver.{cfg.silver_table}"
    SILVER_BOOKS_TABLES = {"bronze.events", silver_name, "silver.quarantine", "ops.batch_accounting"}
    started = time.monotonic()
    names = [only] if only else existing(cfg)
    if only:
        resolve(cfg, only)
    paths = {n: resolve(cfg, n, must_exist=False) for n in
             set(names) | SILVER_BOOKS_TABLES}
    # The tables' histories, and below each gold table's checks, side by side: each is many
    # small Spark jobs and Delta log reads, mostly driver time, which two threads overlap even
    # on two cores (a fresh process's audit of a small lakehouse: 30 s one at a time).
    histories = dict(zip(names, together(*[(lambda n=n: table_history(spark, paths[n])) for n in names])))
    present = set(existing(cfg))
    if "ops.batch_accounting" in present and "ops.batch_accounting" not in histories:
        histories["ops.batch_accounting"] = table_history(spark, paths["ops.batch_accounting"])
    recorded = histories.get("ops.batch_accounting") or []
    silver_path = paths[silver_name]
    silver_history = (histories[silver_name] if silver_name in histories else
                      table_history(spark, silver_path) if silver_name in present else None)
    # The checks recompute gold from silver in a few wide jobs. On a small lakehouse generating
    # and compiling their code costs more than it saves, as for the pipeline's small batches
    # (MicroBatch.choose_expressions): a fresh process's audit of a three-round lakehouse,
    # 20.2 s compiled, 16.8 s interpreted.
    rows = _silver_rows(silver_history)
    if rows is not None and rows < cfg.spark.interpreted_below_rows:
        spark.conf.set(EXPRESSIONS, "NO_CODEGEN")
    report = {"tables": [], "accounting": [], "horizon": _horizon(cfg)}
    too_old = _too_old(spark, cfg, silver_path, report["horizon"]) if any(
        n.startswith("gold.") for n in names) else None
    entries = {}
    for name in names:
        entry = entries[name] = {"table": name, "history": [v.as_dict() for v in histories[name]]}
        if histories[name] and histories[name][0].version > 0:
            # Log files older than maintenance.log_retention are cleaned at Delta checkpoints.
            entry["log_cleaned_before"] = histories[name][0].version

    def gold(name: str) -> dict | None:
        """Fills the table's entry with its prefix checks; returns its accounting."""
        entry, spec = entries[name], BY_TABLE[name.partition(".")[2]]
        # The queries that wrote the table (one, `gold`; a lakehouse of an older version had
        # one per table). Their batches that changed nothing in the table have their lineage
        # only in accounting.
        writers = sorted({v.lineage["query"] for v in histories[name] if v.lineage})
        mine = [v for v in recorded if v.lineage and v.lineage["query"] in writers]
        try:
            checks = P.check_table(spark, cfg, spec, paths[name], histories[name], silver_path, mine, too_old)
        except (PySparkException, *java_errors()) as e:
            if not any(c.startswith("FAILED_READ_FILE.FILE_NOT_EXIST") for c in _conditions(e)):
                raise
            entry["error"] = (f"a version younger than the audit horizon ({cfg.maintenance.audit_horizon}) "
                              "reads a file that is gone: VACUUM ran with a shorter retention than "
                              "maintenance.audit_horizon, or a file was deleted by hand")
            return None
        entry["prefix"] = [c.as_dict() for c in checks]
        entry["prefix_summary"] = _summary(checks)
        if "ops.batch_accounting" not in present:
            return None
        # The books of the table as it is: its latest refresh's checkpoint (every checkpoint
        # that built it, if it was never refreshed; old accounting rows name no checkpoint).
        cuts = P.epochs(histories[name])
        last = cuts[-1] if cuts else []
        ids = P.query_ids(last)
        mine = [v for v in mine if v.lineage.get("query_id") in ids]
        if P.other_logic([v for v in last if v.lineage][-1:], logic_hash(cfg)):
            return B.BooksCheck(name, "SKIP", note="its last batch ran with other logic than today's "
                                                   "profile").as_dict()
        return B.gold_books(spark, name, writers, silver_path, paths["ops.batch_accounting"],
                            P.batch_lineages(last, mine),
                            _on_time_counter(spark, silver_path, last, mine, cfg.gold.watermark),
                            ids if len(cuts) > 1 else None).as_dict()

    work = {name: (lambda name=name: gold(name)) for name in names if name.startswith("gold.")}
    silver_ids = B.silver_writers(silver_history)
    dimension = cfg.profile.dimension
    if silver_name in names and dimension and f"silver.{dimension.table}" in present:
        work[silver_name + " attribution"] = lambda: check_attribution(spark, cfg, silver_path, histories[silver_name])
    if (not only or only == "silver.late_events") and {"silver.late_events", "ops.batch_accounting"} <= present:
        work["late books"] = lambda: B.late_books(spark, paths["silver.late_events"],
                                                  paths["ops.batch_accounting"], silver_ids).as_dict()
    if (not only or only in SILVER_BOOKS_TABLES) and SILVER_BOOKS_TABLES <= present:
        work[silver_name + " books"] = lambda: B.silver_books(spark, cfg, paths, recorded, silver_ids).as_dict()
        work[silver_name + " rescued"] = lambda: [c.as_dict() for c in B.rescued_books(spark, cfg, paths, silver_ids)]
    done = dict(zip(work, together(*work.values())))
    if silver_name + " attribution" in done:
        entries[silver_name]["attribution"] = done.pop(silver_name + " attribution")
    report["tables"] = [entries[n] for n in names]
    rescued = done.pop(silver_name + " rescued", None) or []
    report["accounting"] = [books for books in (done.pop(silver_name + " books", None), *rescued, *done.values())
                            if books is not None]
    report["failures"] = _failures(report)
    report["ok"] = not report["failures"]
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def _conditions(error) -> list[str]:
    """Spark error conditions of an exception and its JVM causes (a failed task's error reaches
    Python wrapped in a SparkException that pyspark does not convert)."""
    out = [error.getCondition() or ""] if isinstance(error, PySparkException) else []
    java = getattr(error, "java_exception", None)
    while java is not None:
        try:
            out.append(java.getCondition() or "")
        except Exception:   # noqa: BLE001 - not a SparkThrowable
            pass
        java = java.getCause()
    return out


def _horizon(cfg) -> dict:
    from datetime import datetime

    # Naive local time, as pyspark returns the history's commit timestamps.
    cutoff = datetime.fromtimestamp(time.time() - cfg.maintenance.audit_horizon.seconds)
    return {"audit_horizon": str(cfg.maintenance.audit_horizon),
            "cutoff": cutoff.isoformat(sep=" ", timespec="seconds")}


def _too_old(spark, cfg, silver_path, horizon: dict):
    """VACUUM (make maintain) keeps the files of every version younger than the horizon; a gold
    version older than it, or one that consumed a silver version older than it, may need files
    that are gone."""
    from datetime import datetime

    cutoff = datetime.fromisoformat(horizon["cutoff"])
    silver_time = {v.version: v.timestamp for v in table_history(spark, silver_path)}
    oldest_silver = min(silver_time, default=0)

    def too_old(version, upstream) -> bool:
        if version.timestamp < cutoff:
            return True
        if upstream is None or upstream < 0:
            return False
        return upstream < oldest_silver or silver_time.get(upstream, cutoff) < cutoff
    return too_old


def _on_time_counter(spark, silver_path, history, recorded, watermark):
    batches, _ = P.batches_of(history, recorded)
    stamps = P.row_versions(spark, silver_path)
    return lambda upstream: P.on_time_events(
        P.silver_rows(spark, silver_path, upstream, batches, stamps), batches, watermark).count()


def _summary(checks) -> dict:
    return {s: sum(1 for c in checks if c.status == s) for s in ("PASS", "FAIL", "SKIP", "VACUUMED")}


def _failures(report: dict) -> list[str]:
    out = []
    for t in report["tables"]:
        if t.get("error"):
            out.append(f"{t['table']}: {t['error']}")
        for c in t.get("prefix", []):
            if c["status"] == "FAIL":
                who = c["made_by"] or "table creation"
                out.append(f"{t['table']} version {c['version']} ({c['operation']}, {who}): "
                           f"{c['missing']} expected rows missing, {c['unexpected']} rows not produced "
                           f"by the pipeline (recomputed from silver@{c['upstream']})")
        a = t.get("attribution")
        if a and a["status"] == "FAIL":
            out.append(f"{t['table']}: {a['rows_differ']} of {a['rows_checked']} rows carry other {a['table']} "
                       "columns than the point-in-time join with the dimension version their batch pinned")
    for a in report["accounting"]:
        if a["status"] == "FAIL":
            out.append(f"accounting {a['name']}: {a['equation']}" + (f" ({a['note']})" if a["note"] else ""))
    return out


@command
def main(argv=None, prog: str = "audit") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", help="audit one table, e.g. gold.device_sessions (default: all)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    cfg = load_config()
    if args.table:
        resolve(cfg, args.table)
    elif not existing(cfg):
        raise TableError(f"no tables under {cfg.table_path('bronze', 'events').rsplit('/', 2)[0]}: "
                         "run the pipeline first (make run-all)")
    with session(cfg, "audit") as spark:
        report = run_audit(spark, cfg, args.table)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
