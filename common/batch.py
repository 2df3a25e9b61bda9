"""The foreachBatch scaffolding every layer shares; the layer supplies only `write`.

Around the layer's own work, each micro-batch: runs its Spark jobs in the layer's FAIR pool,
knows its checkpoint's id (the app id prefix that makes its Delta appends idempotent), reads
its lineage from the offset log, validates through the quality gate, and commits: the layer's
writes, the gate's ops.dq_results rows and the batch's ops.batch_accounting row run at once,
all before Spark commits the batch (a no-data batch that wrote no row has nothing to count and
records none).
"""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import KeptFailure
from common.lineage import batch_lineage, checkpoint_query_id, last_logged_batch, read_nothing
from common.quality import check


WRITTEN = ("rows_written", "events_written", "events_quarantined")


class Committed(dict):
    """The counts a batch booked, as MicroBatch.commit returns them: proof that write() ran it."""


@dataclass(frozen=True)
class BatchContext:
    batch_id: int
    app_id: str              # "<query>-<checkpoint id>": the append key prefix of this query
    lineage: dict            # commit metadata of every write of this batch
    replay: bool = True      # its offsets were logged before this run: an attempt may have committed


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
    """foreachBatch body: subclasses implement write(df, ctx), which ends every path with
    `return self.commit(ctx, counts, *writes)` while what the writes read is still cached."""

    def __init__(self, spark, cfg, query: str, upstream: str, gate, books):
        super().__init__(cfg, query)
        self.spark, self.upstream = spark, upstream
        self.gate, self.books = gate, books
        self.dq_path = cfg.table_path("ops", "dq_results")

    def __call__(self, df, batch_id: int) -> None:
        self.in_pool(self.spark)
        lineage = batch_lineage(self.checkpoint, self.query, batch_id, self.upstream)
        ctx = BatchContext(batch_id, self.app_id, lineage, self.replay(batch_id))
        with self.failure.keep():
            committed = self.write(df, ctx)
        if not isinstance(committed, Committed):
            raise RuntimeError(f"{type(self).__name__}.write returned without commit() for batch {batch_id}")

    def write(self, df, ctx: BatchContext) -> dict:   # pragma: no cover - interface
        raise NotImplementedError

    def commit(self, ctx: BatchContext, counts: dict, *writes) -> dict:
        """Run the batch's writes (callables, None skipped) and its accounting row at once.
        The counts are known before any write: the row needs none of them to finish, and every
        write is idempotent per batch, so a crash between them is repaired by the replay. The
        accounting row waits for nothing, so a batch costs its slowest write, not their sum."""
        book = None
        if any(counts.get(k) for k in WRITTEN) or not read_nothing(self.checkpoint, ctx.batch_id):
            # (A watermark-only batch that wrote no row has no count to book: no ops commit.)
            book = lambda: self.books.record(self.query, ctx.batch_id, lineage=ctx.lineage,  # noqa: E731
                                             replay=ctx.replay, **counts)
        together(*writes, book)
        return Committed(counts)

    def validate(self, df, ctx: BatchContext, rows: int | None = None):
        """Run the gate on df (`rows`: its count, if known); raise on a `fail` rule (its results
        recorded). Returns the GateRun whose `record` the layer runs beside its writes."""
        return check(self.gate, df, self.spark, self.dq_path, self.query, ctx.batch_id,
                     ctx.app_id, ctx.lineage, rows, ctx.replay)


def aggregates_while_caching(df, *columns):
    """`columns` (aggregate expressions) over `df`, in the job that fills the caller's cache of
    it: a no-op write that observes them, one stage. `df.agg(...).first()` adds a final
    one-task stage behind a shuffle, which on a busy machine waits for a free core behind the
    other layers' tasks. Returns a Row (by name and by attribute)."""
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
