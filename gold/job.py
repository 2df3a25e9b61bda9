"""Gold job: silver -> the profile's gold tables (nest: gold.zip_hourly_sightings,
gold.device_activity, gold.device_sessions). One streaming query per table, own checkpoint.

    python -m gold.job [--only sightings,activity,sessions] [--trigger ...] [--interval ...]

Every table holds the current value of every window or session seen so far: each micro-batch's
updated rows are MERGEd by key (setting values, so a replayed batch is harmless). Windows whose
end is behind the watermark of the last batch that brought rows are marked finalized, and
sessions whose end + gap is behind it closed (status open/closed).
"""
from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common import accounting
from common.config import ConfigError
from common.delta import commit_metadata, ensure_table, idempotent_append, live_files, retry_on_conflict
from common.lineage import read_nothing
from common.batch import BatchContext, MicroBatch, together
from common.quality import QualityGate, load_suites
from common.schemas import DQ_RESULTS
from common.storage import is_delta_table
from common.errors import JobError
from common.streaming import trigger
from common.flow import Flow, Layer
from gold import transform as T
from gold.tables import GoldTable, for_config


def output_schema(spark, cfg, spec: GoldTable, silver_schema):
    empty = spark.createDataFrame([], silver_schema)
    if not spec.windowed:
        return spark.createDataFrame([], spec.session_spec(cfg).output_schema(silver_schema)).schema
    return T.with_finalized(spec.build(empty, cfg), 0).schema


def merge(spark, cfg, path: str, spec: GoldTable, updates: DataFrame, watermark_ms: int,
          ctx: BatchContext, close_behind: bool = True) -> None:
    """MERGE the batch's updated rows. A conflict with a concurrent compaction (make maintain,
    the runner's maintenance) replans and retries: the MERGE is a function of the batch and the
    table's rows, which compaction does not change.

    Into an empty table (a fresh lakehouse's first batch, the whole of a first available-now
    run) every row is an insert, so an append keyed by the batch does the MERGE's work without
    its joins: a third of the batch's time. A replay finds the rows there and MERGEs the same
    values over them, or finds the table still empty and appends (or is skipped) once.
    `close_behind`: also close the table's rows the watermark passed that the batch does not
    carry (see _merge_once)."""
    if live_files(spark, path) == 0:
        rows = updates if spec.windowed else updates.where("status <> 'merged'")
        idempotent_append(rows, path, f"{ctx.app_id}-first", ctx.batch_id, ctx.lineage, ctx.replay)
        return
    retry_on_conflict(lambda: _merge_once(spark, cfg, path, spec, updates, watermark_ms, close_behind))


def _merge_once(spark, cfg, path: str, spec: GoldTable, updates: DataFrame, watermark_ms: int,
                close_behind: bool) -> None:
    cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in spec.keys)
    target = DeltaTable.forPath(spark, path)
    source = updates
    if close_behind:
        # Rows this batch did not touch still close as the watermark moves (windows become
        # final, sessions closed), including what watermark-only batches left: they write
        # nothing. They go into the source rather than a NOT MATCHED BY SOURCE clause, which
        # would make the MERGE join (and rewrite) the whole table every batch: this way it
        # rewrites only the files holding a changed row, and finding the rows to close skips
        # files by their stats.
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


class GoldBatch(MicroBatch):
    """foreachBatch body for one gold table."""

    layer = "gold"

    def __init__(self, spark, cfg, spec: GoldTable, gate: QualityGate | None, books):
        super().__init__(spark, cfg, spec.query, f"silver.{cfg.silver_table}", gate, books)
        self.spec = spec
        self.path = cfg.table_path("gold", spec.table)
        # Whether the table may hold rows the watermark has passed that no later batch carries.
        # Windows: always (update mode never re-emits a window the watermark evicts). Sessions:
        # only after a batch that wrote nothing, since every other batch emits the sessions it
        # times out; and at a start, for what an earlier run left.
        self.stale_behind = True

    def write(self, batch: DataFrame, ctx: BatchContext) -> dict:
        cfg, spec, lineage = self.cfg, self.spec, ctx.lineage
        watermark = lineage["watermark_ms"]
        updates = (T.with_finalized(batch, watermark) if spec.windowed else batch).persist()
        try:
            n = updates.count()
            session = batch.sparkSession
            # A batch that read no row (one that only moved the watermark) writes nothing:
            # marking the windows it made final, or the sessions it timed out, would cost a
            # MERGE (10-14 s at the end of a run, three queries at once) for a flag. The next
            # batch with rows marks them in its MERGE. (It still ran: its state was committed.)
            if not n or read_nothing(self.checkpoint, ctx.batch_id):
                self.stale_behind = True
                return self.commit(ctx, dict(rows_written=0, quality_ms=None))
            gate = None
            if self.gate is not None:
                live = updates.where("status <> 'merged'") if not spec.windowed else updates
                gate = self.validate(T.quality_view(live, cfg.profile.dimension), ctx,
                                     n if spec.windowed else None)

            close_behind = spec.windowed or self.stale_behind

            def write():
                with commit_metadata(session, lineage):
                    merge(session, cfg, self.path, spec, updates, watermark, ctx, close_behind)

            publish = spec.publish and cfg.gold.stats_to_kafka
            committed = self.commit(ctx, dict(rows_written=n, quality_ms=gate.ms if gate else None), write,
                                    gate.record if gate else None,
                                    (lambda: publish_stats(cfg, spec, updates)) if publish else None)
            self.stale_behind = spec.windowed
            return committed
        finally:
            updates.unpersist()


def publish_stats(cfg, spec: GoldTable, updates: DataFrame) -> None:
    """Updated window values to the compacted stats topic. A replayed batch re-sends the same
    key with the same value, which compaction collapses."""
    (T.stats_kafka_records(updates, *spec.publish).write.format("kafka")
     .option("kafka.bootstrap.servers", cfg.kafka.bootstrap_servers)
     .option("topic", cfg.kafka.topics.stats).save())


INPUT_METRICS = "gold_input"


def progress_counts(progress: dict) -> dict:
    seen = accounting.observed(progress, INPUT_METRICS)
    # Late events are counted before on_time() drops them; no stateful operator drops any row
    # in gold (state_drops would count partial aggregates, not events, if one ever did).
    return {"rows_in": int(seen.get("rows_in") or 0), "late_dropped": int(seen.get("late") or 0),
            "duplicates_dropped": 0}


def prepare_gold(spark, cfg, specs) -> None:
    """Check the stats topic when publishing, create the gold and ops tables."""
    silver_path = cfg.table_path("silver", cfg.silver_table)
    if not is_delta_table(silver_path):
        raise JobError(f"silver table {silver_path} does not exist yet: run `make run-silver` first")
    if cfg.gold.stats_to_kafka:
        from common.kafka import BrokerError, ensure_topic, wait_for_kafka

        try:
            wait_for_kafka(cfg.kafka.bootstrap_servers, cfg.kafka.connect_timeout.seconds)
        except BrokerError as e:
            raise JobError(f"gold.stats_to_kafka is on but {e}") from None
        ensure_topic(cfg.kafka.bootstrap_servers, cfg.kafka.topics.stats,
                     cfg.kafka.topic_partitions, compacted=True)
    silver_schema = spark.read.format("delta").load(silver_path).schema
    # Created up front: concurrent queries creating it on their first batch would conflict.
    # Distinct tables, so side by side.
    together(lambda: ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS),
             lambda: accounting.ensure_accounting(spark, cfg),
             *[(lambda spec=spec: ensure_table(spark, cfg, "gold", spec.table,
                                               output_schema(spark, cfg, spec, silver_schema)))
               for spec in specs])


def start_table(spark, cfg, spec: GoldTable, suites: dict):
    """Start one gold table's query (each batch records its own accounting row)."""
    silver_path = cfg.table_path("silver", cfg.silver_table)
    wm = cfg.gold.watermark
    metrics = [F.count(F.lit(1)).alias("rows_in")]
    if wm is not None:   # without a watermark nothing is late (progress_counts reads 0)
        metrics.append(F.count(F.when(T.late(wm.seconds), 1)).alias("late"))
    silver = (spark.readStream.format("delta")
              .option("maxFilesPerTrigger", cfg.gold.max_files_per_trigger).load(silver_path)
              .observe(INPUT_METRICS, *metrics))
    events = T.on_time(silver, wm)
    suite = suites.get(f"gold.{spec.table}")
    books = accounting.Accounting(spark, cfg, "gold", cfg.checkpoint(spec.query), progress_counts)
    batch = GoldBatch(spark, cfg, spec, QualityGate(suite) if suite else None, books)
    return (spec.build(events, cfg).writeStream.queryName(spec.query)
            .outputMode("update")
            .foreachBatch(batch)
            .option("checkpointLocation", cfg.checkpoint(spec.query))
            .trigger(**trigger(cfg, "gold"))
            .start())


def start(spark, cfg, only=None, suites=None):
    """Prepare and start the selected gold queries in this session; returns them."""
    specs = [spec for spec in for_config(cfg) if not only or spec.key in only]
    suites = load_suites(cfg.gold.expectations) if suites is None else suites
    prepare_gold(spark, cfg, specs)
    return [start_table(spark, cfg, spec, suites) for spec in specs]


def layer(cfg, only=None) -> Layer:
    """The profile's gold tables (or the `only` subset, by key), one flow each."""
    suites = load_suites(cfg.gold.expectations, gx=False)   # a bad suite fails here or in validate
    tables = for_config(cfg)
    unknown = set(only or ()) - {t.key for t in tables}
    if unknown:
        raise ConfigError(f"--only: unknown {sorted(unknown)} for profile {cfg.profile.name} "
                          f"(known: {', '.join(t.key for t in tables)})")
    chosen = [t for t in tables if not only or t.key in only]
    silver_path = cfg.table_path("silver", cfg.silver_table)

    def preflight(selected):
        if "silver" not in selected and not is_delta_table(silver_path):
            raise JobError(f"silver table {silver_path} does not exist yet: run `make run-silver` first")

    def flow(spec):
        return Flow(spec.query, "gold", lambda spark: start_table(spark, cfg, spec, suites))

    return Layer("gold", "silver", tuple(flow(spec) for spec in chosen), preflight=preflight,
                 prepare=lambda spark: prepare_gold(spark, cfg, chosen),
                 validate=lambda: load_suites(cfg.gold.expectations),
                 describe=f"silver.{cfg.silver_table} -> {', '.join(f'gold.{t.table}' for t in chosen)}")


if __name__ == "__main__":
    from pipeline.cli import exit_now, layer_main

    exit_now(layer_main("gold"))
