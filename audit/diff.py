"""Rows added and removed between two versions of a lakehouse table, and the commits between.

    python -m audit.diff gold.zip_hourly_sightings 3 7
    python -m audit.diff silver.camera_events 12 10 --sample 5 --json

Rows are compared as multisets (exceptAll both ways): a row present twice in TO and once in
FROM counts as one added row. FROM may be later than TO; the report is still "what changes
going from FROM to TO", so the rows a rollback would bring back show as added.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date, datetime, timezone
from decimal import Decimal

from common.config import load_config
from common.errors import JobError, command, describe
from tools.text_table import boxed

from audit.tables import TableError, resolve
from common.spark import session as spark_session

DEFAULT_SAMPLE = 10
# History columns worth a glance in the text report; sizes and timings are left to --json.
_METRIC_WORDS = ("Rows", "Files")


class VersionError(JobError, ValueError):
    """A version that is not an integer or that the table does not have."""


def parse_version(text: str, what: str = "version") -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise VersionError(f"{what} must be an integer Delta version, got {text!r}") from None
    if v < 0:
        raise VersionError(f"{what} must be a version >= 0, got {v}")
    return v


def history(spark, path: str, after: int | None = None, upto: int | None = None) -> list[dict]:
    """Commits of the table, oldest first, optionally only versions in (after, upto]."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    df = DeltaTable.forPath(spark, path).history()
    if after is not None:
        df = df.where(F.col("version") > after)
    if upto is not None:
        df = df.where(F.col("version") <= upto)
    # Formatted in Spark (session time zone is UTC): collected timestamps would come back as
    # naive datetimes in the Python process's local zone.
    rows = (df.select("version",
                      F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("timestamp"),
                      "operation", "operationParameters", "operationMetrics", "userMetadata")
            .orderBy("version").collect())
    return [{"version": r.version, "timestamp": r.timestamp, "operation": r.operation,
             "parameters": dict(r.operationParameters or {}),
             "metrics": dict(r.operationMetrics or {}),
             "user_metadata": r.userMetadata} for r in rows]


def version_range(spark, path: str) -> tuple[int, int]:
    """(oldest, latest) version still in the Delta log."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    r = DeltaTable.forPath(spark, path).history().agg(F.min("version"), F.max("version")).first()
    return int(r[0]), int(r[1])


def check_version(name: str, version: int, versions: tuple[int, int]) -> None:
    lo, hi = versions
    if not lo <= version <= hi:
        raise VersionError(f"{name} has no version {version}; versions {lo}..{hi} exist")


def snapshot(spark, path: str, version: int):
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def _comparable(df):
    """Set operations reject map columns; sorted entries compare the same content."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    return df.select(*[F.array_sort(F.map_entries(F.col(f.name))).alias(f.name)
                       if isinstance(f.dataType, MapType) else F.col(f.name)
                       for f in df.schema.fields])


def _align(a, b):
    """Both snapshots with the union of their columns (a column the other lacks is NULL there),
    so a schema change between the versions still diffs row by row."""
    from pyspark.sql import functions as F

    a_types = {f.name: f.dataType for f in a.schema.fields}
    b_types = {f.name: f.dataType for f in b.schema.fields}
    columns = a.columns + [c for c in b.columns if c not in a_types]

    def widen(df, own):
        return df.select(*[F.col(c) if c in own else F.lit(None).cast(a_types.get(c) or b_types[c]).alias(c)
                           for c in columns])

    return widen(a, a_types), widen(b, b_types), columns


def _python_value(value, dtype):
    from pyspark.sql.types import TimestampType

    # PySpark hands back TIMESTAMP values as naive local-zone datetimes; make them UTC.
    if isinstance(dtype, TimestampType) and isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone(timezone.utc)
    return value


def _side(df, limit: int) -> dict:
    df = df.persist()
    try:
        count = df.count()
        types = {f.name: f.dataType for f in df.schema.fields}
        rows = df.limit(limit).collect() if limit > 0 and count else []
    finally:
        df.unpersist()
    sample = [{k: _python_value(v, types[k]) for k, v in r.asDict(recursive=True).items()}
              for r in sorted(rows, key=lambda r: [str(v) for v in r])]
    return {"count": count, "sample": sample}


def diff(spark, path: str, from_version: int, to_version: int, sample: int = DEFAULT_SAMPLE) -> dict:
    """Rows added and removed going from one version to the other (multiset semantics).

    Returns {"from", "to", "columns", "schema_change", "added": {"count", "sample"},
    "removed": {...}}; sample rows are dicts, at most `sample` per side."""
    a = snapshot(spark, path, from_version)
    b = snapshot(spark, path, to_version)
    schema_change = None
    if set(a.columns) != set(b.columns):
        schema_change = {"added_columns": [c for c in b.columns if c not in a.columns],
                         "removed_columns": [c for c in a.columns if c not in b.columns]}
    a, b, columns = _align(_comparable(a), _comparable(b))
    if from_version == to_version:
        empty = {"count": 0, "sample": []}
        return {"from": from_version, "to": to_version, "columns": columns, "schema_change": None,
                "added": empty, "removed": dict(empty)}
    return {"from": from_version, "to": to_version, "columns": columns, "schema_change": schema_change,
            "added": _side(b.exceptAll(a), sample), "removed": _side(a.exceptAll(b), sample)}


def report(spark, name: str, path: str, from_version: int, to_version: int,
           sample: int = DEFAULT_SAMPLE) -> dict:
    """diff() plus the table name and the commits between the two versions; checks versions."""
    versions = version_range(spark, path)
    check_version(name, from_version, versions)
    check_version(name, to_version, versions)
    result = diff(spark, path, from_version, to_version, sample)
    lo, hi = sorted((from_version, to_version))
    return {"table": name, **result, "operations": history(spark, path, after=lo, upto=hi)}


# --- rendering -------------------------------------------------------------------------------

def _json_default(v):
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    raise TypeError(f"not JSON serializable: {type(v).__name__}")


def to_json(rep: dict) -> str:
    keys = ("table", "from", "to", "added", "removed", "operations")
    return json.dumps({k: rep[k] for k in keys}, default=_json_default, ensure_ascii=False, indent=2)


def _cell(v):
    if isinstance(v, datetime) and v.tzinfo is not None:
        return v.astimezone(timezone.utc).replace(tzinfo=None)
    return v


def _metrics_summary(metrics: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(metrics.items())
                     if v not in ("0", 0) and any(w in k for w in _METRIC_WORDS))


def operations_table(ops: list[dict]) -> str:
    return boxed(["version", "timestamp", "operation", "metrics"],
                 [(o["version"], o["timestamp"], o["operation"], _metrics_summary(o["metrics"]))
                  for o in ops], max_width=100)


def to_text(rep: dict) -> str:
    f, t = rep["from"], rep["to"]
    lines = [f"{rep['table']}: version {f} -> {t}"]
    if rep.get("schema_change"):
        sc = rep["schema_change"]
        lines.append(f"schema changed: columns added {sc['added_columns'] or 'none'}, "
                     f"removed {sc['removed_columns'] or 'none'} (missing values shown as NULL)")
    lo, hi = sorted((f, t))
    if not rep["operations"]:
        lines.append("\nno commits between them")
    else:
        undo = " (TO is older: these are the commits being undone)" if f > t else ""
        lines.append(f"\ncommits {lo + 1}..{hi}{undo}:")
        lines.append(operations_table(rep["operations"]))
    for side in ("added", "removed"):
        part = rep[side]
        n, rows = part["count"], part["sample"]
        shown = f", first {len(rows)} shown" if len(rows) < n else ""
        lines.append(f"\n{side}: {n} row{'s' if n != 1 else ''}{shown}")
        if rows:
            lines.append(boxed(rep["columns"], [tuple(_cell(r.get(c)) for c in rep["columns"]) for r in rows]))
    return "\n".join(lines)


@command
def main(argv=None, *, spark=None, cfg=None, prog: str = "audit.diff") -> int:
    """Exit code: 0 done, 2 bad input. `spark`/`cfg` let tests reuse theirs (not stopped here)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", metavar="TABLE", help="lakehouse table, e.g. gold.zip_hourly_sightings")
    parser.add_argument("from_version", metavar="FROM", help="Delta version to compare from")
    parser.add_argument("to_version", metavar="TO", help="Delta version to compare to")
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                        help=f"rows to show of each side (default {DEFAULT_SAMPLE})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args(argv)
    # Every check that needs no Spark runs before Spark's ~15 s start-up.
    from_v = parse_version(args.from_version, "FROM")
    to_v = parse_version(args.to_version, "TO")
    if args.sample < 0:
        raise VersionError(f"--sample must be >= 0, got {args.sample}")
    cfg = cfg or load_config()
    path = resolve(cfg, args.table)
    from pyspark.errors import PySparkException

    with spark_session(cfg, "audit-diff", spark) as session:
        try:
            rep = report(session, args.table, path, from_v, to_v, args.sample)
        except PySparkException as e:
            raise TableError(f"{args.table}: {describe(e)}") from None
        print(to_json(rep) if args.json else to_text(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
