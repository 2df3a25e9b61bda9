"""The locations dimension as history (SCD type 2): a snapshot merged into validity intervals.

A row is (key, values, valid_from, valid_to): the device was at `values` from valid_from
(inclusive; None: since always) to valid_to (exclusive; None: still). A device's intervals never
overlap, so a point-in-time lookup finds at most one row, and adjacent intervals with the same
values are one row, so a history holds a row per move, not per load.

Every full snapshot says where each device was from its as-of t until the next snapshot's as-of
n (None: still), and nothing about other times. Merging it replaces each device's history on
[t, n) with the snapshot's row (or with no row: a device it does not list is end-dated there, not
deleted), whether t is after every load so far or before some (a load that arrived late splits
the interval it falls in, and the later loads' rows still stand). The same as-of again replaces
that snapshot. So the history is the same whatever order the loads arrive in.

n needs every as-of applied so far, also those of loads that moved no device, which leave no
boundary in the intervals: the table keeps one mark per applied as-of (a row without a key,
valid_from = valid_to = the as-of, which no event matches). An undated snapshot (as-of None:
since always) is applied on (-infinity, the first as-of) and needs no mark.

Pure functions over plain tuples: the table is small (it is broadcast to every join), and the
load collects it, merges, and writes it back in one commit only when something changed.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple


class Interval(NamedTuple):
    key: str
    values: tuple
    valid_from: int | None     # epoch microseconds; None: since always
    valid_to: int | None       # epoch microseconds; None: still valid


def _starts(t: int | None) -> float:
    return float("-inf") if t is None else t


def _ends(t: int | None) -> float:
    return float("inf") if t is None else t


def merge_snapshot(history: Iterable[Interval], applied: frozenset[int], as_of: int | None,
                   rows: dict[str, tuple]) -> tuple[list[Interval], frozenset[int]]:
    """The history and applied as-ofs after the snapshot `rows` (key -> values) as of `as_of`
    (None: undated)."""
    t = _starts(as_of)
    later = [a for a in applied if a > t]
    until = min(later) if later else None
    n = _ends(until)
    by_key: dict[str, list[Interval]] = {}
    for r in history:
        by_key.setdefault(r.key, []).append(r)
    out: list[Interval] = []
    for key in sorted(by_key.keys() | rows.keys()):
        kept = []
        for r in by_key.get(key, ()):
            if _starts(r.valid_from) < t:                       # the part before the window
                kept.append(r._replace(valid_to=r.valid_to if _ends(r.valid_to) <= t else as_of))
            if _ends(r.valid_to) > n:                           # the part after it
                kept.append(r._replace(valid_from=r.valid_from if _starts(r.valid_from) >= n else until))
        if key in rows:
            kept.append(Interval(key, tuple(rows[key]), as_of, until))
        out.extend(coalesce(kept))
    return out, (applied | {as_of}) if as_of is not None else applied


class Change(NamedTuple):
    """What one snapshot does at its as-of, against the history before it: keys it moves (other
    values), keys it adds (not located then), keys it end-dates (located then, not listed)."""
    as_of: int | None
    moved: list[str]
    added: list[str]
    end_dated: list[str]


def change(history: Iterable[Interval], as_of: int | None, rows: dict[str, tuple]) -> Change:
    """The snapshot `rows` as of `as_of` compared with the row each key held at that instant
    (undated: since always); a load logs it, so a file of moves that forgot the devices that
    stay, and so end-dates them, says so before or as it is written."""
    t = _starts(as_of)
    then = {r.key: tuple(r.values) for r in history if _starts(r.valid_from) <= t < _ends(r.valid_to)}
    return Change(as_of,
                  sorted(k for k in rows.keys() & then.keys() if tuple(rows[k]) != then[k]),
                  sorted(rows.keys() - then.keys()),
                  sorted(then.keys() - rows.keys()))


def coalesce(intervals: list[Interval]) -> list[Interval]:
    """One device's intervals in time order, each pair that touches with equal values as one."""
    out: list[Interval] = []
    for r in sorted(intervals, key=lambda r: _starts(r.valid_from)):
        if out and out[-1].valid_to == r.valid_from and r.valid_from is not None and out[-1].values == r.values:
            out[-1] = out[-1]._replace(valid_to=r.valid_to)
        else:
            out.append(r)
    return out


def overlaps(history: Iterable[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of one device's intervals that overlap (a table edited by hand): a point-in-time
    join would give their events two rows."""
    by_key: dict[str, list[Interval]] = {}
    for r in history:
        by_key.setdefault(r.key, []).append(r)
    bad = []
    for rs in by_key.values():
        rs.sort(key=lambda r: _starts(r.valid_from))
        bad += [(a, b) for a, b in zip(rs, rs[1:]) if _ends(a.valid_to) > _starts(b.valid_from)]
    return bad
