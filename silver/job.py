"""Silver job: bronze.events -> silver.<profile's table> + silver.quarantine, with a quality gate.

    python -m silver.job [--trigger available-now|processing-time] [--interval '10 seconds']

Per micro-batch: parse and flatten the records as the profile (PROFILE) declares, drop duplicate
events within the watermark, join the profile's dimension at each event's time (nest: device
locations, a history; its version is pinned every batch, so a load applies without a restart,
and each version's rows are read once), run the Great Expectations suite from conf/, then
write silver, quarantine, ops.dq_results and ops.batch_accounting idempotently (a replayed
batch writes nothing twice).
"""
from __future__ import annotations

import logging
import threading

from pyspark.sql import functions as F

from common import accounting
from common.delta import add_missing_columns, change_feed, ensure_table, skipping_stats, table_version
from common.delta_source import delta_stream
from common.errors import describe
from common.literal_frame import local_frame
from common.batch import BatchContext, MicroBatch, aggregates_while_caching, start_writer, together
from common.outputs import Append, Result
from common.quality import QualityGate, SuiteError, load_suites
from common.schemas import BRONZE_EVENTS, DQ_RESULTS, NEW_FIELDS
from common.streaming import trigger
from common.flow import Flow, Layer, Started
from common import late
from common.internals import running_input
from common.refreshing import check_not_switching
from silver import contract as C
from silver import drift as D
from silver import logic as silver_logic
from silver import transform as T
from silver.locations import ensure_seeded, schema as locations_schema

QUERY = "silver"
METRICS = "silver_input"

log = logging.getLogger(__name__)


def output_schemas(spark, profile):
    """Table schemas, derived by running the transforms on an empty bronze batch."""
    empty = spark.createDataFrame([], BRONZE_EVENTS)
    parsed = T.parse_events(empty, T.datetime(2000, 1, 1), 0, profile)
    dim = profile.dimension
    locations = spark.createDataFrame([], locations_schema(dim)) if dim else None
    return (T.to_silver(T.join_dimension(T.accepted(parsed), locations, profile), 0, profile).schema,
            T.to_quarantine(T.rejected(parsed), 0, profile).schema)


def ensure_tables(spark, cfg, dimension: bool = True) -> None:
    """Silver's tables; `dimension`: and the dimension's first-run seed (the runner starts that
    one apart, earlier: seed_dimension). Independent tables, created side by side: a creation
    is mostly waiting on the log."""
    def outputs():
        silver_schema, quarantine_schema = output_schemas(spark, cfg.profile)
        # No row tracking: Delta 4.4 rebuilt the table's state on every append to find the next
        # row id (an append of 20,000 rows: 0.8 s with it, 0.2 s without). The audit tells which
        # gold micro-batch read each event from the row's silver_batch_id and the commits' keys.
        partition = [cfg.profile.partition] if cfg.profile.partition else []
        feed = change_feed(cfg.silver.change_feed)
        stats = skipping_stats(T.stats_columns(cfg.profile, silver_schema))
        together(lambda: ensure_table(spark, cfg, "silver", cfg.silver_table, silver_schema, partition,
                                      {**feed, **stats}),
                 lambda: ensure_table(spark, cfg, "silver", "quarantine", quarantine_schema, (), feed))

    together((lambda: seed_dimension(spark, cfg)) if dimension else None,
             outputs,
             lambda: ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS),
             lambda: ensure_table(spark, cfg, "ops", "new_fields", NEW_FIELDS),
             lambda: accounting.ensure_accounting(spark, cfg))


def seed_dimension(spark, cfg, dimension: Dimension | None = None) -> None:
    """The profile's dimension table, loaded on the first run (the longest of silver's set-up:
    a CSV read and a commit). It needs no other table, so the runner starts it at once; then
    its latest version is read into `dimension`'s cache, off the first batch's path."""
    if cfg.profile.dimension:
        ensure_seeded(spark, cfg)
        if dimension is not None:
            dimension.warm(spark)


class Dimension:
    """The dimension's rows at one version, cached while batches pin that version: a version
    never changes, and re-reading it (snapshot, file listing, scan) cost every batch a job.
    Shared by the layer's set-up, which warms it with the latest version while the layers
    before silver run (a time-travel read and its scan took 0.8-1 s of a cold first batch),
    and the query's batches."""

    def __init__(self, path: str):
        self.path = path
        self._cached = None          # (version, its cached rows)
        self._lock = threading.Lock()
        self._warming = None         # the read-ahead's thread

    @classmethod
    def of(cls, cfg) -> Dimension | None:
        """The profile's dimension, None if it has none."""
        dim = cfg.profile.dimension
        return cls(cfg.table_path("silver", dim.table)) if dim else None

    def warm(self, spark) -> None:
        """Read the latest version into the cache on a thread of its own: silver's query starts
        meanwhile, and its first batch waits for the rows only if it pins that version before
        they are in. A failure here is left to the batch, which reads the version again."""
        from pyspark import InheritableThread

        def fill():
            with self._lock:
                try:
                    self._at(spark, table_version(spark, self.path)).count()
                except Exception as e:   # noqa: BLE001 - the batch reads it again, and raises
                    log.info(f"{self.path}: not read ahead ({describe(e)})")

        self._warming = InheritableThread(target=fill, name="dimension-warm", daemon=True)
        self._warming.start()

    def settle(self, timeout_s: float = 60.0) -> None:
        """Wait for the read-ahead: a run that ends first (nothing new to read) would stop the
        session under its job, and Spark prints the cancelled job's and its blocks' errors."""
        if self._warming is not None:
            self._warming.join(timeout_s)

    def at(self, spark, version: int):
        with self._lock:
            return self._at(spark, version)

    def _at(self, spark, version: int):
        if self._cached is None or self._cached[0] != version:
            if self._cached is not None:
                self._cached[1].unpersist()
            df = spark.read.format("delta").option("versionAsOf", version).load(self.path)
            self._cached = (version, df.persist())
        return self._cached[1]


class SilverBatch(MicroBatch):
    """The foreachBatch body: silver's outputs and its computation. Holds the GX context so it
    is built once per job, not per batch."""

    layer = "silver"
    fuses_stages = True      # its parse: every record's JSON through from_json and explode

    def __init__(self, spark, cfg, suite, accounting_, dimension: Dimension | None = None):
        events = cfg.table_path("silver", cfg.silver_table)
        outputs = (Append("events", events, "events"),
                   Append("quarantine", cfg.table_path("silver", "quarantine"), "quarantine"),
                   Append("fields", cfg.table_path("ops", "new_fields"), "fields"),
                   Append(late.OUTPUT, cfg.table_path("silver", late.TABLE), late.KEY))
        gate = QualityGate(suite, cfg.spark.gate_one_task_below_rows)
        super().__init__(spark, cfg, QUERY, "bronze.events", {"events": gate}, accounting_, outputs)
        self.profile = cfg.profile
        self.dimension = cfg.profile.dimension.table if cfg.profile.dimension else None
        self._dimension = dimension or Dimension.of(cfg)
        self.late_table_ready = False
        self.paths = {"bronze": cfg.table_path("bronze", "events"), "events": events}
        self.logic = silver_logic.lineage(cfg)

    def lineage(self, batch_id: int) -> dict:
        """The batch's lineage and the parsing its rows follow (silver/logic.py)."""
        return {**super().lineage(batch_id), "logic": self.logic}

    def pin_dimension(self, lineage: dict) -> int:
        """Pin the dimension's version, so the lineage of the batch's commits (accounting included)
        says exactly which one it joined. A no-data batch joins nothing and pins nothing."""
        version = table_version(self.spark, self._dimension.path)
        lineage["dimensions"] = {f"silver.{self.dimension}": version}
        return version

    def dimension_at(self, version: int):
        return self._dimension.at(self.spark, version)

    def compute(self, batch, ctx: BatchContext) -> Result:
        spark, profile, batch_id, lineage = self.spark, self.profile, ctx.batch_id, ctx.lineage
        if not ctx.read:
            # Spark's watermark-only batch: its plan must run for the state stores' commit (and
            # the eviction of what the watermark passed), but deduplication emits nothing without
            # input, so there is nothing to cache, join, gate or write. Its rows are counted all
            # the same: one it did emit would otherwise be lost without a trace.
            emitted = aggregates_while_caching(batch, F.count(F.lit(1)).alias("rows")).rows
            if emitted:
                raise accounting.AccountingError(f"silver batch {batch_id} read nothing and its plan "
                                                 f"emitted {emitted} rows; nothing written")
            return Result({}, dict(events_written=0, events_quarantined=0, rows_written=0,
                                   events_rescued=0, fields_rescued=0))
        # The batch's accepted rows join the dimension in the same pass that computes them once:
        # everything after it (counts, gate, silver, quarantine) reads those rows, and the batch
        # is never materialized twice. Pinned (a local checkpoint: the rows as computed) rather
        # than cached: a columnar cache converts every value of every row into column vectors
        # first. 200,000 events: computed and kept in 5.2 s instead of 5.9 (94 MB of memory
        # instead of 62, spilled to disk past what the driver has, as a cache is).
        rows = batch
        if self.dimension:
            rows = T.join_dimension(batch, self.dimension_at(self.pin_dimension(lineage)), profile,
                                    only=T.is_accepted())
        rows = ctx.pin(rows)
        # One pass over the batch for every count the write needs (it also computes the pinned rows).
        sizes = aggregates_while_caching(
            rows, F.count(F.lit(1)).alias("rows"), F.count(F.when(~T.is_accepted(), 1)).alias("rejects"),
            F.count(F.when(~T.is_accepted() & F.col("parsed"), 1)).alias("event_rejects"),
            *T.fetch_window(~T.is_accepted()), *D.metrics(T.is_accepted()))
        n_rejects, n_event_rejects = sizes.rejects, sizes.event_rejects
        rescued = [sizes.events_rescued, sizes.fields_rescued]
        rows, evolved, new_fields = self.contract(rows, sizes, ctx, rescued)
        n_candidates, n_dq, out = sizes.rows - n_rejects, 0, {}
        fetch = [sizes.fetch_from, sizes.fetch_until]
        frontier = T.frontier_ms(lineage["watermark_ms"], self.cfg.silver.dedup_watermark.seconds)
        kept = self.late_rows(ctx, frontier, evolved)
        if kept is not None:
            out[late.OUTPUT] = kept
        if n_candidates:
            joined = T.accepted(rows)
            candidates = T.to_silver(joined, batch_id, profile, frontier, evolved)
            gate = self.validate(ctx, ("events", candidates, n_candidates))
            dq_reasons = _dq_reasons(spark, gate.outcomes)
            if dq_reasons is not None:
                good = candidates.join(dq_reasons, "event_id", "left_anti")
                dq_bad = (joined.join(dq_reasons, "event_id").withColumn("reasons", F.col("dq_reasons"))
                          .drop("dq_reasons"))
                dq = dq_bad.agg(F.count(F.lit(1)), *T.fetch_window(), *D.metrics(F.lit(True))[:2]).first()
                n_dq = dq[0]
                fetch = _widen(fetch, dq[1:3])
                rescued = [rescued[0] - dq[3], rescued[1] - dq[4]]    # not written to silver
            else:
                good, dq_bad = candidates, None
            # Empty appends are skipped: with nothing written there is nothing a retry could duplicate.
            if n_candidates > n_dq:
                out["events"] = good
        if n_rejects or n_dq:
            bound = T.rejected(rows).unionByName(dq_bad) if n_dq else T.rejected(rows)
            if n_event_rejects or n_dq:        # (a record that did not parse holds its bytes)
                bronze = (spark.read.format("delta").load(self.paths["bronze"])
                          if fetch[0] is not None else None)
                bound = T.with_record_bytes(bound, bronze, profile, *fetch)
            out["quarantine"] = T.to_quarantine(bound, batch_id, profile)
        if new_fields:
            out["fields"] = local_frame(spark, new_fields, NEW_FIELDS)
        return Result(out, dict(events_written=n_candidates - n_dq, events_quarantined=n_event_rejects + n_dq,
                                rows_written=n_candidates - n_dq, events_rescued=rescued[0],
                                fields_rescued=rescued[1]))

    def late_rows(self, ctx: BatchContext, frontier: int | None, evolved) -> object | None:
        """silver.late_events rows of the events Spark's deduplication dropped in this batch as
        behind silver's watermark (common/late.py), or None when it dropped none. Spark counts
        them in the executed plan, which the batch has run by now; only then is the batch's
        input read again (its files, from the plan's scan), its records that may hold such an
        event (T.may_hold_late) parsed as the query parses them and filtered by the watermark
        Spark filtered with (read from the plan too). They get the silver row an on-time event
        of this batch would (the pinned dimension, the frontier) and must number what Spark
        counted: the accounting books the one count, the table holds the other."""
        if not self.profile.dedup:
            return None                          # nothing deduplicated, nothing dropped as late
        dropped = self.books.late_dropped(QUERY, ctx.batch_id)
        if not dropped:
            return None
        source, watermark = running_input(self.spark, accounting.active_query(self.spark, QUERY))
        if source is None:
            raise accounting.AccountingError(f"silver batch {ctx.batch_id}: Spark dropped {dropped} events "
                                             "as late, and the batch's input could not be read again to keep them")
        cfg, profile = self.cfg, self.profile
        source = source.where(T.may_hold_late(profile, watermark, cfg.silver.max_record_bytes))
        parsed = T.parse_events(source, cfg.silver.min_event_time, cfg.silver.max_future.seconds, profile,
                                cfg.silver.max_record_bytes)
        rows = T.late_for_dedup(parsed, watermark)
        if self.dimension:
            rows = T.join_dimension(rows, self.dimension_at(lineage_dimension(ctx.lineage, self.dimension)),
                                    profile)
        rows = ctx.keep(T.to_silver(rows, ctx.batch_id, profile, frontier, evolved))
        n = rows.count()
        if n != dropped:
            raise accounting.AccountingError(
                f"silver batch {ctx.batch_id}: Spark dropped {dropped} events as behind "
                f"the watermark ({watermark} ms), {n} of the batch's input are; nothing written")
        if not self.late_table_ready:
            late.ensure(self.spark, cfg, rows.schema)
            self.late_table_ready = True
        return late.found(rows, "silver", QUERY, ctx.batch_id, watermark)

    def contract(self, rows, sizes, ctx: BatchContext, rescued: list):
        """The schema contract on a batch in which some event carries a key the profile does
        not declare: fail naming it, or grow silver by its column (ALTER TABLE ADD COLUMNS,
        before the append: additive, and a replay finds the column there), and the batch's
        ops.new_fields rows. Returns (rows, evolved (path, column)s, new_fields rows)."""
        if not sizes.events_drifted:
            return rows, (), []
        found = D.seen(rows, self.profile)
        D.check(found, self.profile, ctx.batch_id)
        have = {c.lower() for c in T.silver_columns(self.profile)}
        evolved, moved = D.evolution(found, self.profile, have)
        if evolved:
            add_missing_columns(self.spark, self.paths["events"], D.columns(evolved))
        if moved:
            rows = D.rescue_instead(rows, moved)
            rescued[:] = D.rescued_counts(T.accepted(rows))
        return rows, evolved, D.rows(found, evolved, moved, self.query, ctx.batch_id)


def lineage_dimension(lineage: dict, table: str) -> int:
    return lineage["dimensions"][f"silver.{table}"]


def _widen(a: list, b) -> list:
    """The smallest range covering two (from, until) ranges, either of them (None, None)."""
    lo, hi = [x for x in (a[0], b[0]) if x is not None], [x for x in (a[1], b[1]) if x is not None]
    return [min(lo) if lo else None, max(hi) if hi else None]


def _dq_reasons(spark, outcomes):
    """event_id -> its quarantine reasons, or None when no quarantine rule flagged a row."""
    pairs = [(eid, f"dq:{o.rule.name}") for o in outcomes if o.rule.policy == "quarantine"
             for eid in o.unexpected_ids if eid is not None]
    if not pairs:
        return None
    df = spark.createDataFrame(pairs, "event_id STRING, reason STRING")
    return df.groupBy("event_id").agg(F.sort_array(F.collect_set("reason")).alias("dq_reasons"))


def progress_counts(progress: dict) -> dict:
    seen = accounting.observed(progress, METRICS)
    counts = {k: int(seen.get(k) or 0)
              for k in ("records_parsed", "records_quarantined_unparsed", "events_parsed")}
    counts["records_in"] = counts["records_parsed"] + counts["records_quarantined_unparsed"]
    counts["rows_in"] = counts["records_in"]      # silver reads one bronze row per record
    return {**counts, **accounting.state_drops(progress)}


def start_query(spark, cfg, suite, dimension: Dimension | None = None):
    """The silver query on tables that exist (the runner prepares them once, before)."""
    check_not_switching(cfg, "silver")
    bronze_path = cfg.table_path("bronze", "events")
    bronze = delta_stream(spark, bronze_path, cfg.checkpoint(QUERY), cfg.silver.max_files_per_trigger)
    parsed = T.parse_events(bronze, cfg.silver.min_event_time, cfg.silver.max_future.seconds, cfg.profile,
                            cfg.silver.max_record_bytes, cfg.silver.carry_record_bytes)
    observed = parsed.observe(METRICS, *T.input_metrics(parsed, cfg.profile))
    deduped = T.deduplicate(observed, cfg.silver.dedup_watermark.spark(), cfg.profile)
    books = accounting.Accounting(spark, cfg, "silver", cfg.checkpoint(QUERY), progress_counts)
    body = SilverBatch(spark, cfg, suite, books, dimension)
    writer = (deduped.writeStream.queryName(QUERY).foreachBatch(body)
              .option("checkpointLocation", cfg.checkpoint(QUERY)).trigger(**trigger(cfg, "silver")))
    return Started(start_writer(writer, spark, body), body)


def silver_suite(cfg, gx: bool = True):
    suites = load_suites(cfg.silver.expectations, gx)
    name = f"silver.{cfg.silver_table}"
    if name not in suites:
        raise SuiteError(f"{cfg.silver.expectations}: no suite for table {name} "
                         f"(profile {cfg.profile.name}): write one with `table: {name}` (as "
                         f"conf/expectations/events.yaml does for silver.actions) and name its file "
                         f"in the profile, `silver: {{expectations: <file>}}`")
    return suites[name]


def layer(cfg, suite=None) -> Layer:
    """Silver, gated by `suite` (default: the profile's suite in conf silver.expectations)."""
    # A bad suite fails here or in validate, before any query.
    suite = suite or silver_suite(cfg, gx=False)
    dimension = Dimension.of(cfg)

    def prepare(spark) -> None:
        ensure_tables(spark, cfg, dimension=False)
        silver_logic.other_logic(spark, cfg)      # warns of rows parsed by another profile

    return Layer("silver", "bronze", (Flow(QUERY, "silver", lambda spark: start_query(spark, cfg, suite, dimension)),),
                 reads_table=cfg.table_path("bronze", "events"),
                 prepare=prepare,
                 prepare_alone=lambda spark: seed_dimension(spark, cfg, dimension),
                 validate=lambda: silver_suite(cfg),
                 describe=f"bronze.events -> silver.{cfg.silver_table} (profile {cfg.profile.name})",
                 settle=dimension.settle if dimension else lambda: None)


if __name__ == "__main__":
    from pipeline.cli import exit_now, layer_main

    exit_now(layer_main("silver"))
