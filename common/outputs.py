"""What a flow writes, declared: each output says where one batch's rows go and how they are
written exactly once. The batch runner (common/batch.py) runs them; a layer only declares them
and computes, per batch, the rows each one gets (`Result`).

The write disposition is in the declaration, not in the layer's code: an `Append` is keyed by
(app id, batch id) so a replayed batch finds its first commit; a `Merge` folds rows into a table
by key, one commit per batch under the same kind of key, which a replay looks up before folding
again; a `Publish` goes where a repeat is harmless (a compacted topic keyed by row).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from common.delta import appended, idempotent_append, live_files, retry_on_conflict


def _key(ctx, suffix: str) -> str:
    return f"{ctx.app_id}-{suffix}" if suffix else ctx.app_id


@dataclass(frozen=True)
class Append:
    """The batch's rows appended once, keyed by (app id[-suffix], batch id)."""
    name: str
    path: str
    suffix: str = ""               # one key per table the query appends to

    def writer(self, rows, ctx) -> Callable[[], bool]:
        return lambda: idempotent_append(rows, self.path, _key(ctx, self.suffix), ctx.batch_id,
                                         ctx.lineage, ctx.replay)


class Changed(NamedTuple):
    """A Merge's input for one batch: the changed rows and the batch's arguments of its clauses."""
    rows: Any
    args: dict = {}


@dataclass(frozen=True)
class Merge:
    """Rows merged into a table by `keys`, through `clauses(target DeltaTable, rows, **args)`.
    Into an empty table (a fresh lakehouse's first batch) every row is an insert, so an append
    of `initial(rows)` keyed by the batch does the MERGE's work without its joins. MERGE has no
    writer option: the runner sets the batch's lineage and key as the session's commit metadata,
    the same key for every Merge of the flow (`suffix`), one commit per table per batch."""
    name: str
    path: str
    keys: tuple
    clauses: Callable
    initial: Callable = field(default=lambda rows: rows)
    suffix: str = "merge"
    # Its rows are pinned (BatchContext.pin), and its clauses pin what they add to them: Delta
    # need not copy the MERGE's source (common.delta.sources_pinned).
    pinned: bool = False

    def key(self, ctx) -> str:
        return _key(ctx, self.suffix)

    def written(self, spark, ctx) -> bool:
        """A replayed batch that committed to this table before the crash: its rows are in the
        table already, and folding them in again would count them twice."""
        return ctx.replay and appended(spark, self.path, self.key(ctx), ctx.batch_id, ctx.lineage.get("query_id"))

    def writer(self, change: Changed, ctx) -> Callable[[], None]:
        from delta.tables import DeltaTable

        def write():
            spark = change.rows.sparkSession
            if live_files(spark, self.path) == 0:
                idempotent_append(self.initial(change.rows), self.path, self.key(ctx), ctx.batch_id,
                                  ctx.lineage, ctx.replay)
                return
            # A conflict with a concurrent compaction replans and retries: the rows are computed
            # already, and compaction does not change the table's rows.
            retry_on_conflict(lambda: self.clauses(DeltaTable.forPath(spark, self.path), change.rows, **change.args))
        return write


@dataclass(frozen=True)
class Update:
    """Rows changed in place by `apply(target DeltaTable, **args)`, for a change that repeating
    leaves as it is (a flag set twice): a replay needs no key to find it, and the runner commits
    it under the batch's lineage alone. (Delta commits no version when no row matches.)"""
    name: str
    path: str
    apply: Callable

    def writer(self, args: dict, ctx) -> Callable[[], None]:
        from delta.tables import DeltaTable

        def write():
            spark = ctx.session
            retry_on_conflict(lambda: self.apply(DeltaTable.forPath(spark, self.path), **args))
        return write


@dataclass(frozen=True)
class Publish:
    """Rows sent by `send(rows)` to a sink where a replayed batch's repeat is harmless."""
    name: str
    send: Callable

    def writer(self, rows, ctx) -> Callable[[], None]:
        return lambda: self.send(rows)


class Result(NamedTuple):
    """A batch's computation: the rows each output gets (by name; absent or None: nothing to
    write this batch) and the counts foreachBatch knows for its accounting row."""
    rows: dict
    counts: dict
