"""How long the sessions in a batch of generated events last, without Spark.

The same rule as gold.device_sessions (gold/sessions.py): one device's events, ordered by
start time, belong to one session while each gap to the previous event is at most the gap;
a session lasts from its first event's start to its last event's start. Computed over every
event the generator emitted (late ones at their emitted time), so it describes the feed, not
what gold keeps after dropping events too late for its watermark.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping


def sessions(times_ms: Iterable[int], gap_ms: int) -> list[tuple[int, int]]:
    """(duration ms, events) of each session in one device's event start times."""
    out: list[tuple[int, int]] = []
    first = last = None
    count = 0
    for t in sorted(times_ms):
        if last is not None and t - last > gap_ms:
            out.append((last - first, count))
            first, count = t, 0
        if first is None:
            first = t
        last, count = t, count + 1
    if count:
        out.append((last - first, count))
    return out


def _rank(sorted_values: list, q: float):
    """Nearest-rank percentile: the smallest value with at least q of the values at or below it."""
    return sorted_values[max(0, math.ceil(len(sorted_values) * q) - 1)] if sorted_values else None


def summary(times_by_device: Mapping[str, Iterable[int]], gap_s: float) -> dict:
    """Session count, length percentiles in minutes and events per session, for the manifest."""
    all_sessions = [s for times in times_by_device.values() for s in sessions(times, int(gap_s * 1000))]
    minutes = sorted(d / 60_000 for d, _ in all_sessions)
    events = sorted(n for _, n in all_sessions)
    r = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return {"gap_minutes": r(gap_s / 60), "count": len(all_sessions),
            "minutes": {"p50": r(_rank(minutes, 0.5)), "p90": r(_rank(minutes, 0.9)),
                        "max": r(minutes[-1] if minutes else None)},
            "events": {"p50": _rank(events, 0.5), "max": events[-1] if events else None}}


def describe(s: dict) -> str:
    """One line for the generator's printed summary."""
    m, e = s["minutes"], s["events"]
    if not s["count"]:
        return "sessions: none"
    return (f"sessions (gap {s['gap_minutes']:g} min): {s['count']:,}, minutes p50 {m['p50']:g} "
            f"p90 {m['p90']:g} max {m['max']:g}, events per session p50 {e['p50']} max {e['max']}")
