"""After the drain: did every generated record and event survive the kills exactly once?

- bronze: every (file, line) written is in bronze.events once, with its exact bytes, and
  nothing else is;
- quarantine: each quarantined record's bytes, held once per record, equal bronze's;
- silver: no event_id twice; nothing that was not generated; every generated event is in
  silver or quarantine, or kept in silver.late_events as late for silver (which the audit's
  books hold to the late drops ops.batch_accounting counted);
- the audit (separate process) passes: accounting identities and gold = its batch recompute.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import functions as F

from common.raw_bytes import as_binary


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass
class Checks:
    items: list[Check] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.items.append(Check(name, bool(ok), detail))

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.items)


def _sample(xs, n: int = 5) -> list:
    return sorted(xs, key=str)[:n]


def verify(spark, cfg, expected, audit_code: int, audit_report: dict | None) -> Checks:
    out = Checks()
    read = lambda layer, table: spark.read.format("delta").load(cfg.table_path(layer, table))  # noqa: E731
    _check_bronze(out, read, expected)
    _check_quarantine(out, read)
    _check_silver(out, read, expected, cfg.silver_table, cfg.table_path("silver", "late_events"))
    _check_booked(out, read, cfg)
    _check_audit(out, audit_code, audit_report)
    return out


def _check_bronze(out: Checks, read, expected) -> None:
    bronze = read("bronze", "events")
    rows = bronze.select(F.element_at(F.split("file_path", "/"), -1).alias("file"), "line_number",
                         as_binary().alias("raw")).collect()
    n_bronze = len(rows)
    keys = [(r.file, r.line_number) for r in rows]
    dup_lines = len(keys) - len(set(keys))
    missing = set(expected.records) - set(keys)
    extra = set(keys) - set(expected.records)
    # raw holds the line's bytes as they arrived, valid UTF-8 or not: compare bytes.
    changed = [k for k, r in zip(keys, rows) if k in expected.records
               and _bytes(r.raw) != expected.records[k]]
    out.figures.update(records_generated=len(expected.records), bronze_rows=n_bronze)
    out.add("bronze: each generated line once (by file/line)", not dup_lines and not missing and not extra,
            f"{n_bronze} rows for {len(expected.records)} generated lines; {dup_lines} duplicated, "
            f"{len(missing)} missing {_sample(missing)}, {len(extra)} not generated {_sample(extra)}")
    out.add("bronze: raw bytes unchanged", not changed, f"{len(changed)} lines differ {_sample(changed)}")


def _check_quarantine(out: Checks, read) -> None:
    """Quarantine keeps a record's bytes on one of its rows (the record's own row, or its first
    quarantined event); they must be bronze's, byte for byte."""
    key = ["source", "file_path", "line_number", "kafka_topic", "kafka_partition", "kafka_offset"]
    held = (read("silver", "quarantine")
            .select(*[F.col(f"bronze_{k}").alias(k) for k in key], as_binary().alias("q"))
            .groupBy(*key).agg(F.count("q").alias("copies"), F.first("q", ignorenulls=True).alias("q")))
    bronze = read("bronze", "events").select(*key, as_binary().alias("b"))
    joined = held.join(bronze, [held[k].eqNullSafe(bronze[k]) for k in key], "left")
    summary = joined.agg(
        F.count(F.lit(1)).alias("records"),
        F.count(F.when(F.col("copies") != F.when(F.col("b").isNotNull(), 1).otherwise(0), 1)).alias("copies_off"),
        F.count(F.when(~F.col("q").eqNullSafe(F.col("b")), 1)).alias("differ")).first()
    out.figures.update(quarantined_records=summary.records)
    out.add("quarantine: each record's bytes once, equal to bronze's",
            not summary.copies_off and not summary.differ,
            f"{summary.records} records quarantined: {summary.differ} differ from bronze, "
            f"{summary.copies_off} held other than once")


def _check_silver(out: Checks, read, expected, silver_table: str, late_path: str) -> None:
    silver_ids = [r.event_id for r in read("silver", silver_table).select("event_id").collect()]
    quarantined = {r.event_id for r in read("silver", "quarantine").where("event_id IS NOT NULL")
                   .select("event_id").collect()}
    dup_events = len(silver_ids) - len(set(silver_ids))
    silver = set(silver_ids)
    unknown = silver - expected.events
    from common.storage import is_delta_table

    kept = ({r.event_id for r in read("silver", "late_events").where("late_for = 'silver'").select("event_id").collect()}
            if is_delta_table(late_path) else set())
    unaccounted = expected.events - silver - quarantined - kept
    acct = (read("ops", "batch_accounting").where("layer = 'silver'")
            .agg(F.sum("late_dropped").alias("late"), F.sum("duplicates_dropped").alias("dups")).first())
    late = int(acct.late or 0)
    out.figures.update(events_generated=len(expected.events), silver_rows=len(silver_ids),
                       quarantined_events=len(quarantined), silver_late_dropped=late,
                       silver_late_kept=len(kept - silver - quarantined),
                       silver_duplicates_dropped=int(acct.dups or 0))
    # Waves must not share an event (same device, start and end), or "twice" would be ambiguous.
    out.add("generator: every event distinct", len(expected.events) == expected.event_count,
            f"{expected.event_count} events made, {len(expected.events)} distinct event_ids")
    out.add("silver: no event twice (by event_id)", not dup_events, f"{dup_events} duplicate rows")
    out.add("silver: only generated events", not unknown, f"{len(unknown)} unknown {_sample(unknown)}")
    out.add("silver: every generated event in silver, quarantine, or kept late",
            not unaccounted,
            f"{len(expected.events)} generated: {len(silver)} in silver, "
            f"{len(expected.events & quarantined - silver)} quarantined, "
            f"{len(expected.events & kept - silver - quarantined)} kept late ({late} counted late), "
            f"{len(unaccounted)} nowhere {_sample(unaccounted)}")


def _check_booked(out: Checks, read, cfg) -> None:
    # A batch committed to its checkpoint is never run again, so its ops.batch_accounting row
    # (written inside the batch, before the commit) must exist, or its drop counts are lost.
    # A no-data batch (watermark only) read no row, so it dropped none and may have no row.
    from bronze.job import QUERY_NAME
    from common.internals import committed_batches
    from common.lineage import read_nothing
    from gold.tables import for_config, query_name

    booked = {}
    for r in read("ops", "batch_accounting").select("query", "batch_id").collect():
        booked.setdefault(r.query, set()).add(r.batch_id)
    unbooked = {}
    for query in [QUERY_NAME[cfg.bronze.source], "silver", query_name(cfg, for_config(cfg))]:
        done = set(committed_batches(cfg.checkpoint(query)))
        done = {b for b in done if not read_nothing(cfg.checkpoint(query), b)}
        if done - booked.get(query, set()):
            unbooked[query] = sorted(done - booked.get(query, set()))
    out.figures["committed_batches_without_accounting_row"] = unbooked
    out.add("ops.batch_accounting: a row for every committed batch", not unbooked,
            f"missing rows: {unbooked}" if unbooked else "every committed batch booked")


def _check_audit(out: Checks, audit_code: int, audit_report: dict | None) -> None:
    if audit_report is None:
        out.add("audit passes", False, f"audit exit {audit_code}, no JSON report")
    else:
        out.add("audit passes", audit_code == 0 and audit_report.get("ok"),
                f"exit {audit_code}; failures: {audit_report.get('failures')}")
        for a in audit_report.get("accounting", []):
            out.add(f"audit accounting {a['name']}", a["status"] == "PASS", a["equation"])
        backfilled = sum(1 for t in audit_report.get("tables", []) for c in t.get("prefix", [])
                         if (c.get("made_by") or "").startswith("backfill "))
        out.figures["gold_versions_made_by_backfills"] = backfilled
        for t in audit_report.get("tables", []):
            if "prefix_summary" in t:
                s = t["prefix_summary"]
                out.add(f"audit {t['table']} = batch recompute, every version", not s["FAIL"] and s["PASS"],
                        f"{s['PASS']} PASS, {s['FAIL']} FAIL, {s['SKIP']} SKIP")


def _bytes(raw) -> bytes:
    return bytes(raw) if raw is not None else b""
