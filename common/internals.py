"""Every use of a private Spark, Delta or py4j API, and every read of Spark's checkpoint files, in
one place, pinned to the versions it was written against.

Each function's docstring says which public API is missing and why the project needs the
private one. tests/test_internals.py runs each against the real session, and fails if a module
outside this one uses a private name; `check_versions()` (called by common.spark.build_spark)
refuses a pyspark, delta-spark or py4j this module was not checked against. To move to a new
version: run tests/test_internals.py on it, fix what broke here, then widen WRITTEN_AGAINST.

Delta's _delta_log is not in here: its format is Delta's published protocol (PROTOCOL.md).
Spark's checkpoint folders (offsets/, commits/, metadata, sources/) have no such document.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from common.errors import JobError
from common.storage import location

# component -> the version prefix this module was written against and tested with.
WRITTEN_AGAINST = {"pyspark": "4.1.", "delta-spark": "4.", "py4j": "0.10.9."}


class UnpinnedVersion(JobError):
    """An installed pyspark, delta-spark or py4j is not one common.internals was checked against."""


def installed_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in WRITTEN_AGAINST:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def check_versions(installed: dict[str, str | None] | None = None) -> None:
    """Raise UnpinnedVersion naming each component whose installed version is not the one this
    module's private API uses were written against (`installed`: for tests; default: this
    environment's)."""
    installed = installed_versions() if installed is None else installed
    wrong = [f"{name} {have or '(not installed)'} (written against {want}x)"
             for name, want in WRITTEN_AGAINST.items()
             if (have := installed.get(name)) is None or not have.startswith(want)]
    if wrong:
        raise UnpinnedVersion(
            f"common/internals.py uses private APIs of {', '.join(wrong)}: install the pinned "
            "versions (requirements.lock), or check each function of common/internals.py against "
            "the new ones (tests/test_internals.py) and widen its WRITTEN_AGAINST")


# --- py4j: errors a call into the JVM raises -------------------------------------------------

def api_moved() -> tuple[type, ...]:
    """What a call of a private JVM API raises when an upgrade moved or changed it (py4j's base
    error: no such method or class, or the JVM threw); callers with a public fallback catch
    `except api_moved():`. A function, so importing this module does not import py4j."""
    from py4j.protocol import Py4JError

    return (Py4JError,)


def java_errors() -> tuple[type, ...]:
    """A JVM exception that PySpark did not convert to one of its own (py4j's Py4JJavaError):
    some Delta and Spark calls still raise it, and code that reads conditions must catch it."""
    from py4j.protocol import Py4JJavaError

    return (Py4JJavaError,)


# --- py4j: what a name means in the JVM ------------------------------------------------------

def remember_jvm_names() -> None:
    """Make py4j remember what a name reached from the gateway's JVM view means (a package, a
    class, a static method), instead of asking the JVM again on every use. py4j asks every time:
    each `functions.col` or `lit` PySpark builds costs three round trips to the driver JVM where
    one (the call) is needed, and a name that is a package (`jvm.py4j`, `jvm.scala`) is first
    looked up as a class under each of the view's imports, each miss a search of every jar on the
    classpath: 2-7 ms each. PySpark converts each JVM exception with a dozen of those checks
    (`py4j.reflection.TypeUtil.isInstanceOf`), so even the end of iterating a Java set cost
    25 ms. A run-all asks about 10,000 times (5 s of its Python threads at 20,000 events).

    Remembered: classes, packages and static methods (and nested classes) that were found, and
    a Scala object's one instance (`MODULE$`, which PySpark reads on every active-session
    lookup); a name that was not found is asked again, and any other static field's value is
    read every time. A class does not change for the life of a JVM, and a view's imports are
    PySpark's, made when the gateway starts. py4j has no option for this; it wraps the three
    lookups (idempotent)."""
    from py4j.java_gateway import JavaClass, JavaMember, JavaPackage, JVMView

    for kind, kept in ((JVMView, (JavaClass, JavaPackage)), (JavaPackage, (JavaClass, JavaPackage)),
                       (JavaClass, (JavaClass, JavaMember))):
        if not getattr(kind.__getattr__, "_remembers", False):
            kind.__getattr__ = _remembering(kind.__getattr__, kept)


SCALA_OBJECT = "MODULE$"       # the static final field that holds a Scala object


def _remembering(lookup, kept: tuple[type, ...]):
    from functools import wraps

    @wraps(lookup)                           # __wrapped__: py4j's own lookup
    def remembered(self, name):
        found = lookup(self, name)
        if isinstance(found, kept) or name == SCALA_OBJECT:
            self.__dict__[name] = found      # read before __getattr__ from now on
        return found

    remembered._remembers = True
    return remembered


# --- PySpark's errors ------------------------------------------------------------------------

def jvm_throwable(error: BaseException):
    """The JVM Throwable behind a PySpark error, or None. PySpark keeps it as `_origin` and has no
    public accessor; a foreachBatch error keeps only the text of the batch's error, so the
    search follows PySpark's `_cause` to the one that has an origin. Needed to recognise
    failures by their JVM exception classes instead of the text of a stack trace."""
    origin = _origin(error)
    while origin is None and getattr(error, "_cause", None) is not None:
        error = error._cause
        origin = _origin(error)
    return origin


def _origin(error: BaseException):
    # py4j's own error (a call PySpark does not convert, such as a collect in a batch's body)
    # keeps the Throwable as `java_exception`.
    origin = getattr(error, "_origin", None)
    return origin if origin is not None else getattr(error, "java_exception", None)


def is_jvm_instance(java_object, java_class: str) -> bool:
    """Whether a JVM object is an instance of `java_class` (or a subclass). py4j's is_instance_of
    needs the gateway, which PySpark keeps as SparkContext._gateway (no public accessor)."""
    from py4j.java_gateway import is_instance_of
    from pyspark import SparkContext

    return bool(is_instance_of(SparkContext._gateway, java_object, java_class))


def spark_error_message(error: BaseException) -> str:
    """A PySpark error's own message, without the JVM stack trace str() appends: PySpark keeps it
    as `_desc`; getMessage() adds the condition and the trace."""
    return getattr(error, "_desc", None) or str(error)


# --- the running micro-batch's execution ---------------------------------------------------

_STATE_WRITER = "org.apache.spark.sql.execution.streaming.operators.stateful.StateStoreWriter"


@dataclass(frozen=True)
class Execution:
    batch_id: int
    trigger_start_ms: int
    state_operators: list      # each stateful operator's progress, as a dict (the progress report's)
    observed: dict             # observed metrics by name, each a dict


def _plan_nodes(plan):
    """Every node of a JVM SparkPlan, through py4j."""
    pending = [plan]
    while pending:
        node = pending.pop()
        yield node
        children = node.children()
        pending.extend(children.apply(i) for i in range(children.size()))


def running_execution(spark, query) -> Execution:
    """The metrics of the micro-batch a query is running, read from its executed plan. Spark
    publishes them only in the progress report, after the batch has committed; accounting must
    write them before (common.accounting). No public API reaches the running batch: this reads
    the query's JVM object (`_jsq`), its latest execution context, the StateStoreWriter nodes
    of the executed plan (by class name) and the observed metrics (a Scala map)."""
    context = query._jsq.streamingQuery().getLatestExecutionContext()
    execution = context.executionPlan()
    writer = spark._jvm.java.lang.Class.forName(_STATE_WRITER)
    operators = [json.loads(node.getProgress().json()) for node in _plan_nodes(execution.executedPlan())
                 if writer.isInstance(node)]
    metrics = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(execution.observedMetrics())
    seen = {name: json.loads(metrics.get(name).json()) for name in metrics.keySet()}
    return Execution(int(context.batchId()), int(context.currentTriggerStartTimestamp()), operators, seen)


_FILE_SCAN = "org.apache.spark.sql.execution.FileSourceScanExec"


def running_input(spark, query) -> tuple:
    """(input, watermark) of the micro-batch a query is running: the rows it read from its one
    file-based source (a Delta source's files of this batch) as a batch DataFrame of their own,
    and the watermark in ms its stateful operator dropped late rows by (None: no such operator,
    or the plan does not scan exactly one source). Rows the operator dropped are gone from the
    batch's own DataFrame; these are what they were dropped from, and which of them it dropped.
    This reads the executed plan: its FileSourceScanExec, whose relation's file index lists the
    batch's files only, and its StateStoreWriter's eventTimeWatermarkForLateEvents (classes by
    name; Spark takes that watermark from the previous batch, or from the batch itself when it is
    the first of a run)."""
    from pyspark.sql import DataFrame

    plan = query._jsq.streamingQuery().getLatestExecutionContext().executionPlan().executedPlan()
    scan, writer = (spark._jvm.java.lang.Class.forName(c) for c in (_FILE_SCAN, _STATE_WRITER))
    scans, marks = [], []
    for node in _plan_nodes(plan):
        if scan.isInstance(node):
            scans.append(node)
        elif writer.isInstance(node):
            mark = node.eventTimeWatermarkForLateEvents()
            if mark.isDefined():
                marks.append(int(mark.get()))
    if len(scans) != 1 or len(set(marks)) != 1:
        return None, None
    return DataFrame(spark._jsparkSession.baseRelationToDataFrame(scans[0].relation()), spark), marks[0]


# --- a local checkpoint's blocks ------------------------------------------------------------

class PinnedBlocks:
    """A local checkpoint's blocks (DataFrame.localCheckpoint), released like a cache
    (`unpersist`): PySpark gives no handle on the RDD behind the checkpointed plan."""

    def __init__(self, df):
        self.rdd = df._jdf.queryExecution().logical().rdd()

    def unpersist(self):
        self.rdd.unpersist(False)


# --- Delta's cached snapshot -----------------------------------------------------------------

def _snapshot(spark, path: str):
    jvm = spark._jvm
    return (jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
            .update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()))


def delta_properties(spark, path: str) -> dict[str, str]:
    """A Delta table's properties from its cached snapshot (DeltaLog.forTable, JVM only): the
    public DESCRIBE DETAIL / SHOW TBLPROPERTIES run a Spark job, about 2 s a table, on every
    start. Raises api_moved() when a Delta upgrade moved it."""
    it = _snapshot(spark, path).metadata().configuration().iterator()
    out = {}
    while it.hasNext():
        pair = it.next()
        out[pair._1()] = pair._2()
    return out


def delta_version(spark, path: str) -> int:
    """A Delta table's latest version from its cached snapshot: the public DESCRIBE HISTORY runs a
    job (about 0.3 s, on every silver batch that pins its dimension). Raises api_moved()."""
    return int(_snapshot(spark, path).version())


def delta_file_count(spark, path: str) -> int:
    """How many files a Delta table's latest version holds, from the version's checksum file
    (numOfFiles would rebuild the table's state: three jobs for every new version); the public
    DESCRIBE DETAIL runs a job. Raises api_moved()."""
    snapshot = _snapshot(spark, path)
    checksum = snapshot.checksumOpt()
    return int(checksum.get().numFiles() if checksum.isDefined() else snapshot.numOfFiles())


def delta_column_names(spark, path: str) -> list[str]:
    """A Delta table's column names from its cached snapshot, without resolving a DataFrame (the
    public DeltaTable.toDF().columns analyses a plan). Raises api_moved()."""
    return list(_snapshot(spark, path).schema().fieldNames())


# --- the driver JVM --------------------------------------------------------------------------

def launch_driver_jvm(conf, open_stderr: Callable[[], int]) -> bool:
    """Start the driver JVM and its py4j gateway before any SparkContext, unless one runs; True
    if this call started it. PySpark has no public way to start the JVM alone (so it overlaps
    what the caller does before building the session) nor to pass the JVM's stderr through a
    pipe: this sets SparkContext._gateway/_jvm, which the SparkContext built later picks up.
    `open_stderr()` returns the write end of a pipe for the JVM's stderr, closed here once the
    JVM holds its own copy; it is called only when a JVM is started."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return False
        write = open_stderr()
        try:
            SparkContext._gateway = launch_gateway(conf, popen_kwargs={"stderr": write})
            SparkContext._jvm = SparkContext._gateway.jvm
        finally:
            os.close(write)
        return True


def driver_jvm_process(spark):
    """The driver JVM's process (a subprocess.Popen; None when spark-submit started it), which
    PySpark keeps as the gateway's `proc`. Needed to close its stdin and wait for it to exit:
    the class archive is written as the JVM exits."""
    return spark.sparkContext._gateway.proc


def driver_jvm_pid(spark) -> int:
    """The driver JVM's process id, through PySpark's py4j view of the JVM (`_jvm`; no public
    accessor), for the soak's memory samples."""
    return int(spark._jvm.java.lang.ProcessHandle.current().pid())


# The collectors' names for their young-generation collections (G1, parallel, serial); every
# other collector bean counts full collections.
_YOUNG_COLLECTIONS = ("Young", "Scavenge", "Copy", "ParNew")


def driver_memory(spark, attempts: int = 5) -> dict[str, int | None]:
    """The driver JVM's heap and non-heap bytes in use right after a full GC (the live set), from
    its MemoryMXBean through `_jvm`: Spark reports no driver memory in public API.

    System.gc() returns without collecting while any thread is inside a JNI critical region (the
    native compression and RocksDB calls of a running pipeline enter them all the time): the heap
    read then is whatever the young generation held, 1.3-1.5 GB in soak samples whose live set
    was 0.25 GB. So the call is repeated, a little apart, until the collectors' count shows a full
    collection; heap_used is None when none came."""
    jvm = spark._jvm
    management = jvm.java.lang.management.ManagementFactory

    full = [b for b in management.getGarbageCollectorMXBeans()
            if not any(young in b.getName() for young in _YOUNG_COLLECTIONS)]

    def full_collections() -> int:
        return sum(int(b.getCollectionCount()) for b in full)

    collected = False
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.1 * attempt)
        before = full_collections()
        jvm.java.lang.System.gc()
        if full_collections() > before:
            collected = True
            break
    bean = management.getMemoryMXBean()
    return {"heap_used": int(bean.getHeapMemoryUsage().getUsed()) if collected else None,
            "nonheap_used": int(bean.getNonHeapMemoryUsage().getUsed())}


def detach_accumulator_server(spark):
    """Take PySpark's accumulator server (`_accumulatorServer`, no public API) from the context
    and return it (None if there is none, or PySpark moved it), for the caller to shut down
    after the session stops without waiting for it. SparkContext.stop() waits for that server's
    thread, whose handler of the JVM's connection looks at the shutdown flag only between 1-s
    polls of its socket: after a run with Python workers (gold's sessions), 0.35-0.7 s of every
    stop was that wait, against 0.1-0.4 s for the JVM's own stop. Nothing is lost: once the
    queries have ended no task runs, so no update comes."""
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)
    if server is None or not hasattr(server, "shutdown"):
        return None
    sc._accumulatorServer = None
    return server


@contextmanager
def quiet_console(spark):
    """Scala's `println` goes nowhere on this thread while the block runs. Delta's VACUUM prints
    `Deleted N files and directories in a total of M directories.` that way (DatabricksLogging
    .logConsole), once per table and round, into every maintenance's output and the pipeline's
    log, and no logger setting reaches it. Scala 2.13 keeps the stream in a per-thread variable
    (`Console.outVar`, private; `withOut` takes a Scala closure, which py4j cannot pass); it is
    set for the py4j thread serving this Python thread (PySpark pins them one to one), which is
    the one a SQL command runs on. If an upgrade moved it, the block runs and prints as before."""
    try:
        field = spark._jvm.java.lang.Class.forName("scala.Console$").getDeclaredField("outVar")
        field.setAccessible(True)
        out = field.get(None)
        before = out.value()
        set_out = getattr(out, "value_$eq")       # Scala's setter of `value`
        set_out(spark._jvm.java.io.PrintStream(spark._jvm.java.io.OutputStream.nullOutputStream()))
    except api_moved():
        set_out = None
    try:
        yield
    finally:
        if set_out is not None:
            set_out(before)


_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.StateStore"


def stop_state_stores(spark) -> bool:
    """Stop the state stores' maintenance task and unload every provider (StateStore.stop, a JVM
    object with no Python API) before the session stops: Spark stops it only after SparkEnv is
    gone, and a maintenance run in between logs an IllegalStateException after a run that
    succeeded. False if an upgrade moved it (the session then stops as before).

    The maintenance pool is stopped first, without the lock: StateStore.stop holds the providers'
    lock while it waits for the pool (maintenanceShutdownTimeout, 300 s, then 60 s more), and a
    maintenance thread that is asking the coordinator whether its store is still active waits for
    that same lock. Spark 4.1.1 then stalls for 360 s (seen in CI; jstack shows both threads)."""
    try:
        getattr(getattr(spark._jvm, _STATE_STORE + "$"), "MODULE$").stopMaintenanceTaskWithoutLock()
        unlocked = True
    except api_moved():
        unlocked = False
    try:
        getattr(spark._jvm, _STATE_STORE).stop()
    except api_moved():
        return False
    return unlocked


# --- Spark's streaming checkpoint files ------------------------------------------------------
# A checkpoint folder holds `metadata` (the query's id, JSON), `offsets/<batch>` (what each
# batch reads, written before it runs), `commits/<batch>` (written once it has committed) and
# `sources/<n>/` (the file source's log). Spark has no public reader for any of them.

def checkpoint_id(checkpoint: str) -> str | None:
    """The query id kept in the checkpoint's metadata file (None before a query first started on
    it): stable across restarts, new when the checkpoint is deleted. The running query's id is
    public, but the id must be known before the query starts and outside a running one."""
    path = location(checkpoint) / "metadata"
    if not path.exists():
        return None
    return json.loads(path.read_text())["id"]


def has_state_folder(checkpoint: str) -> bool:
    """Whether the checkpoint holds a `state/` folder (a stateful query has committed a batch on
    it). The `state-metadata` data source answers an empty table without one, but logs a warning
    per checkpoint asked; a tool asking about every checkpoint would print them all."""
    return (location(checkpoint) / "state").is_dir()


def _batch_ids(checkpoint: str, folder: str) -> list[int]:
    d = location(checkpoint) / folder
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def logged_batches(checkpoint: str) -> list[int]:
    """The batch ids in the checkpoint's offset log (planned: written before the batch runs),
    ascending; the progress reports say only what ran in this process."""
    return _batch_ids(checkpoint, "offsets")


def committed_batches(checkpoint: str) -> list[int]:
    """The batch ids in the checkpoint's commit log (committed), ascending."""
    return _batch_ids(checkpoint, "commits")


def offset_log_entry(checkpoint: str, batch_id: int) -> tuple[dict, list]:
    """(batch metadata, source offsets) of one batch from the offset log: the watermark a batch
    ran with and what it read, known before it runs (a replay reads the same), which no public
    API gives. The file is "v1", a JSON line of batch metadata (watermark, timestamp, conf), then
    one line per source: its end offset as JSON, or "-" when the source had none yet. Raises
    FileNotFoundError for a batch not (or no longer) in the log."""
    lines = (location(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    meta = json.loads(lines[1]) if len(lines) > 1 and lines[1].startswith("{") else {}
    sources = [json.loads(line) if line.startswith("{") else None for line in lines[2:]]
    return meta, sources


def unlogged_offset_files(checkpoint: str) -> list[Path]:
    """The files of a checkpoint's offset log when it holds no batch ([] once it holds one): what
    a process killed between writing an entry's temporary file (".0.<uuid>.tmp", its ".crc") and
    renaming it leaves. Spark 4.1 then refuses the checkpoint for good
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) and offers no repair."""
    folder = location(checkpoint) / "offsets"
    if not folder.is_dir():
        return []
    entries = list(folder.iterdir())
    return [] if any(p.name.isdigit() for p in entries) else entries


def file_source_log(checkpoint: str, source: int = 0) -> Iterator[dict]:
    """The file source's log entries ({"path", "batchId", ...}: which batch read each file), plain
    and compacted; the progress reports name no file."""
    for f in (location(checkpoint) / "sources" / str(source)).glob("*"):
        if f.name.startswith("."):
            continue
        for line in f.read_text().splitlines():
            if line.startswith("{"):
                yield json.loads(line)


# --- Delta's streaming source offsets --------------------------------------------------------

# DeltaSourceOffset: index -1 (and the metadata-change markers below it) sit before the first
# file of `reservoirVersion`; END_INDEX sits after its last file.
_END_INDEX = 2**63 - 1 - 100


def delta_offset_read_through(offset: dict | None) -> int | None:
    """The last version of a Delta source's table an offset has read completely (-1: none); None
    when the batch stopped inside a version, so no snapshot equals what it read. The offset is
    public (progress reports, offset log) but its index encoding is Delta's DeltaSourceOffset,
    undocumented."""
    if offset is None:
        return -1
    version, index = int(offset["reservoirVersion"]), int(offset["index"])
    if index >= _END_INDEX:
        return version
    if index < 0:
        # A query's first batches read the table's snapshot at reservoirVersion
        # (isStartingVersion); before its first file nothing at all has been read.
        return -1 if offset.get("isStartingVersion") else version - 1
    return None
