"""Sessions per key with arbitrary stateful processing (applyInPandasWithState), the PySpark
counterpart of Scala's flatMapGroupsWithState, plus the same sessions computed in plain batch.

The profile declares them (`sessions:` key, gap, measures, latest): a session is a run of one
key's events whose gaps are at most `gap`; it counts its events, sums each measure (a per-event
integer expression) and keeps the `latest` columns' values of its latest event. It closes when
the watermark passes its last event + gap: any event that could still extend it would be late.
Events may arrive out of order, so one key can hold several open sessions at once, and an
event landing between two of them merges them. Each session keeps the id it was born with
(key + first start seen); when two merge, the survivor keeps the smaller id and the other is
emitted once with status 'merged' so the gold table deletes that row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

STATE_SCHEMA = "sessions STRING"
_MS = 1000


@dataclass(frozen=True)
class SessionSpec:
    key: str
    gap_seconds: float
    measures: tuple[tuple[str, str], ...] = ()   # (output column, per-event SQL expression)
    latest: tuple[str, ...] = ()                 # columns carried from the latest event

    @classmethod
    def of(cls, sessions, gap_seconds: float) -> "SessionSpec":
        """From a profile's `sessions` declaration (common.profile.Sessions)."""
        return cls(sessions.key, gap_seconds, tuple(sessions.measures), tuple(sessions.latest))

    @property
    def gap_ms(self) -> int:
        return int(self.gap_seconds * _MS)

    @property
    def sums(self) -> list[str]:
        return [name for name, _ in self.measures]

    @property
    def columns(self) -> list[str]:
        return [self.key, "session_id", *self.latest, "session_start", "session_end",
                "duration_seconds", "events", *self.sums, "status"]

    def output_schema(self, events_schema) -> str:
        """DDL of the session rows; key and latest columns keep their silver types."""
        types = {f.name: f.dataType.simpleString() for f in events_schema.fields}
        cols = [f"`{self.key}` {types[self.key]}", "session_id STRING",
                *(f"`{c}` {types[c]}" for c in self.latest),
                "session_start TIMESTAMP", "session_end TIMESTAMP", "duration_seconds DOUBLE",
                "events LONG", *(f"`{m}` LONG" for m in self.sums), "status STRING"]
        return ", ".join(cols)


def _value(v):
    """A pandas cell as a JSON-able Python value (the state is JSON)."""
    if v is None or (not isinstance(v, (list, dict)) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def merge_events(sessions: list[dict], events: pd.DataFrame, spec: SessionSpec) -> tuple[list[dict], set[str]]:
    """Fold events into sessions (each a dict with times in epoch ms); returns the merged sessions
    sorted by start, and the ids of sessions absorbed into another. The events are first grouped
    among themselves with numpy (a dense device sends thousands a batch; a dict per event cost
    about 4 s of Python per 200,000), then their runs and the sessions are swept by start."""
    runs = _event_runs(events, spec)
    items = sorted([*({**s, "new": False} for s in sessions), *runs], key=lambda s: (s["start"], s["end"]))
    merged: list[dict] = []
    absorbed: set[str] = set()
    for s in items:
        cur = merged[-1] if merged else None
        if cur is not None and s["start"] - cur["end"] <= spec.gap_ms:
            ids = [i for i in (cur["id"], s["id"]) if i is not None]
            keep = min(ids) if ids else None
            absorbed.update(i for i in ids if i != keep)
            # At equal times this batch's event is the later one (it arrived after the session's).
            if (s["latest_at"], s["new"]) >= (cur["latest_at"], cur["new"]):
                cur["latest"], cur["latest_at"], cur["new"] = dict(s["latest"]), s["latest_at"], s["new"]
            cur.update(id=keep, end=max(cur["end"], s["end"]), events=cur["events"] + s["events"],
                       sums={m: cur["sums"][m] + s["sums"][m] for m in spec.sums})
        else:
            merged.append({**s, "sums": dict(s["sums"]), "latest": dict(s["latest"])})
    for s in merged:
        del s["new"]
    return merged, absorbed


def _event_runs(events: pd.DataFrame, spec: SessionSpec) -> list[dict]:
    """The events as sessions of their own, new ones (no id): sorted by time, a run ends where
    the next event is more than the gap later. A run's latest values are its last event's, the
    last in the frame's order among those at its latest time."""
    if not len(events):
        return []
    t = events["event_ms"].to_numpy(dtype="int64")
    order = np.argsort(t, kind="stable")
    t = t[order]
    firsts = np.flatnonzero(np.r_[True, np.diff(t) > spec.gap_ms])
    lasts = np.r_[firsts[1:], len(t)] - 1
    counts = np.diff(np.r_[firsts, len(t)])
    # A null measure adds 0, as the per-event fold did (and SQL's sum).
    sums = {m: np.add.reduceat(np.where(events[m].isna(), 0, events[m]).astype("int64")[order], firsts)
            for m in spec.sums}
    latest = events[list(spec.latest)].iloc[order[lasts]].to_dict("records") if spec.latest else None
    return [{"id": None, "start": int(t[a]), "end": int(t[b]), "events": int(n),
             "sums": {m: int(sums[m][i]) for m in spec.sums},
             "latest": {c: _value(v) for c, v in latest[i].items()} if latest else {},
             "latest_at": int(t[b]), "new": True}
            for i, (a, b, n) in enumerate(zip(firsts, lasts, counts))]


def _row(key_value, s: dict, status: str, spec: SessionSpec) -> dict:
    return {spec.key: key_value, "session_id": s["id"], **s["latest"],
            "session_start": pd.Timestamp(s["start"], unit="ms"),
            "session_end": pd.Timestamp(s["end"], unit="ms"),
            "duration_seconds": (s["end"] - s["start"]) / _MS, "events": s["events"],
            **s["sums"], "status": status}


def _merged_notice(key_value, session_id: str, spec: SessionSpec) -> dict:
    """The row that tells gold to delete an absorbed session (only its keys matter)."""
    empty = {"id": session_id, "start": 0, "end": 0, "events": 0,
             "sums": {m: 0 for m in spec.sums}, "latest": {c: None for c in spec.latest}}
    return _row(key_value, empty, "merged", spec)


def _frame(rows: list[dict], spec: SessionSpec) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=spec.columns)


def fold_batch(key_value, sessions: list[dict], frames, spec: SessionSpec) -> tuple[list[dict], set[str]]:
    """One micro-batch of a key: fold its events in, then name the sessions born in it.
    A session is named once, after its batch (key + its start then), so its id depends on
    what arrived in which batch; the audit replays the batches to rebuild the same ids."""
    absorbed: set[str] = set()
    for pdf in frames:
        sessions, gone = merge_events(sessions, pdf, spec)
        absorbed |= gone
    for s in sessions:
        if s["id"] is None:
            s["id"] = f"{key_value}@{s['start']}"
    return sessions, absorbed


def is_closed(session: dict, gap_ms: int, watermark_ms: int) -> bool:
    """Closed once no on-time event can extend it: end + gap is at or behind the watermark."""
    return session["end"] + gap_ms <= watermark_ms


def closing(table: DataFrame, spec: SessionSpec, watermark_ms: int) -> DataFrame:
    """Open rows of a sessions table that the watermark has closed (is_closed), marked closed.
    A batch that only moves the watermark (its timeouts) writes nothing: the rows it closed in
    the state hold their final values already, and the next MERGE changes only their status."""
    return table.where(is_closing(spec, watermark_ms)).withColumn("status", F.lit("closed"))


def is_closing(spec: SessionSpec, watermark_ms: int):
    """An open session row the watermark closed (is_closed)."""
    return (F.col("status") == "open") & (F.col("session_end") <= F.timestamp_millis(F.lit(watermark_ms - spec.gap_ms)))


def make_session_updater(spec: SessionSpec):
    gap_ms = spec.gap_ms

    def update(key, batches: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        (key_value,) = key
        sessions = json.loads(state.get[0]) if state.exists else []
        watermark = state.getCurrentWatermarkMs()
        # A late event reaches the function without an event time (common/late.py keeps it, the
        # stateful branch shares the batch's one shuffle): it is no event of a session.
        frames = [] if state.hasTimedOut else [f for f in (b[b["event_ms"].notna()] for b in batches) if len(f)]
        if not (state.hasTimedOut or frames):
            return
        sessions, absorbed = fold_batch(key_value, sessions, frames, spec)
        closed = [s for s in sessions if is_closed(s, gap_ms, watermark)]
        still_open = [s for s in sessions if not is_closed(s, gap_ms, watermark)]
        rows = ([_row(key_value, s, "closed", spec) for s in closed]
                + [_row(key_value, s, "open", spec) for s in still_open]
                + [_merged_notice(key_value, i, spec) for i in sorted(absorbed)])
        if still_open:
            state.update((json.dumps(still_open),))
            # Fires once the watermark reaches the earliest possible close (end + gap <= watermark,
            # as above); Spark times a key out only when its timestamp is strictly behind it.
            state.setTimeoutTimestamp(min(s["end"] for s in still_open) + gap_ms - 1)
        elif state.exists:
            state.remove()
        if rows:
            yield _frame(rows, spec)

    return update


def session_columns(spec: SessionSpec) -> set[str]:
    return {spec.key, "event_time", "event_ms", *spec.sums, *spec.latest}


def session_inputs(events: DataFrame, spec: SessionSpec, *extra: str) -> DataFrame:
    # event_time stays in the input: the event-time timeout needs the watermarked column.
    return events.select(spec.key, "event_time", F.unix_millis("event_time").alias("event_ms"),
                         *(F.expr(e).cast("long").alias(m) for m, e in spec.measures),
                         *spec.latest, *extra)


def sessionize(events: DataFrame, spec: SessionSpec, *carried: str) -> DataFrame:
    """Streaming (or batch) sessions: one row per session touched, status open/closed/merged.
    `carried`: columns handed to the state function unused, so that the plan below it reads
    the same columns as another branch over the same events (Spark then shuffles them once)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    inputs = session_inputs(events, spec, *[c for c in carried if c not in session_columns(spec)])
    return inputs.groupBy(spec.key).applyInPandasWithState(
        make_session_updater(spec), spec.output_schema(events.schema), STATE_SCHEMA, "update",
        GroupStateTimeout.EventTimeTimeout)


def batch_sessions(events: DataFrame, spec: SessionSpec) -> DataFrame:
    """The same sessions in plain batch, with window functions: a new session starts where the
    gap to the previous event of the key exceeds the gap. Used by tests and audits."""
    from pyspark.sql import Window

    by_key = Window.partitionBy(spec.key).orderBy("event_time", "event_id")
    gap = F.unix_millis("event_time") - F.unix_millis(F.lag("event_time").over(by_key))
    starts = events.withColumn("new_session", F.coalesce(gap > spec.gap_ms, F.lit(True)))
    numbered = starts.withColumn("session_no", F.sum(F.col("new_session").cast("int")).over(
        by_key.rowsBetween(Window.unboundedPreceding, 0)))
    return (numbered.groupBy(spec.key, "session_no")
            .agg(F.min("event_time").alias("session_start"), F.max("event_time").alias("session_end"),
                 F.count(F.lit(1)).alias("events"),
                 *(F.sum(F.expr(e).cast("long")).alias(m) for m, e in spec.measures))
            .withColumn("duration_seconds",
                        (F.unix_millis("session_end") - F.unix_millis("session_start")) / _MS)
            .drop("session_no"))


def replay_sessions(events: DataFrame, arrival_col: str, spec: SessionSpec,
                    watermark_ms: int) -> DataFrame:
    """The sessions table a stream holds after the batch with `watermark_ms`, rebuilt in batch.

    `events` are the on-time events it consumed, `arrival_col` the micro-batch each arrived in.
    Per key the batches are folded in order with the stream's own fold_batch, so session ids
    match; statuses follow that batch's watermark, as its MERGE closes every session behind it.
    Sessions that closed earlier are kept in the fold: no later on-time event can reach them."""
    gap_ms = spec.gap_ms

    def replay(pdf: pd.DataFrame) -> pd.DataFrame:
        key_value = _value(pdf[spec.key].iloc[0])
        sessions: list[dict] = []
        for _, frame in pdf.sort_values(arrival_col, kind="stable").groupby(arrival_col, sort=True):
            sessions, _ = fold_batch(key_value, sessions, [frame], spec)
        return _frame([_row(key_value, s, "closed" if is_closed(s, gap_ms, watermark_ms) else "open", spec)
                       for s in sessions], spec)

    return (session_inputs(events, spec, arrival_col).groupBy(spec.key)
            .applyInPandas(replay, spec.output_schema(events.schema)))


def state_schema(spec: SessionSpec, events_schema) -> tuple[str, str]:
    """(key, value) of the state sessionize() keeps, as Spark's `statestore` data source reads
    it: a checkpoint holding another shape cannot be resumed by this query."""
    key_type = {f.name: f.dataType.simpleString() for f in events_schema.fields}[spec.key]
    return f"`{spec.key}` {key_type}", f"groupState STRUCT<{STATE_SCHEMA.replace(' ', ': ')}>, timeoutTimestamp BIGINT"


# The state a key holds (STATE_SCHEMA's one column): its open sessions, as update() writes them.
_STATE_SESSIONS = "array<struct<id:string, start:long, end:long, events:long>>"


def open_sessions(state: DataFrame, spec: SessionSpec) -> DataFrame:
    """The sessions held open in the state store, from its rows as Spark's `statestore` data
    source reads them (key: the session key; value: groupState, timeoutTimestamp): one row each,
    with the key, session_id, session_start, last_event and events so far."""
    sessions = F.explode(F.from_json(F.col("value.groupState.sessions"), _STATE_SESSIONS)).alias("s")
    return (state.select(F.col(f"key.`{spec.key}`").alias(spec.key), sessions)
            .select(spec.key, F.col("s.id").alias("session_id"),
                    F.timestamp_millis("s.start").alias("session_start"),
                    F.timestamp_millis("s.end").alias("last_event"), F.col("s.events").alias("events")))
