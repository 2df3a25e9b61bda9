"""The one place a SparkSession is built: Delta, RocksDB state, UTC, jars from the Maven cache."""
from __future__ import annotations

import logging
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from common import class_archive
from common.catalog import register_tables
from common.config import Config
from common.jars import s3a_jars, spark_extra_jars

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
FAIR_POOLS = CONF_DIR / "fairscheduler.xml"
# The driver's log: Spark's warnings without the noise every healthy run logs (see the file).
LOG_CONFIG = f"-Dlog4j2.configurationFile={CONF_DIR / 'log4j2.properties'}"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LOCAL_FS = "localfs.NioLocalFileSystem"
LOCAL_FS_CONTEXT = "localfs.NioLocalFs"
LOCAL_LOG_STORE = "localfs.LinkLogStore"
# Spark's switch for micro-batches that only move the watermark (conf streaming.no_data_batches).
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


# C1 only, with a code cache large enough that C1 never fills it and switches the JIT off mid-run.
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"
PARALLEL_GC = "-XX:+UseParallelGC"
# With the throughput collector, a run of minutes paid three full collections (0.14-0.28 s each,
# every thread stopped): one when class metadata first passed the JVM's 21 MB threshold, two when
# the heap, started at 1/64 of the machine's memory, grew in steps under the batches. With room
# for the metadata Spark and Delta load, and the heap at its full size from the start, none.
PARALLEL_METADATA = "-XX:MetaspaceSize=256m"


def jvm_options(cfg: Config, archive: bool = True) -> str:
    """Driver JVM flags: UTC, the JIT and the garbage collector that suit how long the run lasts
    (conf spark.jit, spark.gc), and the class archive `make setup` built (conf
    spark.class_archive). The archive maps under either collector."""
    short = cfg.streaming.trigger == "available-now"
    jit = cfg.spark.jit if cfg.spark.jit != "auto" else ("c1" if short else "tiered")
    gc = cfg.spark.gc if cfg.spark.gc != "auto" else ("parallel" if short else "g1")
    cds = class_archive.driver_options(archive and cfg.spark.class_archive)
    # -Xms as spark-submit writes -Xmx: the value of spark.driver.memory as it is.
    collector = f"{PARALLEL_GC} {PARALLEL_METADATA} -Xms{cfg.spark.driver_memory}" if gc == "parallel" else ""
    return " ".join(o for o in ("-Duser.timezone=UTC", LOG_CONFIG, C1_ONLY if jit == "c1" else "", collector, cds) if o)


def object_store_conf(cfg: Config) -> dict[str, str]:
    """s3a settings when a lakehouse path is s3a:// (conf object_store). No credentials: the
    connector's default chain reads them from the environment."""
    if not cfg.on_object_store:
        return {}
    store = cfg.store
    conf = {"spark.hadoop.fs.s3a.endpoint.region": store.region,
            "spark.hadoop.fs.s3a.path.style.access": str(store.path_style_access).lower()}
    if store.endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = store.endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(store.endpoint.startswith("https")).lower()
    return conf


def state_checkpointing(cfg: Config) -> dict[str, str]:
    """How RocksDB state stores reach the checkpoint, by how long the process lives.

    processing-time: changelog checkpointing. A commit uploads only the batch's changed keys; a
    background thread (every conf maintenance.state_maintenance_interval) uploads a snapshot
    every 10 batches, compacted first: silver's dedup keys expire with the watermark,
    and uncompacted their tombstones kept its snapshots at 2-3x the live keys and its checkpoint
    folder growing for the first 40 batches of the 30-minute soak.
    available-now: a snapshot with every commit. A run of a few batches may end before that
    thread has uploaded a snapshot, and stopping the session drops the ones it has not: no run left
    one, so every start rebuilt each store from all the changelogs since the query began (silver
    after 1M events: 1M puts and 350k deletes replayed, 15 s of task time, for 6,000 new rows).
    Not compacted: a commit then uploads only the files it flushed (RocksDB compacts in the
    background), where a compacted store is uploaded whole every batch. A checkpoint written in
    either mode restarts in the other."""
    changelog = str(cfg.streaming.trigger != "available-now").lower()
    return {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": changelog,
            "spark.sql.streaming.stateStore.rocksdb.compactOnCommit": changelog}


def ships_jars(cfg: Config) -> bool:
    """Whether executors outside the driver's JVM may run the tasks, so the jars must be sent to
    them (spark.jars): yes for a cluster master, or when spark-submit's --master decides. A local
    master's tasks run in the driver's JVM, whose classpath holds the jars already; sending them
    anyway made every start copy each jar into a fresh temp folder (on s3a, the AWS SDK bundle:
    641 MB), and a process killed with -9 never deletes its folder: kills filled a CI disk."""
    master = master_override(cfg)
    return master is None or not master.startswith("local")


def plain_encoded(cfg: Config) -> dict[str, str]:
    """Spark settings that write a record's bytes, the event id and event times (silver's and the
    profile's timestamps) without a dictionary. Parquet's per-column setting is a Hadoop key with
    the column after '#': it applies to a column of that name in any table, and every table here
    that has one of these holds distinct values in it."""
    from common.raw_bytes import RAW, RAW_BYTES

    columns = {RAW, RAW_BYTES, "event_id", "event_time",
               *(f.name for f in cfg.profile.fields if f.type == "timestamp")}
    return {f"spark.hadoop.parquet.enable.dictionary#{c}": "false" for c in sorted(columns)}


def spark_conf(cfg: Config, ship_jars: bool | None = None) -> dict[str, str]:
    """Spark settings shared by Python sessions and the spark-sql shell. `ship_jars`: list the
    jars in spark.jars (default: ships_jars, by the master)."""
    # s3a jars go after the others: the class archive was dumped with the others alone, and a
    # JVM accepts an archive whose classpath is a prefix of its own.
    s3a = s3a_jars() if cfg.on_object_store else []
    ship = ships_jars(cfg) if ship_jars is None else ship_jars
    return {
        **({"spark.jars": ",".join(spark_extra_jars() + s3a)} if ship else {}),
        # The jars on the driver's own classpath, where the class archive can hold them.
        "spark.driver.extraClassPath": ":".join([class_archive.driver_class_path(), *s3a]),
        **object_store_conf(cfg),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(cfg.root / "_warehouse"),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # One watermark per query, not one per stateful operator: no query here chains two, and
        # the per-operator propagation does not see through a reused shuffle (gold's sessions
        # and its pass-through of the events read one): from the second batch of a run the
        # sessions' operator got no watermark, and no session ever timed out.
        "spark.sql.streaming.statefulOperator.allowMultiple": "false",
        # Watermark-only batches (conf streaming.no_data_batches): they write nothing here.
        NO_DATA_BATCHES: str(cfg.streaming.no_data_batches).lower(),
        **state_checkpointing(cfg),
        # Local paths through Java's file API instead of Hadoop's shell-outs (jvm/localfs): without
        # Hadoop's native library every file created forked `chmod` and every checkpoint or log
        # rename `readlink`, half the CPU of a streaming run in system time. Checksums unchanged.
        "spark.hadoop.fs.file.impl": LOCAL_FS,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": LOCAL_FS_CONTEXT,
        # Delta commits to local tables put-if-absent across processes (jvm/localfs): Delta's
        # default checks and renames under a lock of its own JVM only, and two layers run as
        # separate applications commit to the same ops tables.
        "spark.delta.logStore.file.impl": LOCAL_LOG_STORE,
        "spark.sql.session.timeZone": "UTC",
        # A JSON object with a key twice (bad input silver must survive) read as a MAP or a
        # VARIANT (the schema contract's key scan): the last value wins, as in the typed parse,
        # instead of DUPLICATED_MAP_KEY failing the batch or the record parsing as NULL.
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        "spark.sql.variant.allowDuplicateKeys": "true",
        "spark.sql.shuffle.partitions": str(cfg.spark.shuffle_partitions),
        "spark.default.parallelism": str(cfg.spark.shuffle_partitions),
        "spark.driver.memory": cfg.spark.driver_memory,
        "spark.buffer.pageSize": cfg.spark.page_size,
        "spark.ui.enabled": str(cfg.spark.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",
        # Delta rebuilds a table's log state (two Spark jobs) for every new version a MERGE or scan
        # reads: gold pays it per table per batch. The pipeline's tables hold a few files each
        # (auto-compaction), so one task does it (Delta's default is 50; measured in
        # docs/benchmark.md, "Reading the figures").
        "spark.databricks.delta.snapshotPartitions": "1",
        # A scan is cut into pieces of at most this size, or of the input / spark.default.parallelism
        # if that is smaller. With Spark's 128 MB, a 1M-event batch (290 MB of landing files)
        # became 3 tasks on 2 cores: two ran side by side, the third alone after them, in bronze
        # and again in silver, which reads bronze's three files (its longest stage: 26 s, of which
        # 11 s on one core). 256 MB gives one piece per core up to 512 MB, and changes nothing
        # for batches under 256 MB. Fresh 1M run-all, three pairs alternated in one (slow) hour:
        # 123.5 / 114.5 / 111.4 s before, 114.4 / 107.0 / 104.7 s after.
        "spark.sql.files.maxPartitionBytes": "256m",
        "spark.sql.adaptive.enabled": "true",
        # Gold caches each micro-batch to count it and write it (silver did too; it now keeps its
        # rows as computed, BatchContext.pin). Compressing the cached columns (stats for
        # dictionary/run-length encodings on every value) was 9% of a 200k run-all's task CPU
        # for ~20% less memory on JSON lines that hardly compress: caching 200k parsed events
        # took 3.2-4.2 s compressed, 2.0-2.3 s not (345 vs 420 MB).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Parquet starts every column of a file with a dictionary and falls back to plain values
        # once it outgrows 1 MB, the work spent: bronze's record bytes and silver's event ids and
        # event times are nearly all distinct (PLAIN_DICTIONARY then PLAIN in every file). They
        # are written plain from the start (fresh run-all of 200,000 events, four pairs
        # alternated: 29.38 -> 29.05 s, silver 14.28 -> 13.88 s; the timestamps' files smaller).
        **plain_encoded(cfg),
        # Whole-stage codegen compiles a Java class for every new plan, and a micro-batch pipeline
        # makes many small plans (gates, MERGEs, commits): a JVM profile of run-all had ~20% of its
        # CPU in code formatting and Janino. Off: run-all of 20,000 events ~10% faster, of 200,000
        # 4%, of 1,000,000 the same (expressions are still compiled, only not fused per stage).
        # Silver's large batches fuse their own query's stages (conf spark.whole_stage_from_rows).
        "spark.sql.codegen.wholeStage": "false",
        # Compiled classes are cached by their source, 100 by default: fewer than the distinct
        # classes one round of the pipeline's plans needs (bronze, silver, gold, their gates,
        # MERGEs and commits), so the cache turned over and each batch recompiled what the last
        # one had (measured in docs/benchmark.md, "Reading the figures").
        "spark.sql.codegen.cache.maxEntries": "2000",
        # PySpark's "DataFrame query context": on every DataFrame and Column call it asks the JVM
        # for the active session and a conf, captures the Python stack and sets then clears the
        # call site in the JVM, about five py4j round trips per call. Silver's plan is built from
        # some 4,500 calls (1.1 s warm, 0.55 s without) and every micro-batch builds its writes,
        # gates and MERGEs anew. Analysis errors lose the Python line of the failing call; the
        # pipeline's own errors name the query and batch.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # Python workers that do not re-read the zip archives on their path before every task
        # (common/python_daemon.py): half of an empty gold batch's time.
        "spark.python.daemon.module": "common.python_daemon",
        # Table maintenance (conf maintenance.*): auto-compaction's threshold and the streaming
        # checkpoints' history.
        "spark.databricks.delta.autoCompact.minNumFiles": str(cfg.maintenance.auto_compact_min_files),
        # Without these two, Delta ignores minNumFiles: it compacts every partition a commit
        # touches as soon as it holds two files, so each table's first write of a run paid for an
        # OPTIMIZE and a second commit on the batch's path. With them, a table is compacted once
        # this process has seen minNumFiles small files in it (make maintain and the runner's
        # maintenance compact what accumulates across runs).
        "spark.databricks.delta.autoCompact.earlySkipPartitionTable.enabled": "true",
        "spark.databricks.delta.autoCompact.modifiedPartitionsOnly.enabled": "false",
        "spark.sql.streaming.minBatchesToRetain": str(cfg.maintenance.min_batches_to_retain),
        # State versions past minBatchesToRetain are deleted only by this background task, and only
        # for stores loaded in this process: often enough that a run of seconds gets a turn.
        "spark.sql.streaming.stateStore.maintenanceInterval":
            f"{max(1, round(cfg.maintenance.state_maintenance_interval.seconds * 1000))}ms",
        # Delta refuses time travel past delta.deletedFileRetentionDuration counted in whole hours,
        # so a horizon under an hour (the soak's) would refuse every old version. The audit checks
        # the same horizon itself, to the second (audit.__main__._too_old).
        "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
        # VACUUM lists a table with this many tasks (default 10,000: 130 s for a one-folder table).
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(cfg.spark.shuffle_partitions),
        # Batch accounting reads per-batch progress; keep enough of it between polls.
        "spark.sql.streaming.numRecentProgressUpdates": "1000",
        # One application runs every layer: each layer's queries in its own FAIR pool.
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(FAIR_POOLS),
        "spark.driver.extraJavaOptions": jvm_options(cfg),
        # Executors of a cluster keep Spark's own logging: their logs are the cluster's.
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    }


def submitted() -> bool:
    """True when spark-submit launched this driver: its JVM is already running (and told us
    where, in these variables), started with the submit's --master and --conf."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def master_override(cfg: Config) -> str | None:
    """The master this process sets: SPARK_MASTER, else conf spark.master; none under
    spark-submit without SPARK_MASTER, so `spark-submit --master ...` wins over conf. `local[*]`
    gets conf spark.local_slots_per_core task slots per core (local_master)."""
    if submitted() and "SPARK_MASTER" not in os.environ:
        return None
    return local_master(cfg.spark.master, cfg.spark.local_slots_per_core)


def local_master(master: str, slots_per_core: int, cores: int | None = None) -> str:
    """`local[*]` as `local[N]`, N = the cores this process may run on x `slots_per_core`; any
    other master as it is (an explicit `local[4]` is the user's count)."""
    if master.replace(" ", "") != "local[*]" or slots_per_core == 1:
        return master
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"local[{cores * slots_per_core}]"


def submit_properties(cfg: Config) -> str:
    """spark_conf as a spark-submit --properties-file: what the driver JVM needs at launch
    (jars on its classpath, JVM options, memory), which a session built inside an already
    running JVM cannot add. No master: spark-submit's --master says where to run."""
    def escape(v: str) -> str:
        return v.replace("\\", "\\\\")

    lines = [f"{k} {escape(v)}" for k, v in spark_conf(cfg, ship_jars=True).items()]
    return "# spark-submit --properties-file for this lakehouse (python -m common.spark --properties)\n" + "\n".join(lines) + "\n"


def _worker_environment() -> None:
    # The Python workers (pandas UDFs, applyInPandasWithState) must use this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Python workers inherit this: pyspark 4.1's Arrow serializer trips a pandas FutureWarning
    # on every state batch, which would bury real messages in the job's output.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")


_launching: threading.Thread | None = None

# Spark's launcher gives every driver JVM --add-modules=jdk.incubator.vector (pyspark 4.1's
# JavaModuleOptions, placed after any option of ours, so no conf takes it out), and the JDK then
# prints this line at start; no JVM flag silences it. It says nothing an operator can act on, so
# the JVM's stderr goes through _forward_stderr, which drops that line and passes every other.
# On s3a the AWS SDK's bundle, which shades an SLF4J 1.7 of its own without a binding, prints
# three lines more at its first use (its own logging then goes nowhere; Spark's is log4j's).
JVM_STARTUP_NOISE = frozenset({
    b"WARNING: Using incubator modules: jdk.incubator.vector",
    b'SLF4J: Failed to load class "org.slf4j.impl.StaticLoggerBinder".',
    b"SLF4J: Defaulting to no-operation (NOP) logger implementation",
    b"SLF4J: See http://www.slf4j.org/codes.html#StaticLoggerBinder for further details.",
})


def prelaunch_jvm(cfg: Config) -> None:
    """Start the driver JVM (only the JVM and its Py4J gateway: no SparkContext, no query) on a
    thread, so its second of start-up overlaps what the caller does before build_spark (the
    pipeline declares its layers and locks their checkpoints). The JVM
    gets the flags build_spark would give it; build_spark then finds it running."""
    global _launching
    if submitted() or _launching is not None:
        return
    _worker_environment()
    _launching = threading.Thread(target=_launch, args=(_launch_conf(cfg),), name="jvm-launch", daemon=True)
    _launching.start()


def _launch_conf(cfg: Config, extra: dict[str, str] | None = None):
    """What spark-submit needs to start the driver JVM (its options, classpath, memory); the
    session built on it later gets the whole conf again."""
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False).setAll(list({**spark_conf(cfg), **(extra or {})}.items()))
    master = master_override(cfg)
    if master:
        conf.setMaster(master)
    return conf


def _launch(conf) -> None:
    from common.internals import launch_driver_jvm

    def stderr_pipe() -> int:
        # The JVM's stderr, through _forward_stderr; the pipe ends when the JVM does. It goes where
        # this process's stderr pointed at the launch, as a child's would (bench/soak points it at
        # spark.log while the JVM starts, and back at the console after).
        read, write = os.pipe()
        try:
            target = os.dup(2)
        except OSError:         # no stderr: _forward_stderr drains the pipe all the same
            target = 2
        threading.Thread(target=_forward_stderr, args=(read, target), name="jvm-stderr", daemon=True).start()
        return write

    try:
        launch_driver_jvm(conf, stderr_pipe)
    except Exception:   # noqa: BLE001 - build_spark launches it again and reports the error
        pass


def _forward_stderr(fd: int, target: int = 2) -> None:
    """The JVM's stderr, line by line as it comes, to `target`, less JVM_STARTUP_NOISE."""
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            if line.rstrip(b"\r\n") in JVM_STARTUP_NOISE:
                continue
            try:
                while line:
                    line = line[os.write(target, line):]
            except OSError:     # stderr closed: keep draining, so the JVM never blocks on it
                pass
    if target != 2:
        os.close(target)


def build_spark(cfg: Config, app_name: str | None = None, extra: dict[str, str] | None = None):
    from common.internals import check_versions, remember_jvm_names

    check_versions()        # its private API uses are pinned: refuse an untested Spark or Delta
    remember_jvm_names()
    _worker_environment()
    if _launching is not None:
        _launching.join()
    elif not submitted():
        _launch(_launch_conf(cfg, extra))
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name or cfg.spark.app_name)
    master = master_override(cfg)
    if master:
        builder = builder.master(master)
    for key, value in {**spark_conf(cfg), **(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(cfg.spark.log_level)
    _quiet_query_context_loggers()
    register_tables(spark, cfg)
    return spark


def _quiet_query_context_loggers() -> None:
    """PySpark logs every SQL error it converts, with the JVM's whole stack trace as one JSON line
    at ERROR, on loggers with a stderr handler of their own, also for errors the caller handles
    (a fallback, a retry) or says itself (a command's `error:` line). Kept for LOG_LEVEL=debug."""
    from pyspark.logger import PySparkLogger

    from common.log import PACKAGES

    debugging = logging.getLogger(PACKAGES[0]).getEffectiveLevel() <= logging.DEBUG
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = not debugging


def stop(spark) -> None:
    """Stop the session, the state stores' maintenance task first. Spark stops that task only
    after SparkEnv is gone, and a maintenance run falling in between logs
    `IllegalStateException: SparkEnv not active` with 20 lines of stack after a run that
    succeeded. Stopping it first (StateStore.stop: unload every provider, cancel the task) is
    what SparkContext.stop does a moment later anyway. PySpark's accumulator server is shut down
    after, on a thread nobody waits for (detach_accumulator_server)."""
    import threading

    from common.internals import detach_accumulator_server, stop_state_stores

    server = detach_accumulator_server(spark)
    stop_state_stores(spark)      # an internal API: if a Spark upgrade moves it, stop as before
    spark.stop()
    if server is not None:
        threading.Thread(target=server.shutdown, name="accumulator-server-stop", daemon=True).start()


@contextmanager
def session(cfg: Config, app_name: str, spark=None):
    """The caller's session if it passed one (tests, the pipeline), else one built for this
    tool and stopped when the block ends."""
    if spark is not None:
        yield spark
        return
    own = build_spark(cfg, app_name)
    try:
        yield own
    finally:
        stop(own)


def main(argv=None) -> int:
    import argparse

    from common.config import load_config

    parser = argparse.ArgumentParser(
        prog="python -m common.spark",
        description="Print the Spark settings of this lakehouse as a spark-submit properties file:\n"
                    "  python -m common.spark --properties > lakehouse.conf\n"
                    "  spark-submit --master spark://host:7077 --properties-file lakehouse.conf pipeline/__main__.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--properties", action="store_true", help="print the properties file (default)")
    parser.parse_args(argv)
    sys.stdout.write(submit_properties(load_config()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
