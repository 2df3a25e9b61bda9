"""SQL over the lakehouse catalog (bronze.*, silver.*, gold.*, ops.*), Delta time travel included.

    python -m common.sql "SELECT * FROM gold.zip_hourly_sightings ORDER BY sightings DESC"
    python -m common.sql            # interactive spark-sql shell with Delta and the tables
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common.config import ConfigError, load_config
from common.streaming import fail


def format_table(columns: list[str], rows: list[tuple], max_width: int = 60) -> str:
    def cell(v) -> str:
        s = "NULL" if v is None else str(v)
        return s if len(s) <= max_width else s[: max_width - 1] + "…"

    body = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    return "\n".join([line, fmt(columns), line, *map(fmt, body), line])


def run_query(spark, query: str, limit: int) -> str:
    df = spark.sql(query)
    rows = [tuple(r) for r in df.limit(limit + 1).collect()]
    more = len(rows) > limit
    out = format_table(df.columns, rows[:limit])
    return out + (f"\n(first {limit} rows shown; use --limit)" if more else f"\n({len(rows)} rows)")


def spark_sql_shell(cfg) -> int:
    """pyspark's own spark-sql CLI, configured like our sessions; its throwaway Derby metastore
    lives in a temp dir, and an init file registers every table found under the root."""
    import pyspark

    from common.catalog import ddl
    from common.spark import jvm_options, spark_conf

    spark_home = Path(pyspark.__file__).parent
    tmp = Path(tempfile.mkdtemp(prefix="lakehouse-sql-"))
    init = tmp / "init.sql"
    init.write_text("".join(f"{s};\n" for s in ddl(cfg)))
    conf = spark_conf(cfg)
    conf.update({
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={tmp / 'metastore_db'};create=true",
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={tmp} {jvm_options(cfg)}",
        "spark.sql.catalogImplementation": "hive",
    })
    cmd = [str(spark_home / "bin" / "spark-sql"), "--master", cfg.spark.master, "-i", str(init)]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    env = dict(os.environ, SPARK_HOME=str(spark_home), PYSPARK_PYTHON=sys.executable)
    return subprocess.call(cmd, env=env, cwd=tmp)


def _statements(path: Path) -> list[str]:
    text = "\n".join(l for l in path.read_text().splitlines() if not l.strip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def main(argv=None, prog: str = "sql") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("query", nargs="?", help="SQL to run; omit for an interactive shell")
    parser.add_argument("-f", "--file", help="run the ';'-separated statements of a file, printing each")
    parser.add_argument("--limit", type=int, default=100, help="rows to print (default 100)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config()
    except ConfigError as e:
        return fail(str(e))
    if not args.query and not args.file:
        return spark_sql_shell(cfg)
    queries = [args.query] if args.query else _statements(Path(args.file))
    from pyspark.errors import AnalysisException, ParseException

    from common.spark import build_spark

    spark = build_spark(cfg, "sql")
    try:
        for q in queries:
            if args.file:
                print(f"\n{q}")
            print(run_query(spark, q, args.limit))
    except (AnalysisException, ParseException) as e:
        return fail(str(e).split("\n")[0])
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
