"""make status: each streaming query's latest batch, rates, lag, state and last error.

    python -m tools.status [--json]

Reads ops.query_progress (written by every job while it runs) and the queries' checkpoints, so
it works while jobs run and after they stop. A run without a recorded end whose checkpoint
nobody on this machine holds (common/checkpoint_lock.held; on object storage, its lease) died:
killed before it could record one. A checkpoint whose offset log is ahead of its commit log has
a batch running now, or one that was interrupted and will be replayed.
Below the queries: the keys the feed carries that the profile does not declare (ops.new_fields,
written by silver's schema contract), when each first appeared and how many records have
carried it since; and the late events kept in silver.late_events that no backfill has folded
into gold yet, with what folds them in.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

from common.checkpoint_lock import held as checkpoint_held
from common.errors import command
from common.config import load_config
from common.storage import is_delta_table
from tools.text_table import aligned


def queries(cfg) -> tuple[str, ...]:
    # gold: the one query that writes every gold table (a `--only` subset runs as gold_<keys>).
    return ("bronze_files", "bronze_kafka", "silver", "gold")


def checkpoint_batches(checkpoint: str) -> tuple[int | None, int | None]:
    """(latest planned batch, latest committed batch) from the offset and commit logs."""
    from common.internals import committed_batches, logged_batches

    return max(logged_batches(checkpoint), default=None), max(committed_batches(checkpoint), default=None)


def delta_lag(spark, sources_json: str | None) -> str | None:
    """Versions a Delta source's table has beyond what the query has read, measured now (the
    Delta source reports no latest offset in its progress)."""
    import re

    from common.delta import table_version
    from common.internals import delta_offset_read_through

    behind = None
    for s in json.loads(sources_json or "[]"):
        m = re.match(r"DeltaSource\[(.+)\]$", s.get("description") or "")
        end = s.get("endOffset")
        if not m or not isinstance(end, dict):
            continue
        read = delta_offset_read_through(end)
        if read is None:
            read = int(end["reservoirVersion"]) - 1
        latest = table_version(spark, m.group(1))
        behind = (behind or 0) + max(0, latest - read)
    return None if behind is None else f"{behind:,} versions"


def error_summary(text: str, width: int = 160) -> str:
    """The line that says what went wrong: a Python error raised in foreachBatch arrives wrapped
    in py4j and Spark exceptions, whose first lines only say that something was raised."""
    import re

    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    own = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)
           and not line.startswith(("py4j.", "org.apache.spark", "java."))]
    return (own[-1] if own else lines[0])[:width]


def is_running(run_id: str, at, start, end) -> bool:
    """Whether a query runs now, from its latest batch (`run_id` at `at`, None if none) and its
    latest start and end events. The run now is the latest start's when it came after the latest
    batch (a query started again that has had nothing to read), else the batch's; it runs unless
    that run has ended. Tables written before starts were recorded have none: there an end
    belongs to the run now when it came after the latest batch."""
    if start is not None and (at is None or start.timestamp > at):
        run_id = start.run_id
    if end is None:
        return True
    if end.run_id == run_id:
        return False
    return start is not None or (at is not None and end.timestamp < at)


def query_status(spark, cfg) -> list[dict]:
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    path = cfg.table_path("ops", "query_progress")
    rows: dict[str, dict] = {}
    if is_delta_table(path):
        progress = spark.read.format("delta").load(path)
        latest = (progress.where("event = 'progress'")
                  .withColumn("_n", F.row_number().over(Window.partitionBy("query_name")
                                                        .orderBy(F.desc("timestamp"), F.desc("batch_id"))))
                  .where("_n = 1").drop("_n").collect())
        runs = (progress.where("event IN ('started', 'terminated') AND query_name IS NOT NULL")
                .orderBy("timestamp").collect())
        ends = [r for r in runs if r.event == "terminated"]
        last_end = {r.query_name: r for r in ends}
        last_error = {r.query_name: r for r in ends if r.error}
        last_start = {r.query_name: r for r in runs if r.event == "started"}
        for r in latest:
            rows[r.query_name] = {
                "query": r.query_name, "batch": r.batch_id,
                "at": r.timestamp, "rows": r.input_rows, "input_per_s": r.input_rows_per_second,
                "processed_per_s": r.processed_rows_per_second,
                "batch_s": (r.batch_duration_ms or 0) / 1000,
                "lag": (delta_lag(spark, r.sources) if r.source_lag is None
                        else f"{r.source_lag:,} {r.lag_unit}"),
                "state_rows": r.state_rows, "state_mb": None if r.state_memory_bytes is None
                else round(r.state_memory_bytes / 2**20, 1),
                "watermark": r.watermark, "_run": r.run_id}
        for name in (set(last_end) | set(last_start)) - set(rows):   # no batch finished yet
            rows[name] = {"query": name, "_run": (last_start.get(name) or last_end[name]).run_id}
        for name, row in rows.items():
            end = last_end.get(name)
            running = is_running(row["_run"], row.get("at"), last_start.get(name), end)
            if running and checkpoint_held(cfg, name) is False:
                row["state"] = "died"          # nobody holds its checkpoint: killed before its end
            else:
                row["state"] = "running" if running else ("failed" if end.error else "stopped")
            if name in last_error:
                row["last_error"] = error_summary(last_error[name].error)
                row["error_at"] = last_error[name].timestamp
            del row["_run"]
    for q in queries(cfg):
        planned, committed = checkpoint_batches(cfg.checkpoint(q))
        if planned is None and q not in rows:
            continue
        row = rows.setdefault(q, {"query": q, "state": "no progress recorded"})
        row["checkpoint"] = (f"{committed} committed" if planned == committed or planned is None
                             else f"batch {planned} planned, {committed} committed")
        held = held_keys(spark, cfg.checkpoint(q))
        if held:
            row["held"] = held
    return list(rows.values())


def new_fields(spark, cfg) -> list[dict]:
    """Each undeclared key silver has met: when and where it first appeared, what the contract
    did with it (its latest batch's mode), and the records and events that carried it since."""
    from pyspark.sql import functions as F

    path = cfg.table_path("ops", "new_fields")
    if not is_delta_table(path):
        return []
    first = F.min(F.struct("recorded_at", "batch_id", "first_at"))
    latest = F.max(F.struct("recorded_at", "batch_id", "mode", "column"))
    rows = (spark.read.format("delta").load(path).groupBy("field", "level")
            .agg(first.alias("first"), latest.alias("latest"), F.sum("records").alias("records"),
                 F.sum("events").alias("events"))
            .orderBy("first").collect())
    return [{"field": r.field, "level": r.level, "mode": r.latest.mode, "column": r.latest.column,
             "first_seen": r.first.recorded_at, "first_at": r.first.first_at, "records": r.records,
             "events": r.events} for r in rows]


FIELD_COLUMNS = [("field", "new field"), ("level", "level"), ("mode", "contract"), ("column", "column"),
                 ("first_seen", "first seen (UTC)"), ("first_at", "first in"), ("records", "records since"),
                 ("events", "events since")]


# what a stateful operator's keys are, for the operators this pipeline runs
KEYS_OF = {"dedupeWithinWatermark": "dedup keys", "applyInPandasWithState": "keys with open sessions"}


def held_keys(spark, checkpoint: str) -> str | None:
    """The keys the query's state holds now, read from its checkpoint (`lakehouse state` lists
    them): e.g. silver's dedup keys, gold's keys with an open session."""
    from common.state import counts

    held = counts(spark, checkpoint)
    return ", ".join(f"{n:,} {KEYS_OF.get(op, op + ' keys')}" for op, n in held.items()) or None


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, datetime):
        return v.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if v.year > 1970 else ""
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


COLUMNS = [("query", "query"), ("state", "state"), ("batch", "batch"), ("at", "last batch (UTC)"),
           ("rows", "rows"), ("input_per_s", "in/s"), ("processed_per_s", "done/s"),
           ("batch_s", "batch s"), ("lag", "lag"), ("state_rows", "state rows"),
           ("state_mb", "state MB"), ("held", "state now"), ("watermark", "watermark"), ("checkpoint", "checkpoint"),
           ("last_error", "last error")]


def render(rows: list[dict], fields: list[dict] = (), late: dict | None = None, folded_by: str = "") -> str:
    if not rows:
        return "no streaming query has run yet under this lakehouse (make run-all)"
    text = _table(COLUMNS, rows)
    if fields:
        text += ("\n\nkeys the profile does not declare (ops.new_fields; the profile's parse.contract "
                 "says what silver does with them):\n" + _table(FIELD_COLUMNS, fields))
    if late:
        missed = ", ".join(f"{n:,} behind {layer}'s" for layer, n in sorted(late["late_for"].items()))
        text += (f"\n\nlate events not yet in gold (silver.late_events): {late['events']:,} ({missed} "
                 f"watermark), event time {_cell(late['first_event_time'])} to "
                 f"{_cell(late['last_event_time'])}; {folded_by}")
    return text


def _table(columns, rows) -> str:
    return "\n".join(aligned([h for _, h in columns], [[_cell(r.get(k)) for k, _ in columns] for r in rows]))


@command
def main(argv=None, *, spark=None, cfg=None, prog: str = "tools.status") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cfg = cfg or load_config()
    from common.spark import session

    from common import late

    with session(cfg, "status", spark) as spark:
        rows, fields, pending = query_status(spark, cfg), new_fields(spark, cfg), late.pending(spark, cfg)
    # --json keeps its list of queries; each new field is one more entry, marked as such, and so
    # are the pending late events.
    extra = [{"new_field": f} for f in fields] + ([{"late_events_pending": pending}] if pending else [])
    print(json.dumps(rows + extra, indent=2, default=str) if args.json
          else render(rows, fields, pending, late.folded_by(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
