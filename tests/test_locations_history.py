"""The locations history without Spark: a file's snapshots and their merge into validity
intervals in as-of order (silver/locations_file.py, silver/locations_history.py). The table,
its commits and the point-in-time join are in test_locations_load.py."""
from __future__ import annotations

import itertools

import pytest

from silver.locations_file import LocationsFileError, parse_as_of, read_snapshots
from silver.locations_history import Change, Interval, change, merge_snapshot

COLS = ("zip_code", "city", "state")
HOUR = 3_600_000_000
T = {h: parse_as_of(f"2026-11-01T{h:02d}:00:00Z") for h in range(24)}


def snap(**where) -> dict:
    return {k: (z, "C", "S") for k, z in where.items()}


def at(history, device, hour):
    """The zip of `device` at the start of `hour`, from the intervals (None: no location)."""
    t = T[hour]
    hits = [r for r in history if r.key == device
            and (r.valid_from is None or r.valid_from <= t) and (r.valid_to is None or t < r.valid_to)]
    assert len(hits) <= 1, hits
    return hits[0].values[0] if hits else None


def apply(*loads, marks=False):
    history, applied = [], frozenset()
    for hour, rows in loads:
        history, applied = merge_snapshot(history, applied, None if hour is None else T[hour], rows)
    return (history, applied) if marks else history


def test_in_order_loads_end_date_a_move_and_a_missing_device_and_keep_one_row_per_location():
    h = apply((1, snap(a="z1", b="z1")), (3, snap(a="z1", b="z1")), (5, snap(a="z2")))
    assert sorted(h) == [Interval("a", ("z1", "C", "S"), T[1], T[5]), Interval("a", ("z2", "C", "S"), T[5], None),
                         Interval("b", ("z1", "C", "S"), T[1], T[5])]      # b missing at 5: end-dated
    assert (at(h, "a", 0), at(h, "a", 4), at(h, "a", 5), at(h, "b", 6)) == (None, "z1", "z2", None)


# a moves and comes back, b stays put while a moves (loads that leave it where it was), c comes and goes.
LOADS = [(1, snap(a="z1", b="z1")), (3, snap(a="z3", b="z1", c="z3")), (5, snap(a="z1", b="z1", c="z3")),
         (7, snap(b="z1")), (9, snap(a="z9", b="z1", c="z9")), (11, snap(a="z9", b="z1", c="z9"))]


def test_loads_in_any_order_give_the_history_of_the_loads_in_as_of_order():
    """Every arrival order of the snapshots ends in the history that loading them in as-of order
    gives: a late load splits the interval it falls in, and ends where the next applied load
    begins, also one that moved nothing (its as-of is marked)."""
    expected, marks = apply(*LOADS, marks=True)
    assert marks == {T[h] for h, _ in LOADS}
    assert [at(expected, "a", h) for h in (0, 1, 2, 3, 4, 5, 8, 9, 12)] == \
        [None, "z1", "z1", "z3", "z3", "z1", None, "z9", "z9"]
    assert [r for r in expected if r.key == "b"] == [Interval("b", ("z1", "C", "S"), T[1], None)]
    for order in itertools.permutations(LOADS):
        assert sorted(apply(*order), key=str) == sorted(expected, key=str), [h for h, _ in order]


def test_a_late_load_holds_until_the_next_load_and_an_undated_file_since_always():
    h = apply((1, snap(a="z1")), (5, snap(a="z1")), (3, snap(a="z3")))
    assert [at(h, "a", x) for x in (2, 3, 4, 5)] == ["z1", "z3", "z3", "z1"]
    # An undated snapshot says where devices were before the first dated one (b is missing from it).
    h = apply((5, snap(a="z5")), (None, snap(a="z0", b="z0")))
    assert [at(h, "a", 0), at(h, "a", 5), at(h, "b", 4), at(h, "b", 5)] == ["z0", "z5", "z0", None]
    # A load at an as-of already applied replaces that snapshot; loading it again changes nothing.
    h = apply((1, snap(a="z1")), (3, snap(a="z3")), (3, snap(a="z1")))
    assert h == [Interval("a", ("z1", "C", "S"), T[1], None)]
    h, marks = apply((1, snap(a="z1")), (3, snap(a="z3")), marks=True)
    assert merge_snapshot(h, marks, T[3], snap(a="z3")) == (h, marks)


def test_the_file_carries_snapshots_by_as_of_and_names_the_line_of_each_problem():
    text = ("device_id,zip_code,city,state,as_of\n"
            "a,02108,Boston,MA,2026-11-01T05:00:00Z\n"
            "a,94105,,CA,2026-11-01T01:00:00\n"
            "b,\"1,2\",X,Y,2026-11-01T05:00:00+00:00\n")
    first, second = read_snapshots(text, "f.csv", "device_id", COLS)
    assert (first.as_of_us, first.rows) == (T[1], {"a": ("94105", None, "CA")})
    assert (second.as_of_us, second.rows) == (T[5], {"a": ("02108", "Boston", "MA"), "b": ("1,2", "X", "Y")})
    undated, = read_snapshots("state,city,zip_code,device_id\nMA,Boston,02108,a\n", "f.csv", "device_id", COLS)
    assert (undated.as_of_us, undated.rows) == (None, {"a": ("02108", "Boston", "MA")})

    head = "device_id,zip_code,city,state,as_of\n"
    bad = {
        head + "a,1,B,C,2026-11-01T05:00:00Z\nb,1,B,C,2026-11-01T05:00:00Z\na,2,B,C,2026-11-01T05:00:00Z\n":
            "f.csv line 4: device_id 'a' twice as of 2026-11-01T05:00:00Z (first on line 2)",
        "device_id,zip_code,city,state,floor\na,1,B,C,3\n": "f.csv line 1: unknown column 'floor'",
        head + "a,1,B,C,2026-11-01T05:00:00Z\nb,1,B,C,yesterday\n": "f.csv line 3: as_of 'yesterday' is not",
        head + "a,1,B,C,\n": "f.csv line 2: as_of '' is not",
        head + "a,1,B,C\n": "f.csv line 2: 4 fields, the header has 5",
        head + ",1,B,C,2026-11-01T05:00:00Z\n": "f.csv line 2: empty device_id",
        "device_id,zip_code,state\na,1,C\n": "f.csv line 1: missing column city",
        head: "f.csv line 1: no rows",
    }
    for text, message in bad.items():
        with pytest.raises(LocationsFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_snapshots(text, "f.csv", "device_id", COLS)


def test_a_snapshot_change_names_what_it_moves_adds_and_end_dates_at_its_as_of():
    """What a load reports (and warns of) before writing: measured against the row each device
    held at the snapshot's instant, late snapshots and undated files included."""
    h = apply((None, snap(a="z0")), (1, snap(a="z1", b="z1", c="z1")), (5, snap(a="z2", b="z1")))
    assert change(h, T[3], snap(a="z9", b="z1", d="z1")) == Change(T[3], ["a"], ["d"], ["c"])   # late, mid-interval
    assert change(h, T[6], snap(a="z2", b="z1")) == Change(T[6], [], [], [])                     # nothing to say
    assert change(h, T[6], snap(c="z1")) == Change(T[6], [], ["c"], ["a", "b"])                  # c ended at 5
    assert change(h, None, snap(b="z0")) == Change(None, [], ["b"], ["a"])                       # since always
    assert change([], T[1], snap(a="z1")) == Change(T[1], [], ["a"], [])                         # a first load
