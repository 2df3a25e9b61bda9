"""Accounting over each table's whole history: nothing appears or vanishes between layers.

Units are silver's input rows: one per camera event, or one per bronze record that could not
be parsed into events (silver/transform.parse_events). Over silver's history

    parsed bronze rows = silver + quarantine + duplicates dropped + too late dropped

with bronze taken at the version silver's last micro-batch had read, and the drops summed from
ops.batch_accounting (Spark's own operator metrics). For each gold table, the silver events its
last batch had read are either consumed on time (the prefix recompute) or counted late.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import functions as F

from audit.history import Version, read_version


@dataclass
class BooksCheck:
    name: str
    status: str                      # PASS | FAIL | SKIP
    left: dict = field(default_factory=dict)    # name -> count, summed
    right: dict = field(default_factory=dict)
    note: str = ""

    @property
    def equation(self) -> str:
        side = lambda d: " + ".join(f"{k} {v:,}" for k, v in d.items())  # noqa: E731
        return f"{side(self.left)} {'=' if self.status == 'PASS' else '!='} {side(self.right)}"

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "left": self.left, "right": self.right,
                "equation": self.equation, "note": self.note}


def last_lineage(history: list[Version], query: str) -> dict | None:
    """Lineage of the query's most recent commit to a table (history is in version order;
    batch ids restart if a checkpoint is replaced, versions do not)."""
    found = [v.lineage for v in history if v.lineage and v.lineage["query"] == query]
    return found[-1] if found else None


def drops(spark, accounting_path: str, query, query_ids=None) -> dict[str, int]:
    """Drops booked by a query's batches (`query`: a name, or several), by the checkpoints
    `query_ids` only when given (a refreshed table's: batch ids restart with its checkpoint)."""
    names = [query] if isinstance(query, str) else list(query)
    rows = spark.read.format("delta").load(accounting_path).where(F.col("query").isin(names))
    if query_ids is not None:
        rows = rows.where(F.col("query_id").isin(sorted(query_ids)))
    row = (rows
           .agg(F.coalesce(F.sum("duplicates_dropped"), F.lit(0)).alias("d"),
                F.coalesce(F.sum("late_dropped"), F.lit(0)).alias("l"), F.count(F.lit(1)).alias("n"))
           .first())
    return {"duplicates dropped": int(row.d), "too late dropped": int(row.l), "batches": int(row.n)}


def silver_writers(silver_history: list[Version] | None) -> set | None:
    """The checkpoints whose batches made silver's rows as they are: the last silver refresh's
    (pipeline/refresh_silver.py replaced every row, and the books of the checkpoint it replaced
    with them), or None: every silver batch booked (never refreshed)."""
    for v in reversed(silver_history or []):
        refresh = (v.lineage or {}).get("refresh") or {}
        if refresh.get("layer") == "silver":
            return {v.lineage["query_id"]}
    return None


def _silver_rows(rows, query_ids: set | None):
    """Accounting rows, silver's only those of `query_ids` (None: all)."""
    if query_ids is None:
        return rows
    return rows.where((F.col("query") != "silver") | F.col("query_id").isin(sorted(query_ids)))


def silver_books(spark, cfg, paths: dict[str, str], accounting_history: list[Version],
                 query_ids: set | None = None) -> BooksCheck:
    from silver import transform as ST

    lineage = last_lineage(accounting_history, "silver")
    if lineage is None:
        return BooksCheck("silver", "SKIP", note="no silver micro-batch recorded in ops.batch_accounting")
    upstream = lineage["upstream"]["version"]
    if upstream is None:
        return BooksCheck("silver", "FAIL", note=f"silver batch {lineage['batch_id']} stopped inside a "
                                                 "bronze version; no bronze snapshot equals its input")
    bronze = read_version(spark, paths["bronze.events"], upstream)
    parsed = ST.parse_events(bronze, cfg.silver.min_event_time, cfg.silver.max_future.seconds, cfg.profile,
                             cfg.silver.max_record_bytes)
    d = drops(spark, paths["ops.batch_accounting"], "silver", query_ids)
    left = {f"bronze@{upstream} parsed rows": parsed.count()}
    right = {"silver": spark.read.format("delta").load(paths[f"silver.{cfg.silver_table}"]).count(),
             "quarantine": spark.read.format("delta").load(paths["silver.quarantine"]).count(),
             "duplicates dropped": d["duplicates dropped"], "too late dropped": d["too late dropped"]}
    ok = sum(left.values()) == sum(right.values())
    return BooksCheck("silver", "PASS" if ok else "FAIL", left, right,
                      note=f"bronze@{upstream} holds {bronze.count():,} records; {d['batches']} silver batches")


def rescued_books(spark, cfg, paths: dict[str, str], query_ids: set | None = None) -> list[BooksCheck]:
    """The schema contract's rescued data (silver/contract.py): the events and the keys silver's
    batches booked as rescued are silver's rows holding rescued data, and their keys."""
    from silver.contract import RESCUED_DATA

    silver = spark.read.format("delta").load(paths[f"silver.{cfg.silver_table}"])
    if RESCUED_DATA not in silver.columns:
        return [BooksCheck("silver rescued", "SKIP", note=f"silver has no {RESCUED_DATA} column yet")]
    booked = (_silver_rows(spark.read.format("delta").load(paths["ops.batch_accounting"]), query_ids)
              .where(F.col("query") == "silver")
              .agg(F.coalesce(F.sum("events_rescued"), F.lit(0)), F.coalesce(F.sum("fields_rescued"), F.lit(0)))
              .first())
    held = (silver.where(F.col(RESCUED_DATA).isNotNull())
            .agg(F.count(F.lit(1)), F.coalesce(F.sum(F.size(F.json_object_keys(RESCUED_DATA))), F.lit(0))).first())
    checks = []
    for name, what, have, n_booked, n_held in (
            ("silver rescued events", "rows with rescued data", "events", booked[0], held[0]),
            ("silver rescued keys", "keys in rescued data", "keys", booked[1], held[1])):
        left, right = {f"{have} booked rescued": int(n_booked)}, {f"silver {what}": int(n_held)}
        checks.append(BooksCheck(name, "PASS" if int(n_booked) == int(n_held) else "FAIL", left, right))
    return checks


def gold_books(spark, name: str, query, silver_path: str, accounting_path: str,
               lineages: list[dict], on_time_count, query_ids=None) -> BooksCheck:
    """`query`: the query (or queries) that wrote the table; `lineages`: their batches in run
    order (audit.prefix.batch_lineages);
    `on_time_count(upstream_version)` is the prefix recompute's count of events consumed."""
    lineage = lineages[-1] if lineages else None
    if lineage is None:
        return BooksCheck(name, "SKIP", note="no micro-batch has written this table yet")
    upstream = lineage["upstream"]["version"]
    if upstream is None:
        return BooksCheck(name, "SKIP", note="its last batch stopped inside a silver version")
    d = drops(spark, accounting_path, query, query_ids)
    left = {f"silver@{upstream} events": read_version(spark, silver_path, upstream).count()}
    right = {"consumed on time": on_time_count(upstream), "too late dropped": d["too late dropped"],
             "duplicates dropped": d["duplicates dropped"]}
    ok = sum(left.values()) == sum(right.values())
    return BooksCheck(name, "PASS" if ok else "FAIL", left, right, note=f"{d['batches']} batches")


def late_books(spark, late_path: str, accounting_path: str, query_ids: set | None = None) -> BooksCheck:
    """Every event a silver or gold batch counted late is kept in silver.late_events
    (common/late.py), once: per query, the late events its batches counted since the table
    exists equal its rows there. (Batches before the table was created counted theirs only.)"""
    from delta.tables import DeltaTable

    created = DeltaTable.forPath(spark, late_path).detail().first()["createdAt"]
    counted = {r["query"]: int(r["n"]) for r in
               _silver_rows(spark.read.format("delta").load(accounting_path), query_ids)
               .where(F.col("layer").isin("silver", "gold") & (F.col("recorded_at") >= F.lit(created)))
               .groupBy("query").agg(F.coalesce(F.sum("late_dropped"), F.lit(0)).alias("n")).collect()}
    kept = {r["found_by_query"]: int(r["n"]) for r in
            spark.read.format("delta").load(late_path).groupBy("found_by_query").agg(F.count(F.lit(1)).alias("n")).collect()}
    queries = sorted(set(counted) | set(kept))
    if not queries:
        return BooksCheck("silver.late_events", "SKIP", note="no batch since the table was created")
    left = {f"{q}: counted late": counted.get(q, 0) for q in queries}
    right = {f"{q}: kept": kept.get(q, 0) for q in queries}
    ok = all(counted.get(q, 0) == kept.get(q, 0) for q in queries)
    return BooksCheck("silver.late_events", "PASS" if ok else "FAIL", left, right,
                      note=f"silver and gold batches recorded since {created}")
