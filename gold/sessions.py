"""Per-device sessions with arbitrary stateful processing (applyInPandasWithState), the PySpark
counterpart of Scala's flatMapGroupsWithState, plus the same sessions computed in plain batch.

A session is a run of one device's events whose gaps are at most `gap`. It closes when the
watermark passes its last event + gap: any event that could still extend it would be late.
Events may arrive out of order, so one device can hold several open sessions at once, and an
event landing between two of them merges them. Each session keeps the id it was born with
(device + first start seen); when two merge, the survivor keeps the smaller id and the other
is emitted once with status 'merged' so the gold table deletes that row.
"""
from __future__ import annotations

import json
from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

OUTPUT_SCHEMA = ("device_id STRING, session_id STRING, zip_code STRING, unknown_device BOOLEAN, "
                 "session_start TIMESTAMP, session_end TIMESTAMP, duration_seconds DOUBLE, "
                 "events LONG, person_events LONG, motion_events LONG, status STRING")
STATE_SCHEMA = "sessions STRING"
COLUMNS = [c.split()[0] for c in OUTPUT_SCHEMA.split(", ")]

_MS = 1000


def merge_events(sessions: list[dict], events: pd.DataFrame, gap_ms: int) -> tuple[list[dict], set[str]]:
    """Fold events into sessions (each a dict with times in epoch ms); returns the merged sessions
    sorted by start, and the ids of sessions absorbed into another."""
    items = list(sessions)
    for row in events.itertuples(index=False):
        t = int(row.event_ms)
        items.append({"id": None, "start": t, "end": t, "events": 1,
                      "person": int(bool(row.has_person)), "motion": int(bool(row.has_motion)),
                      "zip": None if pd.isna(row.zip_code) else str(row.zip_code),
                      "unknown": bool(row.unknown_device), "zip_at": t})
    items.sort(key=lambda s: (s["start"], s["end"]))
    merged: list[dict] = []
    absorbed: set[str] = set()
    for s in items:
        cur = merged[-1] if merged else None
        if cur is not None and s["start"] - cur["end"] <= gap_ms:
            ids = [i for i in (cur["id"], s["id"]) if i is not None]
            keep = min(ids) if ids else None
            absorbed.update(i for i in ids if i != keep)
            if s["zip_at"] >= cur["zip_at"]:  # the latest event's location wins
                cur["zip"], cur["unknown"], cur["zip_at"] = s["zip"], s["unknown"], s["zip_at"]
            cur.update(id=keep, end=max(cur["end"], s["end"]), events=cur["events"] + s["events"],
                       person=cur["person"] + s["person"], motion=cur["motion"] + s["motion"])
        else:
            merged.append(dict(s))
    return merged, absorbed


def _row(device_id: str, s: dict, status: str) -> dict:
    return {"device_id": device_id, "session_id": s["id"], "zip_code": s["zip"],
            "unknown_device": s["unknown"],
            "session_start": pd.Timestamp(s["start"], unit="ms"),
            "session_end": pd.Timestamp(s["end"], unit="ms"),
            "duration_seconds": (s["end"] - s["start"]) / _MS, "events": s["events"],
            "person_events": s["person"], "motion_events": s["motion"], "status": status}


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def fold_batch(device_id: str, sessions: list[dict], frames, gap_ms: int) -> tuple[list[dict], set[str]]:
    """One micro-batch of a device: fold its events in, then name the sessions born in it.
    A session is named once, after its batch (device + its start then), so its id depends on
    what arrived in which batch; the audit replays the batches to rebuild the same ids."""
    absorbed: set[str] = set()
    for pdf in frames:
        sessions, gone = merge_events(sessions, pdf, gap_ms)
        absorbed |= gone
    for s in sessions:
        if s["id"] is None:
            s["id"] = f"{device_id}@{s['start']}"
    return sessions, absorbed


def is_closed(session: dict, gap_ms: int, watermark_ms: int) -> bool:
    """Closed once no on-time event can extend it: end + gap is at or behind the watermark."""
    return session["end"] + gap_ms <= watermark_ms


def make_session_updater(gap_seconds: float):
    gap_ms = int(gap_seconds * _MS)

    def update(key, batches: Iterator[pd.DataFrame], state) -> Iterator[pd.DataFrame]:
        (device_id,) = key
        sessions = json.loads(state.get[0]) if state.exists else []
        watermark = state.getCurrentWatermarkMs()
        frames = [] if state.hasTimedOut else batches
        sessions, absorbed = fold_batch(device_id, sessions, frames, gap_ms)
        closed = [s for s in sessions if is_closed(s, gap_ms, watermark)]
        still_open = [s for s in sessions if not is_closed(s, gap_ms, watermark)]
        rows = ([_row(device_id, s, "closed") for s in closed]
                + [_row(device_id, s, "open") for s in still_open]
                + [{**_row(device_id, {"id": i, "start": 0, "end": 0, "events": 0, "person": 0,
                                        "motion": 0, "zip": None, "unknown": False}, "merged")}
                   for i in sorted(absorbed)])
        if still_open:
            state.update((json.dumps(still_open),))
            # Fires once the watermark reaches the earliest possible close (end + gap <= watermark,
            # as above); Spark times a key out only when its timestamp is strictly behind it.
            state.setTimeoutTimestamp(min(s["end"] for s in still_open) + gap_ms - 1)
        elif state.exists:
            state.remove()
        if rows:
            yield _frame(rows)

    return update


def session_inputs(events: DataFrame, *extra: str) -> DataFrame:
    # event_time stays in the input: the event-time timeout needs the watermarked column.
    return events.select("device_id", "event_time", F.unix_millis("event_time").alias("event_ms"),
                         "has_person", "has_motion", "zip_code", "unknown_device", *extra)


def sessionize(events: DataFrame, gap_seconds: float) -> DataFrame:
    """Streaming (or batch) sessions: one row per session touched, status open/closed/merged."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    return session_inputs(events).groupBy("device_id").applyInPandasWithState(
        make_session_updater(gap_seconds), OUTPUT_SCHEMA, STATE_SCHEMA, "update",
        GroupStateTimeout.EventTimeTimeout)


def batch_sessions(events: DataFrame, gap_seconds: float) -> DataFrame:
    """The same sessions in plain batch, with window functions: a new session starts where the
    gap to the previous event of the device exceeds the gap. Used by tests and audits."""
    from pyspark.sql import Window

    by_device = Window.partitionBy("device_id").orderBy("event_time", "event_id")
    gap = F.unix_millis("event_time") - F.unix_millis(F.lag("event_time").over(by_device))
    starts = events.withColumn("new_session", F.coalesce(gap > int(gap_seconds * _MS), F.lit(True)))
    numbered = starts.withColumn("session_no", F.sum(F.col("new_session").cast("int")).over(
        by_device.rowsBetween(Window.unboundedPreceding, 0)))
    return (numbered.groupBy("device_id", "session_no")
            .agg(F.min("event_time").alias("session_start"), F.max("event_time").alias("session_end"),
                 F.count(F.lit(1)).alias("events"),
                 F.sum(F.col("has_person").cast("long")).alias("person_events"),
                 F.sum(F.col("has_motion").cast("long")).alias("motion_events"))
            .withColumn("duration_seconds",
                        (F.unix_millis("session_end") - F.unix_millis("session_start")) / _MS)
            .drop("session_no"))


def replay_sessions(events: DataFrame, arrival_col: str, gap_seconds: float,
                    watermark_ms: int) -> DataFrame:
    """The sessions table a stream holds after the batch with `watermark_ms`, rebuilt in batch.

    `events` are the on-time events it consumed, `arrival_col` the micro-batch each arrived in.
    Per device the batches are folded in order with the stream's own fold_batch, so session ids
    match; statuses follow the final watermark, as timeouts close every session behind it.
    Sessions that closed earlier are kept in the fold: no later on-time event can reach them."""
    gap_ms = int(gap_seconds * _MS)

    def replay(pdf: pd.DataFrame) -> pd.DataFrame:
        device_id = pdf["device_id"].iloc[0]
        sessions: list[dict] = []
        for _, frame in pdf.sort_values(arrival_col, kind="stable").groupby(arrival_col, sort=True):
            sessions, _ = fold_batch(device_id, sessions, [frame], gap_ms)
        return _frame([_row(device_id, s, "closed" if is_closed(s, gap_ms, watermark_ms) else "open")
                       for s in sessions])

    return session_inputs(events, arrival_col).groupBy("device_id").applyInPandas(replay, OUTPUT_SCHEMA)
