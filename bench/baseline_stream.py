"""Figures (d) and (i)'s plain counterpart: what a Spark user writes instead of this project,
as processing-time queries of one SparkSession, fed as the bench feeds the pipeline (same
generator, seed, rates, span and length), each landed file timed to the first silver commit
holding its events and to the first fresh-gold commit that covers that silver commit.

    python -m bench.baseline_stream --seconds 300 --rate 5000 --seed 7 --span-seconds 36000
    python -m bench.baseline_stream --seconds 180 --steps 1000,2000,4000 --seed 7 --speedup 120
    (LAKEHOUSE_ROOT: a fresh folder; intervals: conf streaming.<layer>_interval, TRIGGER_INTERVAL)

  bronze  text files -> Delta, append (bench/baseline.py's)
  silver  from_json + explode, watermark + dropDuplicatesWithinWatermark, stream-static join ->
          Delta, append (bench/baseline.py's); each row keeps its landing file's name, to time it
  gold    fresh: hourly sightings per zip (bench/baseline.py's aggregation and gold's watermark)
          in update output mode, upserted into a Delta table by foreachBatch + MERGE (Delta's
          documented upsert from streaming queries), idempotent by Delta's own transaction key:
          spark.databricks.delta.write.txnAppId / txnVersion = the batch id, set on the batch's
          session (the query's own), as Delta's docs recommend for MERGE in foreachBatch. A
          window's row is in the table from the first batch that saw one of its events, updated
          by every later one: what the pipeline's gold gives, so its latency is comparable.
          Beside it, bench/baseline.py's other gold queries, unchanged (append mode): the 10-minute
          device activity and the sessions. Nothing times them; they are there so the cores carry
          what the pipeline's gold computes beside its hourly table (activity and sessions in the
          same batch). The append-mode hourly query is replaced by the fresh one, not doubled.

Each layer triggers at the pipeline's interval for it (common.streaming.interval), so both runs
get the same intervals. A file's gold time: its events' silver version (from silver's Delta log
and the `landing_file` column), then the first gold commit (its txn version is its batch) whose
batch read silver through that version (the batch's end offset in gold's checkpoint, read while
the run goes: Spark keeps only the last 100). Nothing of this is on the queries' path.

--rate (d): prints one line `BASELINE_STREAM {json}`: per layer (silver, zip_hourly_sightings)
files, p50_s, p95_s, max_s (bench/latency.summarize, files still not visible at the end counted
with the time they had waited), and how busy the cores were during the feed.
--steps (i): the throughput steps of bench/steady.py; the line holds each step's judgement and
the highest rate kept up with.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from pyspark.sql import functions as F

from bench.baseline import gold, run, silver
from bench.contention import feed_measured
from bench.feeder import Feeder, stream_params
from bench.latency import delta_commits, summarize
from common.config import load_config
from common.internals import delta_offset_read_through, offset_log_entry
from common.spark import NO_DATA_BATCHES, build_spark
from common.streaming import interval
from tools.generator.events import Params, write_locations

FILE = "landing_file"
FRESH = "zip_hourly_sightings"          # the fresh gold table, named as the pipeline's
LAYERS = ["silver", FRESH]
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def upsert(stream, path: str, cfg, query: str, keys: list[str]):
    """`stream` (an aggregation) in update mode, MERGEd into the Delta table at `path` on `keys`
    by foreachBatch, idempotent by (txnAppId, txnVersion) = (this query, batch id)."""
    from delta.tables import DeltaTable

    condition = " AND ".join(f"t.{k} <=> s.{k}" for k in keys)   # zip_code is NULL for unknown devices
    app_id = f"bench-baseline-stream-{query}"

    def merge(batch, batch_id: int) -> None:
        session = batch.sparkSession        # the query's own session: its conf is not shared
        session.conf.set(TXN_APP_ID, app_id)
        session.conf.set(TXN_VERSION, str(batch_id))
        try:
            (DeltaTable.forPath(session, path).alias("t").merge(batch.alias("s"), condition)
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        finally:
            session.conf.unset(TXN_APP_ID)
            session.conf.unset(TXN_VERSION)

    return (stream.writeStream.outputMode("update").foreachBatch(merge).queryName(query)
            .option("checkpointLocation", str(cfg.root / "_checkpoints" / query))
            .trigger(processingTime=interval(cfg, "gold").spark()).start())


class OffsetWatch(threading.Thread):
    """Gold batch id -> the last silver version it read completely, read from the query's offset
    log every second (Spark deletes entries past minBatchesToRetain while the run goes)."""

    def __init__(self, checkpoint: str):
        super().__init__(name="bench-offset-watch", daemon=True)
        self.checkpoint, self.seen = checkpoint, {}
        self.stopping = threading.Event()

    def read_through(self, batch: int) -> int | None:
        if batch not in self.seen:
            try:
                _, sources = offset_log_entry(self.checkpoint, batch)
            except (FileNotFoundError, ValueError):
                return None
            src = sources[0] if sources else None
            v = delta_offset_read_through(src)
            if v is None:   # stopped inside a version: the versions before it are read
                v = -1 if src.get("isStartingVersion") else int(src["reservoirVersion"]) - 1
            self.seen[batch] = v
        return self.seen[batch]

    def run(self) -> None:
        from common.internals import logged_batches

        while not self.stopping.wait(1.0):
            try:
                for b in logged_batches(self.checkpoint):
                    self.read_through(b)
            except OSError:
                pass


class Visibility:
    """Landing file -> when silver and the fresh gold made it visible, from the tables' Delta logs
    and silver's new data files (each read once), and the gold query's offsets."""

    def __init__(self, spark, silver_path: str, gold_path: str, watch: OffsetWatch):
        self.spark, self.silver_path, self.gold_path, self.watch = spark, silver_path, gold_path, watch
        self.files_of: dict[str, set] = {}        # silver data file -> landing files in it

    def _silver(self) -> dict[str, tuple[float, int]]:
        """Landing file -> (first silver commit time holding its events, last silver version)."""
        adds = {}
        for c in delta_commits(self.silver_path):
            for path in c["adds"]:
                adds.setdefault(path, (c["ts"], c["version"]))
        new = [p for p in adds if p not in self.files_of]
        if new:
            for p in new:
                self.files_of[p] = set()
            rows = (self.spark.read.parquet(*(os.path.join(self.silver_path, p) for p in new))
                    .select(FILE, F.col("_metadata.file_name").alias("part")).distinct().collect())
            by_name = {p.rsplit("/", 1)[-1]: p for p in new}
            for r in rows:
                self.files_of[by_name[r.part]].add(r[FILE])
        out: dict[str, tuple[float, int]] = {}
        for path, (ts, version) in adds.items():
            for name in self.files_of.get(path, ()):
                t, v = out.get(name, (ts, version))
                out[name] = (min(t, ts), max(v, version))
        return out

    def _gold(self) -> list[tuple[float, int]]:
        """(commit time, silver version read through) of each fresh-gold commit, in order."""
        out = []
        for c in delta_commits(self.gold_path):
            batches = [v for _app, v in c["txns"]]
            if batches:
                through = self.watch.read_through(batches[0])
                if through is not None:
                    out.append((c["ts"], through))
        return out

    def __call__(self, landed: dict[str, float]) -> list[dict]:
        silver_at, gold = self._silver(), self._gold()
        rows = []
        for name, t in sorted(landed.items(), key=lambda kv: kv[1]):
            row = {"file": name, "landed": t, "silver": None, FRESH: None}
            if name in silver_at:
                ts, version = silver_at[name]
                row["silver"] = ts - t
                g = next((g_ts for g_ts, through in gold if through >= version), None)
                row[FRESH] = None if g is None else g - t
            rows.append(row)
        return rows


def start(spark, cfg):
    """The plain layers' queries (each table created first, as the pipeline's runner does: a Delta
    stream cannot start on a folder without a log); returns (queries, Visibility)."""
    bronze_path, silver_path = str(cfg.root / "bronze/events"), str(cfg.root / f"silver/{cfg.silver_table}")
    lines = spark.readStream.format("text").load(str(cfg.landing))
    spark.createDataFrame([], f"value STRING, {FILE} STRING").write.format("delta").save(bronze_path)
    queries = [run(lines.select("value", F.col("_metadata.file_name").alias(FILE)),
                   "bronze/events", cfg, "bronze", "bronze")]
    stream = silver(spark, cfg, spark.readStream.format("delta").load(bronze_path), keep=(FILE,))
    spark.createDataFrame([], stream.schema).write.format("delta").save(silver_path)
    queries.append(run(stream, f"silver/{cfg.silver_table}", cfg, "silver", "silver"))
    tables = gold(spark, cfg, silver_path)
    fresh = tables.pop(FRESH)
    gold_path = str(cfg.root / f"gold/{FRESH}")
    spark.createDataFrame([], fresh.schema).write.format("delta").save(gold_path)
    [agg] = [a for a in cfg.profile.aggregations if a.table == FRESH]
    queries.append(upsert(fresh, gold_path, cfg, FRESH, ["window_start", *agg.group]))
    queries += [run(s, f"gold/{table}", cfg, table, "gold") for table, s in tables.items()]
    watch = OffsetWatch(str(cfg.root / "_checkpoints" / FRESH))
    watch.start()
    return queries, Visibility(spark, silver_path, gold_path, watch)


def check(queries) -> None:
    failed = [q for q in queries if not q.isActive]
    if failed:   # a dead query would leave its files waiting: report it, not a latency
        raise RuntimeError(f"query {failed[0].name or failed[0].id} stopped: {failed[0].exception()}")


def latency(args, cfg, params, queries, visible) -> dict:
    """(d): one feed at --rate, then until every file is in the fresh gold (or --drain-seconds)."""
    feeder = Feeder(cfg.landing, params, args.seed, args.rate, args.seconds)
    busy, others, own = feed_measured(feeder)
    deadline = time.time() + args.drain_seconds
    while True:
        check(queries)
        rows = visible(feeder.landed)
        observed_until = time.time()
        if all(r[FRESH] is not None for r in rows) or observed_until > deadline:
            break
        time.sleep(2)
    warm = feeder.started_at + args.warmup_seconds
    measured = [r for r in rows if r["landed"] >= warm]
    return {"rate_events_per_s": args.rate, **{layer: summarize(measured, layer, observed_until) for layer in LAYERS},
            "stages_p50_s": {layer: summarize(measured, layer)["p50_s"] for layer in LAYERS},
            "cores_busy_during_feed": busy, "others_cpu_share_during_feed": others,
            "own_cpu_share_during_feed": own}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.baseline_stream", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, required=True, help="how long to feed (each step's, with --steps)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--rate", type=int, help="(d) events per second")
    what.add_argument("--steps", help="(i) the throughput steps' rates, e.g. 1000,2000,4000")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--span-seconds", type=float, help="(d) event time the feed spans")
    p.add_argument("--speedup", type=float, default=120, help="(i) event-time seconds per second of feed")
    p.add_argument("--warmup-seconds", type=float, default=15, help="(d) files landed before this are not counted")
    p.add_argument("--drain-seconds", type=float, default=300,
                   help="at most this long for the fresh gold to catch up (after each step, with --steps)")
    args = p.parse_args(argv)
    if args.rate is not None and args.span_seconds is None:
        p.error("--rate needs --span-seconds")

    # Processing-time, so the session gets the JIT and GC a processing-time pipeline gets.
    cfg = load_config(env={**os.environ, "TRIGGER": "processing-time"})
    params = Params.from_config(cfg.generator)
    if args.rate is not None:
        params = stream_params(params, args.span_seconds)
    write_locations(cfg.locations_csv, params.devices, cfg.silver.min_event_time)
    cfg.landing.mkdir(parents=True, exist_ok=True)
    spark = build_spark(cfg, "bench-baseline-stream", extra={NO_DATA_BATCHES: "true"})
    queries, visible = start(spark, cfg)
    try:
        if args.rate is not None:
            out = latency(args, cfg, params, queries, visible)
        else:
            from bench.steady import parse_steps, run_steps

            rates = parse_steps(args.steps)
            out = run_steps(cfg.landing, params, args.seed, rates, args.seconds, args.speedup, visible,
                            LAYERS, args.drain_seconds, check=lambda: check(queries),
                            log=lambda m: print(m, flush=True))
    finally:
        visible.watch.stopping.set()
        for q in queries:
            q.stop()
    spark.stop()
    print("BASELINE_STREAM " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
