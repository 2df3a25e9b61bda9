"""Bronze job: landing files or a Kafka topic -> bronze.events (Delta), exactly once.

    python -m bronze.job [--source files|kafka] [--trigger available-now|processing-time]
"""
from __future__ import annotations

import logging
import threading
import time

from pyspark.errors import StreamingQueryException

from common import accounting, raw_bytes
from common.accounting import executed_batches
from common.batch import BatchContext, MicroBatch, together
from common.delta import ensure_table, skipping_stats
from common.errors import JobError, caused_by
from common.flow import Flow, Layer, Recovery, Started
from common.outputs import Append, Result
from common.schemas import BRONZE_EVENTS, BRONZE_PARTITION
from common.streaming import trigger

log = logging.getLogger(__name__)

BINARY_FILE_SCHEMA = "path STRING, modificationTime TIMESTAMP, length LONG, content BINARY"
QUERY_NAME = {"files": "bronze_files", "kafka": "bronze_kafka"}
INPUT_METRICS = "bronze_input"


def preflight(cfg, source: str) -> None:
    """Fail in seconds, before a Spark session is even started, when the source isn't there."""
    if source == "files" and not cfg.landing.is_dir():
        raise JobError(f"landing folder {cfg.landing} does not exist "
                       "(set LANDING, or write files there with `make generate`)")
    if source == "kafka":
        from common.kafka import BrokerError, wait_for_kafka

        try:
            wait_for_kafka(cfg.kafka.bootstrap_servers, cfg.kafka.connect_timeout.seconds)
        except BrokerError as e:
            raise JobError(f"{e} (set KAFKA_BOOTSTRAP, or start one with `make kafka-up`)") from None


def file_stream(spark, cfg):
    from pyspark.sql import functions as F

    from bronze.transform import lines_from_files

    gzip = cfg.profile.compression == "gzip"
    reader = (spark.readStream.format("text").option("wholetext", "true") if gzip else
              spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA))
    raw = (reader
           .option("maxFilesPerTrigger", cfg.bronze.max_files_per_trigger)
           .option("latestFirst", str(cfg.bronze.latest_first).lower())
           .option("recursiveFileLookup", str(cfg.bronze.subfolders).lower())
           # Hidden files (.part-*.tmp) are in-flight writes; the file source skips names
           # starting with '.' or '_', so only renamed, complete files are read.
           .load(str(cfg.landing)))
    if gzip:
        # The text source decompresses by extension (Hadoop codecs); binaryFile would hand us
        # the compressed bytes. Text is decoded as UTF-8 here, so re-encode it for the splitter.
        raw = raw.select(F.col("_metadata.file_path").alias("path"),
                         F.col("_metadata.file_modification_time").alias("modificationTime"),
                         F.encode("value", "UTF-8").alias("content"))
    return lines_from_files(raw, whole_file=cfg.profile.record == "file")


def kafka_stream(spark, cfg):
    from bronze.transform import rows_from_kafka

    src = cfg.kafka.source
    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", cfg.kafka.bootstrap_servers)
           .option("subscribe", cfg.kafka.topics.events)
           .option("startingOffsets", src.starting_offsets)
           .option("maxOffsetsPerTrigger", src.max_offsets_per_trigger)
           .option("failOnDataLoss", str(src.fail_on_data_loss).lower())
           # How long the source's clients wait for an unreachable broker before the query
           # fails (then run_kafka below takes over). The admin client ignores an API timeout
           # shorter than its request timeout, so cap that one too.
           .option("kafka.default.api.timeout.ms", int(src.api_timeout.seconds * 1000))
           .option("kafka.request.timeout.ms", int(min(src.api_timeout.seconds, 30) * 1000))
           .load())
    return rows_from_kafka(raw)


# Delta's per-file min/max statistics for the lineage columns only: reads of bronze pick rows by
# position or ingest time (silver's fetch of a record's bytes, the audit), never by the bytes,
# whose statistics (a prefix of every line, compared row by row) were about 8% of an append's
# time (200,000 events in 124,711 lines; fresh run-all, four pairs alternated: bronze 4.8 -> 4.55 s).
STATS = [f.name for f in BRONZE_EVENTS.fields
         if f.name not in (*raw_bytes.PAIRS, *raw_bytes.PAIRS.values(), *BRONZE_PARTITION)]


def prepare(spark, cfg) -> None:
    """Bronze's table and the accounting table its batches book in: independent, side by side."""
    together(lambda: ensure_table(spark, cfg, "bronze", "events", BRONZE_EVENTS, BRONZE_PARTITION,
                                  skipping_stats(STATS)),
             lambda: accounting.ensure_accounting(spark, cfg))


class BronzeBatch(MicroBatch):
    """foreachBatch body of bronze: the batch's rows appended once, keyed by (query, batch id),
    with its lineage (the source and its offsets) and an accounting row. Delta's own streaming
    sink keys its commits the same way but looks the key up in the table's state before every
    batch, which Delta 4.4 rebuilds for each new version: 1-2 s of a cold first batch, 0.3-0.4 s
    of every later one. Here only a batch replayed after a crash looks for its earlier commit
    (common.delta.idempotent_append), which makes the file/Kafka -> bronze path exactly once.
    Bronze counts no row itself: the append's own job observes them (INPUT_METRICS), and the
    accounting row waits for that job only (MicroBatch.counted_by)."""

    layer = "bronze"
    counted_by = "events"
    # Its input rows are files or messages, each of any number of records: compiled always.
    sized_by_rows = False

    def __init__(self, spark, cfg, query: str, source: str, books):
        super().__init__(spark, cfg, query, None, {}, books,
                         outputs=(Append("events", cfg.table_path("bronze", "events")),), source=source)

    def compute(self, df, ctx: BatchContext) -> Result:
        return Result({"events": df}, {})


def progress_counts(progress: dict) -> dict:
    # Bronze keeps every row it reads: what it read is what it wrote.
    rows = int(accounting.observed(progress, INPUT_METRICS).get("rows") or 0)
    return {"rows_in": rows, "rows_written": rows}


def start_query(spark, cfg, source: str):
    from pyspark.sql import functions as F

    rows = file_stream(spark, cfg) if source == "files" else kafka_stream(spark, cfg)
    name = QUERY_NAME[source]
    books = accounting.Accounting(spark, cfg, "bronze", cfg.checkpoint(name), progress_counts)
    body = BronzeBatch(spark, cfg, name, source, books)
    return Started(rows.observe(INPUT_METRICS, F.count(F.lit(1)).alias("rows"))
                   .writeStream.foreachBatch(body).queryName(name)
                   .option("checkpointLocation", cfg.checkpoint(name))
                   .trigger(**trigger(cfg, "bronze"))
                   .start(), body)


def _kafka_replay_metrics_npe(error: StreamingQueryException) -> bool:
    """Spark 4.1.1's Kafka source (SPARK-55271) throws a NullPointerException while reporting
    metrics for the first batch after a restart when that batch is replayed from the offset log
    (a crash mid-batch): the latest offsets it reports against were never fetched. It fails
    after the replayed batch has committed, so starting the query again carries on normally."""
    return caused_by(error, "java.lang.NullPointerException",
                     raised_in="org.apache.spark.sql.kafka010.KafkaMicroBatchStream")


_BROKER_DOWN = ("TimeoutException", "DisconnectException", "NetworkException")   # org.apache.kafka.common.errors


def _broker_unreachable(error: StreamingQueryException) -> bool:
    """The Kafka client's errors of an unreachable broker, on the driver (offset fetch through
    the admin client: retriable timeouts, disconnects, network errors) or on an executor (the
    connector's own timeout of a fetch that could not complete)."""
    return (any(caused_by(error, f"org.apache.kafka.common.errors.{name}") for name in _BROKER_DOWN)
            or caused_by(error, "java.util.concurrent.TimeoutException",
                         raised_in="org.apache.spark.sql.kafka010"))


class KafkaRecovery(Recovery):
    """When the Kafka query fails because the broker is unreachable, wait for the broker (backoff
    from kafka.source) and restart the query from its checkpoint; bronze's appends keyed by batch
    id (BronzeBatch) make the restart exactly once. Raises JobError once the broker has been unreachable for
    kafka.source.max_outage with no batch completed in between."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.failing_since = None
        self.npe_restarted = False

    def resume(self, spark, error, query, run):
        cfg, src = self.cfg, self.cfg.kafka.source
        if not isinstance(error, StreamingQueryException):
            raise error
        if _kafka_replay_metrics_npe(error) and not self.npe_restarted:
            self.npe_restarted = True
            log.warning("bronze: Kafka source failed reporting a replayed batch (SPARK-55271); "
                        "restarting the query from its checkpoint")
        elif _broker_unreachable(error):
            if self.failing_since is None or executed_batches(query):
                self.failing_since = time.monotonic()   # a new outage: the last run made progress
            log.warning(f"bronze: Kafka query failed, broker at {cfg.kafka.bootstrap_servers} unreachable "
                        f"({str(error).splitlines()[0][:200]}); restarting the query from its checkpoint once "
                        f"the broker answers (giving up after {src.max_outage})")
            _wait_for_broker(cfg, run.stop, self.failing_since + src.max_outage.seconds, run.stop_all)
            if run.stop.is_set() or run.stop_all.is_set():
                return None
        else:
            raise error
        started = start_query(spark, cfg, "kafka")
        log.info("bronze: Kafka query restarted from its checkpoint")
        return started


def _wait_for_broker(cfg, stop: threading.Event, give_up_at: float,
                     stop_all: threading.Event | None = None) -> None:
    from common.kafka import BrokerError, wait_for_kafka

    src, servers = cfg.kafka.source, cfg.kafka.bootstrap_servers
    backoff = src.reconnect_backoff.seconds
    stopped = lambda: stop.is_set() or (stop_all is not None and stop_all.is_set())
    while not stopped():
        left = give_up_at - time.monotonic()
        try:
            wait_for_kafka(servers, max(1.0, min(cfg.kafka.connect_timeout.seconds, left)))
            return
        except BrokerError:
            pass
        left = give_up_at - time.monotonic()
        if left <= 0:
            raise JobError(f"Kafka broker at {servers} unreachable for kafka.source.max_outage "
                           f"({src.max_outage}) with no batch completed; bronze stops. Its checkpoint "
                           "is intact: start it again once the broker is back")
        pause = min(backoff, left)
        log.warning(f"bronze: broker at {servers} still unreachable; next try in {pause:g} s "
                    f"(giving up in {left:.0f} s)")
        stop.wait(pause)
        backoff = min(backoff * 2, src.reconnect_backoff_max.seconds)


def layer(cfg, source: str | None = None) -> Layer:
    """Bronze from `source` (files or kafka; default: conf bronze.source)."""
    source = source or cfg.bronze.source
    name = QUERY_NAME[source]
    flow = Flow(name, "bronze", lambda spark: start_query(spark, cfg, source),
                recovery=(lambda: KafkaRecovery(cfg)) if source == "kafka" else None)
    return Layer("bronze", None, (flow,),
                 preflight=lambda: preflight(cfg, source),
                 prepare=lambda spark: prepare(spark, cfg),
                 describe=f"{source} -> {cfg.table_path('bronze', 'events')}")


if __name__ == "__main__":
    from pipeline.cli import exit_now, layer_main

    exit_now(layer_main("bronze"))
