"""The profile's dimension as history (nest: silver.device_locations, device -> zip code per
validity interval), which silver joins at each event's time; loaded from locations files.

    lakehouse locations load [FILE] [--dry-run]     (python -m silver.locations load; make seed-locations)

A file holds one snapshot per as-of time (silver/locations_file.py); each is merged into the
table's intervals in as-of order, late ones included (silver/locations_history.py). The load is
one Delta commit, tagged with the file and its as-of times, or none when nothing changes.
docs/locations.md tells the whole story.
"""
from __future__ import annotations

import argparse
import logging
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from common.config import load_config
from common.catalog import register_table
from common.delta import ensure_table, retention_properties, table_version
from common.literal_frame import local_frame
from common.errors import JobError, command
from common.lineage import PIPELINE, to_user_metadata
from common.log import configure, fields
from common.storage import is_delta_table, location
from silver.locations_file import LocationsFileError, read_snapshots
from silver.locations_history import Change, Interval, change, merge_snapshot, overlaps

log = logging.getLogger(__spec__.name)   # not "__main__" under python -m silver.locations

# Each row's validity: [valid_from, valid_to); NULL valid_from: since always, NULL valid_to: still.
VALID_FROM, VALID_TO = "valid_from", "valid_to"
LOAD_LOCK = "locations_load"     # <checkpoint_root>/locations_load.lock while a load runs


def schema(dimension) -> str:
    """The history table's columns. No NOT NULL on the key: a table created by a write has
    nullable columns (Spark's rule); the load refuses a line without a key."""
    return ", ".join([*(f"{c} STRING" for c in (dimension.key, *dimension.columns)),
                      f"{VALID_FROM} TIMESTAMP", f"{VALID_TO} TIMESTAMP"])


def current(history):
    """The rows valid now, one per key: the dimension as a snapshot (the plain baseline's
    static join). Marks (silver/locations_history.py) have a valid_to: never current."""
    return history.where(f"{VALID_TO} IS NULL")


def _dimension(cfg):
    dim = cfg.profile.dimension
    if dim is None:
        raise JobError(f"profile {cfg.profile.name} declares no dimension table")
    return dim


def _read_file(cfg, path):
    dim = _dimension(cfg)
    if not path.is_file():
        # Only the default file is the generator's to write; a file named by the user is theirs.
        hint = " (run `make generate`, or set REFERENCE_DIR)" if path == cfg.locations_csv else ""
        raise JobError(f"{dim.table} file {path} not found{hint}")
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise LocationsFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return read_snapshots(text, str(path), dim.key, tuple(dim.columns))


def _read_history(spark, table: str, dim) -> tuple[list[Interval], frozenset[int]]:
    """The table's intervals, and the as-ofs its marks (rows without a key) say were applied. A
    snapshot table from before the history (no validity columns) reads as valid since always."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(table)
    when = [F.unix_micros(c) if c in df.columns else F.lit(None).cast("long") for c in (VALID_FROM, VALID_TO)]
    rows = df.select(dim.key, *dim.columns, *when).collect()
    intervals = [Interval(r[0], tuple(r[1:-2]), r[-2], r[-1]) for r in rows if r[0] is not None]
    return intervals, frozenset(r[-2] for r in rows if r[0] is None and r[-2] is not None)


def _iso(us: int | None) -> str | None:
    if us is None:
        return None
    t = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)     # exact, unlike a float
    return t.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Plan:
    """What loading a file does: the history before and after, and each snapshot's change."""
    path: object
    table: str
    fresh: bool
    before: list[Interval]
    after: list[Interval]
    marks: frozenset[int]
    applied: frozenset[int]
    changes: list[Change]
    as_of: list[str | None]

    @property
    def writes(self) -> bool:
        return set(self.after) != set(self.before) or self.applied != self.marks


def plan(spark, cfg, path=None) -> Plan:
    """The load of the locations file (default: the profile's under paths.reference), computed
    and not written. A bad file raises LocationsFileError naming its line."""
    dim = _dimension(cfg)
    path = path or cfg.locations_csv
    snapshots = _read_file(cfg, path)
    table = cfg.table_path("silver", dim.table)
    fresh = not is_delta_table(table)
    before, marks = ([], frozenset()) if fresh else _read_history(spark, table, dim)
    clash = overlaps(before)
    if clash:
        a, b = clash[0]
        raise JobError(f"silver.{dim.table} holds overlapping intervals for {dim.key} '{a.key}' "
                       f"({_iso(a.valid_from)} to {_iso(a.valid_to)} and {_iso(b.valid_from)} to "
                       f"{_iso(b.valid_to)}): edited by hand? Fix or restore it before loading")
    after, applied, changes = before, marks, []
    for snap in snapshots:
        changes.append(change(after, snap.as_of_us, snap.rows))
        after, applied = merge_snapshot(after, applied, snap.as_of_us, snap.rows)
    return Plan(path, table, fresh, before, after, marks, applied, changes,
                [_iso(s.as_of_us) for s in snapshots])


def load(spark, cfg, path=None) -> int | None:
    """Merge the locations file into the history table in one commit; returns the version
    written, or None when the file changes nothing. A bad file raises LocationsFileError naming
    its line, before anything is written."""
    return write(spark, cfg, plan(spark, cfg, path))


def write(spark, cfg, p: Plan) -> int | None:
    if not p.writes:
        return None
    if not p.fresh:
        migrate(spark, cfg)
    _write(spark, cfg, p.table, _dimension(cfg), p.after, p.applied, p.fresh,
           {"pipeline": PIPELINE, "made_by": f"locations load {p.path}", "as_of": p.as_of})
    return table_version(spark, p.table)


def _write(spark, cfg, table: str, dim, rows: list[Interval], applied: frozenset[int], fresh: bool,
           lineage: dict) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    micros = StructType([*(StructField(c, StringType()) for c in (dim.key, *dim.columns)),
                         StructField("f", LongType()), StructField("t", LongType())])
    marks = [(None, *(None for _ in dim.columns), t, t) for t in sorted(applied)]
    # A literal plan for a small file: createDataFrame's RDD of pickled rows starts Python
    # workers for them, on a fresh lakehouse's path to silver's first batch.
    data = (local_frame(spark, [(r.key, *r.values, r.valid_from, r.valid_to) for r in rows] + marks, micros)
            .select(dim.key, *dim.columns, F.timestamp_micros("f").alias(VALID_FROM),
                    F.timestamp_micros("t").alias(VALID_TO)))
    # The whole table in one overwrite: it is small, and every version is a complete history
    # that silver can pin. Tagged so history and audits tell a load from an edit made by hand.
    writer = data.coalesce(1).write.format("delta").mode("overwrite").option("userMetadata", to_user_metadata(lineage))
    if fresh:
        # A first load creates the table with its rows and properties in one commit (an empty
        # table first, then the rows, was two commits and two log replays on every fresh
        # lakehouse's path to silver's first batch).
        writer = writer.options(**retention_properties(cfg))
    writer.save(table)
    if fresh:
        register_table(spark, cfg, "silver", dim.table)


def is_history(spark, table: str) -> bool:
    return VALID_FROM in spark.read.format("delta").load(table).columns


def migrate(spark, cfg) -> None:
    """The table as conf wants it (retention properties). A table from before locations had a
    history (a snapshot: key and columns) gains the validity columns, NULL: each row valid since
    always and still, which is what it meant (ALTER TABLE ADD COLUMNS)."""
    from pyspark.sql.types import _parse_datatype_string

    dim = _dimension(cfg)
    table = cfg.table_path("silver", dim.table)
    was_history = is_history(spark, table)
    ensure_table(spark, cfg, "silver", dim.table, _parse_datatype_string(schema(dim)))
    if not was_history:
        log.warning(f"silver.{dim.table}: a snapshot table from before locations had a history; "
                    "its rows are now valid since always (load a dated file to record moves)",
                    extra=fields(event="dimension_migrated", table=f"silver.{dim.table}"))


def ensure_seeded(spark, cfg) -> str:
    """On first run, load the generator's reference data; later runs keep the table's rows as
    they are, and an old snapshot table is migrated to a history on first use."""
    table = cfg.table_path("silver", cfg.profile.dimension.table)
    if is_delta_table(table):
        if not is_history(spark, table):
            migrate(spark, cfg)
    else:
        load(spark, cfg)
    return table


def _some(keys: list[str], shown: int = 3) -> str:
    more = len(keys) - shown
    return ", ".join(keys[:shown]) + (f" and {more} more" if more > 0 else "")


def report(p: Plan, dim, name: str) -> None:
    """Each snapshot's change, and a warning for the devices a snapshot end-dates: a file of
    moves that lists only the devices that move leaves every other one without a location."""
    for c, as_of in zip(p.changes, p.as_of):
        when = f"as of {as_of}" if as_of else "undated (since always)"
        parts = [f"{len(keys)} {what}" + (f" ({_some(keys)})" if keys else "")
                 for what, keys in (("moved", c.moved), ("new", c.added), ("end-dated", c.end_dated))]
        log.info(f"{name} {when}: " + ", ".join(parts),
                 extra=fields(event="locations_snapshot", table=name, as_of=as_of, moved=len(c.moved),
                              new=len(c.added), end_dated=len(c.end_dated)))
        if c.end_dated:
            log.warning(f"{name}: {len(c.end_dated)} {dim.key}s located {when} are not in that snapshot, "
                        f"so they have no location from then on (their events: unknown_device). "
                        f"Each as-of in a file is a full snapshot: list every {dim.key} that stays, "
                        f"with its location, beside those that move",
                        extra=fields(event="locations_end_dated", table=name, as_of=as_of,
                                     end_dated=len(c.end_dated)))


def _run(path_arg: str | None, dry_run: bool = False) -> int:
    configure()
    cfg = load_config()
    path = location(path_arg) if path_arg else None
    dim = _dimension(cfg)
    _read_file(cfg, path or cfg.locations_csv)     # a bad file fails before a JVM starts
    from common.checkpoint_lock import CheckpointBusy, CheckpointLocks
    from common.spark import session

    name = f"silver.{dim.table}"
    # Each load plans from the version it read and overwrites the table: two at once would both
    # read version N and the later one's commit would drop the other's snapshots. One at a time,
    # by a lock beside the checkpoints (a lease on object storage), taken before Spark starts.
    with ExitStack() as held:
        if not dry_run:
            try:
                held.enter_context(CheckpointLocks(cfg, [LOAD_LOCK]))
            except CheckpointBusy as e:
                raise JobError(f"another load of {name} is running ({e.holder}): wait for it to end, "
                               "then load again") from None
        with session(cfg, "locations-load") as spark:
            p = plan(spark, cfg, path)
            report(p, dim, name)
            version = None if dry_run else write(spark, cfg, p)
    now = sum(1 for r in p.after if r.valid_to is None)
    if dry_run:
        what = "dry run, nothing written: " + ("the load would write a new version" if p.writes
                                               else "the load would change nothing")
        log.info(f"{name}: {what}; {now} {dim.key}s would be located now",
                 extra=fields(event="locations_planned", table=name, writes=p.writes, current=now))
        return 0
    what = f"version {version}" if version is not None else "no change, no new version"
    log.info(f"{name}: {what}; {now} {dim.key}s located now",
             extra=fields(event="locations_loaded", table=name, version=version, current=now))
    return 0


@command
def main(argv=None, prog: str = "silver.locations") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{load}")
    load_cmd = commands.add_parser(
        "load", help="merge a locations file into the history table",
        description="Merge a locations file into the profile's dimension history, in as-of order. "
                    "Header: the key and the dimension's columns (nest: device_id,zip_code,city,state), "
                    "optionally as_of (ISO-8601, on every line; each as-of is a full snapshot: a device "
                    "it does not list is end-dated). Without as_of the file is undated: valid since "
                    "always. A bad file is refused whole, naming its line; a file that changes nothing "
                    "writes no version.")
    load_cmd.add_argument("file", nargs="?", help="the locations file (default: "
                                                  "$REFERENCE_DIR/<the profile's dimension csv>)")
    load_cmd.add_argument("--dry-run", action="store_true",
                          help="say what each snapshot moves, adds and end-dates; write nothing")
    args = parser.parse_args(argv)
    return _run(args.file, args.dry_run)


@command
def seed_main(argv=None, prog: str = "seed-locations") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Load the reference locations file into the "
                                     "dimension's history (the same as `lakehouse locations load`).")
    parser.add_argument("--csv", help="locations file with device_id,zip_code,city,state[,as_of] "
                                      "(default: $REFERENCE_DIR/device_locations.csv)")
    args = parser.parse_args(argv)
    return _run(args.csv)


if __name__ == "__main__":
    sys.exit(main())
