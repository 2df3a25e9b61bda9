"""SQL over the lakehouse catalog (bronze.*, silver.*, gold.*, ops.*), Delta time travel included.

    python -m tools.sql "SELECT * FROM gold.zip_hourly_sightings ORDER BY sightings DESC"
    python -m tools.sql "SELECT count(*) FROM gold.device_sessions VERSION AS OF 3"
    python -m tools.sql -f conf/demo.sql
    python -m tools.sql            # interactive spark-sql shell with Delta and the tables

Queries run on the embedded engine (delta-rs + DuckDB, no JVM: an answer in well under a
second). A statement it cannot run (DDL/DML, DESCRIBE HISTORY, a function or syntax it lacks,
a table delta-rs cannot read) runs on Spark instead, with a one-line note on stderr saying why;
--no-fallback makes that an error. ENGINE=spark (or --engine spark) runs everything on Spark.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common.config import load_config
from common.errors import JobError, command
from tools.text_table import boxed

ENGINES = ("embedded", "spark")


class StatementError(JobError):
    """A statement that failed: Spark's first line of why, or why it was not run at all."""


def render(columns: list[str], rows: list[tuple], limit: int) -> str:
    """The table and its footer from up to limit + 1 rows (one more says there are more)."""
    more = len(rows) > limit
    out = boxed(columns, rows[:limit])
    return out + (f"\n(first {limit} rows shown; use --limit)" if more else f"\n({len(rows)} rows)")


def run_query(spark, query: str, limit: int) -> str:
    from pyspark.errors import AnalysisException, ParseException

    try:
        df = spark.sql(query)
        return render(df.columns, [tuple(r) for r in df.limit(limit + 1).collect()], limit)
    except (AnalysisException, ParseException) as e:
        raise StatementError(str(e).split("\n")[0]) from None
    except Exception as e:   # noqa: BLE001 - a failed job (bad data, a lost file): its first line, no traceback
        raise StatementError(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None


class Runner:
    """Runs statements on the chosen engine; Spark starts only for the first statement that
    needs it, and stays up for the rest."""

    def __init__(self, cfg, engine: str, fallback: bool = True, spark=None):
        """spark: a running session to use instead of starting one; close() leaves it running."""
        self.cfg, self.engine, self.fallback = cfg, engine, fallback
        self._embedded = None
        self.spark, self._own_spark = spark, spark is None

    def run(self, query: str, limit: int) -> str:
        if self.engine == "embedded":
            from tools.embedded_sql import EmbeddedEngine, Unsupported

            try:
                if self._embedded is None:
                    self._embedded = EmbeddedEngine(self.cfg)
                return render(*self._embedded.query(query, limit + 1), limit)
            except Unsupported as e:
                if not self.fallback:
                    raise StatementError(f"the embedded engine cannot run this statement: {e}; "
                                         f"run it with ENGINE=spark") from None
                print(f"sql: the embedded engine cannot run this statement ({e}); running it on Spark",
                      file=sys.stderr, flush=True)
        if self.spark is None:
            from common.spark import build_spark

            self.spark = build_spark(self.cfg, "sql")
        return run_query(self.spark, query, limit)

    def close(self) -> None:
        if self.spark is not None and self._own_spark:
            from common.spark import stop

            stop(self.spark)



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


@command
def main(argv=None, prog: str = "sql") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("query", nargs="?", help="SQL to run; omit for an interactive shell")
    parser.add_argument("-f", "--file", help="run the ';'-separated statements of a file, printing each")
    parser.add_argument("--limit", type=int, default=100, help="rows to print (default 100)")
    parser.add_argument("--engine", default=os.environ.get("ENGINE") or "embedded",
                        help="embedded (delta-rs + DuckDB, default) or spark; default from env ENGINE")
    parser.add_argument("--no-fallback", action="store_true",
                        help="fail on a statement the embedded engine cannot run instead of running it on Spark")
    args = parser.parse_args(argv)
    if args.engine not in ENGINES:
        raise JobError(f"unknown engine {args.engine!r} (--engine or ENGINE): use one of {', '.join(ENGINES)}")
    cfg = load_config()
    if not args.query and not args.file:
        return spark_sql_shell(cfg)
    queries = [args.query] if args.query else _statements(Path(args.file))
    runner = Runner(cfg, args.engine, fallback=not args.no_fallback)
    try:
        for q in queries:
            if args.file:
                print(f"\n{q}", flush=True)
            print(runner.run(q, args.limit), flush=True)
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
