"""Silver job: bronze.events -> silver.camera_events + silver.quarantine, with a quality gate.

    python -m silver.job [--trigger available-now|processing-time] [--interval '10 seconds']

Per micro-batch: parse and flatten the Nest JSON, drop duplicate events within the watermark,
join device locations (re-read every batch, so edits apply without a restart), run the
Great Expectations suite from conf/, then write silver, quarantine, ops.dq_results and
ops.batch_accounting idempotently (a replayed batch writes nothing twice).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import functions as F

from common import accounting
from common.config import ConfigError, load_config
from common.delta import ensure_table, idempotent_append
from common.lineage import batch_lineage, checkpoint_query_id
from common.quality import QualityGate, SuiteError, check, load_suites
from common.schemas import BRONZE_EVENTS, DQ_RESULTS
from common.streaming import (GracefulStop, JobError, add_trigger_args, apply_trigger_args,
                              await_queries, fail, run_job, trigger)
from silver import transform as T
from silver.locations import ensure_seeded

QUERY = "silver"
METRICS = "silver_input"


def output_schemas(spark):
    """Table schemas, derived by running the transforms on an empty bronze batch."""
    empty = spark.createDataFrame([], BRONZE_EVENTS)
    parsed = T.parse_events(empty, T.datetime(2000, 1, 1), 0)
    locations = spark.createDataFrame([], "device_id STRING, zip_code STRING, city STRING, state STRING")
    return (T.to_silver(T.join_locations(T.accepted(parsed), locations), 0).schema,
            T.to_quarantine(T.rejected(parsed), 0).schema)


def ensure_tables(spark, cfg) -> None:
    silver_schema, quarantine_schema = output_schemas(spark)
    # Row tracking stamps each row with the version that added it (_metadata.row_commit_version,
    # kept through OPTIMIZE): the audit uses it to tell which gold micro-batch read each event.
    ensure_table(spark, cfg, "silver", "camera_events", silver_schema, ["event_date"],
                 {"delta.enableRowTracking": "true"})
    ensure_table(spark, cfg, "silver", "quarantine", quarantine_schema)
    ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS)
    accounting.ensure_accounting(spark, cfg)
    ensure_seeded(spark, cfg)


class SilverBatch:
    """The foreachBatch body. Holds the GX context so it is built once per job, not per batch."""

    def __init__(self, spark, cfg, suite, accounting_):
        self.spark, self.cfg, self.suite, self.accounting = spark, cfg, suite, accounting_
        self.gate = QualityGate(suite)
        self.paths = {t: cfg.table_path("silver", t) for t in ("camera_events", "quarantine",
                                                               "device_locations")}

    def __call__(self, batch, batch_id: int) -> None:
        spark, cfg = self.spark, self.cfg
        checkpoint = cfg.checkpoint(QUERY)
        app_id = f"{QUERY}-{checkpoint_query_id(checkpoint)}"
        batch.persist()
        candidates = None
        try:
            # Pin the dimension's version so the lineage says exactly which one this batch joined.
            loc_version = latest_version(spark, self.paths["device_locations"])
            locations = (spark.read.format("delta").option("versionAsOf", loc_version)
                         .load(self.paths["device_locations"]))
            lineage = batch_lineage(checkpoint, QUERY, batch_id, "bronze.events",
                                    {"silver.device_locations": loc_version})
            joined = T.join_locations(T.accepted(batch), locations)
            candidates = T.to_silver(joined, batch_id).persist()
            n_candidates = candidates.count()

            outcomes, quality_ms = check(self.gate, candidates, n_candidates, spark,
                                         cfg.table_path("ops", "dq_results"), QUERY, batch_id, app_id,
                                         lineage)

            dq_reasons = _dq_reasons(spark, outcomes)
            good = candidates.join(dq_reasons, "event_id", "left_anti")
            dq_bad = (joined.join(dq_reasons, "event_id")
                      .withColumn("reasons", F.col("dq_reasons")))
            quarantine = T.to_quarantine(T.rejected(batch), batch_id).unionByName(
                T.to_quarantine(dq_bad, batch_id))

            n_dq = dq_bad.count()
            n_rejects = T.rejected(batch).count()
            n_event_rejects = T.rejected(batch).where("parsed").count() if n_rejects else 0
            # Empty appends are skipped: with nothing written there is nothing a retry could duplicate.
            if n_candidates > n_dq:
                idempotent_append(good, self.paths["camera_events"], f"{app_id}-events", batch_id, lineage)
            if n_rejects or n_dq:
                idempotent_append(quarantine, self.paths["quarantine"], f"{app_id}-quarantine", batch_id,
                                  lineage)

            self.accounting.stash(batch_id, events_written=n_candidates - n_dq,
                                  events_quarantined=n_event_rejects + n_dq,
                                  rows_written=n_candidates - n_dq, quality_ms=quality_ms)
        finally:
            if candidates is not None:
                candidates.unpersist()
            batch.unpersist()


def latest_version(spark, path: str) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).history(1).select("version").first()[0]


def _dq_reasons(spark, outcomes):
    pairs = [(eid, f"dq:{o.rule.name}") for o in outcomes if o.rule.policy == "quarantine"
             for eid in o.unexpected_ids if eid is not None]
    df = spark.createDataFrame(pairs, "event_id STRING, reason STRING")
    return df.groupBy("event_id").agg(F.sort_array(F.collect_set("reason")).alias("dq_reasons"))


def progress_counts(progress: dict) -> dict:
    seen = accounting.observed(progress, METRICS)
    counts = {k: int(seen.get(k) or 0)
              for k in ("records_parsed", "records_quarantined_unparsed", "events_parsed")}
    counts["records_in"] = counts["records_parsed"] + counts["records_quarantined_unparsed"]
    counts["rows_in"] = int(progress.get("numInputRows") or 0)
    return {**counts, **accounting.state_drops(progress)}


def start(spark, cfg, suite=None):
    """Start the silver query; returns (query, accounting) - call accounting(query) to record."""
    bronze_path = cfg.table_path("bronze", "events")
    if not (Path(bronze_path) / "_delta_log").is_dir():
        raise JobError(f"bronze table {bronze_path} does not exist yet: run `make run-bronze` first")
    suite = suite or load_suites(cfg.silver.expectations)["silver.camera_events"]
    ensure_tables(spark, cfg)
    bronze = (spark.readStream.format("delta")
              .option("maxFilesPerTrigger", cfg.silver.max_files_per_trigger).load(bronze_path))
    parsed = T.parse_events(bronze, cfg.silver.min_event_time, cfg.silver.max_future.seconds)
    observed = parsed.observe(METRICS, *T.input_metrics(parsed))
    deduped = T.deduplicate(observed, cfg.silver.dedup_watermark.spark())
    books = accounting.Accounting(spark, cfg, "silver", cfg.checkpoint(QUERY), progress_counts,
                                  upstream="bronze.events")
    query = (deduped.writeStream.queryName(QUERY)
             .foreachBatch(SilverBatch(spark, cfg, suite, books))
             .option("checkpointLocation", cfg.checkpoint(QUERY))
             .trigger(**trigger(cfg, "silver"))
             .start())
    return query, books


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="silver.job", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trigger_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(env=apply_trigger_args(args, os.environ))
        suite = load_suites(cfg.silver.expectations)["silver.camera_events"]
    except (ConfigError, SuiteError) as e:
        return fail(str(e))
    except KeyError:
        return fail(f"{cfg.silver.expectations}: no suite for table silver.camera_events")
    stop = GracefulStop()
    stop.install()
    def body(spark):
        query, books = start(spark, cfg, suite)
        print(f"silver: bronze.events -> silver.camera_events ({cfg.streaming.trigger})", flush=True)
        await_queries([query], stop, on_tick=books)
        n = spark.read.format("delta").load(cfg.table_path("silver", "camera_events")).count()
        print(f"silver: done; silver.camera_events holds {n} rows", flush=True)

    return run_job(cfg, "silver", body, [QUERY])


if __name__ == "__main__":
    sys.exit(main())
