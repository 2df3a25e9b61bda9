"""The locations history table (silver/locations.py): loads in as-of order as Delta commits, a
bad file changing nothing, an old snapshot table migrated, and the point-in-time join giving
every event exactly one row. The merge itself, without Spark: test_locations_history.py."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from common.config import load_config
from common.storage import is_delta_table
from silver import transform as T
from silver.locations import current, ensure_seeded, load, plan, report
from silver.locations_file import LocationsFileError

NEST = load_config(env={}).profile
REPO = Path(__file__).resolve().parent.parent
HEAD = "device_id,zip_code,city,state,as_of\n"


def csv(tmp_path, name: str, *lines: str, head: str = HEAD):
    path = tmp_path / name
    path.write_text(head + "".join(line + "\n" for line in lines))
    return path


def ts(hh_mm: str) -> datetime:
    return datetime.fromisoformat(f"2026-11-01T{hh_mm}:00+00:00")


def intervals(spark, cfg, version=None) -> list[tuple]:
    """(device, zip, from HH:MM, to HH:MM) of the table's intervals; marks left out."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    rows = (reader.load(cfg.table_path("silver", "device_locations")).where("device_id IS NOT NULL")
            .select("device_id", "zip_code", F.date_format("valid_from", "HH:mm").alias("f"),
                    F.date_format("valid_to", "HH:mm").alias("t")).collect())
    return sorted(tuple(r) for r in rows)


def versions(spark, cfg) -> list[int]:
    return [h.version for h in DeltaTable.forPath(spark, cfg.table_path("silver", "device_locations"))
            .history().collect()]


def test_loads_apply_in_as_of_order_end_date_missing_devices_and_write_only_changes(spark, cfg, tmp_path, logged):
    nine = csv(tmp_path, "nine.csv", "cam-1,11111,A,X,2026-11-01T09:00:00Z", "cam-2,22222,B,X,2026-11-01T09:00:00Z")
    assert load(spark, cfg, nine) == 0
    assert load(spark, cfg, nine) is None                        # the same file: no version
    # 12:00: cam-1 moves, cam-2 is missing (end-dated, not deleted), cam-3 appears.
    noon = csv(tmp_path, "noon.csv", "cam-1,33333,C,Y,2026-11-01T12:00:00Z", "cam-3,44444,D,Y,2026-11-01T12:00:00Z")
    # The dry run (`--dry-run`) says so, warns of the end-dated device, and writes nothing.
    planned = plan(spark, cfg, noon)
    report(planned, cfg.profile.dimension, "silver.device_locations")
    assert planned.writes and versions(spark, cfg) == [0]
    assert "silver.device_locations as of 2026-11-01T12:00:00Z: 1 moved (cam-1), 1 new (cam-3), " \
           "1 end-dated (cam-2)" in logged.messages
    assert any(r.levelname == "WARNING" and "1 device_ids located as of 2026-11-01T12:00:00Z are not in that "
               "snapshot" in r.getMessage() for r in logged.records)
    assert load(spark, cfg, noon) == 1
    assert intervals(spark, cfg) == [("cam-1", "11111", "09:00", "12:00"), ("cam-1", "33333", "12:00", None),
                                     ("cam-2", "22222", "09:00", "12:00"), ("cam-3", "44444", "12:00", None)]
    # A load as of 10:00 arrives late: it splits 09:00-12:00 and ends where the noon load begins.
    late = csv(tmp_path, "late.csv", "cam-1,55555,E,Z,2026-11-01T10:00:00Z", "cam-2,22222,B,X,2026-11-01T10:00:00Z")
    assert load(spark, cfg, late) == 2
    assert intervals(spark, cfg) == [("cam-1", "11111", "09:00", "10:00"), ("cam-1", "33333", "12:00", None),
                                     ("cam-1", "55555", "10:00", "12:00"), ("cam-2", "22222", "09:00", "12:00"),
                                     ("cam-3", "44444", "12:00", None)]
    assert intervals(spark, cfg, 1)[0] == ("cam-1", "11111", "09:00", "12:00")     # history keeps the past
    table = spark.read.format("delta").load(cfg.table_path("silver", "device_locations"))
    assert sorted(r.device_id for r in current(table).collect()) == ["cam-1", "cam-3"]
    commit = DeltaTable.forPath(spark, cfg.table_path("silver", "device_locations")).history(1).first()
    assert json.loads(commit.userMetadata)["made_by"] == f"locations load {late}"
    assert json.loads(commit.userMetadata)["as_of"] == ["2026-11-01T10:00:00Z"]
    # Each bad file names its line and changes nothing.
    bad = [(csv(tmp_path, "dup.csv", "cam-1,1,A,X,2026-11-01T13:00:00Z", "cam-1,2,A,X,2026-11-01T13:00:00Z"),
            "dup.csv line 3: device_id 'cam-1' twice as of 2026-11-01T13:00:00Z"),
           (csv(tmp_path, "col.csv", "cam-1,1,A,X,2026-11-01T13:00:00Z,3", head=HEAD.strip() + ",floor\n"),
            "col.csv line 1: unknown column 'floor'"),
           (csv(tmp_path, "when.csv", "cam-1,1,A,X,2026-11-01T13:00:00Z", "cam-2,1,A,X,13 o'clock"),
            "when.csv line 3: as_of '13 o'clock' is not an ISO-8601 time")]
    for path, message in bad:
        with pytest.raises(LocationsFileError, match=message):
            load(spark, cfg, path)
    assert versions(spark, cfg) == [2, 1, 0]


def test_an_old_snapshot_table_becomes_a_history_valid_since_always(spark, cfg, logged):
    """A lakehouse from before the history: its snapshot table is migrated on first use (the
    lakehouse's table properties, then the columns), each row valid since always, so the join
    keeps attributing events as before."""
    path = cfg.table_path("silver", "device_locations")
    spark.createDataFrame([("cam-1", "11111", "A", "X")], "device_id STRING, zip_code STRING, city STRING, "
                          "state STRING").write.format("delta").save(path)
    ensure_seeded(spark, cfg)
    migrated = versions(spark, cfg)
    ensure_seeded(spark, cfg)                                      # once
    assert versions(spark, cfg) == migrated and len(migrated) > 1
    assert intervals(spark, cfg) == [("cam-1", "11111", None, None)]
    assert any("snapshot table from before locations had a history" in m for m in logged.messages)


def test_a_load_onto_an_old_snapshot_table_plans_without_writing_then_migrates_and_merges(spark, cfg, tmp_path):
    """A dry run reads a table from before the history as valid since always and writes nothing;
    the load migrates it first, then merges the file into it."""
    path = cfg.table_path("silver", "device_locations")
    (spark.createDataFrame([("cam-1", "11111", "A", "X"), ("cam-2", "22222", "B", "X")],
                           "device_id STRING, zip_code STRING, city STRING, state STRING")
     .write.format("delta").save(path))
    moves = csv(tmp_path, "moves.csv", "cam-1,33333,C,Y,2026-11-01T12:00:00Z", "cam-2,22222,B,X,2026-11-01T12:00:00Z")
    planned = plan(spark, cfg, moves)
    assert planned.changes[0].moved == ["cam-1"] and planned.changes[0].end_dated == []
    assert versions(spark, cfg) == [0]
    assert load(spark, cfg, moves) is not None
    assert intervals(spark, cfg) == [("cam-1", "11111", None, "12:00"), ("cam-1", "33333", "12:00", None),
                                     ("cam-2", "22222", None, None)]


def test_a_second_load_while_one_runs_is_refused_before_spark_starts(env, cfg, tmp_path, lock_holder):
    """Two loads at once would both plan from version N, and the later overwrite would drop the
    other's snapshots: the second is refused, naming the first, and writes nothing."""
    import subprocess
    import sys

    from silver.locations import LOAD_LOCK

    moves = csv(tmp_path, "moves.csv", "cam-1,33333,C,Y,2026-11-01T12:00:00Z")
    with lock_holder(env, LOAD_LOCK) as first:
        done = subprocess.run([sys.executable, "-m", "silver.locations", "load", str(moves)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"another load of silver.device_locations is running (pid {first.pid} since" in done.stderr
    assert "SparkSession" not in done.stderr and not is_delta_table(cfg.table_path("silver", "device_locations"))


# Events at every kind of instant around cam-1's move at 12:00 and cam-2's end at 12:00.
EVENTS = [("e1", "cam-1", "08:59"), ("e2", "cam-1", "09:00"), ("e3", "cam-1", "11:59"), ("e4", "cam-1", "12:00"),
          ("e5", "cam-1", "23:00"), ("e6", "cam-2", "11:59"), ("e7", "cam-2", "12:00"), ("e8", "cam-9", "10:00"),
          ("e9", "cam-3", "12:00")]


def test_the_point_in_time_join_gives_each_event_the_row_valid_at_its_time_and_only_one(spark, cfg, tmp_path):
    load(spark, cfg, csv(tmp_path, "a.csv", "cam-1,11111,A,X,2026-11-01T09:00:00Z", "cam-2,22222,B,X,2026-11-01T09:00:00Z",
                         "cam-1,33333,C,Y,2026-11-01T12:00:00Z", "cam-3,44444,D,Y,2026-11-01T12:00:00Z"))
    history = spark.read.format("delta").load(cfg.table_path("silver", "device_locations"))
    events = spark.createDataFrame([(e, d, ts(t)) for e, d, t in EVENTS], "event_id STRING, device_id STRING, "
                                   "event_time TIMESTAMP")
    joined = T.join_dimension(events, history, NEST)
    got = {r.event_id: (r.zip_code, r.unknown_device) for r in joined.collect()}
    assert joined.count() == len(EVENTS) == len(got)               # no fan-out, no drop
    assert got == {"e1": (None, True), "e2": ("11111", False), "e3": ("11111", False), "e4": ("33333", False),
                   "e5": ("33333", False), "e6": ("22222", False), "e7": (None, True), "e8": (None, True),
                   "e9": ("44444", False)}
    # Still a broadcast hash join on the key, the interval as its condition.
    plan = joined._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in plan and "valid_from" in plan, plan


def test_silver_reads_the_dimension_ahead_then_once_per_version_and_a_new_load_anew(spark, cfg, tmp_path):
    """silver.job.Dimension: warmed with the latest version during silver's set-up, it hands the
    batches that pin that version the same cached rows; a load's new version is read anew, and
    the old version's rows are let go."""
    from silver.job import Dimension

    load(spark, cfg, csv(tmp_path, "nine.csv", "cam-1,11111,A,X,2026-11-01T09:00:00Z"))
    dimension = Dimension(cfg.table_path("silver", "device_locations"))
    dimension.warm(spark)
    first = dimension.at(spark, 0)                  # waits for the warm, if it still runs
    assert first.is_cached and dimension.at(spark, 0) is first
    assert [(r.device_id, r.zip_code) for r in first.where("device_id IS NOT NULL").collect()] == [("cam-1", "11111")]
    load(spark, cfg, csv(tmp_path, "noon.csv", "cam-1,33333,C,Y,2026-11-01T12:00:00Z"))
    second = dimension.at(spark, 1)
    assert second is not first and second.is_cached and not first.is_cached
    assert sorted(r.zip_code for r in second.where("device_id IS NOT NULL").collect()) == ["11111", "33333"]
