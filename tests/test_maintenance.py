"""Table maintenance: retention properties on every table, compaction and VACUUM beside a live
pipeline (no query fails), and an audit that reports versions older than its horizon as
vacuumed instead of failing on them."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from common.config import load_config
from common.catalog import existing_tables
from common.delta import align_properties, ensure_table, retention_properties, table_properties

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from test_run_all import Run  # noqa: E402


def test_every_table_carries_the_retention_of_conf_and_a_changed_conf_applies_at_the_next_start(spark, env, cfg):
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("n", LongType())])
    path = ensure_table(spark, cfg, "ops", "dq_results", schema)
    props = table_properties(spark, path)
    assert props["delta.autoOptimize.autoCompact"] == "true"
    assert props["delta.deletedFileRetentionDuration"] == "interval 604800 seconds"    # audit_horizon 7 days
    assert props["delta.logRetentionDuration"] == "interval 2592000 seconds"          # 30 days
    assert props["delta.checkpointInterval"] == "10"

    changed = load_config(env=dict(env, LAKEHOUSE__MAINTENANCE__AUDIT_HORIZON="2 days",
                                   LAKEHOUSE__MAINTENANCE__AUTO_COMPACT="false"))
    ensure_table(spark, changed, "ops", "dq_results", schema)
    props = table_properties(spark, path)
    assert props["delta.deletedFileRetentionDuration"] == "interval 172800 seconds"
    assert props["delta.autoOptimize.autoCompact"] == "false"


def test_auto_compaction_waits_for_auto_compact_min_files(spark, cfg):
    """Delta's default compacts every touched partition from its second file on: an OPTIMIZE and
    a second commit after a table's first write of every run. The session's settings make it
    wait for conf maintenance.auto_compact_min_files small files."""
    from pyspark.sql.types import LongType, StructField, StructType

    path = ensure_table(spark, cfg, "ops", "dq_results", StructType([StructField("n", LongType())]))
    key = "spark.databricks.delta.autoCompact.minNumFiles"
    before = spark.conf.get(key)
    spark.conf.set(key, "6")
    try:
        for i in range(4):      # two files each: 2, 4, 6 (compacted to 1), 3
            spark.range(i * 10, i * 10 + 10, numPartitions=2).toDF("n").write.format("delta").mode("append").save(path)
    finally:
        spark.conf.set(key, before)
    operations = list(reversed(_operations(spark, path)))
    assert operations.count("OPTIMIZE") == 1, operations
    assert operations.index("OPTIMIZE") == 4, operations       # after the third write (version 3)


def test_maintenance_compacts_only_a_table_with_enough_files_and_vacuums_lite(spark, env, cfg):
    from pipeline.maintenance import maintain_table
    from common.delta import live_files

    path = cfg.table_path("silver", "device_locations")
    for n in range(3):
        spark.range(n * 10, n * 10 + 10).coalesce(1).write.format("delta").mode("append").save(path)
    assert live_files(spark, path) == 3

    few = maintain_table(spark, cfg, "silver", "device_locations", path, vacuum=None)    # compact_min_files 10
    assert (few.files, few.compacted, few.vacuumed) == (3, 0, "")
    eager = load_config(env=dict(env, LAKEHOUSE__MAINTENANCE__COMPACT_MIN_FILES="3"))
    done = maintain_table(spark, eager, "silver", "device_locations", path, vacuum="lite")
    assert (done.compacted, done.into, done.vacuumed) == (3, 1, "lite")
    assert live_files(spark, path) == 1 and spark.read.format("delta").load(path).count() == 30
    # The horizon (7 days) keeps the three small files on disk: older versions stay readable.
    assert done.on_disk_after == 4
    assert spark.read.format("delta").option("versionAsOf", 2).load(path).count() == 30


def test_an_audit_horizon_longer_than_the_log_retention_is_refused(env):
    from common.config import ConfigError

    with pytest.raises(ConfigError, match="maintenance.log_retention"):
        load_config(env=dict(env, LAKEHOUSE__MAINTENANCE__AUDIT_HORIZON="40 days"))


def _generate(env, n: int, seed: int, files: int) -> None:
    gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", str(n), "--seed", str(seed),
                          "--files", str(files)], cwd=REPO, env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr


def _operations(spark, path: str) -> list[str]:
    return [r.operation for r in DeltaTable.forPath(spark, path).history().select("operation").collect()]


@pytest.mark.slow
def test_maintenance_beside_a_live_pipeline_fails_no_query_and_the_audit_knows_its_horizon(spark, env, cfg):
    from audit.__main__ import run_audit
    from pipeline.maintenance import maintain, tables_of

    env = dict(env, TRIGGER="processing-time", TRIGGER_INTERVAL="2 seconds",
               LAKEHOUSE__MAINTENANCE__INTERVAL="20 seconds",
               LAKEHOUSE__MAINTENANCE__AUTO_COMPACT_MIN_FILES="4", LAKEHOUSE__MAINTENANCE__COMPACT_MIN_FILES="2")
    cfg = load_config(env=env)
    _generate(env, 600, 4, 3)
    run = Run(env)
    try:
        run.wait_for(r"^gold\s+batch \d+  [1-9][\d,]* rows", 400)
        # Another process compacts and vacuums every table while the pipeline writes to them:
        # gold's MERGE and this OPTIMIZE may conflict; gold retries, maintenance skips a busy table.
        # VACUUM lists every file of a table (seconds each on 2 cores): the second round vacuums
        # only the tables the pipeline writes most.
        busy = {"bronze.events", "silver.camera_events", "gold.device_sessions"}
        for seed in (11, 12):
            _generate(env, 200, seed, 2)
            tables = tables_of(cfg) if seed == 11 else [t for t in tables_of(cfg) if f"{t[0]}.{t[1]}" in busy]
            results = maintain(spark, cfg, tables, vacuum="lite" if seed == 12 else None)
            assert {r.table for r in results} >= busy
        assert {r.vacuumed for r in results} == {"lite"}
        # ... and the pipeline's own maintenance round, in the application, ran too.
        run.wait_for(r"^maintenance: \d+ tables, compacted \d+ files", 120)
        run.wait_for(r"^gold\s+batch \d+  [1-9][\d,]* rows", 200)
        run.stop()
    finally:
        run.kill_if_running()
    assert "pipeline: every query stopped cleanly" in run.text()
    assert "warning: maintenance failed" not in run.text()
    compacted = [t for t in ("silver.camera_events", "gold.zip_hourly_sightings", "gold.device_activity",
                             "gold.device_sessions", "ops.batch_accounting")
                 if "OPTIMIZE" in _operations(spark, cfg.table_path(*t.split(".")))]
    assert compacted, "no table was compacted"

    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    statuses = {c["status"] for t in report["tables"] for c in t.get("prefix", [])}
    assert "VACUUMED" not in statuses and "PASS" in statuses

    # A horizon that ends inside the run: VACUUM deletes the files only older versions needed,
    # and the audit reports those versions as vacuumed, not provable, and still passes.
    gold = cfg.table_path("gold", "device_sessions")
    times = [r.timestamp for r in DeltaTable.forPath(spark, gold).history().orderBy("version").collect()]
    middle = times[len(times) // 2].timestamp()
    time.sleep(1)
    horizon = f"{int(time.time() - middle) + 1} seconds"
    short = load_config(env=dict(env, LAKEHOUSE__MAINTENANCE__AUDIT_HORIZON=horizon,
                                 LAKEHOUSE__MAINTENANCE__LOG_RETENTION="1 day"))
    # What a restart of the pipeline with this conf does first: align every table's retention.
    for layer, table, path in existing_tables(short):
        align_properties(spark, path, retention_properties(short))
    results = maintain(spark, short, [("gold", "device_sessions", gold)])
    assert sum(r.on_disk_before - r.on_disk_after for r in results) > 0, "VACUUM deleted nothing"
    assert results[0].vacuumed == "full"
    report = run_audit(spark, short)
    assert report["ok"], report["failures"]
    checks = [c for t in report["tables"] for c in t.get("prefix", [])]
    assert any(c["status"] == "VACUUMED" for c in checks)
    assert report["horizon"]["audit_horizon"] == horizon
