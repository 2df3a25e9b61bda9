"""Gold transforms over silver.camera_events. Pure DataFrame functions, batch or streaming."""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from silver.transform import FRONTIER


def late(delay_seconds: float) -> Column:
    """An event more than `delay` behind the event-time frontier silver had reached when it
    arrived (silver's FRONTIER column). Decided from the row alone: counting late events keeps
    no per-event state, and whether an event is late does not depend on how gold's
    micro-batches were cut."""
    threshold = F.col(FRONTIER) - F.make_dt_interval(secs=F.lit(delay_seconds))
    return F.col(FRONTIER).isNotNull() & (F.col("event_time") <= threshold)


def on_time(events: DataFrame, watermark) -> DataFrame:
    """Drop late events (see `late`) and attach the event-time watermark (`watermark`: a
    Duration) that finalizes windows and closes sessions.

    Gold's own watermark is its latest event time minus the same delay, which never passes the
    frontier of rows it has yet to read, so the aggregations drop nothing more: gold's state is
    its open windows and sessions, and late events are counted in events, by the caller."""
    if watermark is None:
        # No watermark (gold.watermark: null): nothing is ever late and no window is final.
        return events
    return events.where(~late(watermark.seconds)).withWatermark("event_time", watermark.spark())


def windowed_aggregate(events: DataFrame, group, window: str, slide: str | None, measures) -> DataFrame:
    """Measures (Spark SQL aggregate expressions) per group per window: tumbling, or sliding by
    `slide`. Columns: window_start, window_end, the group columns, the measures in order, then
    the `_as_of` column of each max_by/min_by measure (see `combinable`).
    Nest's hourly sightings per zip code (Databricks' nest-camera-stats) is one of these.

    Over a micro-batch's events this is the batch's part of each window it touched, which
    `combine` folds into the table's row; over all events, the table itself."""
    w = F.window("event_time", window, slide) if slide else F.window("event_time", window)
    parts = [(name, expression) for m in as_measures(measures) for name, expression in m.parts]
    return (events.groupBy(w.alias("w"), *group)
            .agg(*[F.expr(expression).alias(name) for name, expression in parts])
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    *group, *[name for name, _ in parts]))


class Measure:
    """One measure of a windowed table and how two partial values of it combine: the table's
    row and a micro-batch's part of the same window. count and sum add, min and max keep the
    least and greatest, max_by and min_by keep the value whose ordering is greatest or least,
    which needs the ordering's own max or min beside it (the `<name>_as_of` column)."""

    KINDS = ("count", "sum", "min", "max", "max_by", "min_by")

    def __init__(self, name: str, expression: str, kind: str, args: list[str]):
        self.name, self.expression, self.kind, self.args = name, expression, kind, args

    def __repr__(self) -> str:      # what it computes: part of a table's logic hash (gold/tables.py)
        return f"Measure({self.name!r}, {self.expression!r}, {self.kind!r}, {self.args!r})"

    @property
    def counts(self) -> bool:
        """Whether its value counts something, so is never negative (a table constraint)."""
        return self.kind == "count"

    @property
    def as_of(self) -> str:
        return f"{self.name}_as_of"

    @property
    def parts(self) -> list[tuple[str, str]]:
        """(column, aggregate expression) this measure stores."""
        if self.kind in ("max_by", "min_by"):
            return [(self.name, self.expression), (self.as_of, f"{self.kind[:3]}({self.args[1]})")]
        return [(self.name, self.expression)]

    def combined(self, t: str, s: str) -> list[Column]:
        """The measure's columns after folding batch part `s` into table row `t` (aliases of the
        two sides; the table side is NULL for a window the table does not hold yet)."""
        old, new = F.col(f"{t}.`{self.name}`"), F.col(f"{s}.`{self.name}`")
        if self.kind in ("count", "sum"):
            # NULL + x is NULL: a sum over no non-NULL value is NULL, and stays so until one comes.
            return [F.coalesce(old + new, old, new).alias(self.name)]
        if self.kind in ("min", "max"):
            pick = F.least if self.kind == "min" else F.greatest     # both skip NULLs
            return [pick(old, new).alias(self.name)]
        old_at, new_at = F.col(f"{t}.`{self.as_of}`"), F.col(f"{s}.`{self.as_of}`")
        newer = new_at > old_at if self.kind == "max_by" else new_at < old_at
        take_new = old_at.isNull() | (new_at.isNotNull() & newer)
        return [F.when(take_new, new).otherwise(old).alias(self.name),
                F.when(take_new, new_at).otherwise(old_at).alias(self.as_of)]


def _call(expression: str) -> tuple[str, list[str]] | None:
    """`name(arg, ...)` spanning the whole expression -> (lower-case name, top-level args)."""
    text = expression.strip()
    head = text.split("(", 1)[0].strip()
    if not head.replace("_", "").isalnum() or not text.endswith(")"):
        return None
    args, depth, quote, current = [], 0, None, []
    for ch in text[len(head):].strip()[1:-1]:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:          # "f(a) + g(b)": the first call closes before the end
                return None
        elif ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    args.append("".join(current).strip())
    return head.lower(), args


def combinable(name: str, expression: str) -> Measure:
    """The measure, if a micro-batch's part of it can be folded into the table's value; else
    ValueError saying why. Gold keeps no per-window state of its own: the table is the state."""
    call = _call(expression)
    if call is None or call[0] not in Measure.KINDS:
        raise ValueError(f"measure '{name}: {expression}': gold folds each micro-batch into the "
                         f"table's row, so a measure must be one call of {', '.join(Measure.KINDS)} "
                         "(an average: a sum and a count measure)")
    kind, args = call
    if args and args[0].lower().startswith("distinct "):
        raise ValueError(f"measure '{name}: {expression}': a distinct count cannot be folded "
                         "batch by batch without keeping every value")
    if kind in ("max_by", "min_by") and len(args) != 2:
        raise ValueError(f"measure '{name}: {expression}': {kind} takes a value and an ordering")
    return Measure(name, expression, kind, args)


def as_measures(measures) -> list:
    """Measure objects (anything with `parts` and `combined`, e.g. a kind's own), or
    (name, expression) pairs of a profile, checked by `combinable`."""
    return [m if hasattr(m, "combined") else combinable(*m) for m in measures]


CLOSING = "_closing"      # combine's flag on a table row it returns only for the watermark


def combine(part: DataFrame, current: DataFrame, keys, measures, close_at_ms: int | None = None) -> DataFrame:
    """Each window `part` touched, with its value after the batch: `part` (a micro-batch's
    windowed_aggregate) folded into the table's row for the same key (`current`, the table).

    With `close_at_ms` (the batch's watermark), also the table's rows that watermark makes
    final that are not marked so yet and that `part` does not touch, as they are, flagged in
    column CLOSING (the rows of `part` say false there). Found in the same read of the table:
    a batch that moves the watermark closes windows it brought no event to, and reading the
    table again for them (in the MERGE's source) cost a second scan of it per batch."""
    cond = [F.col(f"t.`{k}`").eqNullSafe(F.col(f"s.`{k}`")) for k in keys]
    measures = as_measures(measures)
    stored = {col for m in measures for col, _ in m.parts}
    rest = [c for c in part.columns if c not in keys and c not in stored]
    folded = [c for m in measures for c in m.combined("t", "s")]
    if close_at_ms is None:
        joined = part.alias("s").join(current.alias("t"), cond, "left")
        in_batch, closing = F.lit(True), F.lit(False)
    else:
        # A full join: a left join could broadcast the table, but would need a second one for
        # the rows the batch did not touch. Whether a row came from the batch is a column of its
        # own, since group columns may be NULL (unknown zip codes) and a key cannot say.
        mark = "_in_batch"
        joined = part.withColumn(mark, F.lit(True)).alias("s").join(current.alias("t"), cond, "full")
        in_batch = F.col(f"s.{mark}").isNotNull()
        closing = ~in_batch & ~F.col("t.finalized") & is_final(close_at_ms, "t.window_end")
    # A measure folded with no batch side keeps the table's value (see Measure.combined).
    return (joined.where(in_batch | closing)
            .select(*[F.when(in_batch, F.col(f"s.`{c}`")).otherwise(F.col(f"t.`{c}`")).alias(c)
                      for c in [*keys, *rest]], *folded, (~in_batch).alias(CLOSING))
            .select(*part.columns, *([] if close_at_ms is None else [CLOSING])))


def open_or_after(table: DataFrame, earliest_event: str | None) -> DataFrame:
    """The rows of a windowed table a micro-batch's fold can need: those not finalized (the
    watermark may close them) and those whose window ends after the batch's earliest event
    (`earliest_event`, a timestamp literal in the session's time zone; None: the batch has no
    event). Every window an event touches ends after it, and is not finalized either (no event
    reaches a final window, see `late`), so the second test only guards that. The finalized
    past, which grows with every hour of events, is filtered out at the scan, before the full
    join's shuffle."""
    current = ~F.col("finalized")
    if earliest_event is not None:
        current = current | (F.col("window_end") > F.expr(f"TIMESTAMP '{earliest_event}'"))
    return table.where(current)


def with_finalized(windows: DataFrame, watermark_ms: int) -> DataFrame:
    """A window is final once its end is at or behind the watermark: no later event can reach it."""
    return windows.withColumn("finalized", is_final(watermark_ms))


def is_final(watermark_ms: int, window_end: str = "window_end"):
    return F.col(window_end) <= F.timestamp_millis(F.lit(watermark_ms))


def quality_view(df: DataFrame, dimension=None, checks=()) -> DataFrame:
    """Columns the gold suite checks that are derived, not stored: window_seconds, and for each
    column of the profile's dimension join the table carries, `<column>_null_without_flag`
    (true where it is NULL although the dimension flag says the join matched). And for each of
    `checks` (the table constraints whose derived rule the gate runs on the view,
    gold.constraints.viewed), a column named after it: true where its CHECK expression is, false
    where it is false or NULL (Delta refuses both). Projections of `df`, computed in the jobs
    that read them: the gate's rules on them add no Spark job."""
    taken = {c.lower() for c in df.columns}
    clash = [c.name for c in checks if c.name.lower() in taken]
    if clash:
        raise ValueError(f"the gate's view adds column {clash[0]!r} for the table constraint of that name, "
                         "which the table has already: rename the table's column")
    for check in checks:
        df = df.withColumn(check.name, F.coalesce(F.expr(check.sql), F.lit(False)))
    if "window_end" in df.columns:
        df = df.withColumn("window_seconds",
                           F.col("window_end").cast("long") - F.col("window_start").cast("long"))
    if dimension is not None and dimension.flag in df.columns:
        for col in dimension.columns:
            if col in df.columns:
                df = df.withColumn(f"{col}_null_without_flag",
                                   F.col(col).isNull() & ~F.col(dimension.flag))
    return df


def stats_kafka_records(updates: DataFrame, key_columns, value: str) -> DataFrame:
    """Rows for the compacted stats topic: key = key columns + window (JSON), value = the measure
    (nest: zip code + hour -> sightings)."""
    key = F.to_json(F.struct(
        *key_columns,
        F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
        F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end")),
        # Keep e.g. "zip_code": null for unknown devices: every key has the same fields.
        {"ignoreNullFields": "false"})
    return updates.select(key.alias("key"), F.col(value).cast("string").alias("value"))

