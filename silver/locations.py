"""silver.device_locations: the static device -> zip code table silver joins against.

    python -m silver.locations [--csv PATH]    (make seed-locations)
"""
from __future__ import annotations

import argparse
import sys

from common.config import ConfigError, load_config
from common.delta import ensure_table
from common.lineage import PIPELINE, to_user_metadata
from common.streaming import JobError, fail, run_job

SCHEMA = "device_id STRING NOT NULL, zip_code STRING, city STRING, state STRING"


def read_csv(spark, path):
    # Zip codes stay strings: "02108" is Boston, not 2108.
    return spark.read.option("header", True).schema(SCHEMA.replace(" NOT NULL", "")).csv(str(path))


def seed(spark, cfg, csv_path=None) -> int:
    """Replace the table's contents with the CSV (a new Delta version; history keeps the old)."""
    from pyspark.sql.types import _parse_datatype_string

    path = csv_path or cfg.locations_csv
    if not path.is_file():
        raise JobError(f"device locations file {path} not found "
                                "(run `make generate`, or set REFERENCE_DIR)")
    table = ensure_table(spark, cfg, "silver", "device_locations", _parse_datatype_string(SCHEMA))
    rows = read_csv(spark, path).where("device_id IS NOT NULL").dropDuplicates(["device_id"])
    # Tagged so history and audits tell a reference load from an edit made by hand.
    (rows.write.format("delta").mode("overwrite")
     .option("userMetadata", to_user_metadata({"pipeline": PIPELINE, "made_by": f"seed-locations {path}"}))
     .save(table))
    return spark.read.format("delta").load(table).count()


def ensure_seeded(spark, cfg) -> str:
    """On first run, load the generator's reference data; later runs keep the table as it is."""
    from pathlib import Path

    table = cfg.table_path("silver", "device_locations")
    if not (Path(table) / "_delta_log").is_dir():
        seed(spark, cfg)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="silver.locations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", help="CSV with device_id,zip_code,city,state "
                                      "(default: $REFERENCE_DIR/device_locations.csv)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config()
    except ConfigError as e:
        return fail(str(e))
    from pathlib import Path

    def body(spark):
        n = seed(spark, cfg, Path(args.csv) if args.csv else None)
        print(f"silver.device_locations: {n} devices")

    return run_job(cfg, "seed-locations", body)


if __name__ == "__main__":
    sys.exit(main())
