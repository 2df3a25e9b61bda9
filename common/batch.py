"""The foreachBatch scaffolding every layer shares; the layer supplies only `write`.

Around the layer's own work, each micro-batch: runs its Spark jobs in the layer's FAIR pool,
knows its checkpoint's id (the txnAppId prefix that makes its Delta appends idempotent), reads
its lineage from the offset log, validates through the quality gate into ops.dq_results, and
records its ops.batch_accounting row before Spark commits it.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.lineage import batch_lineage, checkpoint_query_id
from common.quality import check


@dataclass(frozen=True)
class BatchContext:
    batch_id: int
    app_id: str              # "<query>-<checkpoint id>": Delta txnAppId prefix of this query
    lineage: dict            # commit metadata of every write of this batch


class MicroBatch:
    """foreachBatch body: subclasses implement write(df, ctx) -> accounting counts."""

    layer = ""

    def __init__(self, spark, cfg, query: str, upstream: str, gate, books):
        self.spark, self.cfg, self.query, self.upstream = spark, cfg, query, upstream
        self.gate, self.books = gate, books
        self.checkpoint = cfg.checkpoint(query)
        self.dq_path = cfg.table_path("ops", "dq_results")
        self._app_id = None

    @property
    def app_id(self) -> str:
        # The checkpoint's id never changes while the query runs: read its metadata file once.
        if self._app_id is None:
            self._app_id = f"{self.query}-{checkpoint_query_id(self.checkpoint)}"
        return self._app_id

    def pinned(self) -> dict:
        """Versions of other tables this batch reads, for its lineage (default none)."""
        return {}

    def __call__(self, df, batch_id: int) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.layer)
        lineage = batch_lineage(self.checkpoint, self.query, batch_id, self.upstream, self.pinned())
        ctx = BatchContext(batch_id, self.app_id, lineage)
        counts = self.write(df, ctx)
        self.books.record(self.query, batch_id, lineage=lineage, **counts)

    def write(self, df, ctx: BatchContext) -> dict:   # pragma: no cover - interface
        raise NotImplementedError

    def validate(self, df, ctx: BatchContext, rows: int | None = None):
        """Run the gate on df (`rows`: its count, if known), record the results, raise on a
        `fail` rule: (outcomes, ms)."""
        return check(self.gate, df, self.spark, self.dq_path, self.query, ctx.batch_id,
                     ctx.app_id, ctx.lineage, rows)
