"""Windowed aggregates (a profile's `aggregations:`): measures per group per event-time window,
tumbling or sliding. Gold keeps no Spark state for them: a batch's part of each window it
touched is folded into the window's row in the table (gold.transform.combine), so the table is
the windows' state and a window costs nothing once batches stop touching it."""
from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common.batch import aggregates_while_caching
from common.config import ConfigError
from common.profile import Aggregation
from gold import transform as T
from gold.constraints import after, not_negative, not_null
from gold.kinds import CLOSING, EVENT, LITERAL_TS, Declaring, GoldTable, identifiers, register


@register
@dataclass(frozen=True)
class WindowedTable(GoldTable):
    kind = "windowed"

    key: str
    table: str
    group: tuple[str, ...]
    window: str                    # a Spark interval ("1 hour")
    slide: str | None
    measures: tuple                # T.Measure each
    publish: tuple | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return ("window_start", *self.group)

    @classmethod
    def declare(cls, entry, at: Declaring) -> "WindowedTable":
        agg = at.entry(Aggregation, entry)
        measures = []
        for name, expression in agg.measures:
            try:
                measures.append(T.combinable(name, expression))
            except ValueError as e:
                raise ConfigError(f"{at.where}: {e}") from None
        publish = (agg.publish_key, agg.publish_value) if agg.publish_value else None
        return cls(agg.key, agg.table, tuple(at.column("group", c) for c in agg.group),
                   at.duration(agg.window).spark(), at.duration(agg.slide).spark() if agg.slide else None,
                   tuple(measures), publish)

    def reads(self) -> set[str]:
        return {*self.group, *identifiers(m.expression for m in self.measures)}

    def checks(self):
        counts = [m.name for m in self.measures if getattr(m, "counts", False)]
        return (not_null("window_start"), not_null("window_end"), after("window_end", "window_start", False),
                *map(not_negative, counts))

    def build(self, events: DataFrame) -> DataFrame:
        """Each window's measures over `events`: a batch's part of the windows it touched, or,
        over all events, the table itself."""
        return T.windowed_aggregate(events, self.group, self.window, self.slide, self.measures)

    def output_schema(self, spark, silver_schema):
        return T.with_finalized(self.build(spark.createDataFrame([], silver_schema)), 0).schema

    def updates(self, batch, current, watermark_ms, earliest):
        part = self.build(batch.where(F.col(EVENT).isNotNull()).select(f"{EVENT}.*"))
        current = current()
        if current is None:
            full = part.withColumn(CLOSING, F.lit(False))
        else:
            full = T.combine(part, T.open_or_after(current, earliest), self.keys, self.measures, watermark_ms)
        return T.with_finalized(full, watermark_ms)

    def sizes(self, rows):
        r = aggregates_while_caching(rows, F.count_if(~F.col(CLOSING)).alias("n"),
                                     F.date_format(F.min("window_start"), LITERAL_TS).alias("first"))
        return r["n"], r["n"], r["first"]

    def merge(self, target: DeltaTable, rows, watermark_ms, hint):
        # `rows` carry the windows the watermark closed (combine): the table needs no read here.
        cond = self.condition()
        if hint is not None:
            # Implied by the keys (window_start is one): a condition on the target alone, which
            # Delta checks against each file's window_start range to skip the files of windows
            # the batch did not change, instead of joining the whole table.
            cond += f" AND t.window_start >= TIMESTAMP '{hint}'"
        (target.alias("t").merge(rows.alias("s"), cond)
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    def close(self, target: DeltaTable, watermark_ms):
        target.update(~F.col("finalized") & T.is_final(watermark_ms), {"finalized": F.lit(True)})

    def expected(self, events, arrival, watermark_ms):
        return T.with_finalized(self.build(events), watermark_ms)
