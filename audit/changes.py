"""A table's change data feed: the rows each commit inserted, updated and deleted.

    python -m audit.changes gold.device_sessions --from 3 [--to 7] [--limit 50] [--json]
    lakehouse changes gold.zip_hourly_sightings --from 0

Silver and gold tables record Delta's change data feed (conf silver.change_feed,
gold.change_feed): an append's rows are inserts, a MERGE's are update_preimage /
update_postimage pairs, inserts and deletes. Read here with delta-rs, no JVM. A consumer that
follows the feed as a stream is in docs/change-feed.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date, datetime

from common.config import load_config
from common.errors import JobError, command

from audit.diff import parse_version
from audit.tables import resolve

CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
KINDS = ("insert", "update_preimage", "update_postimage", "delete")


class ChangeFeedError(JobError):
    """The table has no change data feed over the versions asked for."""


def documented_consumer():
    """The `mirror` function of docs/change-feed.md, from its python block, as a user copies it
    (tests and `make demo-day2` run it as written)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "change-feed.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/change-feed.md", "exec"), scope)    # noqa: S102 - our own docs
    return scope["mirror"]


def mirror_differences(spark, cfg, workdir: str) -> dict[str, int]:
    """Each gold table rebuilt by the documented consumer from version 0 into `workdir`: the
    rows that differ from the table (0 each when the change feed holds every change)."""
    from gold.tables import by_table

    mirror, specs, out = documented_consumer(), by_table(cfg), {}
    for table in cfg.tables["gold"]:
        source = cfg.table_path("gold", table)
        mirror(spark, source, f"{workdir}/{table}", list(specs[table].keys), f"{workdir}/_checkpoints/{table}").awaitTermination()
        want = spark.read.format("delta").load(source)
        got = spark.read.format("delta").load(f"{workdir}/{table}").select(*want.columns)
        out[table] = got.exceptAll(want).count() + want.exceptAll(got).count()
    return out


def read_changes(cfg, name: str, start: int, end: int | None = None):
    """The feed of `name` over versions [start, end]: its column names and its rows (dicts),
    oldest commit first, each commit's changes in KINDS order."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    from tools.embedded_sql import storage_options, table_uri

    path = resolve(cfg, name)
    table = DeltaTable(table_uri(path), storage_options=storage_options(cfg))
    latest = table.version()
    if start > latest or (end is not None and end > latest):
        raise ChangeFeedError(f"{name} has versions 0 to {latest}; asked for {start} to {end if end is not None else 'latest'}")
    if end is not None and end < start:
        raise ChangeFeedError(f"--to {end} is before --from {start}")
    try:
        feed = pa.table(table.load_cdf(starting_version=start, ending_version=end))
    except DeltaError as e:
        raise ChangeFeedError(f"{name} has no change data feed from version {start} "
                              f"({str(e).strip().splitlines()[0]}); it records one from the version "
                              "that enabled it (delta.enableChangeDataFeed, conf <layer>.change_feed)") from None
    # The feed's commit times are UTC without a zone, the table's timestamps UTC with one: both
    # with it, so the two print alike (text and --json).
    at = feed.schema.get_field_index("_commit_timestamp")
    if at >= 0 and feed.schema.field(at).type.tz is None:
        stamps = feed.column(at)
        feed = feed.set_column(at, "_commit_timestamp", stamps.cast(pa.timestamp(stamps.type.unit, tz="UTC")))
    rows = feed.to_pylist()
    rows.sort(key=lambda r: (r["_commit_version"], KINDS.index(r["_change_type"])))
    return feed.column_names, rows


def _cell(v):
    return v.isoformat() if isinstance(v, (datetime, date)) else v


@command
def main(argv=None, prog: str = "python -m audit.changes") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", help="layer.table, e.g. gold.device_sessions")
    p.add_argument("--from", dest="start", required=True, help="first version (included)")
    p.add_argument("--to", dest="end", help="last version (included; default: the latest)")
    p.add_argument("--limit", type=int, default=100, help="rows to print (default 100; --json prints all)")
    p.add_argument("--json", action="store_true", help="one JSON object per change on stdout")
    args = p.parse_args(argv)
    start = parse_version(args.start, "--from")
    end = parse_version(args.end, "--to") if args.end is not None else None
    names, rows = read_changes(load_config(), args.table, start, end)
    if args.json:
        for r in rows:
            print(json.dumps({k: _cell(v) for k, v in r.items()}))
        return 0
    from tools.sql import render

    columns = [*CHANGE_COLUMNS, *[c for c in names if c not in CHANGE_COLUMNS]]
    counts = {k: sum(1 for r in rows if r["_change_type"] == k) for k in KINDS}
    print(render(columns, [tuple(r[c] for c in columns) for r in rows[:args.limit + 1]], args.limit))
    print(", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
