"""Gold job: silver -> the profile's gold tables (nest: gold.zip_hourly_sightings,
gold.device_activity, gold.device_sessions), all written by ONE streaming query (`gold`).

    python -m gold.job [--only sightings,activity,sessions] [--trigger ...] [--interval ...]

Each micro-batch reads silver once. Its on-time events are shuffled once by the sessions key;
the same shuffle output feeds both the sessions' arbitrary stateful processing
(applyInPandasWithState) and, passed through as they are, the windowed tables, which keep no
Spark state: a batch's part of each window it touched (a plain aggregation of the batch) is
folded into the window's current row in the table (gold.transform.combine), and the rows it
changed are MERGEd by key. The tables are the windows' state, so gold's state store holds open
sessions only, and a window costs nothing once the batches stop touching it.

Every table holds the current value of every window or session seen so far. Windows whose end
is behind the watermark of the last batch that brought an on-time event are marked finalized,
and sessions whose end + gap is behind it closed (status open/closed).

A window's row is the sum of every batch that touched it, so each batch must reach a table
exactly once: a replayed batch (after a crash) first looks for its own commit in the table's
history and skips the tables it already wrote, and a table is only ever written by the
checkpoint that wrote it first (prepare refuses another).
"""
from __future__ import annotations

import re

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common import accounting
from common.config import ConfigError
from common.delta import (TXN, appended, change_feed, commit_metadata, ensure_table, idempotent_append, last_lineage, live_files,
                          retry_on_conflict)
from common.lineage import checkpoint_query_id, read_nothing
from common.batch import BatchContext, MicroBatch, aggregates_while_caching, together
from common.quality import QualityGate, check_tables, load_suites
from common.schemas import DQ_RESULTS
from common.storage import is_delta_table, location
from common.errors import JobError
from common.streaming import trigger
from common.flow import Flow, Layer
from gold import sessions as S
from gold import transform as T
from gold.tables import GoldTable, for_config, query_name
from silver.transform import FRONTIER

EVENT, SESSION = "event", "session"        # the two kinds of row a gold micro-batch hands over
INPUT_METRICS = "gold_input"
# Timestamps handed from one plan to the next as SQL literals, in the session's time zone: a
# literal is what Delta's data skipping and Parquet's filter pushdown compare with file stats.
LITERAL_TS = "yyyy-MM-dd HH:mm:ss.SSSSSS"
LIVE_SESSION = "status <> 'merged'"      # sessions' `merged` notices are deletions, not rows


def output_schema(spark, cfg, spec: GoldTable, silver_schema):
    empty = spark.createDataFrame([], silver_schema)
    if not spec.windowed:
        return spark.createDataFrame([], spec.session_spec(cfg).output_schema(silver_schema)).schema
    return T.with_finalized(spec.build(empty, cfg), 0).schema


def event_columns(cfg, tables, silver_columns) -> list[str]:
    """The silver columns the tables read: shuffling only these keeps the batch's one shuffle
    narrow (a silver row also carries its raw lineage)."""
    wanted = {"event_time"}
    for spec in tables:
        if spec.windowed:
            agg = next(a for a in cfg.profile.aggregations if a.key == spec.key)
            wanted |= set(agg.group)
            expressions = [e for _, e in agg.measures]
        else:
            sessions = spec.sessions
            wanted |= {sessions.key, *sessions.latest}
            expressions = [e for _, e in sessions.measures]
        for e in expressions:
            wanted |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", e))
    wanted = {w.lower() for w in wanted}          # Spark's column names are case-insensitive
    return [c for c in silver_columns if c.lower() in wanted]


def hands_over_events(tables) -> bool:
    """Whether gold's stream carries the batch's on-time events (column `event`): only the
    windowed tables read them; a selection of sessions alone gets session updates only."""
    return any(t.windowed for t in tables)


def gold_stream(spark, cfg, tables) -> DataFrame:
    """The gold query's streaming plan: one row per on-time event (column `event`) and one per
    session update (column `session`), from one read and one shuffle of silver."""
    silver_path = cfg.table_path("silver", cfg.silver_table)
    wm = cfg.gold.watermark
    metrics = [F.count(F.lit(1)).alias("rows_in")]
    if wm is not None:   # without a watermark nothing is late (progress_counts reads 0)
        metrics.append(F.count(F.when(T.late(wm.seconds), 1)).alias("late"))
    silver = (spark.readStream.format("delta")
              .option("maxFilesPerTrigger", cfg.gold.max_files_per_trigger).load(silver_path))
    events = T.on_time(silver.observe(INPUT_METRICS, *metrics), wm)
    events = events.select(*event_columns(cfg, tables, [c for c in silver.columns if c != FRONTIER]))
    sessions = next((t for t in tables if not t.windowed), None)
    windowed = hands_over_events(tables)
    if sessions is not None:
        spec = sessions.session_spec(cfg)
        # The stateful operator needs the events hashed by its key: shuffled once here, the
        # pass-through branch reads the same shuffle output (Spark reuses the exchange), so the
        # batch is read and shuffled once for every table.
        carried = ()
        if windowed:
            events = events.repartition(spec.key)
            carried = events.columns     # else the branches prune differently: two shuffles
        updates = S.sessionize(events, spec, *carried)
    passing = events.select(F.struct(*events.columns).alias(EVENT),
                            *([F.lit(None).cast(updates.schema).alias(SESSION)] if sessions else []))
    if sessions is None:
        return passing
    sessioned = updates.select(F.lit(None).cast(passing.schema[EVENT].dataType).alias(EVENT),
                               F.struct(*updates.columns).alias(SESSION))
    return passing.unionByName(sessioned) if windowed else sessioned


def merge(spark, cfg, path: str, spec: GoldTable, updates: DataFrame, watermark_ms: int,
          ctx: BatchContext, close_behind: bool = True, window_from: str | None = None) -> None:
    """MERGE the batch's updated rows (each window's or session's value after the batch). A
    conflict with a concurrent compaction (make maintain, the runner's maintenance) replans and
    retries: the rows are computed already, and compaction does not change the table's rows.

    Into an empty table (a fresh lakehouse's first batch, the whole of a first available-now
    run) every row is an insert, so an append keyed by the batch does the MERGE's work without
    its joins. `close_behind`: also close the table's rows the watermark passed that the batch
    does not carry (sessions, see _merge_once; a windowed table's `updates` carry them).
    `window_from`: the earliest window_start of a windowed table's `updates` (a timestamp
    literal), which lets the MERGE skip the files of older windows."""
    if live_files(spark, path) == 0:
        idempotent_append(live_rows(spec, updates), path, batch_key(ctx), ctx.batch_id, ctx.lineage, ctx.replay)
        return
    # The commit's metadata (lineage and key) is the batch's session conf, set by the caller
    # for every table at once: MERGE has no writer option, and one session conf set per table
    # by concurrent writes would race.
    retry_on_conflict(lambda: _merge_once(spark, cfg, path, spec, updates, watermark_ms, close_behind, window_from))


def _merge_once(spark, cfg, path: str, spec: GoldTable, updates: DataFrame, watermark_ms: int,
                close_behind: bool, window_from: str | None = None) -> None:
    cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in spec.keys)
    if window_from is not None:
        # Implied by the keys (window_start is one): a condition on the target alone, which
        # Delta checks against each file's window_start range to skip the files of windows the
        # batch did not change, instead of joining the whole table.
        cond += f" AND t.window_start >= TIMESTAMP '{window_from}'"
    target = DeltaTable.forPath(spark, path)
    source = updates
    if close_behind:
        # Sessions this batch did not touch still close as the watermark moves, including what
        # watermark-only batches left: they write nothing. They go into the source rather than
        # a NOT MATCHED BY SOURCE clause, which would make the MERGE join (and rewrite) the
        # whole table every batch: this way it rewrites only the files holding a changed row,
        # and finding the rows to close skips files by their stats.
        closing = (spec.behind_watermark(target.toDF(), cfg, watermark_ms).alias("t")
                   .join(updates.alias("s"), F.expr(cond), "left_anti"))
        source = updates.unionByName(closing)
    m = target.alias("t").merge(source.alias("s"), cond)
    if spec.windowed:
        m = m.whenMatchedUpdateAll().whenNotMatchedInsertAll()
    else:
        m = (m.whenMatchedDelete(condition="s.status = 'merged'").whenMatchedUpdateAll()
             .whenNotMatchedInsertAll(condition="s.status <> 'merged'"))
    m.execute()


def batch_key(ctx: BatchContext) -> str:
    """The key of the batch's commit to each gold table (with the batch id as its version):
    one commit per table per batch, so the table's history tells whether the batch wrote it."""
    return f"{ctx.app_id}-gold"


class GoldBatch(MicroBatch):
    """foreachBatch body of the gold query: every table it writes, from one batch."""

    layer = "gold"

    def __init__(self, spark, cfg, tables, gates: dict, books, query: str | None = None):
        super().__init__(spark, cfg, query or query_name(cfg, tables), f"silver.{cfg.silver_table}", None, books)
        self.tables = tuple(tables)
        self.events = hands_over_events(tables)
        self.gates = gates                   # table -> QualityGate (tables without a suite: none)
        self.paths = {t.table: cfg.table_path("gold", t.table) for t in tables}
        # Whether the sessions table may hold rows the watermark has passed that no later batch
        # carries: only after a batch that wrote nothing, since every other batch emits the
        # sessions it times out; and at a start, for what an earlier run left. (Windows: always,
        # update output never re-emits a window the watermark passes.)
        self.stale_behind = True

    def updates(self, spec: GoldTable, batch: DataFrame, watermark_ms: int, earliest: str | None) -> DataFrame:
        """What the batch changes in one table: each touched window's value after the batch and
        the windows the watermark made final (flagged T.CLOSING), or the session rows the
        stateful operator emitted. `earliest`: the batch's earliest event time (a literal)."""
        if not spec.windowed:
            return batch.where(F.col(SESSION).isNotNull()).select(f"{SESSION}.*")
        events = batch.where(F.col(EVENT).isNotNull()).select(f"{EVENT}.*")
        part = spec.build(events, self.cfg)
        if live_files(self.spark, self.paths[spec.table]) == 0:
            full = part.withColumn(T.CLOSING, F.lit(False))
        else:
            table = DeltaTable.forPath(self.spark, self.paths[spec.table]).toDF()
            full = spec.combine(part, T.open_or_after(table, earliest), watermark_ms)
        return T.with_finalized(full, watermark_ms)

    def written(self, spec: GoldTable, ctx: BatchContext) -> bool:
        """A replayed batch that committed to this table before the crash: its part is in the
        rows already, and folding it in again would count it twice."""
        return ctx.replay and appended(self.spark, self.paths[spec.table], batch_key(ctx), ctx.batch_id,
                                       ctx.lineage.get("query_id"))

    def write(self, batch: DataFrame, ctx: BatchContext) -> dict:
        cfg, lineage = self.cfg, ctx.lineage
        watermark = lineage["watermark_ms"]
        batch.persist()
        cached: list[DataFrame] = []
        try:
            # A batch that brought no on-time event writes nothing: a no-data batch (it only
            # moved the watermark), one over silver commits that changed no data (a compaction)
            # or one of late rows only. What it would write is the sessions its watermark timed
            # out and the windows it made final: a MERGE for a flag. The next batch with events
            # marks them in its MERGE. (It still ran: its state was committed.) A selection of
            # the sessions table alone hands over no events, so there only an empty or no-data
            # batch is skipped.
            # One job counts the batch (and fills its cache) and finds its earliest event.
            seen = aggregates_while_caching(
                batch, F.count(F.lit(1)).alias("n"), F.count(EVENT).alias("events"),
                F.date_format(F.min(f"{EVENT}.event_time"), LITERAL_TS).alias("earliest"))
            brought = seen["events"] if self.events else seen["n"]
            if not brought or read_nothing(self.checkpoint, ctx.batch_id):
                self.stale_behind = True
                return self.commit(ctx, dict(rows_written=0, quality_ms=None))
            # Each table's fold (its Delta snapshot, plan and one job) overlaps the others': the
            # jobs are small, and one at a time the driver's part of each was most of a batch.
            def fold(spec: GoldTable) -> tuple | None:
                if self.written(spec, ctx):
                    return None
                rows = self.updates(spec, batch, watermark, seen["earliest"]).persist()
                cached.append(rows)
                return (spec, rows, *self.sizes(spec, rows))

            folded = together(*[(lambda spec=spec: fold(spec)) for spec in self.tables])
            changed = [f for f in folded if f is not None]
            gated = [(self.gates[spec.table], T.quality_view(live_rows(spec, touched(rows)), cfg.profile.dimension), live)
                     for spec, rows, n, live, _ in changed if live and spec.table in self.gates]
            gate = (check_tables(gated, self.spark, self.dq_path, self.query, ctx.batch_id, ctx.app_id,
                                 lineage, ctx.replay) if gated else None)
            writes = []
            for spec, rows, n, _, window_from in changed:
                if not n:
                    continue
                close_behind = not spec.windowed and self.stale_behind
                writes.append(lambda spec=spec, rows=rows, close_behind=close_behind, window_from=window_from: merge(
                    rows.sparkSession, cfg, self.paths[spec.table], spec, rows.drop(T.CLOSING), watermark, ctx,
                    close_behind, window_from))
                if spec.publish and cfg.gold.stats_to_kafka:
                    writes.append(lambda spec=spec, rows=rows: publish_stats(cfg, spec, touched(rows)))
            counts = dict(rows_written=sum(f[2] for f in changed), quality_ms=gate.ms if gate else None)
            key = {TXN: {"app": batch_key(ctx), "version": ctx.batch_id}}
            with commit_metadata(batch.sparkSession, {**lineage, **key}):
                committed = self.commit(ctx, counts, *writes, gate.record if gate else None)
            self.stale_behind = False
            return committed
        finally:
            for rows in cached:
                rows.unpersist()
            batch.unpersist()

    @staticmethod
    def sizes(spec: GoldTable, rows: DataFrame) -> tuple[int, int, str | None]:
        """The rows the batch's events changed (the windows they touched, the sessions the
        stateful operator emitted), the live ones of those (the gate's row count) and, for
        windows, the earliest window_start of `rows` (a literal for the MERGE), in one Spark
        job, which also fills the cache of `rows`."""
        if spec.windowed:
            r = rows.agg(F.count_if(~F.col(T.CLOSING)).alias("n"),
                         F.date_format(F.min("window_start"), LITERAL_TS).alias("first")).first()
            return r["n"], r["n"], r["first"]
        r = rows.agg(F.count(F.lit(1)).alias("n"), F.count_if(F.expr(LIVE_SESSION)).alias("live")).first()
        return r["n"], r["live"], None


def touched(rows: DataFrame) -> DataFrame:
    """The rows of an update the batch's events changed: not the windows it only closes,
    which the gate has checked and the stats topic has had already (same values)."""
    return rows.where(~F.col(T.CLOSING)).drop(T.CLOSING) if T.CLOSING in rows.columns else rows


def live_rows(spec: GoldTable, rows: DataFrame) -> DataFrame:
    """The rows a gold table holds of an update: the gate checks these, a first write appends them."""
    return rows if spec.windowed else rows.where(LIVE_SESSION)


def publish_stats(cfg, spec: GoldTable, updates: DataFrame) -> None:
    """Updated window values to the compacted stats topic. A replayed batch re-sends the same
    key with the same value, which compaction collapses."""
    (T.stats_kafka_records(updates, *spec.publish).write.format("kafka")
     .option("kafka.bootstrap.servers", cfg.kafka.bootstrap_servers)
     .option("topic", cfg.kafka.topics.stats).save())


def progress_counts(progress: dict) -> dict:
    seen = accounting.observed(progress, INPUT_METRICS)
    # Late events are counted before on_time() drops them; no stateful operator drops any row
    # in gold (state_drops would count partial aggregates, not events, if one ever did).
    return {"rows_in": int(seen.get("rows_in") or 0), "late_dropped": int(seen.get("late") or 0),
            "duplicates_dropped": 0}


def check_owner(spark, cfg, query: str, tables) -> None:
    """Refuse to fold batches into rows they would make wrong. A window's row is the sum of
    every batch its query folded in: a second query (a deleted checkpoint, another --only
    selection, the per-table queries of an older version) would read silver from its start
    and count every event again, and rows changed by hand since the query's last batch (a
    RESTORE) no longer hold what it folded in."""
    checkpoint = cfg.checkpoint(query)
    mine = checkpoint_query_id(checkpoint) if (location(checkpoint) / "metadata").exists() else None
    rebuild = ("Rebuild gold from silver: `make reset-gold` drops the gold tables and checkpoints, "
               "then run gold again.")
    for spec in tables:
        path = cfg.table_path("gold", spec.table)
        if not is_delta_table(path):
            continue
        writer, outside = last_lineage(spark, path)
        if writer is not None and writer.get("query_id") != mine:
            raise JobError(
                f"gold.{spec.table} was written by query {writer.get('query')} (checkpoint id "
                f"{writer.get('query_id')}), not by {query} ({checkpoint}"
                f"{', which does not exist yet' if mine is None else ''}): its rows are the sum "
                f"of the batches that query folded in, and another one would count silver's "
                f"events again. Run the selection that wrote it (`--only`), or: {rebuild}")
        if writer is not None and outside:
            version, operation = outside[-1]
            raise JobError(
                f"gold.{spec.table} was changed outside the pipeline ({operation} at version "
                f"{version}) after the last batch of {query}: its rows no longer hold what the "
                f"query folded in, and the next batches would build on them. {rebuild}")


def prepare_gold(spark, cfg, specs) -> None:
    """Check the stats topic when publishing, create the gold and ops tables, check that this
    query owns its tables."""
    silver_path = cfg.table_path("silver", cfg.silver_table)
    if cfg.gold.stats_to_kafka:
        from common.kafka import BrokerError, ensure_topic, wait_for_kafka

        try:
            wait_for_kafka(cfg.kafka.bootstrap_servers, cfg.kafka.connect_timeout.seconds)
        except BrokerError as e:
            raise JobError(f"gold.stats_to_kafka is on but {e}") from None
        ensure_topic(cfg.kafka.bootstrap_servers, cfg.kafka.topics.stats,
                     cfg.kafka.topic_partitions, compacted=True)
    check_owner(spark, cfg, query_name(cfg, specs), specs)
    silver_schema = spark.read.format("delta").load(silver_path).schema
    # Created up front: concurrent writers creating it on their first batch would conflict.
    # Distinct tables, so side by side.
    together(lambda: ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS),
             lambda: accounting.ensure_accounting(spark, cfg),
             *[(lambda spec=spec: ensure_table(spark, cfg, "gold", spec.table,
                                               output_schema(spark, cfg, spec, silver_schema), (),
                                               change_feed(cfg.gold.change_feed)))
               for spec in specs])


def start_query(spark, cfg, specs, suites: dict):
    """Start the gold query over `specs` (each batch records its own accounting row)."""
    query = query_name(cfg, specs)
    gates = {spec.table: QualityGate(suites[f"gold.{spec.table}"]) for spec in specs
             if f"gold.{spec.table}" in suites}
    books = accounting.Accounting(spark, cfg, "gold", cfg.checkpoint(query), progress_counts)
    batch = GoldBatch(spark, cfg, specs, gates, books, query)
    return (gold_stream(spark, cfg, specs).writeStream.queryName(query)
            .outputMode("update")
            .foreachBatch(batch)
            .option("checkpointLocation", cfg.checkpoint(query))
            .trigger(**trigger(cfg, "gold"))
            .start())


def select(cfg, only=None) -> list[GoldTable]:
    tables = for_config(cfg)
    unknown = set(only or ()) - {t.key for t in tables}
    if unknown:
        raise ConfigError(f"--only: unknown {sorted(unknown)} for profile {cfg.profile.name} "
                          f"(known: {', '.join(t.key for t in tables)})")
    return [t for t in tables if not only or t.key in only]


def layer(cfg, only=None, suites=None) -> Layer:
    """The profile's gold tables (or the `only` subset, by key), written by one flow, gated by
    `suites` (default: conf gold.expectations)."""
    if suites is None:
        suites = load_suites(cfg.gold.expectations, gx=False)   # a bad suite fails here or in validate
    chosen = select(cfg, only)
    flow = Flow(query_name(cfg, chosen), "gold", lambda spark: start_query(spark, cfg, chosen, suites))
    return Layer("gold", "silver", (flow,), reads_table=cfg.table_path("silver", cfg.silver_table),
                 prepare=lambda spark: prepare_gold(spark, cfg, chosen),
                 validate=lambda: load_suites(cfg.gold.expectations),
                 describe=f"silver.{cfg.silver_table} -> {', '.join(f'gold.{t.table}' for t in chosen)}")


if __name__ == "__main__":
    from pipeline.cli import exit_now, layer_main

    exit_now(layer_main("gold"))
