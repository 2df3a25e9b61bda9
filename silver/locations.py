"""The profile's dimension table (nest: silver.device_locations, device -> zip code) that silver
joins against, loaded from a CSV under paths.reference.

    python -m silver.locations [--csv PATH]    (make seed-locations)
"""
from __future__ import annotations

import argparse
import logging
import sys

from common.config import load_config
from common.catalog import register_table
from common.delta import ensure_table, retention_properties
from common.errors import JobError, command
from common.lineage import PIPELINE, to_user_metadata
from common.log import configure, fields
from common.storage import is_delta_table, location

log = logging.getLogger(__spec__.name)   # not "__main__" under python -m silver.locations


def schema(cfg) -> str:
    # No NOT NULL on the key: a table created by a write has nullable columns (Spark's rule), and
    # the load drops rows without a key, which no event could join anyway. (Tables created
    # before the one-commit load below keep the constraint they were created with.)
    dim = cfg.profile.dimension
    return ", ".join(f"{c} STRING" for c in (dim.key, *dim.columns))


def read_csv(spark, path, cfg):
    # Every column stays a string: zip "02108" is Boston, not 2108.
    return spark.read.option("header", True).schema(schema(cfg)).csv(str(path))


def seed(spark, cfg, csv_path=None) -> int:
    """Replace the table's contents with the CSV (a new Delta version; history keeps the old);
    returns the table's row count."""
    return spark.read.format("delta").load(_load(spark, cfg, csv_path)).count()


def _load(spark, cfg, csv_path=None) -> str:
    from pyspark.sql.types import _parse_datatype_string

    dim = cfg.profile.dimension
    if dim is None:
        raise JobError(f"profile {cfg.profile.name} declares no dimension table")
    path = csv_path or cfg.locations_csv
    if not path.is_file():
        raise JobError(f"{dim.table} file {path} not found "
                       "(run `make generate`, or set REFERENCE_DIR)")
    table = cfg.table_path("silver", dim.table)
    fresh = not is_delta_table(table)
    if not fresh:
        ensure_table(spark, cfg, "silver", dim.table, _parse_datatype_string(schema(cfg)))
    rows = read_csv(spark, path, cfg).where(f"{dim.key} IS NOT NULL").dropDuplicates([dim.key])
    # Tagged so history and audits tell a reference load from an edit made by hand.
    writer = (rows.write.format("delta").mode("overwrite")
              .option("userMetadata", to_user_metadata({"pipeline": PIPELINE, "made_by": f"seed-locations {path}"})))
    if fresh:
        # A first load creates the table with its rows and properties in one commit (an empty
        # table first, then the rows, was two commits and two log replays on every fresh
        # lakehouse's path to silver's first batch).
        writer = writer.options(**retention_properties(cfg))
    writer.save(table)
    if fresh:
        register_table(spark, cfg, "silver", dim.table)
    return table


def ensure_seeded(spark, cfg) -> str:
    """On first run, load the generator's reference data; later runs keep the table as it is."""
    table = cfg.table_path("silver", cfg.profile.dimension.table)
    if not is_delta_table(table):
        _load(spark, cfg)
    return table


@command
def main(argv=None, prog: str = "silver.locations") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", help="CSV with device_id,zip_code,city,state "
                                      "(default: $REFERENCE_DIR/device_locations.csv)")
    args = parser.parse_args(argv)
    configure()
    cfg = load_config()
    from common.spark import build_spark

    spark = build_spark(cfg, "seed-locations")
    try:
        n = seed(spark, cfg, location(args.csv) if args.csv else None)
    finally:
        spark.stop()
    log.info(f"silver.{cfg.profile.dimension.table}: {n} rows",
             extra=fields(event="seeded", table=f"silver.{cfg.profile.dimension.table}", rows=n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
