"""The one foreachBatch body of every flow: a layer declares its outputs (common/outputs.py) and
computes, per batch, the rows each gets; this runs the rest.

Around the layer's computation, each micro-batch: runs its Spark jobs in the layer's FAIR pool,
knows its checkpoint's id (the app id prefix that makes its Delta appends idempotent), reads
its lineage from the offset log, runs the declared quality gates when the computation asks, and
commits: the outputs' writes, the gates' ops.dq_results rows and the batch's
ops.batch_accounting row run at once, all before Spark commits the batch (a no-data batch that
wrote no row has nothing to count and records none), and the batch's caches are released.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from common.delta import TXN, commit_metadata, sources_pinned
from common.errors import KeptFailure
from common.internals import PinnedBlocks
from common.lineage import (batch_lineage, checkpoint_query_id, last_logged_batch, read_nothing,
                            source_lineage)
from common.outputs import Merge, Result, Update
from common.quality import check_tables


WRITTEN = ("rows_written", "events_written", "events_quarantined")
# How Spark evaluates expressions: FALLBACK (its default) compiles them, falling back to
# interpreting an expression it cannot compile; NO_CODEGEN interprets every one.
EXPRESSIONS = "spark.sql.codegen.factoryMode"
COMPILED = "FALLBACK"       # Spark's default mode: compiled, interpreted where code fails to compile
# Whether Spark fuses each stage's operators into one compiled class: off for the session
# (common/spark.py: the pipeline's many small plans paid its compiles), on for the batches of a
# query that `fuses_stages` and reads many rows.
WHOLE_STAGE = "spark.sql.codegen.wholeStage"
_STARTING_FUSED = threading.Lock()


def start_writer(writer, spark, body: "MicroBatch"):
    """Start `writer`'s query (a DataStreamWriter on `spark`, running `body`). A query plans each
    batch in a session of its own, a copy of `spark`'s taken as it starts, and its body sets
    that copy's settings from its second batch on (MicroBatch.choose_expressions); a first batch
    counts as large, so a query whose body fuses one starts from `spark` with whole stages on.
    They are on in `spark` only while the copy is taken: a plan another thread builds in that
    moment is fused as well, to the same rows."""
    if not body.fuses(None):
        return writer.start()
    with _STARTING_FUSED:
        before = spark.conf.get(WHOLE_STAGE)
        spark.conf.set(WHOLE_STAGE, "true")
        try:
            return writer.start()
        finally:
            spark.conf.set(WHOLE_STAGE, before)


@dataclass(frozen=True)
class BatchContext:
    batch_id: int
    app_id: str              # "<query>-<checkpoint id>": the append key prefix of this query
    lineage: dict            # commit metadata of every write of this batch
    replay: bool = True      # its offsets were logged before this run: an attempt may have committed
    session: Any = None      # the batch's SparkSession (a clone per query), whose conf holds commit metadata
    # False for Spark's watermark-only batch (lineage.read_nothing): asked of the offset log once
    # for all the batch does (each asking reads two files, two GETs on object storage).
    read: bool = True
    cached: list = field(default_factory=list)   # released once the batch has committed (or failed)
    gated: list = field(default_factory=list)    # the gates' runs, recorded beside the writes

    def keep(self, df):
        """`df` cached until the batch's writes are done: what they read is computed once."""
        self.cached.append(df.persist())
        return df

    def pin(self, df):
        """`df` computed once (by its first job) and cut from its plan until the batch's writes
        are done; use the returned DataFrame. Its rows are kept as computed, where a cache
        converts them into column vectors first (silver's parsed batch: cheaper kept this way,
        for about 1.5x the memory). Needed for rows computed from a table the batch then
        writes: a cache follows its plan's tables, and a Delta commit to one re-plans every
        cached plan that reads it (Delta's file-filtering jobs, two per table per batch in gold);
        the next read of the cache computes it again over the new version, so a gold batch's
        update read after its MERGE folded the batch in twice. (AQE runs `df`'s shuffles here,
        its last stage in that job.)"""
        pinned = df.localCheckpoint(eager=False)
        self.cached.append(PinnedBlocks(pinned))
        return pinned


class QueryBody:
    """What every foreachBatch body knows of its query: the checkpoint, whose id prefixes the key
    of each of its appends, and which batches are replays, and keeps the typed error a batch
    raised (`failure`) for the runner that started the query. Build it before the query starts."""

    layer = ""

    def __init__(self, cfg, query: str):
        self.cfg, self.query = cfg, query
        self.checkpoint = cfg.checkpoint(query)
        self._query_id = None
        self.failure = KeptFailure()        # this start of the query's: a restart builds a new body
        # Batches up to this one were planned by an earlier run (read before the query logs any
        # offset): only those can find their own writes already there.
        self.replays_through = last_logged_batch(self.checkpoint)

    @property
    def query_id(self) -> str:
        # The checkpoint's id never changes while the query runs: read its metadata file once.
        if self._query_id is None:
            self._query_id = checkpoint_query_id(self.checkpoint)
        return self._query_id

    @property
    def app_id(self) -> str:
        return f"{self.query}-{self.query_id}"

    def replay(self, batch_id: int) -> bool:
        return batch_id <= self.replays_through

    def in_pool(self, spark) -> None:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.layer)


class MicroBatch(QueryBody):
    """foreachBatch body of a flow. A layer subclasses it to declare `outputs` and implement
    `compute(df, ctx) -> Result` (what each output gets, and the counts it knows); it writes
    nothing itself. `upstream`: the Delta table the query reads, or `source` ("files", "kafka")
    for a query reading outside the lakehouse. `gates`: output name -> QualityGate.
    `counted_by`: the output whose write evaluates the batch when the accounting's counts are
    the query's observed metrics alone (bronze counts no row itself: no job of its own)."""

    outputs: tuple = ()
    counted_by: str | None = None
    sized_by_rows: bool = True     # its input rows say its size (choose_expressions)
    fuses_stages: bool = False     # large batches fuse whole stages (choose_expressions, start_writer)

    def __init__(self, spark, cfg, query: str, upstream: str | None, gates: dict, books,
                 outputs: tuple = (), source: str | None = None):
        super().__init__(cfg, query)
        self.spark, self.upstream, self.source = spark, upstream, source
        self.gates, self.books = gates or {}, books
        self.outputs = tuple(outputs) or self.outputs
        self.dq_path = cfg.table_path("ops", "dq_results")
        self._rows_read: int | None = None       # previous_rows

    def lineage(self, batch_id: int) -> dict:
        if self.source is not None:
            return source_lineage(self.checkpoint, self.query, batch_id, self.source)
        return batch_lineage(self.checkpoint, self.query, batch_id, self.upstream)

    def __call__(self, df, batch_id: int) -> None:
        self.in_pool(self.spark)
        ctx = BatchContext(batch_id, self.app_id, self.lineage(batch_id), self.replay(batch_id), df.sparkSession,
                           read=not read_nothing(self.checkpoint, batch_id))
        self.choose_expressions(ctx)
        with self.failure.keep():
            try:
                result = self.compute(df, ctx)
                if not isinstance(result, Result):
                    raise RuntimeError(f"{type(self).__name__}.compute returned {type(result).__name__} "
                                       f"for batch {batch_id}, not a Result")
                self.commit(df, ctx, result)
            finally:
                for cached in ctx.cached:
                    cached.unpersist()

    def choose_expressions(self, ctx: BatchContext) -> None:
        """Compiled or interpreted expressions for this batch (conf spark.interpreted_below_rows),
        and, in a query that `fuses_stages`, whole stages fused or not (conf
        spark.whole_stage_from_rows). Spark generates and compiles Java code for every
        projection and predicate of a plan, and generates its text again in every task, even
        when a compiled class is cached: a fixed cost per job that a batch of a few hundred rows
        pays many times over (a gold batch of 250 rows: 9.0 s compiled, 5.6 s interpreted),
        while at 200,000 rows the compiled code pays for itself many times over (a run-all: 59 s
        compiled, 94 s interpreted), and fusing the operators of silver's parse saves copying
        every row between them. The batch's size is not known before it runs: a batch that reads
        nothing (it only moves the watermark) is small, and one that reads is taken to be the
        size of the query's last batch that read (a first batch is large). The settings are the
        query's own session's: they hold for the plans this body builds, and, since Spark plans
        a batch's streaming part before its body runs, for the streaming part of the next."""
        if not self.sized_by_rows:
            return
        before = self.previous_rows()    # asked by a watermark-only batch too: it notes the one before
        rows = before if ctx.read else 0
        below = self.cfg.spark.interpreted_below_rows
        if below > 0 and rows is not None and rows < below:
            ctx.session.conf.set(EXPRESSIONS, "NO_CODEGEN")
        else:
            # Set, not unset: the batch runs inside its streaming part's execution, which put
            # the session's setting of the batch before in the thread's properties, and a job
            # takes a setting its session lacks from there (so the batch after a small one ran
            # interpreted, whatever its own size).
            ctx.session.conf.set(EXPRESSIONS, COMPILED)
        if self.fuses_stages:
            # Fusing is chosen when a plan is made, and the next batch's streaming part is planned
            # with what this sets: a watermark-only batch keeps the choice of the one before it.
            ctx.session.conf.set(WHOLE_STAGE, "true" if self.fuses(before) else "false")

    def fuses(self, rows: int | None) -> bool:
        """Whether a batch expected to read `rows` (None: a first batch) fuses whole stages."""
        fused_from = self.cfg.spark.whole_stage_from_rows
        return self.fuses_stages and fused_from > 0 and (rows is None or rows >= fused_from)

    def previous_rows(self) -> int | None:
        """Rows read by the query's last batch that read any (None: none yet in this run, or no
        such query). A watermark-only batch reads nothing and says nothing of the next one's size: a
        heavy stream runs one between two large batches whenever its watermark moves and no file
        is waiting, and the large batch after it ran interpreted."""
        for query in self.spark.streams.active:
            if query.name == self.query:
                last = query.lastProgress
                if last is not None and int(last["numInputRows"]) > 0:
                    self._rows_read = int(last["numInputRows"])
                break
        return self._rows_read

    def compute(self, df, ctx: BatchContext) -> Result:   # pragma: no cover - interface
        raise NotImplementedError

    def validate(self, ctx: BatchContext, *checked):
        """Run the declared gates on (output name, df, rows or None) each, side by side; raise on
        a `fail` rule (its results recorded). Outputs without a gate are not checked. Returns the
        GateRun (None if nothing was checked), whose rows the commit records beside the writes."""
        gated = [(self.gates[name], df, rows) for name, df, rows in checked if name in self.gates]
        if not gated:
            return None
        run = check_tables(gated, self.spark, self.dq_path, self.query, ctx.batch_id, ctx.app_id,
                           ctx.lineage, ctx.replay)
        ctx.gated.append(run)
        return run

    def commit(self, df, ctx: BatchContext, result: Result) -> dict:
        """Run the outputs' writes, the gates' records and the accounting row at once. The counts
        are known before any write (or observed by the one write that evaluates the batch), and
        every write is idempotent per batch, so a crash between them is repaired by the replay.
        The accounting row waits for nothing else, so a batch costs its slowest write, not their
        sum. Merges commit under the batch's lineage and key, set once for the session: MERGE
        has no writer option, and one setting per table by concurrent writes would race."""
        unknown = set(result.rows) - {out.name for out in self.outputs}
        if unknown:
            raise ValueError(f"{self.query}: rows for outputs it does not declare: {sorted(unknown)}")
        counts = {**result.counts, "quality_ms": sum(g.ms for g in ctx.gated) if ctx.gated else None}
        chosen = [(out, result.rows.get(out.name)) for out in self.outputs]
        chosen = [(out, rows) for out, rows in chosen if rows is not None]
        writes = [out.writer(rows, ctx) for out, rows in chosen]
        book = None
        if self.counted_by is not None:
            i = next(i for i, (out, _) in enumerate(chosen) if out.name == self.counted_by)
            writes[i], book = _counted(self.spark, df, writes[i], lambda: self.record(ctx, counts), ctx.replay)
        elif any(counts.get(k) for k in WRITTEN) or ctx.read:
            # (A watermark-only batch that wrote no row has no count to book: no ops commit.)
            book = lambda: self.record(ctx, counts)  # noqa: E731
        merges = [out for out, _ in chosen if isinstance(out, Merge)]
        keys = {out.key(ctx) for out in merges}
        if len(keys) > 1:
            raise ValueError(f"{self.query}: a batch commits its merges under one key, got {sorted(keys)}")
        # Updates need no key (repeating one changes nothing), only the lineage.
        updating = any(isinstance(out, Update) for out, _ in chosen)
        merging = (commit_metadata(df.sparkSession, {**ctx.lineage, TXN: {"app": keys.pop(), "version": ctx.batch_id}})
                   if keys else commit_metadata(df.sparkSession, ctx.lineage) if updating else nullcontext())
        pinned = sources_pinned(df.sparkSession) if merges and all(m.pinned for m in merges) else nullcontext()
        with merging, pinned:
            together(*writes, *(g.record for g in ctx.gated), book)
        return counts

    def record(self, ctx: BatchContext, counts: dict) -> None:
        self.books.record(self.query, ctx.batch_id, lineage=ctx.lineage, replay=ctx.replay, **counts)


def _counted(spark, df, write, book, replay: bool):
    """(write, book) for a batch whose counts Spark observes while `write` evaluates it: the
    book starts beside the write and waits only for the write's Spark job, not its Delta commit,
    so the two commits overlap. A replay waits for the whole write (looking for its earlier
    commit may run jobs of its own), and one that found that commit evaluated nothing: the
    batch is evaluated once more, to count it. A failed write books nothing (the batch fails,
    and is replayed)."""
    jobs = _JobWatch(spark) if not replay else None
    done, wrote = threading.Event(), []

    def counted_write():
        try:
            wrote.append(write())
        finally:
            done.set()

    def counted_book():
        if jobs is None:
            done.wait()
        else:
            jobs.wait(done)
        if done.is_set() and not wrote:
            return                       # the write failed: together() raises its error
        if wrote == [False]:
            df.write.format("noop").mode("overwrite").save()
        book()

    return counted_write, counted_book


class _JobWatch:
    """Jobs of the calling thread's job group (a streaming query's run id) started after it was
    made: the public status tracker, polled."""

    def __init__(self, spark):
        sc = spark.sparkContext
        self.tracker, self.group = sc.statusTracker(), sc.getLocalProperty("spark.jobGroup.id")
        self.before = set(self.tracker.getJobIdsForGroup(self.group))

    def wait(self, done: threading.Event, poll: float = 0.02, longest: float = 0.1) -> None:
        """Until a new job of the group has succeeded, or `done` is set. The poll stretches to
        `longest`: each one is two or more calls into the JVM, and at a steady 20 ms a bronze or
        silver write of 10-30 s paid about 0.8 s of the Python driver's CPU (py-spy, run-all on
        200,000 events) for a book that only needs to start before the write's commit ends."""
        while not done.wait(poll):
            for job in set(self.tracker.getJobIdsForGroup(self.group)) - self.before:
                info = self.tracker.getJobInfo(job)
                if info is not None and info.status == "SUCCEEDED":
                    return
            poll = min(poll * 1.25, longest)


def aggregates_while_caching(df, *columns):
    """`columns` (aggregate expressions) over `df`, in the job that fills the caller's cache of
    it (or computes its pinned rows): a no-op write that observes them, one stage.
    `df.agg(...).first()` adds a final one-task stage behind a shuffle, which on a busy machine
    waits for a free core behind the other layers' tasks. Returns a Row (by name and by
    attribute)."""
    from pyspark.sql import Observation, Row

    seen = Observation()
    df.observe(seen, *columns).write.format("noop").mode("overwrite").save()
    return Row(**seen.get)


def together(*writes) -> list:
    """Run independent writes of one batch at once, each on its own thread (Spark local
    properties, so the FAIR pool, are inherited), and return their results in order (None for
    a None write). A Delta commit is mostly driver-side waiting (log listing, small jobs, the
    commit file), so two overlap well even on two cores. Every write is idempotent per batch, so
    a crash between them is repaired by the replay. The first error is raised once all have
    finished."""
    from pyspark import InheritableThread

    results: list = [None] * len(writes)
    errors: list[BaseException] = []

    def run(i, write):
        try:
            results[i] = write()
        except BaseException as e:   # noqa: BLE001 - re-raised on the batch's thread
            errors.append(e)

    todo = [(i, w) for i, w in enumerate(writes) if w is not None]
    threads = [InheritableThread(target=run, args=iw) for iw in todo[1:]]
    for t in threads:
        t.start()
    if todo:
        run(*todo[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
