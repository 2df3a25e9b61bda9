"""Backfill: fold the late events kept in silver.late_events into the gold rows they belong to.

    lakehouse backfill [--from TIME] [--to TIME] [--dry-run]      (make backfill FROM= TO=)

A late event missed gold's watermark: the windows and sessions it belongs to were (or could
have been) finalized without it. A backfill restates them: each window's measures get the
event's part (the same fold a micro-batch makes, gold/kinds), and each session it extends,
joins or starts is rewritten and closed (the same merge the session operator makes,
gold/sessions.py). One MERGE per table, a commit of the pipeline named by the backfill's id, so the audit proves
the version: the recompute of the batch before it adds the backfilled events to the on-time
ones, in the order they were folded (audit/prefix.py).

Sessions still open live in the gold query's state store, which a backfill cannot change: a
late event that would extend or join an open session stays pending until that session closes
(and is reported). Nothing else may write gold meanwhile: with gold stopped the command holds
its checkpoint lock; while gold runs it leaves a request, and the gold query's next batch runs
the backfill before its own fold (InBatch; with `gold.backfill: auto` also by itself, a delay
after it found late events).

Exactly once: the chosen events are first marked with the backfill's id in silver.late_events
(one commit), then each table is written once, skipped if its history already holds the id.
A backfill killed half way is finished by the next one before it chooses anything new.
"""
from __future__ import annotations

import argparse
import sys
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common.errors import JobError, command
from common.lineage import closes_ms
from common import late
from gold.kinds import CLOSING, EVENT, LITERAL_TS, GoldTable

BACKFILL = "backfill"        # the lineage key of a backfill's commits: {"id", "events"}


@dataclass
class Outcome:
    id: str | None = None
    events: int = 0                                    # late events folded in
    resumed: list[str] = field(default_factory=list)   # unfinished backfills it completed
    pending_open: int = 0                              # left pending: their session is open
    duplicates: int = 0                                # late for silver, but their id is in silver
    copies: int = 0                                    # late rows beyond the first of their id
    retry_at_ms: int | None = None                     # ... until gold's watermark is here
    tables: dict[str, int] = field(default_factory=dict)   # table -> its version after

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def backfilled_ids(spark, path: str) -> set[str]:
    """Ids of the backfills a table's history holds."""
    from delta.tables import DeltaTable

    from common.lineage import parse

    rows = DeltaTable.forPath(spark, path).history().select("userMetadata").collect()
    return {lin[BACKFILL]["id"] for lin in (parse(r.userMetadata) for r in rows) if lin and BACKFILL in lin}


class NotWrittenYet(JobError):
    """No gold batch has written the table yet: nothing can be late for it, and a backfill has
    no watermark to restate by. The backfill gold runs itself waits for its next batch."""


def watermarks(spark, path: str, checkpoint: str | None = None) -> tuple[int, int]:
    """The table's last batch's watermark, by which the query's state store still holds the
    sessions it has not timed out, and its closing watermark, by which the table's rows are
    final or closed (a later batch's only closes more). A backfill holds a late event's key by
    the first and flags what it writes by the second, as the batch did; the audit places the
    backfill's commit after that batch."""
    from common.delta import last_lineage

    lineage, outside = last_lineage(spark, path)
    if lineage is None:
        raise NotWrittenYet(f"{path}: no gold batch has written it yet, so nothing can be late for it")
    if outside:
        version, operation = outside[-1]
        raise JobError(f"{path} was changed outside the pipeline ({operation} at version {version}); "
                       "its rows no longer hold what gold folded in, so a backfill cannot build on them")
    state = int(lineage["watermark_ms"])
    if checkpoint is not None:
        # Watermark-only batches time sessions out in the state store and write nothing to
        # the table (the batch before closed them there): the checkpoint knows the last one.
        state = max(state, last_committed_watermark(checkpoint, lineage["query_id"]))
    return state, closes_ms(lineage)


def last_committed_watermark(checkpoint: str, query_id: str) -> int:
    """The watermark of the last batch the checkpoint committed (0: none, or another query's)."""
    from common.internals import committed_batches
    from common.lineage import batch_watermark_ms, checkpoint_query_id

    try:
        if checkpoint_query_id(checkpoint) != query_id:
            return 0
        done = committed_batches(checkpoint)
        return batch_watermark_ms(checkpoint, max(done)) if done else 0
    except FileNotFoundError:
        return 0


def _as_event_batch(events: DataFrame, specs) -> DataFrame:
    """Late silver rows as the gold query hands on-time events to a batch (column EVENT)."""
    from gold.job import event_columns

    return events.select(F.struct(*event_columns(specs, events.columns)).alias(EVENT))


def _session_dicts(rows, spec) -> list[dict]:
    """Table rows of one key's sessions (times read as epoch ms) as gold.sessions folds them."""
    return [{"id": r["session_id"], "start": r["_start"], "end": r["_end"], "events": r["events"],
             "sums": {m: r[m] for m in spec.sums}, "latest": {c: r[c] for c in spec.latest},
             "latest_at": r["_end"], "_status": r["status"]} for r in rows]


_TIMES = ("session_start", "session_end")


def _frame(spark, rows: list[dict], schema) -> DataFrame:
    """Session rows (gold.sessions._row) as a DataFrame of the table's schema; times go through
    epoch ms, not Python datetimes, whose conversion would follow the process's time zone."""
    from pyspark.sql.types import LongType, StructField, StructType

    as_ms = StructType([StructField(f.name, LongType()) if f.name in _TIMES else f for f in schema.fields])
    plain = [{**r, **{t: int(r[t].value // 1_000_000) for t in _TIMES}} for r in rows]
    return (spark.createDataFrame(plain, as_ms)
            .select(*[F.timestamp_millis(c).alias(c) if c in _TIMES else F.col(c) for c in schema.names]))


def restate_sessions(spark, spec: GoldTable, table: DataFrame, events: DataFrame, watermark_ms: int):
    """The session rows a backfill of `events` writes, the keys it must leave pending (their
    late events would extend or join a session still open at `watermark_ms`), and the earliest
    watermark at which one of those could go (None: none pending)."""
    from gold import sessions as S

    s = spec.spec
    inputs = S.session_inputs(events, s).toPandas()
    if inputs.empty:
        return [], set(), None
    keys = sorted(inputs[s.key].dropna().unique().tolist())
    held = (table.where(F.col(s.key).isin(keys) & (F.col("status") != "merged"))
            .withColumn("_start", F.unix_millis("session_start")).withColumn("_end", F.unix_millis("session_end"))
            .collect())
    by_key: dict = {}
    for r in held:
        by_key.setdefault(r[s.key], []).append(r)
    out, pending, closes = [], set(), []
    for key, frame in inputs.groupby(s.key, sort=True):
        before = _session_dicts(sorted(by_key.get(key, []), key=lambda r: r["_start"]), s)
        status = {b["id"]: b.pop("_status") for b in before}
        old = {b["id"]: dict(b) for b in before}
        after, absorbed = S.fold_batch(key, [dict(b) for b in before], [frame], s)
        changed = [a for a in after if a["id"] not in old or _differs(a, old[a["id"]])]
        if any(status.get(i) != "closed" for i in absorbed) or not all(
                S.is_closed(a, s.gap_ms, watermark_ms) for a in changed):
            pending.add(key)
            closes.append(max(a["end"] for a in changed) + s.gap_ms)
            continue
        out += [S._row(key, a, "closed", s) for a in changed]
        out += [S._merged_notice(key, i, s) for i in sorted(absorbed)]
    return out, pending, min(closes, default=None)


def _differs(a: dict, b: dict) -> bool:
    return any(a[k] != b[k] for k in ("start", "end", "events", "sums", "latest"))


class Backfill:
    def __init__(self, spark, cfg):
        from gold.tables import for_config, query_name

        self.spark, self.cfg = spark, cfg
        self.specs = for_config(cfg)
        self.query = query_name(cfg, self.specs)
        self.checkpoint = cfg.checkpoint(self.query)
        self.late_path = cfg.table_path("silver", late.TABLE)
        self.paths = {spec.table: cfg.table_path("gold", spec.table) for spec in self.specs}

    def late(self) -> DataFrame:
        from common.storage import is_delta_table

        if not is_delta_table(self.late_path):
            raise JobError(f"silver.{late.TABLE} does not exist at {self.late_path}: gold keeps late "
                           "events there from its first run on; run gold first")
        return self.spark.read.format("delta").load(self.late_path)

    def run(self, since: datetime | None = None, until: datetime | None = None, dry_run: bool = False) -> Outcome:
        from delta.tables import DeltaTable

        outcome = Outcome()
        rows = self.late()
        marked = {r[0] for r in rows.where(F.col("backfilled_by").isNotNull())
                  .select("backfilled_by").distinct().collect()}
        done = {t: backfilled_ids(self.spark, p) for t, p in self.paths.items()}
        for unfinished in sorted(i for i in marked if any(i not in ids for ids in done.values())):
            if not dry_run:
                self.apply(unfinished, rows.where(F.col("backfilled_by") == unfinished), done)
            outcome.resumed.append(unfinished)
        pending = rows.where(F.col("backfilled_by").isNull()
                             & (((F.col("late_for") == "gold") & (F.col("found_by_query") == self.query))
                                | (F.col("late_for") == "silver")))
        if since is not None:
            pending = pending.where(F.col("event_time") >= F.lit(since))
        if until is not None:
            pending = pending.where(F.col("event_time") < F.lit(until))
        # One copy per event (a replayed batch appends none twice; a late event is found once,
        # but a feed may repeat one that was late for silver). Rows chosen = events folded +
        # pending open + repeats of silver's (ids) + copies (rows beyond an id's first): the
        # figures the command prints add up to the table's rows.
        n, ids = pending.agg(F.count(F.lit(1)), F.count_distinct("event_id")).first()
        outcome.copies = n - ids
        pending, outcome.duplicates = self.not_in_silver(pending, rows)
        pending = pending.dropDuplicates(["event_id"]).cache()
        try:
            held = set()
            stateful = next((s for s in self.specs if s.stateful), None)
            if stateful is not None:
                path = self.paths[stateful.table]
                _, held, outcome.retry_at_ms = restate_sessions(self.spark, stateful, DeltaTable.forPath(self.spark, path).toDF(),
                                           pending, watermarks(self.spark, path, self.checkpoint)[0])
                outcome.pending_open = pending.where(F.col(stateful.spec.key).isin(sorted(held))).count() if held else 0
            chosen = pending.where(~F.col(stateful.spec.key).isin(sorted(held))) if held else pending
            outcome.events = chosen.count()
            if outcome.events and not dry_run:
                outcome.id = f"backfill-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
                self.mark(outcome.id, chosen)
                self.apply(outcome.id, self.late().where(F.col("backfilled_by") == outcome.id), done)
        finally:
            pending.unpersist()
        from common.delta import table_version
        outcome.tables = {t: table_version(self.spark, p) for t, p in self.paths.items()}
        return outcome

    def not_in_silver(self, pending: DataFrame, rows: DataFrame) -> tuple[DataFrame, int]:
        """Events late for silver missed its deduplication: one whose id silver holds (or a
        backfill folded in already) is a repeat, left out; returns the rest and how many ids
        were left out. Events late for gold are silver's rows themselves."""
        theirs = pending.where(F.col("late_for") == "silver")
        if not self.cfg.profile.dedup or not theirs.limit(1).count():
            return pending, 0
        seen = (self.spark.read.format("delta").load(self.cfg.table_path("silver", self.cfg.silver_table))
                .select("event_id")
                .unionByName(rows.where(F.col("backfilled_by").isNotNull()).select("event_id")))
        new = theirs.join(seen, "event_id", "left_anti")
        repeats = theirs.select("event_id").distinct().count() - new.select("event_id").distinct().count()
        return pending.where(F.col("late_for") != "silver").unionByName(new), repeats

    def mark(self, backfill_id: str, chosen: DataFrame) -> None:
        """The chosen events, named by the backfill before any gold table changes (one commit)."""
        from delta.tables import DeltaTable

        from common.delta import commit_metadata
        from common.lineage import PIPELINE

        with commit_metadata(self.spark, {"pipeline": PIPELINE, "made_by": f"backfill {backfill_id}"}):
            (DeltaTable.forPath(self.spark, self.late_path).alias("t")
             .merge(chosen.select("event_id", "found_by_query").alias("s"),
                    "t.event_id = s.event_id AND t.found_by_query = s.found_by_query AND t.backfilled_by IS NULL")
             .whenMatchedUpdate(set={"backfilled_by": F.lit(backfill_id),
                                     "backfilled_at": F.current_timestamp()}).execute())

    def apply(self, backfill_id: str, events: DataFrame, done: dict[str, set]) -> None:
        """Each table not yet holding the backfill gets its MERGE, under the backfill's lineage."""
        from delta.tables import DeltaTable

        from common.delta import commit_metadata
        from common.lineage import PIPELINE

        events = events.dropDuplicates(["event_id"]).cache()
        try:
            n = events.count()
            earliest = events.agg(F.date_format(F.min("event_time"), LITERAL_TS)).first()[0]
            for spec in self.specs:
                if backfill_id in done[spec.table]:
                    continue
                path = self.paths[spec.table]
                state_ms, closes = watermarks(self.spark, path, self.checkpoint)
                target = DeltaTable.forPath(self.spark, path)
                if spec.stateful:
                    restated, held, _ = restate_sessions(self.spark, spec, target.toDF(), events, state_ms)
                    if held:
                        raise JobError(f"backfill {backfill_id}: its events of {sorted(held)[:5]} now extend "
                                       f"a session open in gold.{spec.table}; nothing written to it")
                    if not restated:
                        continue
                    rows = _frame(self.spark, restated, target.toDF().schema)
                else:
                    batch = _as_event_batch(events, self.specs)
                    rows = spec.updates(batch, lambda: target.toDF(), closes, earliest).drop(CLOSING)
                # A commit of the pipeline, not of a batch: the audit holds the version to the
                # batch before it plus the backfilled events, whatever batch that is.
                with commit_metadata(self.spark, {"pipeline": PIPELINE, "made_by": f"backfill {backfill_id}",
                                                  BACKFILL: {"id": backfill_id, "events": n}}):
                    spec.merge(target, rows, closes, None)
                done[spec.table].add(backfill_id)
        finally:
            events.unpersist()


REQUEST = "gold.backfill-request"     # beside the checkpoints: what the running gold query should do


def request_path(cfg):
    from common.storage import location

    return location(str(cfg.checkpoint_root)) / REQUEST


def request(cfg, since: datetime | None, until: datetime | None) -> None:
    """Leave a backfill for the running gold query: it folds it in at its next batch."""
    import json

    where = request_path(cfg)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps({"from": since.isoformat() if since else None,
                                 "to": until.isoformat() if until else None,
                                 "requested_at": datetime.now(timezone.utc).isoformat()}))


class InBatch:
    """The gold query's own backfills, run at the start of a batch, before its fold (so the
    fold builds on them and nothing else writes gold meanwhile): a request the command left
    while gold ran, or, with `gold.backfill: auto`, late events found `gold.backfill_delay` ago
    or more. A batch that does neither checks a file's existence, no table."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.auto = cfg.gold.backfill == "auto"
        self.delay = cfg.gold.backfill_delay.seconds
        self.late_since: float | None = None     # monotonic time a pending late event was seen
        self.retry_at: int | None = None         # auto: a backfill left events for this watermark
        self.looked = False
        self.last_watermark: int | None = None   # the batch before's: what gold's tables hold

    def found_late(self) -> None:
        import time

        if self.late_since is None:
            self.late_since = time.monotonic()

    def __call__(self, spark, watermark_ms: int) -> Outcome | None:
        """`spark`: the batch's own session (commit metadata set on it stays the query's);
        `watermark_ms`: the batch's. Events whose session was open wait for the watermark of a
        batch before to pass it (its tables hold the sessions closed by then)."""
        import json
        import logging
        import time

        from common.log import fields

        held, self.last_watermark = self.last_watermark, watermark_ms
        passed = lambda at: at is None or (held is not None and held >= at)  # noqa: E731
        where = request_path(self.cfg)
        asked = json.loads(where.read_text()) if where.exists() else None
        if asked is not None and not passed(asked.get("retry_at_ms")):
            asked = None
        if self.auto and not self.looked:
            # A start: late events an earlier run kept wait the delay from now.
            self.looked = True
            if self.late_since is None and Backfill(spark, self.cfg).late().where(
                    "backfilled_by IS NULL").limit(1).count():
                self.found_late()
        due = (self.auto and self.late_since is not None and time.monotonic() - self.late_since >= self.delay
               and passed(self.retry_at))
        if asked is None and not due:
            return None
        since, until = (_time(asked[k]) if asked and asked.get(k) else None for k in ("from", "to"))
        try:
            outcome = Backfill(spark, self.cfg).run(since, until)
        except NotWrittenYet as waiting:
            # The first batch of a gold whose tables exist but hold no batch yet (a first run on
            # a silver that kept late events, or a restart after a kill before the first
            # commit): this batch writes them, the next one backfills. The request and the
            # pending events stay as they are.
            logging.getLogger(__name__).info(f"backfill waits for gold's first batch: {waiting}")
            return None
        if asked is not None:
            if outcome.pending_open:      # the request stands for what is left
                where.write_text(json.dumps({**asked, "retry_at_ms": outcome.retry_at_ms}))
            else:
                where.unlink(missing_ok=True)
        self.retry_at = outcome.retry_at_ms
        if not outcome.pending_open:
            self.late_since = None
        logging.getLogger(__name__).info(
            f"{outcome.id or 'backfill'}: folded {outcome.events} late event(s) into gold"
            + (f", {outcome.pending_open} wait for their session to close" if outcome.pending_open else ""),
            extra=fields(event="backfill", **outcome.as_dict()))
        return outcome


def _time(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r} (e.g. 2026-11-01T10:00:00Z)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


@command
def main(argv=None, prog: str = "gold.backfill", spark=None, cfg=None) -> int:
    """Exit code: 0 done (or nothing pending), 2 something to fix first (gold running, ...)."""
    import json

    from common.checkpoint_lock import CheckpointLocks
    from common.config import load_config
    from common.log import configure

    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="since", type=_time, help="only late events at or after this event time")
    parser.add_argument("--to", dest="until", type=_time, help="only late events before this event time")
    parser.add_argument("--dry-run", action="store_true", help="say what would be backfilled; change nothing")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    args = parser.parse_args(argv)
    configure()
    cfg = cfg or load_config()
    from gold.tables import for_config, query_name

    from common.checkpoint_lock import CheckpointBusy

    try:
        locks = CheckpointLocks(cfg, [query_name(cfg, for_config(cfg))]).__enter__()
    except CheckpointBusy as busy:
        if args.dry_run:
            raise JobError(f"gold is running ({busy}); a dry run needs it stopped") from None
        request(cfg, args.since, args.until)
        print(f"gold is running: backfill requested ({request_path(cfg)}); its next batch (when new "
              "data comes) folds the pending late events in before its own rows (the gold log says so)")
        return 0
    try:
        from common.spark import session

        with session(cfg, "backfill", spark) as spark:
            outcome = Backfill(spark, cfg).run(args.since, args.until, args.dry_run)
    finally:
        locks.__exit__(None, None, None)
    if args.json:
        print(json.dumps(outcome.as_dict(), default=str))
        return 0
    verb = "would fold" if args.dry_run else "folded"
    for i in outcome.resumed:
        print(f"finished the interrupted {i}")
    print(f"{outcome.id or 'backfill'}: {verb} {outcome.events} late event(s) into gold"
          + (f"; {outcome.pending_open} stay pending: their session is still open" if outcome.pending_open else "")
          + (f"; {outcome.duplicates} late for silver repeat an event silver holds (left out)"
             if outcome.duplicates else "")
          + (f"; {outcome.copies} more late row(s) repeat one of these events (each folded once)"
             if outcome.copies else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
