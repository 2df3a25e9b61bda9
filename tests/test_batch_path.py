"""The pieces that keep a micro-batch lean: ops rows built as literals, a batch's writes and its
accounting row run at once, no-data batches told apart from the offset log, the JIT chosen by
how long a run lasts, and the chaos schedule that covers both deployment shapes in one session."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from common.batch import together
from common.config import load_config
from common.literal_frame import local_frame
from common.lineage import read_nothing
from common.schemas import BATCH_ACCOUNTING, QUERY_PROGRESS
from common.spark import NO_DATA_BATCHES


def test_local_frame_holds_the_same_rows_as_create_dataframe_in_one_partition(spark):
    now = datetime(2026, 11, 24, 1, 2, 3, tzinfo=timezone.utc)
    rows = [("progress", "silver", "id", "run", 3, now, 10, 1.5, 2.5, 100, {"addBatch": 5, "getBatch": 1},
             3, 1000, now, 0, "versions", "[]", None, now),
            ("terminated", None, "id", "run", None, now, None, None, None, None, {}, None, None, None,
             None, None, None, "it's \"quoted\"", now)]
    frame = local_frame(spark, rows, QUERY_PROGRESS)
    assert frame.rdd.getNumPartitions() == 1
    assert frame.schema.fieldNames() == QUERY_PROGRESS.fieldNames()
    assert [f.dataType for f in frame.schema] == [f.dataType for f in QUERY_PROGRESS]
    assert frame.collect() == spark.createDataFrame(rows, QUERY_PROGRESS).collect()
    one = [("gold", "gold_x", 7, now) + (None,) * (len(BATCH_ACCOUNTING) - 4)]
    assert local_frame(spark, one, BATCH_ACCOUNTING).collect() == spark.createDataFrame(one, BATCH_ACCOUNTING).collect()


def test_local_frame_renders_every_value_exactly_and_builds_other_types_from_columns(spark):
    from datetime import date

    from pyspark.sql.types import (BooleanType, DateType, DoubleType, IntegerType, LongType, MapType,
                                   StringType, StructField, StructType, TimestampType)

    schema = StructType([StructField("s", StringType()), StructField("l", LongType()), StructField("i", IntegerType()),
                         StructField("d", DoubleType()), StructField("b", BooleanType()),
                         StructField("t", TimestampType()), StructField("m", MapType(StringType(), LongType()))])
    tricky = ["it's \\ \"q\" ${env:HOME} ${x}", "line\nbreak\ttab", "Zürich 東京 🎥", "", "X'00'"]
    rows = [(text, 2**63 - 1, -2**31, value, flag, when, m) for text, value, flag, when, m in zip(
        tricky, [float("nan"), float("inf"), float("-inf"), 0.1, 1e-300],
        [True, False, True, False, True],
        [datetime(2026, 11, 24, 1, 2, 3, 999999), datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=timezone.utc),
         datetime(2026, 3, 29, 1, 30), None, datetime(9999, 12, 31, 23, 59, 59)],
        [{}, {"a": None, "b": -2**63}, None, {"${x}": 1}, {"é": 0}])]
    rows.append((None,) * len(schema))
    frame = local_frame(spark, rows, schema)
    assert [f.dataType for f in frame.schema] == [f.dataType for f in schema]
    # repr: NaN is unequal to itself
    assert repr(frame.collect()) == repr(spark.createDataFrame(rows, schema).collect())
    assert frame.rdd.getNumPartitions() == 1

    # a type the SQL text does not render (dates) still gives the rows, through Column literals
    dated = StructType([StructField("day", DateType()), StructField("n", IntegerType())])
    assert local_frame(spark, [(date(2026, 1, 2), 3)], dated).collect() == \
        spark.createDataFrame([(date(2026, 1, 2), 3)], dated).collect()

    # a row of another width is an error naming it, on either path, never a truncated row
    for short in ([(date(2026, 1, 2), 3), (date(2026, 1, 3), 4, "extra")], [rows[0][:-1]]):
        with pytest.raises(ValueError, match=r"row \d+ has \d+ values, schema .* has \d+ fields"):
            local_frame(spark, short, dated if len(short) == 2 else schema)


def test_together_runs_writes_at_once_returns_their_results_inherits_the_pool_and_raises_the_first_error(spark):
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", "silver")
    started, pools = [], []

    def write(n):
        def run():
            started.append(time.monotonic())
            pools.append(spark.sparkContext.getLocalProperty("spark.scheduler.pool"))
            time.sleep(0.5 - 0.1 * n)    # the last started ends first: results keep their order
            return n * 10
        return run

    t0 = time.monotonic()
    assert together(write(1), None, write(2), write(3)) == [10, None, 20, 30]
    assert len(started) == 3 and max(started) - t0 < 0.45, "the writes did not start together"
    assert pools == ["silver"] * 3

    done = threading.Event()

    def boom():
        raise ValueError("append failed")

    def slow():
        time.sleep(0.3)
        done.set()

    with pytest.raises(ValueError, match="append failed"):
        together(slow, boom)
    assert done.is_set(), "together returned before every write had finished"


def _offsets(checkpoint: Path, batch: int, version: int, index: int) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": batch * 1000, "batchTimestampMs": 0, "conf": {}}
    source = {"sourceVersion": 1, "reservoirId": "r", "reservoirVersion": version, "index": index,
              "isStartingVersion": False}
    (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(source)}\n")


def test_a_no_data_batch_is_one_whose_offsets_did_not_move(tmp_path):
    _offsets(tmp_path, 0, 3, -1)
    _offsets(tmp_path, 1, 5, 2**63 - 101)
    _offsets(tmp_path, 2, 5, 2**63 - 101)        # only the watermark moved (batchWatermarkMs differs)
    _offsets(tmp_path, 3, 6, 2**63 - 101)
    assert [read_nothing(str(tmp_path), b) for b in range(4)] == [False, False, True, False]


def test_the_jit_and_the_collector_follow_how_long_the_run_lasts(env):
    from common.spark import C1_ONLY, PARALLEL_GC, PARALLEL_METADATA, jvm_options

    base = {k: v for k, v in env.items() if k not in ("LAKEHOUSE__SPARK__JIT", "LAKEHOUSE__SPARK__GC")}

    def options(**extra):
        return jvm_options(load_config(env={**base, **extra}))

    assert C1_ONLY in options(TRIGGER="available-now")
    assert C1_ONLY not in options(TRIGGER="processing-time")
    assert C1_ONLY in options(TRIGGER="processing-time", LAKEHOUSE__SPARK__JIT="c1")
    assert C1_ONLY not in options(TRIGGER="available-now", LAKEHOUSE__SPARK__JIT="tiered")
    assert all(o.startswith("-Duser.timezone=UTC") for o in (options(), options(LAKEHOUSE__SPARK__JIT="c1")))
    # G1 (the JVM's default, no flag) for a pipeline that runs for hours; the throughput collector
    # for a run of minutes, or when conf asks for it.
    assert PARALLEL_GC in options(TRIGGER="available-now")
    assert PARALLEL_GC not in options(TRIGGER="processing-time")
    assert PARALLEL_GC in options(TRIGGER="processing-time", LAKEHOUSE__SPARK__GC="parallel")
    assert PARALLEL_GC not in options(TRIGGER="available-now", LAKEHOUSE__SPARK__GC="g1")
    # The throughput collector's heap starts at the driver's memory, spark-submit's -Xmx, and
    # leaves class metadata room: no full collection while the heap or the metadata grows.
    short = options(TRIGGER="available-now", LAKEHOUSE__SPARK__DRIVER_MEMORY="3g").split()
    assert "-Xms3g" in short and PARALLEL_METADATA in short
    long = options(TRIGGER="processing-time").split()
    assert not [o for o in long if o.startswith("-Xms")] and PARALLEL_METADATA not in long


def test_a_batch_of_up_to_twice_256_mb_of_files_is_one_task_per_core(spark, tmp_path):
    """Six landing files of 50 MB (sparse: only their sizes matter to the planner). Spark's 128 MB
    pieces made 3 tasks of them on 2 cores, the third run alone after the other two; the
    session's setting makes them one per core, as a 1M-event batch is."""
    for i in range(6):
        with open(tmp_path / f"part-{i}.jsonl", "wb") as f:
            f.truncate(50 << 20)
    cores = int(spark.conf.get("spark.default.parallelism"))
    scan = spark.read.format("binaryFile").load(str(tmp_path))
    assert scan.rdd.getNumPartitions() == cores == 2
    ours = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "128m")     # Spark's default, for contrast
    try:
        assert spark.read.format("binaryFile").load(str(tmp_path)).rdd.getNumPartitions() == 3
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", ours)


def test_state_stores_snapshot_every_commit_only_in_available_now_runs(env):
    from common.spark import spark_conf

    def conf(trigger):
        c = spark_conf(load_config(env={**env, "TRIGGER": trigger}))
        return (c["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"],
                c["spark.sql.streaming.stateStore.rocksdb.compactOnCommit"])

    assert conf("available-now") == ("false", "false")
    assert conf("processing-time") == ("true", "true")


def test_memory_pages_are_the_conf_s_size_in_the_running_jvm(spark, env):
    """Every sort, hash aggregation and broadcast hash table takes at least one page: Spark's
    default of 64 MB here left 2.4 GB of them in a long-lived JVM (conf spark.page_size)."""
    from common.spark import spark_conf

    configured = load_config(env={}).spark.page_size
    jvm = spark.sparkContext._jvm
    in_jvm = spark.sparkContext._jsc.sc().env().memoryManager().pageSizeBytes()
    assert in_jvm == jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(configured) < 64 << 20
    bigger = spark_conf(load_config(env={**env, "LAKEHOUSE__SPARK__PAGE_SIZE": "8m"}))
    assert bigger["spark.buffer.pageSize"] == "8m"


def _oldest_state_version(checkpoint: Path) -> int:
    """The oldest committed version any of the checkpoint's state stores still keeps."""
    stores = [d for d in (checkpoint / "state").glob("*/*") if d.is_dir() and d.name.isdigit()]
    return min(int(f.name.split(".")[0].split("_")[0]) for d in stores for f in d.glob("[0-9]*.zip"))


def test_available_now_runs_leave_state_versions_past_the_retention_deleted(spark, tmp_path):
    """Spark deletes state versions older than minBatchesToRetain only from its background
    maintenance, and only for stores loaded while a query runs: a run of seconds must get a turn
    (conf maintenance.state_maintenance_interval), or every available-now run leaves its versions
    behind for good. Runs here commit two versions each (a batch, then its watermark batch)."""
    from pyspark.sql import functions as F

    interval_ms = int(spark.conf.get("spark.sql.streaming.stateStore.maintenanceInterval").rstrip("ms"))
    assert interval_ms <= 10_000, "state maintenance as rare as Spark's 60 s default misses short runs"
    source, checkpoint = str(tmp_path / "source"), tmp_path / "checkpoint"
    retain, key = 3, "spark.sql.streaming.minBatchesToRetain"
    first_run = 2               # the versions of the first run: its batch and its watermark batch
    # Each run also commits its watermark-only batch (as the pipeline's conf has it): 8 versions, so
    # versions past the retention pile up unless maintenance deletes them.
    previous = {k: spark.conf.get(k) for k in (key, NO_DATA_BATCHES)}
    spark.conf.set(key, str(retain))
    spark.conf.set(NO_DATA_BATCHES, "true")
    held = []

    def run(hold_s: float = 0.0) -> None:
        def body(df, batch_id):
            df.count()                  # loads and commits the batch's state stores
            if hold_s and not held:     # still loaded: the maintenance task gets its turn
                held.append(batch_id)
                until = time.monotonic() + hold_s
                while _oldest_state_version(checkpoint) <= first_run and time.monotonic() < until:
                    time.sleep(0.25)
        stream = (spark.readStream.format("delta").load(source)
                  .withWatermark("t", "1 minute").dropDuplicatesWithinWatermark(["id"]))
        (stream.writeStream.foreachBatch(body).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start().awaitTermination())

    def land(i: int) -> None:
        (spark.range(3).select((F.col("id") + 10 * i).cast("string").alias("id"),
                               F.timestamp_seconds(F.lit(3600 * i) + F.col("id")).alias("t"))
         .write.format("delta").mode("append").save(source))

    try:
        for i in range(3):
            land(i)
            run()
        land(3)
        # Held until pruned (about one interval alone); on a loaded machine (the CI's suite with
        # the soak beside it) one interval and 4 s once fell short, so a few intervals.
        run(hold_s=3 * interval_ms / 1000 + 10)
        # Two versions a run, 8 in all: while the last run held its stores (6 versions committed,
        # 3 to retain) maintenance deleted the first run's. (A count would race the snapshots the
        # last run's two commits add against the next deletion: 6 kept once, in a CI run.)
        assert _oldest_state_version(checkpoint) > first_run, \
            f"state version {_oldest_state_version(checkpoint)} kept with minBatchesToRetain={retain}"
    finally:
        for k, v in previous.items():
            spark.conf.set(k, v)


@pytest.mark.parametrize("kills", [4, 5, 10])
def test_mixed_chaos_kills_the_pipeline_process_first_then_every_layer(kills):
    from chaos.run import Settings, schedule

    plan = schedule(Settings(kills=kills, seed=11, mode="mixed"))
    assert list(plan) == ["pipeline", "bronze", "silver", "gold"]
    assert sum(map(len, plan.values())) == kills
    assert len(plan["pipeline"]) >= 1 and all(len(plan[layer]) >= 1 for layer in ("bronze", "silver", "gold"))
    assert schedule(Settings(kills=kills, seed=11, mode="mixed")) == plan     # the seed repeats it


class _Probe:
    """A flow whose one output waits until the batch's accounting row is readable in
    ops.batch_accounting: it can only finish if the row is written beside it, not after it."""

    def __init__(self, spark, cfg, no_result=False):
        from common import accounting
        from common.batch import MicroBatch
        from common.outputs import Publish, Result

        probe = self
        books = accounting.Accounting(spark, cfg, "silver", cfg.checkpoint("probe"), lambda p: {})

        class ProbeBatch(MicroBatch):
            layer = "silver"
            outputs = (Publish("probe", lambda rows: probe.wait_for_row(spark, books.path)),)

            def compute(self, df, ctx):
                n = df.count()
                probe.batch_id = ctx.batch_id
                if no_result:
                    return {"rows_written": n}
                return Result({"probe": df}, {"rows_written": n})

        self.batch = ProbeBatch(spark, cfg, "probe", "bronze.events", {}, books)
        self.saw_row_first: list[int] = []

    def wait_for_row(self, spark, path):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            seen = (spark.read.format("delta").load(path)
                    .where(f"query = 'probe' AND batch_id = {self.batch_id}").count())
            if seen:
                self.saw_row_first.append(self.batch_id)
                return
            time.sleep(0.2)


@pytest.mark.parametrize("no_result", [False, True])
def test_the_accounting_row_is_written_beside_the_batch_writes(spark, cfg, no_result):
    from pyspark.errors import StreamingQueryException

    source = str(Path(cfg.landing) / "probe")        # lineage reads a Delta source's offsets
    spark.createDataFrame([("x",), ("y",)], "value STRING").write.format("delta").save(source)
    probe = _Probe(spark, cfg, no_result)
    query = (spark.readStream.format("delta").load(source).writeStream.queryName("probe")
             .foreachBatch(probe.batch).option("checkpointLocation", cfg.checkpoint("probe"))
             .trigger(availableNow=True).start())
    if no_result:   # a computation that hands the runner no Result would lose its writes: it fails loudly
        with pytest.raises(StreamingQueryException, match="not a Result"):
            query.awaitTermination()
        return
    query.awaitTermination()
    assert probe.saw_row_first == [0]
    row = spark.read.format("delta").load(cfg.table_path("ops", "batch_accounting")).where("query = 'probe'").first()
    assert row.rows_written == 2 and row.batch_id == 0


def _commit_actions(path: str, version: int) -> dict:
    lines = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return {k: v for line in lines for k, v in json.loads(line).items()}


def test_only_a_replayed_batch_looks_for_its_earlier_append(spark, tmp_path):
    """A batch planned by this run appends blind, its key in the commit's metadata; a replay
    finds that key (or, for commits older than the key, Delta's txnAppId) and appends nothing."""
    from common.delta import appended, idempotent_append

    path = str(tmp_path / "t")
    rows = lambda n: spark.createDataFrame([(n,)], "n INT")  # noqa: E731
    rows(0).limit(0).write.format("delta").save(path)
    count = lambda: spark.read.format("delta").load(path).count()  # noqa: E731
    lineage = {"pipeline": "lakehouse", "query": "q", "query_id": "id-1"}

    assert idempotent_append(rows(1), path, "q-id-1-x", 7, {**lineage, "batch_id": 7}, replay=False)
    blind = _commit_actions(path, 1)
    assert "txn" not in blind, "a batch planned by this run paid for Delta's transaction lookup"
    assert json.loads(blind["commitInfo"]["userMetadata"])["txn"] == {"app": "q-id-1-x", "version": 7}

    # The batch replayed after a crash before its streaming commit: skipped, nothing twice.
    assert not idempotent_append(rows(1), path, "q-id-1-x", 7, {**lineage, "batch_id": 7}, replay=True)
    assert count() == 1
    # The next batch replayed (its first attempt never committed): written once, with txnAppId.
    assert idempotent_append(rows(2), path, "q-id-1-x", 8, {**lineage, "batch_id": 8}, replay=True)
    txn = _commit_actions(path, 2)["txn"]
    assert (txn["appId"], txn["version"]) == ("q-id-1-x", 8)
    assert count() == 2

    # Found past other writers' commits, a page at a time.
    for n in range(5):
        idempotent_append(rows(10 + n), path, "other", n, {"pipeline": "lakehouse", "query_id": "id-2", "batch_id": n},
                          replay=False)
    assert appended(spark, path, "q-id-1-x", 8, "id-1", page=2)
    # The search stops at the same query's earlier batch: batch 9 cannot be older than it.
    assert not appended(spark, path, "q-id-1-x", 9, "id-1", page=2)

    # A commit made before the key was in the metadata (txnAppId only) is still recognised.
    rows(3).write.format("delta").mode("append").option("txnAppId", "old").option("txnVersion", 4).save(path)
    before = count()
    idempotent_append(rows(3), path, "old", 4, None, replay=True)
    assert count() == before


def test_batches_planned_before_the_run_started_are_its_replays(tmp_path):
    from common.lineage import last_logged_batch

    assert last_logged_batch(str(tmp_path / "none")) == -1
    for batch in (0, 1, 2):
        _offsets(tmp_path, batch, batch, -1)
    (tmp_path / "offsets" / ".2.crc").write_text("")
    assert last_logged_batch(str(tmp_path)) == 2


def _compiles(session) -> bool:
    """Whether a job the calling thread runs now compiles its expressions, as Spark decides in
    the job's tasks (the session's setting, or, where the session leaves it unset, what the
    thread's enclosing execution propagated): a projection with a literal no plan had before is a
    new class when compiled, which Spark's codegen metrics count. Whole stages must be off."""
    metrics = session._jvm.org.apache.spark.metrics.source.CodegenMetrics
    before = metrics.METRIC_COMPILATION_TIME().getCount()
    session.range(1).selectExpr(f"id + {time.time_ns()} AS x").collect()
    return metrics.METRIC_COMPILATION_TIME().getCount() > before


def test_a_batch_after_a_small_one_interprets_its_expressions_and_one_after_a_large_one_compiles(spark, env):
    """conf spark.interpreted_below_rows (5 here): each batch of a real query, one source version
    a batch, sets its session's expression mode from the rows the batch before read; a first
    batch compiles. Either way the batch computes the same rows."""
    from common import accounting
    from common.batch import EXPRESSIONS, MicroBatch
    from common.outputs import Result

    cfg = load_config(env={**env, "LAKEHOUSE__SPARK__INTERPRETED_BELOW_ROWS": "5"})
    source = str(Path(cfg.landing) / "sizes")
    for n in (2, 2, 10, 3):
        spark.range(n).coalesce(1).selectExpr("id", "cast(id * 1.5 AS DECIMAL(10, 2)) AS price").write.format("delta").mode("append").save(source)
    seen = []
    books = accounting.Accounting(spark, cfg, "silver", cfg.checkpoint("sizes"), lambda p: {})

    class Sizes(MicroBatch):
        layer = "silver"

        def compute(self, df, ctx):
            total = df.selectExpr("sum(price * 2) AS s").first().s
            seen.append((ctx.session.conf.get(EXPRESSIONS, None), df.count(), float(total), _compiles(ctx.session)))
            return Result({}, {})

    query = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(source).writeStream
             .queryName("sizes").foreachBatch(Sizes(spark, cfg, "sizes", "bronze.events", {}, books))
             .option("checkpointLocation", cfg.checkpoint("sizes")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert [s[:2] for s in seen] == [("FALLBACK", 2), ("NO_CODEGEN", 2), ("NO_CODEGEN", 10), ("FALLBACK", 3)], seen
    assert [s[2] for s in seen] == [3.0, 3.0, 135.0, 9.0]
    # What the tasks did. The last batch runs inside its streaming part's execution, which ran
    # under the setting the batch before left: its body's jobs compile all the same.
    assert [s[3] for s in seen] == [True, False, False, True], seen


@pytest.mark.parametrize("fuses", [False, True])
def test_a_batch_after_a_watermark_only_one_is_sized_by_the_last_batch_that_read(spark, env, fuses):
    """A stream runs a watermark-only batch whenever its watermark moved and nothing waits; it
    reads nothing, and the batch after it is sized by the last batch that read (10 rows here:
    its jobs compile), not by the empty one (interpreted, whatever its size). A watermark-only
    batch keeps the fusing of the batch before it, since the next batch's streaming part is
    planned with it. Processing-time, deduplication within a watermark: a real query's own
    watermark-only batches. (Fused, a job compiles whatever the expression mode: the modes are
    read from the tasks unfused, the fusing from the session.)"""
    from common import accounting
    from common.batch import WHOLE_STAGE, MicroBatch
    from common.outputs import Result

    cfg = load_config(env={**env, "LAKEHOUSE__SPARK__INTERPRETED_BELOW_ROWS": "5",
                           "LAKEHOUSE__SPARK__WHOLE_STAGE_FROM_ROWS": "5"})
    source = str(Path(cfg.landing) / "quiet")
    seen = []
    books = accounting.Accounting(spark, cfg, "silver", cfg.checkpoint("quiet"), lambda p: {})

    def land(n: int, minute: int) -> None:
        (spark.range(n).coalesce(1).selectExpr(f"id + {minute * 100} AS id",
                                               f"TIMESTAMP '2026-01-01 00:00:00' + INTERVAL {minute} MINUTES AS ts")
         .write.format("delta").mode("append").save(source))

    class Quiet(MicroBatch):
        layer = "silver"
        fuses_stages = fuses

        def compute(self, df, ctx):
            seen.append((ctx.read, df.count(), ctx.session.conf.get(WHOLE_STAGE) == "true" if fuses
                         else _compiles(ctx.session)))
            return Result({}, {})

    def wait_for(what, done):
        deadline = time.monotonic() + 60
        while not done():
            assert query.isActive and time.monotonic() < deadline, f"no {what}: {seen}"
            time.sleep(0.1)

    land(10, 0)
    query = (spark.readStream.format("delta").load(source).withWatermark("ts", "1 second")
             .dropDuplicatesWithinWatermark(["id"]).writeStream.queryName("quiet")
             .foreachBatch(Quiet(spark, cfg, "quiet", "bronze.events", {}, books))
             .option("checkpointLocation", cfg.checkpoint("quiet")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        wait_for("watermark-only batch after the first", lambda: any(not r for r, *_ in seen))
        land(2, 1)
        wait_for("batch of 2 rows", lambda: any(n == 2 for _, n, _ in seen))
        wait_for("watermark-only batch after it", lambda: seen[-1][0] is False)
        land(3, 2)
        wait_for("batch of 3 rows", lambda: any(n == 3 for _, n, _ in seen))
    finally:
        query.stop()
    reading = [(n, chosen) for read, n, chosen in seen if read]
    # Compiled / fused after the first batch's 10 rows, though a watermark-only batch came
    # between; not after the 2 rows of the batch before, watermark-only batch or not.
    assert reading == [(10, True), (2, True), (3, False)], seen
    empty = [i for i, (read, n, _) in enumerate(seen) if not read]
    assert empty and all(seen[i][1] == 0 for i in empty), seen
    if fuses:
        last_read = {i: next(n for read, n, _ in reversed(seen[:i]) if read) for i in empty}
        assert all(seen[i][2] == (last_read[i] >= 5) for i in empty), seen


@pytest.mark.parametrize("fuses", [True, False])
def test_a_query_that_fuses_stages_fuses_its_first_batch_and_those_after_a_large_one(spark, env, fuses):
    """conf spark.whole_stage_from_rows (5 here) in a query whose body `fuses_stages`: a first
    batch is large, so its streaming part is planned with whole stages fused (the query started
    so) and so are its body's plans; after that the body's plans are fused when the batch before
    read 5 rows or more, and the streaming part, planned before the body runs, follows one batch
    later. The session's own setting is left as it was. A body that does not fuse never does."""
    from common import accounting
    from common.batch import WHOLE_STAGE, MicroBatch, start_writer
    from common.outputs import Result

    cfg = load_config(env={**env, "LAKEHOUSE__SPARK__WHOLE_STAGE_FROM_ROWS": "5",
                           "LAKEHOUSE__SPARK__INTERPRETED_BELOW_ROWS": "0"})
    source = str(Path(cfg.landing) / "fusing")
    for n in (2, 2, 10, 3, 3):
        spark.range(n).coalesce(1).selectExpr("id", "id * 3 AS price").write.format("delta").mode("append").save(source)
    seen = []
    books = accounting.Accounting(spark, cfg, "silver", cfg.checkpoint("fusing"), lambda p: {})

    def fused(plan) -> bool:
        # "*(n)": an operator inside a whole-stage class (adaptive's final plan: asked after it ran)
        return "*(" in plan.toString()

    class Fusing(MicroBatch):
        layer = "silver"
        fuses_stages = fuses

        def compute(self, df, ctx):
            running = next(q for q in spark.streams.active if q.name == "fusing")
            streaming = running._jsq.streamingQuery().lastExecution().executedPlan()
            own = df.selectExpr("count(*)", "sum(if(price > 1, price, 0))")   # the batch read once:
            rows, total = own.collect()[0]      # its source rows are what the next batch is sized by
            seen.append((rows, fused(streaming), fused(own._jdf.queryExecution().executedPlan()), total))
            return Result({}, {})

    assert spark.conf.get(WHOLE_STAGE) == "false"
    body = Fusing(spark, cfg, "fusing", "bronze.events", {}, books)
    writer = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(source)
              .selectExpr("id", "price + 1 AS price").writeStream.queryName("fusing")
              .foreachBatch(body)
              .option("checkpointLocation", cfg.checkpoint("fusing")).trigger(availableNow=True))
    start_writer(writer, spark, body).awaitTermination()
    assert spark.conf.get(WHOLE_STAGE) == "false"
    assert [s[0] for s in seen] == [2, 2, 10, 3, 3]
    assert [s[3] for s in seen] == [4, 4, 144, 11, 11]
    if fuses:
        assert [s[1] for s in seen] == [True, True, False, False, True], seen
        assert [s[2] for s in seen] == [True, False, False, True, False], seen
    else:
        assert not any(s[1] or s[2] for s in seen), seen


def _jobs(spark) -> dict[int, str]:
    """Spark's jobs so far (its status store, the UI's), by id: their descriptions."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    said = [(job.jobId(), job.description()) for job in map(jobs.apply, range(jobs.size()))]
    return {i: d.get() if d.isDefined() else "" for i, d in said}


@pytest.mark.parametrize("pinned", [True, False])
def test_a_merge_of_pinned_rows_is_not_copied_again_by_delta(spark, cfg, pinned):
    """A gold batch's MERGE source is a local checkpoint already (BatchContext.pin). Delta's
    MERGE copies any source that is not a plain Delta scan into one more local checkpoint, a
    Spark job per table per batch; a Merge declared `pinned` runs without it, to the same rows.
    (Declared not pinned, the copy is made: what the job list is searched for is there.)"""
    from delta.tables import DeltaTable

    from common import accounting
    from common.batch import MicroBatch
    from common.outputs import Changed, Merge, Result
    from pyspark.sql import functions as F

    source, target = (str(Path(cfg.landing) / f"pin-{pinned}" / name) for name in ("source", "target"))
    spark.createDataFrame([(1, "a"), (2, "b")], "k INT, v STRING").write.format("delta").save(source)
    spark.createDataFrame([(1, "old"), (3, "c")], "k INT, v STRING").write.format("delta").save(target)

    def upsert(table, rows):
        table.alias("t").merge(rows.alias("s"), "t.k = s.k").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

    class PinBatch(MicroBatch):
        layer = "gold"
        outputs = (Merge("pin", target, ("k",), upsert, pinned=pinned),)

        def compute(self, df, ctx):
            rows = ctx.pin(df.select("k", F.concat("v", F.lit("!")).alias("v")))
            return Result({"pin": Changed(rows)}, {"rows_written": rows.count()})

    books = accounting.Accounting(spark, cfg, "gold", cfg.checkpoint(f"pin-{pinned}"), lambda p: {})
    body = PinBatch(spark, cfg, f"pin-{pinned}", "silver.events", {}, books)
    before = set(_jobs(spark))
    query = (spark.readStream.format("delta").load(source).writeStream.queryName(f"pin-{pinned}")
             .foreachBatch(body).option("checkpointLocation", cfg.checkpoint(f"pin-{pinned}"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert sorted(map(tuple, DeltaTable.forPath(spark, target).toDF().collect())) == [(1, "a!"), (2, "b!"), (3, "c")]
    copied = [d for i, d in _jobs(spark).items() if i not in before and "materialize source" in d]
    assert bool(copied) is not pinned, copied
