"""Config-driven sources: real public datasets and a profile written here run through the very
same bronze -> silver -> gold jobs, selected by PROFILE, with no code of their own.

The datasets are /work/shared/datasets beside the repository (SHARED_DATASETS overrides)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from common.config import ConfigError, load_config
from gold import sessions as S
from gold.tables import by_table

REPO = Path(__file__).resolve().parent.parent
DATASETS = Path(os.environ.get("SHARED_DATASETS") or REPO.parent / "shared" / "datasets")
EVENTS = DATASETS / "structured-streaming-events"
CLOUDTRAIL = DATASETS / "cloudtrail-flaws2"
MAKE = ["make", "--no-print-directory", "-s", "-o", ".venv/.installed", "-o", ".cache/jars/.fetched"]


def need(folder: Path) -> Path:
    if not folder.is_dir():
        pytest.fail(f"shared dataset {folder} not found: put the datasets beside the repository "
                    "(../shared/datasets) or set SHARED_DATASETS")
    return folder


def profile_env(root: Path, profile: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER", "PROFILE",
                        "PROFILES_DIR") and not k.startswith("LAKEHOUSE__")}
    return {**env, "LAKEHOUSE_ROOT": str(root), "TRIGGER": "available-now", "PROFILE": profile, **extra}


def run_pipeline(spark, cfg) -> None:
    """bronze -> silver -> gold in this process, each available-now, as `make run-all` chains them."""
    from pipeline.runner import start

    for name, options in (("bronze", {"source": "files"}), ("silver", {}), ("gold", {})):
        for query in start(spark, cfg, name, **options):
            query.awaitTermination()


def forget(spark, cfg) -> None:
    # Table names are per session; drop this profile's so later tests register their own roots.
    for layer, tables in cfg.tables.items():
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{table}")


def read(spark, cfg, layer: str, table: str):
    return spark.read.format("delta").load(cfg.table_path(layer, table))


def rows(df, *cols) -> list[tuple]:
    return sorted(tuple(r) for r in df.select(*cols).collect())


# --- events: Databricks' structured-streaming sample, all 100,000 events --------------------

def test_events_profile_defaults_read_one_file_per_trigger_and_drop_nothing():
    cfg = load_config(env=profile_env(Path("/tmp/unused"), "events"))
    assert cfg.bronze.max_files_per_trigger == 1          # as in the original notebook
    assert cfg.gold.watermark is None                     # nothing is ever late
    assert cfg.profile.dedup is None                      # identical (time, action) pairs are events
    # The profile's landing folder is the dataset beside the repository.
    assert cfg.landing == (REPO.parent / "shared" / "datasets" / "structured-streaming-events").resolve()
    assert cfg.tables["gold"] == ("action_hourly",)


@pytest.fixture(scope="module")
def events_lake(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("events") / "lakehouse"
    # 25 files per trigger instead of the profile's 1: two bronze batches rather than fifty
    # keep the test short; the profile default is checked above.
    cfg = load_config(env=profile_env(root, "events", LANDING=str(need(EVENTS)),
                                      LAKEHOUSE__BRONZE__MAX_FILES_PER_TRIGGER="25"))
    run_pipeline(spark, cfg)
    yield cfg
    forget(spark, cfg)


def test_events_gold_equals_a_batch_count_per_action_and_hour(spark, events_lake):
    cfg = events_lake
    gold = read(spark, cfg, "gold", "action_hourly")
    assert gold.columns[:4] == ["window_start", "window_end", "action", "count"]
    source = spark.read.schema("time LONG, action STRING").json(str(EVENTS))
    batch = (source.groupBy("action", F.window(F.col("time").cast("timestamp"), "1 hour").alias("w"))
             .count().select("action", F.col("w.start").alias("window_start"),
                             F.col("w.end").alias("window_end"), "count"))
    assert rows(gold, "action", "window_start", "window_end", "count") == \
        rows(batch, "action", "window_start", "window_end", "count")
    totals = {r.action: r.n for r in gold.groupBy("action").agg(F.sum("count").alias("n")).collect()}
    assert totals == {"Open": 50_000, "Close": 50_000}
    assert read(spark, cfg, "silver", "actions").count() == 100_000
    assert read(spark, cfg, "silver", "quarantine").count() == 0
    # Window bounds are UTC: the sample starts 2016-07-26 02:45 UTC.
    first = gold.agg(F.min("window_start")).first()[0]
    assert (first.year, first.month, first.day, first.hour) == (2016, 7, 26, 2)


def test_make_audit_passes_on_the_events_lakehouse(events_lake):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE__")
           and k not in ("PROFILE", "PROFILES_DIR", "LANDING")}
    env["LAKEHOUSE_ROOT"] = str(events_lake.root)
    proc = subprocess.run([*MAKE, "audit", "PROFILE=events", "JSON=1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and not report["failures"]
    names = {a["name"]: a for a in report["accounting"]}
    assert names["silver"]["status"] == "PASS" and names["gold.action_hourly"]["status"] == "PASS"
    prefix = next(t for t in report["tables"] if t["table"] == "gold.action_hourly")["prefix_summary"]
    assert prefix["PASS"] >= 2 and prefix["FAIL"] == 0


# --- cloudtrail: gzip, one {"Records": [...]} object per file -------------------------------

def test_cloudtrail_every_record_reaches_silver_and_gold_matches_a_batch_count(spark, tmp_path):
    cfg = load_config(env=profile_env(tmp_path / "lakehouse", "cloudtrail", LANDING=str(need(CLOUDTRAIL))))
    try:
        run_pipeline(spark, cfg)
        expected = [r for f in sorted(CLOUDTRAIL.glob("*.json.gz"))
                    for r in json.loads(gzip.decompress(f.read_bytes()))["Records"]]
        assert len(expected) == 37
        silver = read(spark, cfg, "silver", "cloudtrail")
        assert silver.count() == 37 and read(spark, cfg, "silver", "quarantine").count() == 0
        assert sorted(r.eventID for r in silver.select("eventID").collect()) == \
            sorted(r["eventID"] for r in expected)
        # userIdentity is flattened; silver is partitioned by event date.
        by_id = {r.eventID: r for r in silver.collect()}
        sample = expected[0]
        assert by_id[sample["eventID"]].userIdentity_type == sample["userIdentity"]["type"]
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{cfg.table_path('silver', 'cloudtrail')}`").first()
        assert detail.partitionColumns == ["event_date"]
        gold = read(spark, cfg, "gold", "api_calls_hourly")
        batch = (silver.groupBy("eventSource", "eventName", F.window("eventTime", "1 hour").alias("w"))
                 .agg(F.count(F.lit(1)).alias("calls"), F.count("errorCode").alias("errors"))
                 .select("eventSource", "eventName", F.col("w.start").alias("window_start"), "calls", "errors"))
        cols = ("eventSource", "eventName", "window_start", "calls", "errors")
        assert rows(gold, *cols) == rows(batch, *cols)
        assert gold.agg(F.sum("calls")).first()[0] == 37
        assert gold.agg(F.sum("errors")).first()[0] == sum(1 for r in expected if "errorCode" in r)
    finally:
        forget(spark, cfg)


def test_a_cloudtrail_file_of_5000_records_is_linear_and_keeps_its_bytes_once(spark, tmp_path):
    """A real CloudTrail file carries thousands of records in one JSON object: every record is
    in silver or quarantined with its reason, and quarantine holds the file's bytes once, not
    once per rejected record."""
    from common.raw_bytes import as_binary

    sample = [r for f in sorted(need(CLOUDTRAIL).glob("*.json.gz"))
              for r in json.loads(gzip.decompress(f.read_bytes()))["Records"]]
    records, bad = [], set()
    for i in range(5000):
        r = dict(sample[i % len(sample)], eventID=f"synthetic-{i:05d}",
                 eventTime=f"2026-11-01T{i % 24:02d}:{i % 60:02d}:00Z")
        if i % 1000 == 999:
            r["eventTime"] = "not a time"
            bad.add(r["eventID"])
        records.append(r)
    landing = tmp_path / "landing"
    landing.mkdir()
    data = gzip.compress(json.dumps({"Records": records}).encode())
    (landing / "big.json.gz").write_bytes(data)
    cfg = load_config(env=profile_env(tmp_path / "lakehouse", "cloudtrail", LANDING=str(landing)))
    try:
        run_pipeline(spark, cfg)
        silver = read(spark, cfg, "silver", "cloudtrail")
        quarantine = read(spark, cfg, "silver", "quarantine").collect()
        assert silver.count() == 5000 - len(bad)
        assert sorted(r.eventID for r in quarantine) == sorted(bad)
        assert {tuple(r.reasons) for r in quarantine} == {("bad_timestamp:eventTime",)}
        held = [r for r in read(spark, cfg, "silver", "quarantine").select(as_binary().alias("b")).collect()
                if r.b is not None]
        bronze = read(spark, cfg, "bronze", "events").select(as_binary().alias("b")).collect()
        assert len(bronze) == 1 and [bytes(r.b) for r in held] == [bytes(bronze[0].b)]
        assert gzip.decompress(data) == bytes(bronze[0].b)
    finally:
        forget(spark, cfg)


# --- a profile written here, for a feed invented here ---------------------------------------

SENSOR_PROFILE = """
description: invented sensor feed, to show a new source needs a profile and no code
source: {record: line}
parse:
  explode: payload.readings
  fields:
    - {name: sensor, type: string, required: true}
    - {name: at, type: timestamp, format: epoch_millis, required: true}
    - {name: celsius, type: double, required: true}
    - {name: site, path: where.site}
  derived:
    fahrenheit: celsius * 9 / 5 + 32
  event_time: at
  dedup: [sensor, at]
silver_table: readings
aggregations:
  - table: site_temperature
    group: [site]
    window: 10 minutes
    slide: 5 minutes
    measures:
      readings: count(1)
      max_fahrenheit: max(fahrenheit)
sessions:
  table: sensor_sessions
  key: sensor
  gap: 5 minutes
  latest: [site]
  measures:
    hot_readings: CAST(celsius > 22 AS LONG)
silver: {expectations: %(silver_suite)s}
gold: {expectations: %(gold_suite)s, watermark: 1 hour}
"""
SENSOR_SUITE = """
suite: readings
table: silver.readings
row_id: event_id
expectations:
  - name: plausible_temperature
    expectation: expect_column_values_to_be_between
    kwargs: {column: celsius, min_value: -60, max_value: 60}
    policy: quarantine
"""
GOLD_SUITE = """
suite: sensors_gold
tables:
  gold.site_temperature:
    - name: readings_positive
      expectation: expect_column_values_to_be_between
      kwargs: {column: readings, min_value: 1}
      policy: fail
"""
T0 = 1_767_225_600_000     # 2026-01-01T00:00:00Z in epoch ms


def _reading(sensor, minute, celsius, site="north"):
    return {"sensor": sensor, "at": T0 + minute * 60_000, "celsius": celsius, "where": {"site": site}}


def test_a_profile_written_in_a_test_folder_runs_with_no_code_change(spark, tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "suite.yaml").write_text(SENSOR_SUITE)
    (profiles / "gold_suite.yaml").write_text(GOLD_SUITE)
    (profiles / "sensors.yaml").write_text(SENSOR_PROFILE % {
        "silver_suite": profiles / "suite.yaml", "gold_suite": profiles / "gold_suite.yaml"})
    landing = tmp_path / "landing"
    landing.mkdir()
    records = [
        {"payload": {"readings": [_reading("a", 1, 20.0), _reading("b", 2, 30.0, "south")]}},
        {"payload": {"readings": [_reading("a", 1, 20.0)]}},                 # re-sent: dropped
        {"payload": {"readings": [_reading("a", 7, 25.0), _reading("c", 8, 99.0)]}},  # 99: quarantined
        {"payload": {"readings": [{"sensor": "d", "at": "yesterday", "celsius": 1}]}},  # bad time
        {"payload": {}},                                                     # nothing to explode
        "not json",
    ]
    (landing / "part-0.json").write_text("\n".join(r if isinstance(r, str) else json.dumps(r)
                                                   for r in records))
    cfg = load_config(env=profile_env(tmp_path / "lakehouse", "sensors", PROFILES_DIR=str(profiles),
                                      LANDING=str(landing)))
    try:
        run_pipeline(spark, cfg)
        silver = read(spark, cfg, "silver", "readings")
        assert rows(silver, "sensor", "celsius", "fahrenheit", "site") == [
            ("a", 20.0, 68.0, "north"), ("a", 25.0, 77.0, "north"), ("b", 30.0, 86.0, "south")]
        reasons = sorted(tuple(r.reasons) for r in read(spark, cfg, "silver", "quarantine").collect())
        assert reasons == [("bad_timestamp:at",), ("dq:plausible_temperature",), ("malformed_json",),
                           ("missing_readings",)]
        dups = read(spark, cfg, "ops", "batch_accounting").where("layer = 'silver'") \
            .agg(F.sum("duplicates_dropped")).first()[0]
        assert dups == 1
        gold = read(spark, cfg, "gold", "site_temperature").where("site = 'north'")
        # 10-minute windows sliding by 5: minute 1 is in [-5, 5) and [0, 10), minute 7 in [0, 10) and [5, 15).
        got = {(r.window_start.minute if r.window_start.hour == 0 else r.window_start.minute - 60,
                r.readings, r.max_fahrenheit) for r in gold.collect()}
        assert got == {(-5, 1, 68.0), (0, 2, 77.0), (5, 1, 77.0)}
        # Sessions keyed by sensor, 5-minute gap: a's readings at minutes 1 and 7 are two sessions.
        sessions = read(spark, cfg, "gold", "sensor_sessions")
        assert rows(sessions, "sensor", F.minute("session_start"), F.minute("session_end"), "site",
                    "events", "hot_readings", "status") == [
            ("a", 1, 1, "north", 1, 0, "open"), ("a", 7, 7, "north", 1, 1, "open"),
            ("b", 2, 2, "south", 1, 1, "open")]
        spec = by_table(cfg)["sensor_sessions"].spec
        cols = ("sensor", "session_start", "session_end", "events", "hot_readings")
        assert rows(sessions, *cols) == rows(S.batch_sessions(silver, spec), *cols)
    finally:
        forget(spark, cfg)


# --- validation ------------------------------------------------------------------------------

GOOD = {
    "source": {"record": "line"},
    "parse": {"fields": [{"name": "t", "type": "timestamp", "required": True}], "event_time": "t"},
    "silver_table": "things",
    "aggregations": [{"table": "per_hour", "window": "1 hour", "measures": {"n": "count(1)"}}],
}


def _bad(tmp_path, mutate) -> str:
    import copy

    import yaml

    doc = copy.deepcopy(GOOD)
    mutate(doc)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load_config(env={"PROFILE": "p", "PROFILES_DIR": str(tmp_path)})
    assert str(tmp_path / "p.yaml") in str(err.value) or "not found" in str(err.value)
    return str(err.value)


def test_a_valid_minimal_profile_loads(tmp_path):
    import yaml

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(GOOD))
    cfg = load_config(env={"PROFILE": "p", "PROFILES_DIR": str(tmp_path)})
    assert cfg.tables["silver"] == ("things", "quarantine", "late_events") and cfg.tables["gold"] == ("per_hour",)


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["parse"].pop("event_time"), "key 'parse.event_time': missing"),
    (lambda d: d["parse"].update(event_time="nope"), "'nope' must be a declared field of type timestamp"),
    (lambda d: d["parse"]["fields"][0].update(type="date"),
     "key 'parse.fields[0].type': expected one of string, boolean"),
    (lambda d: d["parse"]["fields"][0].update(format="unix"), "key 'parse.fields[0].format'"),
    (lambda d: d["source"].update(compression="zip"), "key 'source.compression': expected one of none, gzip"),
    (lambda d: d["parse"].update(dedup=["id"]), "key 'parse.dedup': 'id' is not a declared field"),
    (lambda d: d["aggregations"][0].update(group=["site"]), "key 'aggregations[0].group'"),
    (lambda d: d["aggregations"][0].update(window="an hour"), "bad duration 'an hour'"),
    (lambda d: d["aggregations"][0].update(window="$gold.nope"), "'$gold.nope' does not name a duration"),
    (lambda d: d.update(colour="blue"), "unknown key 'colour'"),
    (lambda d: d["parse"]["fields"][0].update(sise=1), "key 'parse.fields[0].sise': unknown key"),
    (lambda d: d.update(bronze={"max_files_per_trigger": 0}), "value from profile"),
    (lambda d: d["parse"]["fields"].append({"name": "event_id"}), "a column silver adds itself"),
    (lambda d: d.update(sessions={"table": "s", "key": "t", "gap": "1 hour", "latest": ["nope"]}),
     "key 'sessions.latest': 'nope' is neither a field"),
    (lambda d: d.update(sessions={"table": "s", "key": "t", "gap": "1 hour", "measures": {"events": "1"}}),
     "measure 'events' clashes"),
])
def test_bad_profiles_fail_with_the_file_and_key_named(tmp_path, mutate, expected):
    assert expected in _bad(tmp_path, mutate)


def test_an_unknown_profile_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"profile 'nope' not found.*known: cloudtrail, events, nest"):
        load_config(env={"PROFILE": "nope"})
