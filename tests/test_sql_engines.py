"""tools.sql's two engines on one small lakehouse that the real pipeline built: the embedded
engine (delta-rs + DuckDB, no JVM) gives Spark SQL's answers, time travel included, and says
clearly what it will not run."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlglot
from sqlglot import exp

from common.catalog import register_tables
from common.config import load_config
from tools.embedded_sql import EmbeddedEngine, QueryError, Unsupported
from tools.sql import Runner, _statements, main, run_query

TABLES = load_config(env={}).tables    # the default (nest) profile's tables, by layer

REPO = Path(__file__).resolve().parent.parent
GOLD = "gold.zip_hourly_sightings"
START = datetime(2026, 11, 1, tzinfo=timezone.utc)


def forget_names(spark) -> None:
    for layer, tables in TABLES.items():
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{table}")


def lake_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER", "ENGINE")
           and not k.startswith("LAKEHOUSE__")}
    return {**env, "LAKEHOUSE_ROOT": str(root / "lakehouse"), "TRIGGER": "available-now", **extra}


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """Two rounds through generator + pipeline, the second six hours later in event time, so
    gold.zip_hourly_sightings gains rows: the version after round one is an older, smaller one."""
    from pipeline.cli import main as pipeline

    root = tmp_path_factory.mktemp("sql-engines")
    forget_names(spark)
    versions = []
    for seed, start in ((3, START), (5, START + timedelta(hours=6))):
        env = lake_env(root, LAKEHOUSE__GENERATOR__START=start.isoformat())
        gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "400", "--seed", str(seed),
                              "--files", "2"], cwd=REPO, env=env, capture_output=True, text=True)
        assert gen.returncode == 0, gen.stderr
        assert pipeline([], spark=spark, env=env) == 0
        cfg = load_config(env=env)
        versions.append(spark.sql(f"DESCRIBE HISTORY delta.`{cfg.table_path('gold', 'zip_hourly_sightings')}`")
                        .orderBy("version", ascending=False).first())
    register_tables(spark, cfg)
    yield SimpleNamespace(root=root, env=lake_env(root), cfg=cfg, round_one=versions[0])
    forget_names(spark)


def normal(v):
    """One value as both engines may type it: Decimal vs float, float noise, HUGEINT vs BIGINT."""
    if isinstance(v, (float, Decimal)):
        return round(float(v), 9)
    if isinstance(v, (list, tuple)):
        return tuple(normal(x) for x in v)
    return v


def spark_rows(spark, sql: str):
    df = spark.sql(sql)
    return df.columns, [tuple(normal(v) for v in r) for r in df.collect()]


def embedded_rows(engine: EmbeddedEngine, sql: str):
    columns, rows = engine.query(sql, 100_000)
    return columns, [tuple(normal(v) for v in r) for r in rows]


def total_order(sql: str) -> str:
    """The statement with every output column appended to its ORDER BY (if it has one): a LIMIT
    after ties would otherwise let two correct engines keep different rows."""
    tree = sqlglot.parse_one(sql, read="spark")
    order = tree.args.get("order")
    if order is None:
        return sql
    order.set("expressions", order.expressions + [exp.Ordered(this=exp.Literal.number(i + 1))
                                                  for i in range(len(tree.selects))])
    return tree.sql(dialect="spark")


DEMO = _statements(REPO / "conf" / "demo.sql")


@pytest.mark.parametrize("statement", DEMO, ids=[f"demo-{i + 1}" for i in range(len(DEMO))])
def test_every_demo_statement_gives_the_same_rows_on_both_engines(spark, lake, statement):
    engine = EmbeddedEngine(lake.cfg)
    as_is_s, as_is_e = spark_rows(spark, statement), embedded_rows(engine, statement)
    assert as_is_e[0] == as_is_s[0]                           # column names
    assert len(as_is_e[1]) == len(as_is_s[1]) > 0
    ordered = total_order(statement)
    cols_s, rows_s = spark_rows(spark, ordered)
    cols_e, rows_e = embedded_rows(engine, ordered)
    if "ORDER BY" in statement.upper():
        assert rows_e == rows_s
    else:
        assert Counter(rows_e) == Counter(rows_s)


def test_the_demos_accounting_has_a_statement_per_layer_without_null_figures(spark, lake):
    """Each layer's batches book other columns: summed under silver's, gold's gave a row of
    NULLs. Bronze's statement adds up: what it read is what it wrote, every row of bronze.events."""
    books = [s for s in DEMO if "ops.batch_accounting" in s]
    assert [tuple(f"'{layer}'" in s for layer in ("bronze", "silver", "gold")) for s in books] == [
        (True, False, False), (False, True, False), (False, False, True)]
    for statement in books:
        _, rows = spark_rows(spark, statement)
        assert rows and all(v is not None for row in rows for v in row), (statement, rows)
    (bronze,) = spark_rows(spark, books[0])[1]
    assert bronze[2] == bronze[3] == spark.read.format("delta").load(lake.cfg.table_path("bronze", "events")).count()


def test_time_travel_reads_the_older_version_like_spark(spark, lake):
    engine = EmbeddedEngine(lake.cfg)
    v = lake.round_one.version
    old = f"SELECT * FROM {GOLD} VERSION AS OF {v}"
    cols_s, rows_s = spark_rows(spark, old)
    cols_e, rows_e = embedded_rows(engine, old)
    assert cols_e == cols_s and Counter(rows_e) == Counter(rows_s)
    latest = embedded_rows(engine, f"SELECT count(*) FROM {GOLD}")[1][0][0]
    assert 0 < len(rows_e) < latest, "round two added hourly windows"

    # An aggregate, a self-join of two versions, and TIMESTAMP AS OF a second after round one's
    # last commit (round two's first one came tens of seconds later). Spark's session is UTC.
    committed = lake.round_one.timestamp.astimezone(timezone.utc) + timedelta(seconds=1)
    when = committed.strftime("%Y-%m-%d %H:%M:%S.%f")
    for sql in (f"SELECT count(*), sum(sightings), min(window_start) FROM {GOLD} VERSION AS OF {v}",
                f"SELECT count(*) FROM {GOLD} VERSION AS OF {v} AS o JOIN {GOLD} n "
                f"ON o.zip_code <=> n.zip_code AND o.window_start = n.window_start AND o.sightings <> n.sightings",
                f"SELECT count(*) AS n, sum(sightings) FROM {GOLD} TIMESTAMP AS OF '{when}'"):
        assert embedded_rows(engine, sql) == spark_rows(spark, sql), sql
    assert embedded_rows(engine, f"SELECT count(*) FROM {GOLD} TIMESTAMP AS OF '{when}'")[1] == [(len(rows_e),)]


def test_the_cli_prints_what_spark_prints_without_starting_a_jvm(spark, lake):
    sql = (f"SELECT zip_code, window_start, sightings, round(sightings / 7, 2) AS per_day FROM {GOLD} "
           f"VERSION AS OF {lake.round_one.version} ORDER BY window_start, zip_code, unknown_device LIMIT 8")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tools.sql", "--no-fallback", sql], cwd=REPO,
                          env=lake.env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == run_query(spark, sql, 100)
    assert "(8 rows)" in done.stdout
    assert elapsed < 30, f"{elapsed:.1f} s: did it start Spark?"


def test_an_unknown_table_is_an_error_naming_it(lake, monkeypatch, capsys):
    for var, value in lake.env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("ENGINE", raising=False)
    assert main(["SELECT * FROM gold.no_such_table"]) == 2
    err = capsys.readouterr().err
    assert "unknown table gold.no_such_table" in err and "gold.zip_hourly_sightings" in err
    assert "Traceback" not in err
    with pytest.raises(QueryError, match=r"gold.zip_hourly_sightings has no version 999: its latest is \d+"):
        EmbeddedEngine(lake.cfg).query(f"SELECT * FROM {GOLD} VERSION AS OF 999", 10)


def test_a_statement_that_is_not_a_query_runs_on_spark_and_says_so(spark, lake, capsys, monkeypatch):
    describe = f"DESCRIBE HISTORY {GOLD}"
    with pytest.raises(Unsupported, match="DESCRIBE is not a read-only query"):
        EmbeddedEngine(lake.cfg).query(describe, 10)

    runner = Runner(lake.cfg, "embedded", spark=spark)
    out = runner.run(describe, 100)
    err = capsys.readouterr().err
    assert "the embedded engine cannot run this statement (DESCRIBE is not a read-only query); running it on Spark" in err
    assert "| version" in out and "MERGE" in out
    # A Spark function DuckDB lacks falls back the same way.
    out = runner.run("SELECT java_method('java.lang.Math', 'abs', -3) AS a", 100)
    assert "running it on Spark" in capsys.readouterr().err and "| 3 " in out
    runner.close()
    assert spark.sql("SELECT 1").count() == 1, "the shared session was left running"

    # --no-fallback: an error that says how to run it, and no Spark.
    for var, value in lake.env.items():
        monkeypatch.setenv(var, value)
    assert main(["--no-fallback", f"DELETE FROM {GOLD} WHERE sightings < 0"]) == 2
    err = capsys.readouterr().err
    assert "DELETE is not a read-only query; run it with ENGINE=spark" in err
    assert main(["--engine", "duckdb", "SELECT 1"]) == 2
    assert "unknown engine 'duckdb'" in capsys.readouterr().err
