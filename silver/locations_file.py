"""A locations file: CSV snapshots of the profile's dimension (nest: device -> zip code), each
as of a time, read and checked before anything is written.

Header: the dimension's key and columns (nest: device_id,zip_code,city,state) and optionally
`as_of`, an ISO-8601 time on every line (no zone: UTC). Every as-of time in a file is a full
snapshot: the devices its lines list, and no other, are where they say at that time. A file
without an `as_of` column is undated: where the devices have been since always (the files
written before locations had a history, and hand-made fixtures).

Every problem names the file and line, and the whole file is refused: a file that does not
check changes nothing.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import datetime, timezone

from common.errors import JobError

AS_OF = "as_of"


class LocationsFileError(JobError):
    """A locations file that cannot be loaded; the message names the file and line."""


@dataclass
class Snapshot:
    as_of_us: int | None                         # epoch microseconds; None: undated (since always)
    rows: dict[str, tuple] = field(default_factory=dict)     # key -> the dimension's columns
    lines: dict[str, int] = field(default_factory=dict)      # key -> its line in the file


def parse_as_of(text: str) -> int:
    """An ISO-8601 time (no zone: UTC) -> epoch microseconds. ValueError when it is none."""
    text = text.strip()
    if not text:
        raise ValueError("empty")
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def read_snapshots(text: str, name: str, key: str, columns: tuple[str, ...]) -> list[Snapshot]:
    """The file's snapshots in as-of order (an undated one first). Raises LocationsFileError
    naming the line: unknown, missing or repeated column, a line with too many or too few
    fields, an empty key, an as-of that is no time, a device twice at one as-of, no rows."""
    def fail(line: int, problem: str):
        raise LocationsFileError(f"{name} line {line}: {problem}")

    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if not header:
        fail(1, f"no header (expected {','.join((key, *columns))}[,{AS_OF}])")
    header = [h.strip() for h in header]
    known = (key, *columns, AS_OF)
    for h in header:
        if h not in known:
            fail(1, f"unknown column '{h}' (expected {', '.join(known)}; {AS_OF} optional)")
        if header.count(h) > 1:
            fail(1, f"column '{h}' appears twice")
    missing = [c for c in (key, *columns) if c not in header]
    if missing:
        fail(1, f"missing column{'s' * (len(missing) > 1)} {', '.join(missing)}")
    at = {h: i for i, h in enumerate(header)}
    dated = AS_OF in at
    snapshots: dict[int | None, Snapshot] = {}
    line = 1
    for values in reader:
        line = reader.line_num
        if not values:
            continue                                        # a blank line
        if len(values) != len(header):
            fail(line, f"{len(values)} fields, the header has {len(header)}")
        device = values[at[key]].strip()
        if not device:
            fail(line, f"empty {key}")
        as_of = None
        if dated:
            try:
                as_of = parse_as_of(values[at[AS_OF]])
            except ValueError:
                fail(line, f"{AS_OF} '{values[at[AS_OF]]}' is not an ISO-8601 time (e.g. 2026-11-01T12:00:00Z)")
        snap = snapshots.setdefault(as_of, Snapshot(as_of))
        if device in snap.rows:
            when = f"as of {values[at[AS_OF]].strip()}" if dated else "in an undated file"
            fail(line, f"{key} '{device}' twice {when} (first on line {snap.lines[device]})")
        # An empty cell is NULL, as Spark's CSV reader made it: a known device without a zip.
        snap.rows[device] = tuple(values[at[c]] or None for c in columns)
        snap.lines[device] = line
    if not snapshots:
        fail(line, "no rows: a snapshot lists at least one device")
    return sorted(snapshots.values(), key=lambda s: (s.as_of_us is not None, s.as_of_us or 0))
