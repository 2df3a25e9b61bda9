"""Gold job: silver -> the profile's gold tables, all written by ONE streaming query (`gold`).

    python -m gold.job [--only sightings,activity,sessions] [--trigger ...] [--interval ...]

Each micro-batch reads silver once and shuffles its on-time events once; the stateful table's
operator (sessions) and the tables that fold events (windows, gold/kinds) share that shuffle.
Each table's kind computes what the batch changes in it; this job runs every kind alike: the
rows changed are gated, MERGEd by key, and published, in one commit per table per batch.

A table's rows hold every batch folded in, so each batch must reach a table exactly once: a
replayed batch (after a crash) first looks for its own commit in the table's history and skips
the tables it already wrote, and a table is only ever written by the checkpoint that wrote it
first (gold/owner.py).
"""
from __future__ import annotations

from functools import partial

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common import accounting
from common.config import ConfigError
from common.delta import change_feed, ensure_table, live_files
from common.delta_source import delta_stream
from common.batch import BatchContext, MicroBatch, aggregates_while_caching, together
from common.outputs import Append, Changed, Merge, Publish, Result
from common.quality import QualityGate, load_suites
from common.schemas import DQ_RESULTS
from common.errors import JobError
from common.streaming import trigger
from common.flow import Flow, Layer, RestartOnSchemaChange, Started
from gold import transform as T
from gold.kinds import CLOSING, EVENT, LITERAL_TS, SESSION, GoldTable, touched
from common.lineage import CLOSES
from gold.constraints import by_name, gate_suites, viewed
from gold.owner import check_owner
from common import late
from gold import sinks
from gold.backfill import InBatch
from gold.tables import for_config, logic_hash, query_name
from silver.transform import FRONTIER

INPUT_METRICS = "gold_input"


def event_columns(tables, silver_columns) -> list[str]:
    """The silver columns the tables read: shuffling only these keeps the batch's one shuffle
    narrow (a silver row also carries its lineage)."""
    wanted = {c.lower() for t in tables for c in t.reads()} | {"event_time"}   # Spark's names ignore case
    return [c for c in silver_columns if c.lower() in wanted]


def silver_stream(spark, cfg, checkpoint: str) -> DataFrame:
    return delta_stream(spark, cfg.table_path("silver", cfg.silver_table), checkpoint,
                        cfg.gold.max_files_per_trigger)


def gold_stream(cfg, tables, silver: DataFrame) -> DataFrame:
    """The gold query's streaming plan over `silver` (silver_stream): one row per on-time event
    (column EVENT) for the tables folding events, one per row of the stateful table (column
    SESSION), from one read and one shuffle of silver; a late event's row has only its silver
    row, as text (common/late.py)."""
    wm = cfg.gold.watermark
    metrics = [F.count(F.lit(1)).alias("rows_in")]
    if wm is not None:   # without a watermark nothing is late (progress_counts reads 0)
        metrics.append(F.count(F.when(T.late(wm.seconds), 1)).alias("late"))
    observed = silver.observe(INPUT_METRICS, *metrics)
    wanted = event_columns(tables, [c for c in silver.columns if c != FRONTIER])
    if wm is None:
        events, kept = observed.select(*wanted), []
    else:
        # Late rows go on, as text, to the batch that keeps them; their event time goes (the
        # watermark ignores nulls) so they move nothing, as when they were dropped here.
        marked = observed.withColumn(late.LATE, late.row(silver.columns, T.late(wm.seconds)))
        marked = marked.withColumn("event_time", F.when(F.col(late.LATE).isNull(), F.col("event_time")))
        events, kept = marked.withWatermark("event_time", wm.spark()).select(*wanted, late.LATE), [late.LATE]
    on_time = F.col(late.LATE).isNull() if kept else F.lit(True)
    stateful = next((t for t in tables if t.stateful), None)
    folding = any(not t.stateful for t in tables)
    if stateful is not None:
        carried = ()
        if folding:
            # The stateful operator needs the events hashed by its key: shuffled once here, the
            # pass-through branch reads the same shuffle output (Spark reuses the exchange), so
            # the batch is read and shuffled once for every table.
            events = events.repartition(stateful.keys[0])      # its grouping key
            carried = events.columns     # else the branches prune differently: two shuffles
        # Late rows too: a filter here would go below the shuffle, which the branches would then
        # not share; the state function skips them (no event time).
        updates = stateful.stream(events, *carried)
    event = F.struct(*[c for c in events.columns if c not in kept])
    passing = events.select(F.when(on_time, event).alias(EVENT), *kept,
                            *([F.lit(None).cast(updates.schema).alias(SESSION)] if stateful else []))
    if stateful is None:
        return passing
    sessioned = updates.select(F.lit(None).cast(passing.schema[EVENT].dataType).alias(EVENT),
                               *[F.lit(None).cast("string").alias(c) for c in kept],
                               F.struct(*[c for c in updates.columns if c not in kept]).alias(SESSION))
    if folding:
        return passing.unionByName(sessioned)
    # A selection of the stateful table alone hands over no events, but still its late rows.
    return passing.where(~on_time).unionByName(sessioned) if kept else sessioned


class GoldBatch(MicroBatch):
    """foreachBatch body of the gold query: every table it writes (gold/sinks.py declares each
    one's outputs), from one batch."""

    layer = "gold"

    def __init__(self, spark, cfg, tables, gates: dict, books, query: str | None = None,
                 silver_schema=None):
        tables = tuple(tables)
        outputs = tuple(out for spec in tables for out in sinks.outputs(cfg, spec))
        # The silver rows of late events, kept (common/late.py) when the stream carries them.
        self.late_schema = silver_schema if cfg.gold.watermark is not None else None
        self.late_table_ready = False
        if self.late_schema is not None:
            outputs += (Append(late.OUTPUT, cfg.table_path("silver", late.TABLE), late.KEY),)
        # The query of every table folds backfills in (gold/backfill.py); a selection does not.
        self.backfills = (InBatch(cfg) if self.late_schema is not None
                          and (query or query_name(cfg, tables)) == query_name(cfg, for_config(cfg)) else None)
        # gates: table -> QualityGate (tables without a suite: none)
        super().__init__(spark, cfg, query or query_name(cfg, tables), f"silver.{cfg.silver_table}", gates,
                         books, outputs)
        self.tables = tables
        # table -> the constraints its gate checks on a column its view adds (quality_view)
        self.viewed = {t.table: viewed(t.checks(), self.gates[t.table].suite) for t in tables if t.table in self.gates}
        self.folding = any(not t.stateful for t in tables)   # the stream hands over events
        self.merges = {out.name: out for out in outputs if isinstance(out, Merge)}
        self.published = {out.name for out in outputs if isinstance(out, Publish)}
        # The closing watermark the last batch of this run applied (closing_watermark); None at
        # a start, when the tables may hold rows an earlier run left open behind it.
        self.closed = None
        self.delay_ms = None if cfg.gold.watermark is None else round(cfg.gold.watermark.seconds * 1000)
        self.logic = {"profile": cfg.profile.name, "hash": logic_hash(cfg)}

    def lineage(self, batch_id: int) -> dict:
        """The batch's lineage and the logic its rows follow (the profile's gold tables, hashed):
        the audit recomputes a version only with the logic that made it."""
        return {**super().lineage(batch_id), "logic": self.logic}

    def fold(self, spec: GoldTable, batch: DataFrame, ctx: BatchContext, earliest: str | None) -> tuple | None:
        """The table's update for the batch, pinned (its MERGE changes the table it was read
        from, BatchContext.pin), and its sizes; None if a replay finds the batch already in the
        table (folding it in again would count it twice)."""
        out = self.merges[spec.table]
        if out.written(self.spark, ctx):
            return None
        current = lambda: DeltaTable.forPath(self.spark, out.path).toDF() if live_files(self.spark, out.path) else None  # noqa: E731
        rows = ctx.pin(spec.updates(batch, current, ctx.lineage[CLOSES], earliest))
        return (spec, rows, *spec.sizes(rows))

    def compute(self, batch: DataFrame, ctx: BatchContext) -> Result:
        watermark = ctx.lineage["watermark_ms"]
        if self.backfills is not None:
            self.backfills(ctx.session, watermark)      # before the fold, which then builds on what it restated
        ctx.keep(batch)
        # One job counts the batch's events (and fills its cache) and finds the earliest.
        seen = aggregates_while_caching(
            batch, F.count(EVENT).alias("events"),
            F.date_format(F.min(f"{EVENT}.event_time"), LITERAL_TS).alias("earliest"),
            self.latest_ms(batch).alias("latest_ms"),
            *([F.count(late.LATE).alias("late")] if self.late_schema is not None else []))
        # (A batch cut inside a silver version may leave rows of that version, ahead of their
        # own frontier, to the next one: it closes by its own watermark.)
        whole = ctx.lineage["upstream"]["version"] is not None
        closes = ctx.lineage[CLOSES] = closing_watermark(watermark, seen["latest_ms"] if whole else None,
                                                         self.delay_ms)
        kept = {}
        if self.late_schema is not None and seen["late"]:
            if not self.late_table_ready:
                # Once per query start, and only when late rows come: a restart after silver grew
                # a column (its schema contract) starts the query alone, and its late rows carry it.
                late.ensure(ctx.session, self.cfg, self.late_schema)
                self.late_table_ready = True
            if self.backfills is not None:
                self.backfills.found_late()
            kept[late.OUTPUT] = late.rows(batch, self.late_schema, self.query, ctx.batch_id, watermark)
        # No on-time event reached the stateful operator: Spark's watermark-only batch (at
        # the end of an available-now run, or when the feed goes quiet), one over silver
        # commits that changed no data (a compaction) or of late rows only. Its session rows
        # are timeouts, whose values the table holds already. (A selection of the stateful
        # table alone hands over no events: there only the offset log can tell.)
        if (self.folding and not seen["events"]) or not ctx.read:
            # The batch before closed up to its closing watermark, which is the one Spark gives
            # this batch: nothing is left to close, and the batch writes nothing. Only the first
            # such batch of a start closes in place what an earlier run left open behind it:
            # flags alone, an UPDATE per table, no fold, no gate, nothing counted as written.
            if self.closed is not None and closes <= self.closed:
                return Result(kept, dict(rows_written=0))
            self.closed = closes
            return Result({**kept, **{sinks.closing(spec): dict(watermark_ms=closes) for spec in self.tables}},
                          dict(rows_written=0))
        # Each table's fold (its Delta snapshot, plan and one job) overlaps the others': the
        # jobs are small, and one at a time the driver's part of each was most of a batch.
        folded = together(*[partial(self.fold, spec, batch, ctx, seen["earliest"]) for spec in self.tables])
        changed = [f for f in folded if f is not None]
        self.validate(ctx, *[(spec.table, T.quality_view(spec.live(touched(rows)), self.cfg.profile.dimension,
                                                         self.viewed.get(spec.table, ())), live)
                             for spec, rows, n, live, _ in changed if live])
        out = dict(kept)
        for spec, rows, n, _, hint in changed:
            if n:
                out[spec.table] = Changed(rows.drop(CLOSING), dict(watermark_ms=closes, hint=hint))
                if sinks.stats(spec) in self.published:
                    out[sinks.stats(spec)] = touched(rows)
        # (A batch that fails to commit stops the query; a restart builds a new body.)
        self.closed = closes
        return Result(out, dict(rows_written=sum(f[2] for f in changed)))

    def latest_ms(self, batch: DataFrame):
        """The batch's latest event time (epoch ms; NULL without events): its on-time events',
        and the sessions' ends (a selection of the stateful table alone hands over no event)."""
        latest = F.max(F.unix_millis(f"{EVENT}.event_time"))
        if any(t.stateful for t in self.tables):
            ends = F.max(F.when(F.col(f"{SESSION}.status") != "merged", F.unix_millis(f"{SESSION}.session_end")))
            latest = F.greatest(latest, ends)
        return latest


def closing_watermark(watermark_ms: int, latest_ms: int | None, delay_ms: int | None) -> int:
    """What a batch closes: everything its next watermark passes. Spark fixes the next batch's
    watermark at the end of this one (the latest event time seen, minus the delay), and no
    event read after this batch can be on time behind it: an event is late when it is more than
    the delay behind its silver frontier (silver's latest event time before the batch that
    accepted it), and a row of a later silver version has a frontier at or past every event of
    the versions this batch read whole. So what that watermark passes is final now; waiting for
    the next batch to say so would leave it open until data comes (a watermark-only batch then
    costs an UPDATE per table) and cost readers a batch of freshness."""
    if delay_ms is None or latest_ms is None:
        return watermark_ms
    return max(watermark_ms, int(latest_ms) - delay_ms)


def progress_counts(progress: dict) -> dict:
    seen = accounting.observed(progress, INPUT_METRICS)
    # Late events are counted before on_time() drops them; no stateful operator drops any row
    # in gold (state_drops would count partial aggregates, not events, if one ever did).
    return {"rows_in": int(seen.get("rows_in") or 0), "late_dropped": int(seen.get("late") or 0),
            "duplicates_dropped": 0}


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
             (lambda: late.ensure(spark, cfg, silver_schema)) if cfg.gold.watermark is not None else None,
             *[(lambda spec=spec: ensure_table(spark, cfg, "gold", spec.table,
                                               spec.output_schema(spark, silver_schema), (),
                                               change_feed(cfg.gold.change_feed), by_name(spec.checks())))
               for spec in specs])


def start_query(spark, cfg, specs, suites: dict):
    """Start the gold query over `specs` (each batch records its own accounting row)."""
    query = query_name(cfg, specs)
    # Every table is gated: by its suite's rules and the rules derived from the constraints
    # they do not cover (gold/constraints.py), in one validation. (No suite at all, `suites={}`,
    # is how a test or a bench runs gold without a gate: Delta's constraints still hold.)
    gated = gate_suites(specs, suites) if suites else {}
    gates = {spec.table: QualityGate(gated[f"gold.{spec.table}"], cfg.spark.gate_one_task_below_rows)
             for spec in specs if gated}
    books = accounting.Accounting(spark, cfg, "gold", cfg.checkpoint(query), progress_counts)
    silver = silver_stream(spark, cfg, cfg.checkpoint(query))
    batch = GoldBatch(spark, cfg, specs, gates, books, query, silver.schema)
    running = (gold_stream(cfg, specs, silver).writeStream.queryName(query)
               .outputMode("update")
               .foreachBatch(batch)
               .option("checkpointLocation", cfg.checkpoint(query))
               .trigger(**trigger(cfg, "gold"))
               .start())
    return Started(running, batch)


def select(cfg, only=None) -> list[GoldTable]:
    tables = for_config(cfg)
    unknown = set(only or ()) - {t.key for t in tables}
    if only is not None and not only:
        raise ConfigError(f"--only: names no table; give one or more of "
                          f"{', '.join(t.key for t in tables)}, separated by commas")
    if unknown:
        raise ConfigError(f"--only: unknown {sorted(unknown)} for profile {cfg.profile.name} "
                          f"(known: {', '.join(t.key for t in tables)})")
    return [t for t in tables if not only or t.key in only]


def layer(cfg, only=None, suites=None) -> Layer:
    """The profile's gold tables (or the `only` subset, by key), written by one flow, gated by
    `suites` (default: conf gold.expectations) and each table's constraints (gate_suites);
    `suites={}`: not gated (tests and benches that measure something else)."""
    if suites is None:
        suites = load_suites(cfg.gold.expectations, gx=False)   # a bad suite fails here or in validate
    chosen = select(cfg, only)
    name, begin = query_name(cfg, chosen), (lambda spark: start_query(spark, cfg, chosen, suites))
    # Silver's contract may evolve a column into silver mid-stream (docs/profiles.md).
    flow = Flow(name, "gold", begin, recovery=lambda: RestartOnSchemaChange(name, begin))
    return Layer("gold", "silver", (flow,), reads_table=cfg.table_path("silver", cfg.silver_table),
                 prepare=lambda spark: prepare_gold(spark, cfg, chosen),
                 validate=lambda: gate_suites(chosen, load_suites(cfg.gold.expectations)),
                 describe=f"silver.{cfg.silver_table} -> {', '.join(f'gold.{t.table}' for t in chosen)}")


if __name__ == "__main__":
    from pipeline.cli import exit_now, layer_main

    exit_now(layer_main("gold"))
