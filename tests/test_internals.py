"""common/internals.py: each private Spark, Delta or py4j use against the real session (so a
version upgrade that moves one fails here, by name), the version pin, and no private use anywhere
else in the tree."""
from __future__ import annotations

import ast
import os
import time

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from common import internals as I

from test_layout import FLOORS, REPO, modules

# --- the pin ---------------------------------------------------------------------------------


def test_the_installed_versions_are_the_pinned_ones():
    I.check_versions()
    assert set(I.installed_versions()) == set(I.WRITTEN_AGAINST) == {"pyspark", "delta-spark", "py4j"}


def test_an_unpinned_version_is_refused_by_name():
    good = {"pyspark": "4.1.1", "delta-spark": "4.4.0", "py4j": "0.10.9.9"}
    I.check_versions(good)
    with pytest.raises(I.UnpinnedVersion) as caught:
        I.check_versions({**good, "pyspark": "4.2.0"})
    assert "pyspark 4.2.0 (written against 4.1.x)" in str(caught.value)
    assert "delta-spark" not in str(caught.value).split(":")[0]
    with pytest.raises(I.UnpinnedVersion, match=r"delta-spark 5\.0\.0 .*py4j \(not installed\)"):
        I.check_versions({**good, "delta-spark": "5.0.0", "py4j": None})
    assert I.UnpinnedVersion("x").exit_code == 2       # the user fixes it: install the pinned one


# --- py4j and PySpark's errors ---------------------------------------------------------------

def _sql_error(spark, tmp_path) -> PySparkException:
    with pytest.raises(PySparkException) as caught:
        spark.sql(f"SELECT * FROM delta.`{tmp_path / 'nothing-here'}`").collect()
    return caught.value


def test_api_moved_and_java_error_are_what_a_jvm_call_raises(spark):
    jvm = spark.sparkContext._jvm
    with pytest.raises(I.api_moved()):
        jvm.java.lang.Class.forName("org.example.NoSuchClass")
    with pytest.raises(I.java_errors()):
        jvm.java.lang.Class.forName("org.example.NoSuchClass")


def test_remember_jvm_names_asks_the_jvm_once_per_name(spark, monkeypatch):
    """build_spark installs it: a class, package or static method is looked up in the JVM once;
    a static field is read and a missing member looked up every time."""
    from py4j.protocol import Py4JError

    client = spark.sparkContext._gateway._gateway_client
    sent = []
    send = client.send_command
    monkeypatch.setattr(client, "send_command", lambda command, *a, **k: (sent.append(command), send(command, *a, **k))[1])

    def asked(fqn: str, member: str | None = None) -> int:     # py4j's reflection commands for it
        return sent.count(f"r\nu\n{fqn}\n{spark.sparkContext._jvm._id}\ne\n" if member is None
                          else f"r\nm\n{fqn}\n{member}\ne\n")

    jvm = spark.sparkContext._jvm
    for _ in range(3):
        assert jvm.java.util.concurrent.TimeUnit.valueOf("SECONDS").toMillis(2) == 2000
        assert jvm.py4j.reflection.TypeUtil.isInstanceOf("java.lang.Object", jvm.java.lang.Object())
        assert F.lit(1) is not None and jvm.java.lang.Integer.MAX_VALUE == 2**31 - 1
        with pytest.raises(Py4JError):
            jvm.java.lang.Integer.noSuchMember
    unit = "java.util.concurrent.TimeUnit"
    assert asked("java.util.concurrent") == asked(unit) == asked(unit, "valueOf") == 1
    # Earlier tests may have asked these already (PySpark reads TypeUtil to convert an error).
    util = "py4j.reflection.TypeUtil"
    assert max(asked("py4j"), asked("py4j.reflection"), asked(util), asked(util, "isInstanceOf")) <= 1
    assert max(asked("org.apache.spark.sql.functions"), asked("org.apache.spark.sql.functions", "lit")) <= 1
    assert asked("java.lang.Integer", "MAX_VALUE") == 3 and asked("java.lang.Integer", "noSuchMember") == 3
    assert "valueOf" in jvm.java.util.concurrent.TimeUnit.__dict__
    assert "MAX_VALUE" not in jvm.java.lang.Integer.__dict__
    I.remember_jvm_names()                        # again: no second wrapper
    from py4j.java_gateway import JVMView
    assert JVMView.__getattr__._remembers and not getattr(JVMView.__getattr__.__wrapped__, "_remembers", False)


def test_jvm_throwable_is_the_jvm_exception_behind_a_spark_error(spark, tmp_path):
    origin = I.jvm_throwable(_sql_error(spark, tmp_path))
    assert origin is not None and origin.getClass().getName().startswith("org.apache.spark")
    assert I.jvm_throwable(ValueError("no JVM behind it")) is None


def test_is_jvm_instance_knows_subclasses(spark, tmp_path):
    origin = I.jvm_throwable(_sql_error(spark, tmp_path))
    assert I.is_jvm_instance(origin, "java.lang.Throwable")
    assert not I.is_jvm_instance(origin, "java.lang.NullPointerException")


def test_spark_error_message_leaves_out_the_jvm_stack(spark, tmp_path):
    text = I.spark_error_message(_sql_error(spark, tmp_path))
    assert text and "JVM stacktrace" not in text and "\tat " not in text
    assert I.spark_error_message(ValueError("plain")) == "plain"


# --- the running batch -----------------------------------------------------------------------

def test_running_execution_reads_the_batch_being_run(spark, tmp_path):
    seen = {}
    name = "internals_execution_probe"

    def body(df, batch_id):
        df.write.format("noop").mode("overwrite").save()
        if batch_id not in seen:
            query = next(q for q in spark.streams.active if q.name == name)
            seen[batch_id] = I.running_execution(spark, query)

    rows = (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
            .withWatermark("timestamp", "1 minute").dropDuplicates(["value", "timestamp"])
            .observe("probe", F.count(F.lit(1)).alias("rows")))
    query = (rows.writeStream.queryName(name).foreachBatch(body).trigger(processingTime="1 second")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        deadline = time.monotonic() + 120
        while len(seen) < 2 and time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
    finally:
        query.stop()
    assert len(seen) >= 2, query.exception()
    batch_id, execution = max(seen.items())
    assert execution.batch_id == batch_id
    assert execution.trigger_start_ms <= time.time() * 1000
    assert execution.state_operators and "numRowsTotal" in execution.state_operators[0]
    assert "rows" in execution.observed["probe"]


# --- Delta's snapshot ------------------------------------------------------------------------

@pytest.fixture
def delta_table(spark, tmp_path) -> str:
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").option("delta.appendOnly", "false").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('lakehouse.probe' = 'yes')")
    spark.range(2).write.format("delta").mode("append").save(path)
    return path


def test_delta_properties(spark, delta_table):
    assert I.delta_properties(spark, delta_table)["lakehouse.probe"] == "yes"


def test_delta_version(spark, delta_table):
    assert I.delta_version(spark, delta_table) == 2


def test_delta_file_count(spark, delta_table):
    from delta.tables import DeltaTable

    want = DeltaTable.forPath(spark, delta_table).detail().first()["numFiles"]
    assert I.delta_file_count(spark, delta_table) == want > 0


def test_delta_column_names(spark, delta_table):
    assert I.delta_column_names(spark, delta_table) == ["id"]


# --- the driver JVM --------------------------------------------------------------------------

def test_launch_driver_jvm_leaves_a_running_one_alone(spark):
    def never() -> int:
        raise AssertionError("no pipe for a JVM that runs already")

    assert I.launch_driver_jvm(spark.sparkContext.getConf(), never) is False


def test_driver_jvm_process(spark):
    """The suite's session launches its JVM through PySpark's gateway (never spark-submit), so
    the process is there, running, with the stdin pipe PySpark keeps to it."""
    proc = I.driver_jvm_process(spark)
    assert proc is not None and proc.poll() is None and proc.stdin is not None


def test_driver_jvm_pid(spark):
    pid = I.driver_jvm_pid(spark)
    assert pid != os.getpid() and os.path.exists(f"/proc/{pid}")


def test_driver_memory(spark):
    memory = I.driver_memory(spark)
    assert set(memory) == {"heap_used", "nonheap_used"} and all(v > 0 for v in memory.values())


def _dedup_once(spark, source: str, checkpoint: str):
    query = (spark.readStream.schema("v INT").parquet(source).dropDuplicates(["v"])
             .writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", checkpoint).start())
    query.awaitTermination(120)
    return query


def test_detach_accumulator_server(spark):
    """Found and taken from the context, which then has none for its stop to wait for; put back,
    so the suite's session keeps its accumulators."""
    from pyspark.accumulators import AccumulatorTCPServer

    sc = spark.sparkContext
    server = I.detach_accumulator_server(spark)
    try:
        assert isinstance(server, AccumulatorTCPServer) and sc._accumulatorServer is None
        assert I.detach_accumulator_server(spark) is None
    finally:
        sc._accumulatorServer = server
    counted = sc.accumulator(0)
    sc.parallelize(range(4), 2).foreach(lambda x: counted.add(x))
    assert counted.value == 6


def test_stop_state_stores(spark, tmp_path):
    """Found and stopped; a stateful query started afterwards loads its stores again."""
    assert I.stop_state_stores(spark) is True
    path = str(tmp_path / "in")
    spark.createDataFrame([(1,), (1,), (2,)], "v INT").write.parquet(path)
    query = _dedup_once(spark, path, str(tmp_path / "ckpt"))
    assert query.exception() is None and query.lastProgress["stateOperators"][0]["numRowsTotal"] == 2


def test_stop_state_stores_while_maintenance_runs_does_not_deadlock(spark, tmp_path):
    """StateStore.stop alone held the providers' lock while waiting for a maintenance thread that
    needed it: 360 s of stall (Spark's shutdown timeouts) whenever a maintenance run was at that
    step. Stopped right after a query, with maintenance every 100 ms, it raced often."""
    import threading

    key = "spark.sql.streaming.stateStore.maintenanceInterval"
    before = spark.conf.get(key)
    path = str(tmp_path / "in")
    spark.range(400).selectExpr("CAST(id % 40 AS INT) AS v").write.parquet(path)
    spark.conf.set(key, "100ms")
    try:
        for attempt in range(12):
            assert _dedup_once(spark, path, str(tmp_path / f"ckpt{attempt}")).exception() is None
            time.sleep(0.04 * (attempt % 6))
            stopper = threading.Thread(target=I.stop_state_stores, args=(spark,), daemon=True)
            stopper.start()
            stopper.join(60)     # a liveness check: a healthy stop takes well under a second
            assert not stopper.is_alive(), f"StateStore stop stalled after query {attempt}"
    finally:
        spark.conf.set(key, before)


# --- Spark's checkpoint files ----------------------------------------------------------------

@pytest.fixture
def delta_checkpoint(spark, tmp_path) -> tuple[str, str, object]:
    """A query that read a two-version Delta table in two batches: (checkpoint, table, query)."""
    table = str(tmp_path / "source")
    spark.range(3).write.format("delta").save(table)
    spark.range(2).write.format("delta").mode("append").save(table)
    checkpoint = str(tmp_path / "ckpt")
    query = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(table)
             .writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", checkpoint).start())
    query.awaitTermination(120)
    return checkpoint, table, query


def test_checkpoint_id(delta_checkpoint, tmp_path):
    checkpoint, _, query = delta_checkpoint
    assert I.checkpoint_id(checkpoint) == query.id
    assert I.checkpoint_id(str(tmp_path / "never-started")) is None


def test_has_state_folder_is_what_the_state_metadata_source_finds(spark, delta_checkpoint, tmp_path):
    checkpoint, _, _ = delta_checkpoint        # a stateless query's
    assert not I.has_state_folder(checkpoint) and not I.has_state_folder(str(tmp_path / "nothing"))
    assert spark.read.format("state-metadata").load(checkpoint).count() == 0
    stateful = str(tmp_path / "stateful")
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .withWatermark("timestamp", "1 minute").dropDuplicatesWithinWatermark(["value"])
             .writeStream.format("noop").option("checkpointLocation", stateful).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert I.has_state_folder(stateful)
    assert spark.read.format("state-metadata").load(stateful).count() == 1


def test_logged_and_committed_batches(delta_checkpoint, tmp_path):
    checkpoint, _, query = delta_checkpoint
    ran = sorted(p["batchId"] for p in query.recentProgress if p["numInputRows"])
    assert I.logged_batches(checkpoint) == I.committed_batches(checkpoint) == ran and len(ran) >= 2
    assert I.logged_batches(str(tmp_path / "nothing")) == I.committed_batches(str(tmp_path / "nothing")) == []


def test_offset_log_entry(spark, delta_checkpoint):
    checkpoint, table, _ = delta_checkpoint
    last = I.logged_batches(checkpoint)[-1]
    meta, sources = I.offset_log_entry(checkpoint, last)
    assert "batchWatermarkMs" in meta and len(sources) == 1
    assert int(sources[0]["reservoirVersion"]) <= I.delta_version(spark, table) + 1
    with pytest.raises(FileNotFoundError):
        I.offset_log_entry(checkpoint, last + 1)


def test_delta_offset_read_through(spark, delta_checkpoint):
    checkpoint, table, _ = delta_checkpoint
    _, sources = I.offset_log_entry(checkpoint, I.logged_batches(checkpoint)[-1])
    assert I.delta_offset_read_through(sources[0]) == I.delta_version(spark, table)   # all of it, read
    assert I.delta_offset_read_through(None) == -1
    assert I.delta_offset_read_through({"reservoirVersion": 3, "index": -1, "isStartingVersion": False}) == 2
    assert I.delta_offset_read_through({"reservoirVersion": 3, "index": -1, "isStartingVersion": True}) == -1
    assert I.delta_offset_read_through({"reservoirVersion": 3, "index": 0}) is None


def test_unlogged_offset_files(delta_checkpoint, tmp_path):
    assert I.unlogged_offset_files(delta_checkpoint[0]) == []          # batches logged: Spark's to judge
    offsets = tmp_path / "killed" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.5d7e.tmp").write_text("v1")
    assert [p.name for p in I.unlogged_offset_files(str(tmp_path / "killed"))] == [".0.5d7e.tmp"]


def test_file_source_log(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    for n in range(2):
        (landing / f"f{n}.txt").write_text(f"line {n}\n")
    checkpoint = str(tmp_path / "ckpt")
    query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(landing))
             .writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", checkpoint).start())
    query.awaitTermination(120)
    read = {e["path"].rsplit("/", 1)[-1]: e["batchId"] for e in I.file_source_log(checkpoint)}
    assert read == {"f0.txt": 0, "f1.txt": 1} or read == {"f0.txt": 1, "f1.txt": 0}


# --- no private use anywhere else ------------------------------------------------------------

PRIVATE_ATTRIBUTES = {"_jvm", "_jsparkSession", "_jdf", "_jsc", "_jsq", "_jconf", "_jreader", "_jwrite",
                      "_gateway", "_origin", "_cause", "_desc"}
PRIVATE_MODULES = ("py4j", "pyspark.java_gateway")
JVM_CLASSES = {"DeltaLog", "StateStore", "CollectionConverters"}
CHECKPOINT_FILES = {"offsets", "commits", "metadata", "sources", "state"}
INTERNALS = REPO / "common" / "internals.py"


def private_uses(path) -> list[str]:
    """Where a file uses a private Spark, Delta or py4j API or reads Spark's checkpoint files."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES or node.attr in JVM_CLASSES:
                found.append(f"{line}: .{node.attr}")
            elif (isinstance(node.value, ast.Name) and node.value.id == "SparkContext"
                  and node.attr.startswith("_")):
                found.append(f"{line}: SparkContext.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in PRIVATE_ATTRIBUTES or any(f".{c}" in node.value for c in JVM_CLASSES):
                found.append(f"{line}: {node.value!r}")
        elif isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.startswith(PRIVATE_MODULES)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PRIVATE_MODULES):
            found.append(f"{line}: from {node.module}")
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
              and isinstance(node.right, ast.Constant) and node.right.value in CHECKPOINT_FILES):
            found.append(f"{line}: / {node.right.value!r} (a checkpoint file)")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_no_private_api_outside_the_internals_module():
    assert set(FLOORS) >= {"common", "pipeline", "bronze", "silver", "gold", "audit", "tools", "bench",
                           "chaos", "console"}
    wrong = [f"{path.relative_to(REPO)}:{use}" for _, path in modules() if path != INTERNALS
             for use in private_uses(path)]
    assert not wrong, "private Spark/Delta/py4j use outside common/internals.py:\n" + "\n".join(wrong)
    assert len(private_uses(INTERNALS)) > 10       # the scan does see them where they belong


def test_the_scan_catches_each_kind_of_private_use(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from py4j.protocol import Py4JError\n"
                     "import pyspark.java_gateway\n"
                     "x = spark._jvm.org.apache.spark.sql.delta.DeltaLog\n"
                     "y = getattr(error, '_origin', None)\n"
                     "z = SparkContext._lock\n"
                     "w = location(checkpoint) / 'commits'\n"
                     "ok = self._lock, Path(table) / '_delta_log'\n")
    assert [u.split(":")[0] for u in private_uses(probe)] == ["1", "2", "3", "3", "4", "5", "6"]
