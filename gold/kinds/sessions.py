"""Per-key sessions (a profile's `sessions:`), kept open in the gold query's state store by
arbitrary stateful processing (gold.sessions) and closed when the watermark passes their last
event + gap. The table holds every session; a session absorbed by another is deleted."""
from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from common.batch import aggregates_while_caching
from common.internals import PinnedBlocks
from common.profile import Sessions
from gold import sessions as S
from gold.constraints import after, not_negative, not_null
from gold.kinds import SESSION, Declaring, GoldTable, identifiers, register

LIVE = "status <> 'merged'"      # `merged` notices are deletions, not rows


@register
@dataclass(frozen=True)
class SessionTable(GoldTable):
    kind = "sessions"
    stateful = True

    key: str
    table: str
    spec: S.SessionSpec

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.spec.key, "session_id")

    @classmethod
    def declare(cls, entry, at: Declaring) -> "SessionTable":
        sessions = at.entry(Sessions, entry)
        for c in (sessions.key, *sessions.latest):
            at.column("key" if c == sessions.key else "latest", c)
        return cls("sessions", sessions.table, S.SessionSpec.of(sessions, at.duration(sessions.gap).seconds))

    def checks(self):
        return (*map(not_null, (self.spec.key, "session_id", "session_start", "session_end")),
                after("session_end", "session_start", True), not_negative("events"))

    def reads(self) -> set[str]:
        return {self.spec.key, *self.spec.latest, *identifiers(e for _, e in self.spec.measures)}

    def output_schema(self, spark, silver_schema):
        return spark.createDataFrame([], self.spec.output_schema(silver_schema)).schema

    def stream(self, events, *carried):
        return S.sessionize(events, self.spec, *carried)

    def updates(self, batch, current, watermark_ms, earliest):
        # The state function closed by the batch's own watermark; `watermark_ms` (the next
        # one, GoldBatch.compute) may close more of them already.
        rows = batch.where(F.col(SESSION).isNotNull()).select(f"{SESSION}.*")
        return rows.withColumn("status", F.when(S.is_closing(self.spec, watermark_ms), F.lit("closed"))
                               .otherwise(F.col("status")))

    def sizes(self, rows):
        r = aggregates_while_caching(rows, F.count(F.lit(1)).alias("n"), F.count_if(F.expr(LIVE)).alias("live"))
        return r["n"], r["live"], None

    def live(self, rows):
        return rows.where(LIVE)

    def merge(self, target: DeltaTable, rows, watermark_ms, hint):
        # Sessions the batch does not carry close too: the state store times them out only in
        # a later batch, when Spark's own watermark gets there. They go into the source rather
        # than a NOT MATCHED BY SOURCE clause, which would make the MERGE join (and rewrite)
        # the whole table every batch: this way it rewrites only the files holding a changed
        # row, and finding the rows to close skips files by their stats.
        cond = self.condition()
        closing = (S.closing(target.toDF(), self.spec, watermark_ms).alias("t")
                   .join(rows.alias("s"), F.expr(cond), "left_anti"))
        # A local checkpoint, filled by the MERGE's first pass and read by its second (Delta does
        # not copy a gold batch's source, sinks.outputs): the source reads the target, which the
        # second pass must not see changed, and over the union itself Delta's change-feed plan
        # fails to resolve (MISSING_ATTRIBUTES).
        source = rows.unionByName(closing).localCheckpoint(eager=False)
        try:
            (target.alias("t").merge(source.alias("s"), cond)
             .whenMatchedDelete(condition="s.status = 'merged'").whenMatchedUpdateAll()
             .whenNotMatchedInsertAll(condition="s.status <> 'merged'").execute())
        finally:
            PinnedBlocks(source).unpersist()

    def close(self, target: DeltaTable, watermark_ms):
        target.update(S.is_closing(self.spec, watermark_ms), {"status": F.lit("closed")})

    def held(self, state):
        """The sessions open in the query's state (`statestore` rows): key, id, start, last event, events."""
        return S.open_sessions(state, self.spec)

    def expected(self, events, arrival, watermark_ms):
        return S.replay_sessions(events, arrival, self.spec, watermark_ms)
