"""Gold: silver.camera_events -> hourly sightings, sliding device activity, device sessions.

Silver is written directly as a Delta table (the silver job is not run); gold runs as the real
streaming query of gold.job with its checkpoint, available-now, once per append. Each append
therefore becomes one micro-batch (plus the no-data batch Spark runs when the watermark moves),
and appending events older than earlier batches' maximum, but within the one-hour watermark,
feeds gold out of order. Every result is checked against a
plain batch computation over the silver table.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from common.config import load_config
from common.quality import load_suites
from common.lineage import batch_watermark_ms, parse, read_nothing
from common.errors import JobError
from common.spark import NO_DATA_BATCHES
from gold import sessions as S
from gold.job import GoldBatch
from gold.kinds import EVENT
from gold.tables import gold_tables
from pipeline.runner import start

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)
MIN = 60_000                       # one minute in ms
HOUR = 60 * MIN
GAP_MS = 30 * MIN                  # conf: gold.windows.session_gap
WATERMARK_MS = HOUR                # conf: gold.watermark
NEST = load_config(env={}).profile   # these tests are about the default (nest) feed
TABLES = gold_tables(load_config(env={}))
SPEC = {t.key: t for t in TABLES}
GOLD = "gold"                      # the one query that writes every gold table
ONLY = {"sessions": "gold_sessions", "sightings": "gold_sightings"}   # --only selections' queries
SESSION_COLS = ["device_id", "session_start", "session_end", "events", "person_events", "motion_events"]


def nest_sessions(gap_ms: int = GAP_MS) -> S.SessionSpec:
    """The nest profile's session declaration with the given gap."""
    return dataclasses.replace(SPEC["sessions"].spec, gap_seconds=gap_ms / 1000)


# --- helpers -------------------------------------------------------------------------------

def lakehouse_cfg(root: Path, **overrides: str):
    """A config for a lakehouse under root, like the `cfg` fixture, plus LAKEHOUSE__... overrides."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")
           and not k.startswith("LAKEHOUSE__")}
    env.update(LAKEHOUSE_ROOT=str(root / "lakehouse"), KAFKA_DATA_DIR=str(root / "kafka"), **overrides)
    return load_config(env=env)


def drop_names(spark) -> None:
    """Forget table names registered for a lakehouse root (names are per process)."""
    for layer, tables in load_config(env={}).tables.items():
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{table}")


_SCHEMA = {}


def silver_schema(spark):
    if "silver" not in _SCHEMA:
        from silver.job import output_schemas

        _SCHEMA["silver"], _ = output_schemas(spark, NEST)
    return _SCHEMA["silver"]


def ev(event_id: str, device_id: str, t_ms: int, *, person=False, motion=False, sound=False,
       zip_code: str | None = "94105", unknown=False) -> dict:
    """One silver event, times in ms since T0."""
    return dict(event_id=event_id, device_id=device_id, t=t_ms, person=person, motion=motion,
                sound=sound, zip_code=zip_code, unknown=unknown)


def silver_rows(spark, events: list[dict], batch_id: int = 0, frontier_ms: int | None = None) -> list[tuple]:
    schema = silver_schema(spark)
    frontier = T0 + timedelta(milliseconds=frontier_ms) if frontier_ms is not None else None
    rows = []
    for e in events:
        t = T0 + timedelta(milliseconds=e["t"])
        d = {f.name: None for f in schema.fields}
        d.update(event_id=e["event_id"], device_id=e["device_id"], name=f"cam {e['device_id']}",
                 is_online=True, has_sound=e["sound"], has_motion=e["motion"],
                 has_person=e["person"], start_time=t, end_time=t, duration_seconds=0.0,
                 event_time=t, event_date=t.date(), zip_code=e["zip_code"],
                 unknown_device=e["unknown"], bronze_source="file",
                 bronze_file_path="file:/landing/test.json", bronze_line_number=1,
                 bronze_ingest_time=t, silver_batch_id=batch_id, silver_frontier_time=frontier)
        rows.append(tuple(d[f.name] for f in schema.fields))
    return rows


def frontier_before(batches: list[list[dict]], i: int) -> int | None:
    """What silver stamps on batch i's rows: the latest event time of the batches before it."""
    return max(e["t"] for b in batches[:i] for e in b) if i else None


def append_silver(spark, cfg, events: list[dict], batch_id: int = 0, frontier_ms: int | None = None) -> None:
    """Append events to silver.camera_events as one Delta commit (one gold micro-batch), with
    silver's frontier (ms since T0) on every row."""
    (spark.createDataFrame(silver_rows(spark, events, batch_id, frontier_ms), silver_schema(spark))
     .write.format("delta").mode("append").partitionBy("event_date")
     .save(cfg.table_path("silver", "camera_events")))


def run_gold(spark, cfg, only=None, suites=None, no_data_batch=True) -> dict[str, list[dict]]:
    """Start gold (available-now) and wait for every query (each batch records its accounting).
    Returns, per query name, the progress of the micro-batches this run executed.

    After its data batch, an available-now run also runs a no-data batch once the watermark
    has moved (to finalize windows and time out sessions). That batch costs as much as a data
    batch here, so runs that only feed the next one can skip it (no_data_batch=False): the next
    data batch then runs with the same watermark and does the finalizing and timeouts itself,
    as under a continuous stream. Each query copies the session conf when it starts."""
    previous = spark.conf.get(NO_DATA_BATCHES)
    spark.conf.set(NO_DATA_BATCHES, str(no_data_batch).lower())
    try:
        queries = start(spark, cfg, "gold", only=only, suites=suites)
    finally:
        spark.conf.set(NO_DATA_BATCHES, previous)
    try:
        for query in queries:
            query.awaitTermination()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
    from common.accounting import executed_batches

    return {q.name: executed_batches(q) for q in queries}


def data_batch(progress: list[dict]) -> int:
    """The one batch of a run that read input (the others are no-data watermark batches)."""
    ids = [p["batchId"] for p in progress if p["numInputRows"] > 0]
    assert len(ids) == 1, f"expected one data batch, got {[(p['batchId'], p['numInputRows']) for p in progress]}"
    return ids[0]


def read(spark, cfg, layer: str, table: str):
    return spark.read.format("delta").load(cfg.table_path(layer, table))


def silver(spark, cfg):
    return read(spark, cfg, "silver", "camera_events")


def bag(df, cols) -> Counter:
    """Rows as a multiset, timestamps as epoch ms (no time-zone conversion on collect), arrays
    as tuples."""
    sel = [F.unix_millis(c).alias(c) if isinstance(df.schema[c].dataType, TimestampType) else F.col(c)
           for c in cols]
    return Counter(tuple(tuple(v) if isinstance(v, list) else v for v in r) for r in df.select(*sel).collect())


def assert_same_bag(actual: Counter, expected: Counter, what: str) -> None:
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, (f"{what}: {sum(missing.values())} expected rows missing "
                                       f"{sorted(missing)[:8]}, {sum(extra.values())} unexpected "
                                       f"{sorted(extra)[:8]}")


def assert_one_row_per_key(df, keys) -> None:
    dupes = df.groupBy(*keys).count().where("count > 1").limit(5).collect()
    assert not dupes, f"several rows for key {keys}: {dupes}"


def watermarks(cfg, query: str) -> dict[int, int]:
    """batch id -> the event-time watermark Spark used for it (from the offset log)."""
    checkpoint = cfg.checkpoint(query)
    return {int(f.name): batch_watermark_ms(checkpoint, int(f.name))
            for f in (Path(checkpoint) / "offsets").iterdir() if f.name.isdigit()}


def final_watermark(cfg, query: str) -> int:
    marks = watermarks(cfg, query)
    return marks[max(marks)]


def committed_batches(cfg, query: str, data_only: bool = False) -> list[int]:
    """Batch ids in the checkpoint's commit log (data_only: those that read rows, not the
    watermark-only no-data batches)."""
    commits = Path(cfg.checkpoint(query)) / "commits"
    done = sorted(int(f.name) for f in commits.iterdir() if f.name.isdigit()) if commits.is_dir() else []
    return [b for b in done if not read_nothing(cfg.checkpoint(query), b)] if data_only else done


def assert_booked(books: dict[int, int], cfg, query: str) -> None:
    """`books` (batch id -> rows written): one row for every batch that read rows, none for a
    no-data batch (it writes no row: it only flags closed what its watermark passed)."""
    data = committed_batches(cfg, query, data_only=True)
    assert set(data) == set(books), (query, sorted(books), data)


# Expected aggregates computed in plain Python over silver rows (independent of Spark windows).

def expected_sightings(rows) -> dict:
    out: dict = {}
    for r in rows:
        hour = T0_MS + r["t"] // HOUR * HOUR
        key = (hour, hour + HOUR, r["zip_code"], r["unknown"])
        s, n = out.get(key, (0, 0))
        out[key] = (s + int(bool(r["person"])), n + 1)
    return out


def expected_activity(rows, window=10 * MIN, slide=5 * MIN) -> dict:
    out: dict = {}
    for r in rows:
        t = T0_MS + r["t"]
        first = t // slide * slide
        for start in range(first, t - window, -slide):
            key = (start, start + window, r["device_id"])
            c = out.get(key, (0, 0, 0, 0))
            out[key] = (c[0] + 1, c[1] + int(bool(r["motion"])), c[2] + int(bool(r["sound"])),
                        c[3] + int(bool(r["person"])))
    return out


def silver_events(spark, cfg, exclude=()) -> list[dict]:
    """silver.camera_events read back, as ev() dicts."""
    df = silver(spark, cfg).select("event_id", "device_id", (F.unix_millis("event_time") - T0_MS).alias("t"),
                                   "has_person", "has_motion", "has_sound", "zip_code", "unknown_device")
    return [ev(r.event_id, r.device_id, r.t, person=r.has_person, motion=r.has_motion,
               sound=r.has_sound, zip_code=r.zip_code, unknown=r.unknown_device)
            for r in df.collect() if r.event_id not in set(exclude)]


def gold_sightings(spark, cfg) -> dict:
    df = read(spark, cfg, "gold", "zip_hourly_sightings")
    return {(s, e, z, u): (n, c) for (s, e, z, u, n, c) in
            bag(df, ["window_start", "window_end", "zip_code", "unknown_device", "sightings", "events"])}


def gold_activity(spark, cfg) -> dict:
    df = read(spark, cfg, "gold", "device_activity")
    return {(s, e, d): (n, m, so, p) for (s, e, d, n, m, so, p) in
            bag(df, ["window_start", "window_end", "device_id", "events", "motion_events",
                     "sound_events", "person_events"])}


def rel(d: dict) -> dict:
    """Window keys in minutes since T0, for readable assertion messages."""
    return {((k[0] - T0_MS) // MIN, (k[1] - T0_MS) // MIN, *k[2:]): v for k, v in d.items()}


def assert_dicts_equal(actual: dict, expected: dict, what: str) -> None:
    if actual != expected:
        a, e = rel(actual), rel(expected)
        diff = {k: (a.get(k), e.get(k)) for k in set(a) | set(e) if a.get(k) != e.get(k)}
        pytest.fail(f"{what}: {len(diff)} keys differ (key: (gold, expected)): {sorted(diff.items(), key=str)[:10]}")


# --- windowed aggregates, late events, finalized, dq results: one lakehouse, two appends -------

DEVICES = {"a1": ("94105", False), "a2": ("94105", False), "b1": ("10001", False),
           "b2": ("10001", False), "u1": (None, True)}
T_MAX1 = 200 * MIN                    # event-time maximum of the first batch
LATE = [ev("late-1", "a1", T_MAX1 - 3 * HOUR, person=True, zip_code="94105"),
        ev("late-2", "b1", T_MAX1 - 3 * HOUR + 5 * MIN, person=True, motion=True, sound=True,
           zip_code="10001")]


def windowed_batches(seed: int = 11) -> list[list[dict]]:
    rng = random.Random(seed)

    def rand_ev(prefix, device, lo_min, hi_min):
        zip_code, unknown = DEVICES[device]
        return ev(f"{prefix}-{uuid.UUID(int=rng.getrandbits(128))}", device,
                  rng.randrange(lo_min * MIN, hi_min * MIN, 1000),
                  person=rng.random() < 0.5, motion=rng.random() < 0.6, sound=rng.random() < 0.3,
                  zip_code=zip_code, unknown=unknown)

    first = [rand_ev("b1", d, 0, 195) for d in DEVICES for _ in range(10)]
    first.append(ev("b1-max", "a1", T_MAX1, person=True))
    # Second batch: out of order (older than the first batch's max, within the 1 hour watermark),
    # so windows of the first batch get updated, newer events, and two events 3 hours late.
    second = ([rand_ev("b2-old", d, 145, 200) for d in DEVICES for _ in range(4)]
              + [rand_ev("b2-new", d, 200, 290) for d in DEVICES for _ in range(5)]
              + LATE)
    rng.shuffle(second)
    return [first, second]


@pytest.fixture(scope="module")
def windowed(spark, tmp_path_factory):
    """All three gold queries over two appends; the second has out-of-order and late events.
    Sessions here use a 20 minute gap, from the environment, to show the setting is honoured."""
    cfg = lakehouse_cfg(tmp_path_factory.mktemp("gold-windowed"),
                        LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP="20 minutes")
    assert cfg.gold.windows["session_gap"].seconds == 20 * 60
    batches = windowed_batches()
    runs = []
    for i, events in enumerate(batches):
        append_silver(spark, cfg, events, batch_id=i, frontier_ms=frontier_before(batches, i))
        runs.append(run_gold(spark, cfg))
    yield cfg, batches, runs
    drop_names(spark)


def test_gold_state_holds_open_sessions_not_events_nor_windows(spark, windowed):
    """One query writes every table; its only state is the sessions' (late events are counted
    from silver's frontier, not by a per-event dedup state, and a window's state is its row in
    the table): after every batch, at most one state row per device with an open session."""
    cfg, batches, runs = windowed
    assert [set(run) for run in runs] == [{GOLD}, {GOLD}]
    ops = [op for run in runs for p in run[GOLD] for op in p.get("stateOperators") or []]
    assert ops and {op["operatorName"] for op in ops} == {"applyInPandasWithState"}, ops
    devices = len({e["device_id"] for b in batches for e in b})
    peak = max(int(op["numRowsTotal"]) for op in ops)
    assert 0 < peak <= devices, (peak, devices)
    # One read of silver per batch: its input rows are the batch's silver rows, counted once.
    assert [p["numInputRows"] for run in runs for p in run[GOLD] if p["numInputRows"]] == [len(b) for b in batches]
    # An available-now run leaves a snapshot of its state (no changelogs to replay at the next
    # start): one per partition for every committed batch.
    state = Path(cfg.checkpoint(GOLD)) / "state"
    snapshots = sorted(p.name for p in state.rglob("*.zip"))
    assert snapshots and not list(state.rglob("*.changelog")), snapshots


def test_windowed_aggregates_equal_batch_computation(spark, windowed):
    cfg, batches, _ = windowed
    on_time = silver_events(spark, cfg, exclude={e["event_id"] for e in LATE})
    first_ids = {e["event_id"] for e in batches[0]}
    # The data really updates windows across batches (else this test proves little).
    first = expected_sightings([e for e in on_time if e["event_id"] in first_ids])
    final = expected_sightings(on_time)
    assert any(k in first and first[k] != v for k, v in final.items())

    assert_dicts_equal(gold_sightings(spark, cfg), final, "gold.zip_hourly_sightings vs silver")
    assert_dicts_equal(gold_activity(spark, cfg), expected_activity(on_time),
                       "gold.device_activity vs silver")
    # MERGE sets the current value per key: never a second row for a window.
    assert_one_row_per_key(read(spark, cfg, "gold", "zip_hourly_sightings"), SPEC["sightings"].keys)
    assert_one_row_per_key(read(spark, cfg, "gold", "device_activity"), SPEC["activity"].keys)
    # The unknown device's windows are kept, with a null zip code.
    assert any(k[2] is None and k[3] for k in final)


def test_windowed_aggregates_match_a_spark_group_by(spark, windowed):
    """Same check with Spark batch group-bys over silver (hour truncation, explicit slides)."""
    cfg, _, _ = windowed
    late_ids = [e["event_id"] for e in LATE]
    events = silver(spark, cfg).where(~F.col("event_id").isin(late_ids))
    hourly = (events.groupBy(F.date_trunc("hour", "event_time").alias("window_start"), "zip_code",
                             "unknown_device")
              .agg(F.sum(F.col("has_person").cast("long")).alias("sightings"),
                   F.count(F.lit(1)).alias("events")))
    assert_same_bag(bag(read(spark, cfg, "gold", "zip_hourly_sightings"),
                        ["window_start", "zip_code", "unknown_device", "sightings", "events"]),
                    bag(hourly, ["window_start", "zip_code", "unknown_device", "sightings", "events"]),
                    "hourly sightings")
    slot = F.expr("timestamp_seconds(floor(unix_seconds(event_time) / 300) * 300)")
    slides = events.withColumn("window_start", F.explode(F.array(slot, slot - F.expr("INTERVAL 5 MINUTES"))))
    activity = (slides.groupBy("window_start", "device_id")
                .agg(F.count(F.lit(1)).alias("events"),
                     F.sum(F.col("has_motion").cast("long")).alias("motion_events"),
                     F.sum(F.col("has_sound").cast("long")).alias("sound_events"),
                     F.sum(F.col("has_person").cast("long")).alias("person_events")))
    cols = ["window_start", "device_id", "events", "motion_events", "sound_events", "person_events"]
    assert_same_bag(bag(read(spark, cfg, "gold", "device_activity"), cols), bag(activity, cols),
                    "device activity")


def test_distinct_devices_per_zip_per_day_equal_a_spark_count_distinct(spark, windowed):
    """The distinct kind (gold/kinds/distinct.py, nest's gold.zip_daily_devices) keeps each
    window's set of devices, so folding the second batch into the first batch's rows stays an
    exact distinct count: equal to count(DISTINCT) over every on-time event."""
    cfg, _, _ = windowed
    late_ids = [e["event_id"] for e in LATE]
    events = silver(spark, cfg).where(~F.col("event_id").isin(late_ids))
    daily = (events.groupBy(F.date_trunc("day", "event_time").alias("window_start"), "zip_code", "unknown_device")
             .agg(F.count_distinct("device_id").alias("devices"),
                  F.array_sort(F.collect_set("device_id")).alias("device_id_set")))
    cols = ["window_start", "zip_code", "unknown_device", "devices", "device_id_set"]
    table = read(spark, cfg, "gold", "zip_daily_devices")
    assert_same_bag(bag(table, cols), bag(daily, cols), "distinct devices per zip per day")
    assert_one_row_per_key(table, SPEC["devices"].keys)


def test_a_distinct_count_folds_batch_by_batch_to_the_count_over_all_events(spark):
    """Folding a batch's sets into the table's rows (its own and its new windows, a NULL zip
    code, devices already counted) gives the table built from all the events at once."""
    from gold import transform as T

    spec = SPEC["devices"]
    rows = [("a1", "94105", False, 0), ("a2", "94105", False, 1), ("u1", None, True, 2),
            ("a1", "94105", False, 3), ("a3", "94105", False, 4), ("b1", "10001", False, 5),
            ("u2", None, True, 6), ("a1", "94105", False, 30)]       # hours since T0
    df = spark.createDataFrame([(d, z, u, T0 + timedelta(hours=h)) for d, z, u, h in rows],
                               "device_id STRING, zip_code STRING, unknown_device BOOLEAN, event_time TIMESTAMP")
    first, second = df.where(F.hour("event_time") < 2), df.where(F.hour("event_time") >= 2)
    cols = ["window_start", "zip_code", "unknown_device", "device_id_set", "devices"]
    # (Every window of the first batch is touched again by the second, here.)
    folded = T.combine(spec.build(second), spec.build(first), spec.keys, spec.measures)
    whole = spec.build(df)
    assert bag(folded, cols) == bag(whole, cols)
    assert sorted(r.devices for r in whole.collect()) == [1, 1, 2, 3]


def test_late_events_are_dropped_and_accounted(spark, windowed):
    cfg, batches, runs = windowed
    late_ids = {e["event_id"] for e in LATE}
    # The late events really are 3 hours behind what the first batch had already seen.
    assert all(T_MAX1 - e["t"] >= 3 * HOUR - 5 * MIN for e in LATE)
    assert max(e["t"] for e in batches[0]) == T_MAX1
    acc = read(spark, cfg, "ops", "batch_accounting").where("layer = 'gold'")
    assert {r.query for r in acc.collect()} == {GOLD}
    batch_id = data_batch(runs[1][GOLD])
    row = acc.where(f"batch_id = {batch_id}").collect()
    assert len(row) == 1, f"batch {batch_id}: accounting rows {row}"
    assert row[0].late_dropped == len(LATE), row[0]
    assert row[0].rows_in == len(batches[1]), row[0]
    # The first batch dropped nothing.
    first = acc.where(f"batch_id = {data_batch(runs[0][GOLD])}").collect()
    assert len(first) == 1 and first[0].late_dropped == 0 and first[0].rows_in == len(batches[0])
    # Every batch that read rows has exactly one accounting row.
    mine = acc.collect()
    assert len(mine) == len({r.batch_id for r in mine}), mine
    assert_booked({r.batch_id: r.rows_written for r in mine}, cfg, GOLD)

    on_time = silver_events(spark, cfg, exclude=late_ids)
    assert len(on_time) == silver(spark, cfg).count() - len(LATE)
    sightings, activity = gold_sightings(spark, cfg), gold_activity(spark, cfg)
    assert sum(c for _, c in sightings.values()) == len(on_time)
    assert sum(v[0] for v in activity.values()) == 2 * len(on_time)  # two sliding windows each
    assert_dicts_equal(sightings, expected_sightings(on_time), "sightings without late events")
    # The late events' windows exist from the first batch: they must not have been bumped.
    late_hours = expected_sightings(LATE)
    assert set(late_hours) <= set(sightings)
    sessions = read(spark, cfg, "gold", "device_sessions")
    on_time_df = silver(spark, cfg).where(~F.col("event_id").isin(list(late_ids)))
    expected = bag(S.batch_sessions(on_time_df, nest_sessions(20 * MIN)), SESSION_COLS)
    assert_same_bag(bag(sessions, SESSION_COLS), expected, "device sessions without late events")
    assert expected != bag(S.batch_sessions(on_time_df, nest_sessions()), SESSION_COLS)
    assert sessions.agg(F.sum("events")).first()[0] == len(on_time)


def test_windows_behind_the_watermark_are_finalized(spark, windowed):
    """`finalized` follows the watermark of the run's last batch, and the last batch with data
    set it already: it closes by the watermark Spark gives the batch after it (its closing
    watermark), so the run's closing no-data batch finds nothing left and writes nothing."""
    cfg, batches, _ = windowed
    marks = watermarks(cfg, GOLD)
    # The run's last batch moved the watermark to all data seen: max event time - 1 hour.
    wm = marks[max(marks)]
    assert wm == max(e["t"] for e in silver_events(spark, cfg)) + T0_MS - WATERMARK_MS
    data = committed_batches(cfg, GOLD, data_only=True)
    assert len(data) == 2 and max(marks) not in data
    assert marks[data[-1]] == max(e["t"] for e in batches[0]) + T0_MS - WATERMARK_MS < wm
    for key in ("sightings", "activity"):
        rows = bag(read(spark, cfg, "gold", SPEC[key].table), ["window_end", "finalized"])
        wrong = [(end, fin) for (end, fin) in rows if fin != (end <= wm)]
        assert not wrong, f"{key}: finalized flag wrong for (window_end, finalized) {wrong[:5]} (wm {wm})"
        assert {fin for _, fin in rows} == {True, False}, f"{key}: want both final and open windows"
        # Some are final only by the last watermark, which the last data batch's commit applied.
        assert any(marks[data[-1]] < end <= wm for end, _ in rows), f"{key}: no window between the watermarks"
        last = parse(DeltaTable.forPath(spark, cfg.table_path("gold", SPEC[key].table))
                     .history(1).first()["userMetadata"])
        assert (last["batch_id"], last["closes_ms"]) == (data[-1], wm)


def test_quality_results_for_every_expectation_of_every_batch(spark, windowed):
    """Every table of every batch is gated, by its suite and its constraints, and one append per
    batch records them all."""
    from gold.constraints import gate_suites

    cfg, _, _ = windowed
    suites = load_suites(cfg.gold.expectations)
    dq = read(spark, cfg, "ops", "dq_results").collect()
    books = {r.batch_id: r.rows_written for r in read(spark, cfg, "ops", "batch_accounting")
             .where(F.col("query") == GOLD).collect()}
    assert_booked(books, cfg, GOLD)
    assert sorted(books) == committed_batches(cfg, GOLD, data_only=True) and all(books.values())
    assert {r.query for r in dq} == {GOLD}
    gated = gate_suites(TABLES, suites)      # each suite's rules and its constraints' derived ones
    for spec in TABLES:
        rules = {r.name for r in gated[f"gold.{spec.table}"].rules}
        assert {f"constraint:{c.name}" for c in spec.checks()} & rules, spec.table
        mine = [r for r in dq if r.table_name == f"gold.{spec.table}"]
        assert Counter((r.batch_id, r.expectation) for r in mine) == Counter(
            (b, name) for b in books for name in rules), spec.table
        assert all(r.success and r.element_count > 0 for r in mine)
    commits = [v for v in DeltaTable.forPath(spark, cfg.table_path("ops", "dq_results")).history().collect()
               if v.operation == "WRITE"]
    assert len(commits) == len(books), "one ops.dq_results commit per gold batch"


class _Books:
    """Stands in for the accounting: these batches are replayed by hand, outside any query."""

    def __init__(self):
        self.stashed = {}

    def record(self, query_name, batch_id, **counts):
        self.stashed[batch_id] = counts


def _snapshot(spark, cfg, spec):
    df = read(spark, cfg, "gold", spec.table)
    return bag(df, df.columns)


def gold_input(spark, cfg, events):
    """What the gold query hands its foreachBatch for these silver rows: one `event` row each
    (the windowed tables' input; no session rows)."""
    from gold.job import event_columns

    return events.select(F.struct(*event_columns(TABLES, events.columns)).alias(EVENT))


def batch_events(spark, cfg, append: int):
    """The on-time silver rows of the fixture's append `append`: what gold's data batch of
    that run read."""
    late_ids = [e["event_id"] for e in LATE]
    return silver(spark, cfg).where((F.col("silver_batch_id") == append) & ~F.col("event_id").isin(late_ids))


def copy_lakehouse(cfg, tmp_path):
    import shutil

    shutil.copytree(cfg.root, tmp_path / "lakehouse")
    return lakehouse_cfg(tmp_path, LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP="20 minutes")


def test_the_first_batch_into_an_empty_table_is_an_idempotent_append(spark, windowed, tmp_path):
    """A fresh table's first batch inserts every row: an append keyed by the batch, not a MERGE.
    Its replay finds the append in the table's history and folds nothing in again."""
    from audit.history import table_history

    cfg, _, _ = windowed
    for spec in SPEC.values():
        commits = [v for v in table_history(spark, cfg.table_path("gold", spec.table)) if v.lineage]
        ops = [v.operation for v in commits]
        # (a no-data batch's commit flags closed what its watermark passed: an UPDATE)
        assert ops[0] == "WRITE" and "MERGE" in ops and set(ops[1:]) <= {"MERGE", "UPDATE"}, (spec.table, ops)
        assert commits[0].lineage["query"] == GOLD and commits[0].lineage["batch_id"] == 0

    # The first batch again, on a copy whose table lost its rows since (a crash after the
    # append's commit, before the query's own): the replay finds the append's key.
    copy = copy_lakehouse(cfg, tmp_path)
    spec = SPEC["sightings"]
    path = copy.table_path("gold", spec.table)
    spark.sql(f"DELETE FROM delta.`{path}`")
    GoldBatch(spark, copy, [spec], {}, _Books(), GOLD)(gold_input(spark, copy, batch_events(spark, copy, 0)), 0)
    assert read(spark, copy, "gold", spec.table).count() == 0
    assert DeltaTable.forPath(spark, path).history(1).first().operation == "DELETE"


def test_a_replayed_batch_folds_into_each_table_exactly_once(spark, windowed, tmp_path):
    """A window's row is the sum of the batches folded into it, so a replay must find which
    tables its first attempt reached. Here the run's last batches (the second append's, which
    also finalized what the next watermark passes, then the no-data batch, which finds nothing
    left to close) are replayed twice: on the lakehouse (every table has them: nothing changes),
    and on a copy where sightings lost the append's commit (a kill -9 between two tables'
    commits): it folds in once there, to the same rows."""
    from common.quality import QualityGate

    cfg, _, _ = windowed
    suites = load_suites(cfg.gold.expectations)
    windowed_specs = [SPEC["sightings"], SPEC["activity"]]
    gates = {s.table: QualityGate(suites[f"gold.{s.table}"]) for s in windowed_specs}
    last = max(committed_batches(cfg, GOLD, data_only=True))      # the second append's batch
    tail = [b for b in committed_batches(cfg, GOLD) if b >= last]
    assert len(tail) == 2, tail                                    # and the run's no-data batch
    assert batch_events(spark, cfg, 1).count() > 0
    inputs = {last: gold_input(spark, cfg, batch_events(spark, cfg, 1)),
              tail[1]: gold_input(spark, cfg, batch_events(spark, cfg, 1).limit(0))}
    before = {s.table: _snapshot(spark, cfg, s) for s in windowed_specs}

    def replay_tail(on):
        body = GoldBatch(spark, on, windowed_specs, gates, _Books(), GOLD)
        for _ in range(2):
            for b in tail:
                body(inputs[b], b)
            assert {s.table: _snapshot(spark, on, s) for s in windowed_specs} == before
        return body

    assert replay_tail(cfg).books.stashed[last]["rows_written"] == 0

    copy = copy_lakehouse(cfg, tmp_path)
    spec = SPEC["sightings"]
    log = Path(copy.table_path("gold", spec.table)) / "_delta_log"

    def batch_of(version: int) -> int:
        line = next(line for line in (log / f"{version:020d}.json").read_text().splitlines() if "commitInfo" in line)
        return parse(json.loads(line)["commitInfo"]["userMetadata"])["batch_id"]

    newest = max(int(f.name[:20]) for f in log.glob("*.json"))
    assert batch_of(newest) == last and batch_of(newest - 1) < last
    for f in log.glob(f"*{newest:020d}*"):
        f.unlink()                      # the batch never committed to this table
    assert _snapshot(spark, copy, spec) != before[spec.table]
    replay_tail(copy)
    assert_one_row_per_key(read(spark, copy, "gold", spec.table), spec.keys)


def test_a_batch_s_update_read_after_its_merge_holds_what_the_merge_wrote(spark, windowed, tmp_path):
    """What a batch publishes (the stats topic) reads its update after, or while, the MERGE
    commits it. A cache of the update follows the table it was folded from, so a read after
    the commit computed it again over the new version: the batch folded in twice. A pinned
    update (BatchContext.pin) keeps the values the MERGE wrote."""
    from common.batch import BatchContext
    from common.lineage import CLOSES
    from gold import sinks
    from gold.kinds import CLOSING, LITERAL_TS, touched

    cfg, _, _ = windowed
    copy = copy_lakehouse(cfg, tmp_path)
    spec = SPEC["sightings"]
    path = copy.table_path("gold", spec.table)
    closes = final_watermark(copy, GOLD)
    # Events in windows the table holds open (the second append's newest), folded in again.
    events = batch_events(spark, copy, 1).where(F.unix_millis("event_time") > closes)
    assert events.count() > 0
    body = GoldBatch(spark, copy, [spec], {}, _Books(), GOLD)
    ctx = BatchContext(10_000, body.app_id, {CLOSES: closes}, replay=False, session=spark)
    earliest = events.agg(F.date_format(F.min("event_time"), LITERAL_TS)).first()[0]
    _, rows, n, _, hint = body.fold(spec, gold_input(spark, copy, events), ctx, earliest)
    assert n > 0
    cols = [c for c in rows.columns if c != CLOSING]
    folded = bag(touched(rows), cols)
    try:
        sinks.merge(spark, path, spec, rows.drop(CLOSING), closes, ctx, hint)
        after = bag(touched(rows), cols)
    finally:
        for kept in ctx.cached:
            kept.unpersist()
    assert after == folded, "the update read after its MERGE differs from the one merged"
    table = read(spark, copy, "gold", spec.table)
    assert bag(table, cols) & folded == folded, "the MERGE wrote the update's rows"


def test_gold_tables_carry_their_kinds_constraints_and_a_write_breaking_one_commits_nothing(spark, windowed, tmp_path):
    """Each table holds, as Delta CHECK constraints, exactly what its kind declares (keys not
    NULL, counts not negative, ends after starts). A MERGE that breaks one fails naming it and
    commits nothing; a table made before the constraints gets them at the next start."""
    from common.delta import CONSTRAINT, table_properties
    from gold.job import prepare_gold

    cfg, _, _ = windowed
    for spec in TABLES:
        have = {k[len(CONSTRAINT):]: v for k, v in table_properties(spark, cfg.table_path("gold", spec.table)).items()
                if k.startswith(CONSTRAINT)}
        assert have == {c.name.lower(): c.sql for c in spec.checks()}, spec.table
        assert len(have) >= 3, spec.table
    assert "events_not_negative" in {c.name for c in SPEC["sightings"].checks()}
    assert "session_end_at_or_after_session_start" in {c.name for c in SPEC["sessions"].checks()}

    copy = copy_lakehouse(cfg, tmp_path)
    broken = {"sightings": ("events", F.lit(-1).cast("long"), "events_not_negative"),
              "sessions": ("session_end", F.col("session_start") - F.expr("INTERVAL 1 MINUTE"),
                           "session_end_at_or_after_session_start")}
    for key, (column, value, name) in broken.items():
        spec = SPEC[key]
        path = copy.table_path("gold", spec.table)
        before = DeltaTable.forPath(spark, path).history(1).first().version
        bad = read(spark, copy, "gold", spec.table).limit(1).withColumn(column, value)
        with pytest.raises(Exception) as refused:
            spec.merge(DeltaTable.forPath(spark, path), bad, 0, None)
        assert name in str(refused.value) and "DELTA_VIOLATE_CONSTRAINT" in str(refused.value), key
        assert DeltaTable.forPath(spark, path).history(1).first().version == before, f"{key}: a commit was made"

    path = copy.table_path("gold", SPEC["activity"].table)
    for c in SPEC["activity"].checks():
        spark.sql(f"ALTER TABLE delta.`{path}` DROP CONSTRAINT `{c.name}`")
    assert not [k for k in table_properties(spark, path) if k.startswith(CONSTRAINT)]
    prepare_gold(spark, copy, TABLES)
    assert {k for k in table_properties(spark, path) if k.startswith(CONSTRAINT)} == {
        CONSTRAINT + c.name.lower() for c in SPEC["activity"].checks()}
    drop_names(spark)


def test_each_constraint_is_a_gx_rule_and_a_suite_rule_covering_it_counts():
    """Each kind's constraints in their Great Expectations form; the gate of each table runs the
    suite's rules plus one derived rule (policy fail, `constraint:<name>`) per constraint no
    `fail` rule of the suite covers: same expectation on the same column(s), on every row, a
    bound at least as strict. A derived rule is a single-column expectation (GX bundles it in
    the suite's jobs): the one of an `after` constraint checks a boolean column of the gate's
    view, `<name>` (quality_view), in [true], where a suite rule covering it is GX's column pair."""
    from common.errors import JobError
    from common.quality import Rule
    from gold.constraints import DERIVED, coverage, gate_suite, gate_suites, listing, viewed

    def rules(spec):
        return [(r.name, r.expectation, r.kwargs, r.policy) for r in (c.rule() for c in spec.checks())]

    nn, in_set = "expect_column_values_to_not_be_null", "expect_column_values_to_be_in_set"
    between, pair = "expect_column_values_to_be_between", "expect_column_pair_values_a_to_be_greater_than_b"
    assert rules(SPEC["sightings"]) == [
        ("constraint:window_start_not_null", nn, {"column": "window_start"}, "fail"),
        ("constraint:window_end_not_null", nn, {"column": "window_end"}, "fail"),
        ("constraint:window_end_after_window_start", in_set,
         {"column": "window_end_after_window_start", "value_set": [True]}, "fail"),
        ("constraint:events_not_negative", between, {"column": "events", "min_value": 0}, "fail")]
    assert rules(SPEC["sessions"]) == [
        *[(f"constraint:{c}_not_null", nn, {"column": c}, "fail")
          for c in ("device_id", "session_id", "session_start", "session_end")],
        ("constraint:session_end_at_or_after_session_start", in_set,
         {"column": "session_end_at_or_after_session_start", "value_set": [True]}, "fail"),
        ("constraint:events_not_negative", between, {"column": "events", "min_value": 0}, "fail")]
    assert rules(SPEC["devices"])[-1] == ("constraint:devices_not_negative", between,
                                          {"column": "devices", "min_value": 0}, "fail")
    # The view column is the CHECK itself; what a suite rule covering the constraint is stays
    # GX's column pair.
    ends, at_or_after = SPEC["sightings"].checks()[2], SPEC["sessions"].checks()[4]
    assert (ends.sql, ends.in_view, ends.expectation, dict(ends.kwargs)) == (
        "`window_end` > `window_start`", True, pair,
        {"column_A": "window_end", "column_B": "window_start", "or_equal": False})
    assert (at_or_after.sql, dict(at_or_after.kwargs)["or_equal"]) == ("`session_end` >= `session_start`", True)
    assert not any(c.in_view for spec in TABLES for c in spec.checks() if c.expectation != pair)
    for spec in TABLES:
        for check in spec.checks():
            check.rule().gx()           # a GX expectation with valid kwargs

    # The conf suite: which constraint each rule covers, and the rest derived.
    suites = load_suites(load_config(env={}).gold.expectations)
    covered = {(spec.table, c.check.name): c.rule for spec in TABLES
               for c in coverage(spec.checks(), suites[f"gold.{spec.table}"]) if not c.derived}
    assert covered == {("device_activity", "events_not_negative"): "counts_non_negative",   # min 0
                       ("device_sessions", "events_not_negative"): "session_has_events",    # min 1
                       ("device_sessions", "session_end_at_or_after_session_start"): "session_end_after_start",
                       ("zip_daily_devices", "devices_not_negative"): "at_least_one_device"}
    gated = gate_suites(TABLES, suites)
    for spec in TABLES:
        suite, gate = suites[f"gold.{spec.table}"], gated[f"gold.{spec.table}"]
        assert (gate.name, gate.table) == (suite.name, suite.table)
        assert gate.rules[:len(suite.rules)] == suite.rules, spec.table
        assert [r.name for r in gate.rules[len(suite.rules):]] == [
            DERIVED + c.name for c in spec.checks() if (spec.table, c.name) not in covered], spec.table
        assert all(r.policy == "fail" for r in gate.rules[len(suite.rules):])
    # The gate's view gets a column for each derived `after` rule, none for a covered one; the
    # listing of `lakehouse check` and `graph` shows the column each checks.
    ends_after = ["window_end_after_window_start"]
    assert {spec.table: [c.name for c in viewed(spec.checks(), gated[f"gold.{spec.table}"])] for spec in TABLES} == {
        "zip_hourly_sightings": ends_after, "device_activity": ends_after, "device_sessions": [],
        "zip_daily_devices": ends_after}
    assert [c.name for c in viewed(SPEC["sessions"].checks(), gate_suites([SPEC["sessions"]], {})[
        "gold.device_sessions"])] == ["session_end_at_or_after_session_start"]
    lines = {" ".join(line.split()) for line in listing(TABLES, suites)}
    assert ("gold.zip_hourly_sightings window_end_after_window_start derived rule "
            "constraint:window_end_after_window_start: view column window_end_after_window_start = "
            "`window_end` > `window_start` (NULL: false) in [true]") in lines
    assert "gold.zip_hourly_sightings window_start_not_null derived rule constraint:window_start_not_null" in lines
    assert ("gold.device_sessions session_end_at_or_after_session_start covered by session_end_after_start"
            in lines)

    # What does not cover a constraint: another policy, `mostly`, a looser bound, another
    # column, a row condition, `>=` for a strict `>`. A stricter bound, `>` for `>=`, or the
    # column in other case, does.
    events = SPEC["sightings"].checks()[-1]           # events >= 0
    ends = SPEC["sightings"].checks()[2]              # window_end > window_start
    at_or_after = SPEC["sessions"].checks()[4]        # session_end >= session_start

    def covers(check, expectation, kwargs, policy="fail"):
        return check.covered_by(Rule("r", expectation, kwargs, policy))

    assert covers(events, between, {"column": "events", "min_value": 0})
    assert covers(events, between, {"column": "EVENTS", "min_value": 1, "max_value": 10, "strict_min": True})
    assert covers(events, between, {"column": "events", "min_value": 0, "mostly": 1.0})
    for kwargs in ({"column": "events", "min_value": -1}, {"column": "events", "max_value": 10},
                   {"column": "sightings", "min_value": 0}, {"column": "events", "min_value": 0, "mostly": 0.99},
                   {"column": "events", "min_value": 0, "row_condition": 'col("zip_code").notNull()',
                    "condition_parser": "great_expectations"}):
        assert not covers(events, between, kwargs), kwargs
    assert not covers(events, between, {"column": "events", "min_value": 0}, "warn")
    assert not covers(events, nn, {"column": "events"})
    assert covers(ends, pair, {"column_A": "window_end", "column_B": "window_start"})
    assert not covers(ends, pair, {"column_A": "window_end", "column_B": "window_start", "or_equal": True})
    assert not covers(ends, pair, {"column_A": "window_start", "column_B": "window_end"})
    assert covers(at_or_after, pair, {"column_A": "session_end", "column_B": "session_start", "or_equal": True})
    assert covers(at_or_after, pair, {"column_A": "session_end", "column_B": "session_start", "or_equal": False})
    assert not covers(at_or_after, pair, {"column_A": "session_end", "column_B": "session_start",
                                          "ignore_row_if": "either_value_is_missing"})
    assert covers(SPEC["sessions"].checks()[0], nn, {"column": "device_id"})
    assert not covers(SPEC["sessions"].checks()[0], nn, {"column": "device_id", "mostly": 0.5})

    # A table the suite file has no entry for is gated by its constraints alone, under the
    # file's suite name; a suite rule may not take a derived rule's name.
    alone = gate_suites([SPEC["sessions"]], {})["gold.device_sessions"]
    assert [r.name for r in alone.rules] == [DERIVED + c.name for c in SPEC["sessions"].checks()]
    taken = suites["gold.zip_hourly_sightings"]
    taken = dataclasses.replace(taken, rules=(*taken.rules, Rule("constraint:events_not_negative", between,
                                                                 {"column": "events", "min_value": 0}, "warn")))
    with pytest.raises(JobError, match="'constraint:events_not_negative' is taken"):
        gate_suite("zip_hourly_sightings", SPEC["sightings"].checks(), taken, "gold")


def _broken(spec, **columns):
    """The table's kind with a bug: every row its `updates` hands over gets `columns` (name ->
    Column), whatever the events say."""
    @dataclasses.dataclass(frozen=True)
    class Broken(type(spec)):
        def updates(self, *args):
            rows = super().updates(*args)
            for name, value in columns.items():
                rows = rows.withColumn(name, value)
            return rows

    return Broken(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})


def test_a_batch_breaking_a_constraint_is_stopped_by_the_gate_naming_it_and_commits_nothing(
        spark, windowed, tmp_path, monkeypatch):
    """A transform bug (a negative count, a NULL key, a window ending at its start) is stopped
    by the gate's derived rules, in the one validation and the Spark jobs of the suite's own
    rules, before Delta's own constraint is reached: the error and ops.dq_results name the
    constraint, and no table gets a commit."""
    import shutil

    import common.quality as Q
    from common.errors import DataQualityError
    from gold.constraints import gate_suites, viewed
    from gold.transform import quality_view

    cfg, _, _ = windowed
    copy = copy_lakehouse(cfg, tmp_path)
    suites = load_suites(copy.gold.expectations)
    gated = gate_suites(TABLES, suites)
    sightings, activity = SPEC["sightings"], SPEC["activity"]

    # A clean batch's gate with the derived rules: one validation, every rule passing, and no
    # Spark job beyond those of the suite's rules alone (GX bundles single-column rules; the
    # `after` rule checks the view's column window_end_after_window_start).
    name = "gold.zip_hourly_sightings"
    sc = spark.sparkContext
    rows = read(spark, copy, "gold", sightings.table).cache()
    n = rows.count()
    view = quality_view(rows, NEST.dimension, viewed(sightings.checks(), gated[name]))
    assert "window_end_after_window_start" in view.columns

    def jobs(suite):
        group = f"gate-{uuid.uuid4()}"
        sc.setJobGroup(group, "a gold gate")
        try:
            outcomes = Q.QualityGate(suite).validate(view, n)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        # The status tracker learns of a job from the listener bus, after it ran: on a busy
        # machine the last one may not be there yet.
        sc._jsc.sc().listenerBus().waitUntilEmpty()
        return outcomes, len(sc.statusTracker().getJobIdsForGroup(group))

    validations = []
    real = Q._validator
    monkeypatch.setattr(Q, "_validator", lambda *a: validations.append(a) or real(*a))
    outcomes, with_derived = jobs(gated[name])
    assert len(validations) == 1 and all(o.success for o in outcomes)
    assert {o.rule.name for o in outcomes} >= {"constraint:events_not_negative", "constraint:window_start_not_null",
                                                "constraint:window_end_after_window_start"}
    monkeypatch.undo()
    assert with_derived == jobs(suites[name])[1] > 0
    rows.unpersist()

    # A later batch of the query, on a copy: the second append's events again, under a batch id
    # the checkpoint has not logged (one apart from the last: the batch before it must not look
    # like its no-data twin, which only closes). Activity's windows end at their start or start
    # at NULL (half each), which its `after` rule refuses alike, as Delta's CHECK would.
    offsets = Path(copy.checkpoint(GOLD)) / "offsets"
    batch = max(committed_batches(copy, GOLD)) + 2
    shutil.copy(offsets / str(max(committed_batches(copy, GOLD, data_only=True))), offsets / str(batch))
    half = F.minute("window_start") % 10 == 0          # activity slides by 5 minutes
    specs = [_broken(activity, window_end=F.when(half, F.col("window_start")).otherwise(F.col("window_end")),
                     window_start=F.when(~half, F.lit(None)).otherwise(F.col("window_start"))),
             _broken(sightings, events=F.lit(-1).cast("long"))]
    gates = {s.table: Q.QualityGate(gated[f"gold.{s.table}"]) for s in specs}
    versions = {t.table: DeltaTable.forPath(spark, copy.table_path("gold", t.table)).history(1).first().version
                for t in TABLES}
    before = {s.table: _snapshot(spark, copy, s) for s in specs}
    books = _Books()
    with pytest.raises(DataQualityError) as stopped:
        GoldBatch(spark, copy, specs, gates, books, GOLD)(gold_input(spark, copy, batch_events(spark, copy, 1)), batch)
    message = str(stopped.value)
    assert set(stopped.value.expectations) == {"constraint:window_end_after_window_start",
                                               "constraint:window_start_not_null"}
    assert f"quality gate failed: query 'gold', batch {batch}, table gold.device_activity" in message
    assert ("expectation 'constraint:window_end_after_window_start' (expect_column_values_to_be_in_set "
            "{'column': 'window_end_after_window_start', 'value_set': [True]}): ") in message
    assert "DELTA_VIOLATE_CONSTRAINT" not in message

    dq = read(spark, copy, "ops", "dq_results").where(F.col("batch_id") == batch).collect()
    failed = {(r.table_name, r.expectation): r for r in dq if not r.success}
    assert set(failed) == {("gold.device_activity", "constraint:window_end_after_window_start"),
                           ("gold.device_activity", "constraint:window_start_not_null"),
                           ("gold.zip_hourly_sightings", "constraint:events_not_negative")}, set(failed)
    assert all((r.policy, r.suite) == ("fail", "gold") for r in failed.values())
    # Each counts the rows it refuses: every row for `after` and the count, half for the NULL.
    ends = failed["gold.device_activity", "constraint:window_end_after_window_start"]
    starts = failed["gold.device_activity", "constraint:window_start_not_null"]
    count = failed["gold.zip_hourly_sightings", "constraint:events_not_negative"]
    assert ends.expectation_type == "expect_column_values_to_be_in_set"
    assert ends.unexpected_count == ends.element_count == starts.element_count > starts.unexpected_count > 0, (
        ends, starts)
    assert count.unexpected_count == count.element_count > 0, count
    assert json.loads(ends.result_json)["expectation_config"]["kwargs"]["column"] == "window_end_after_window_start"
    assert {(r.table_name, r.expectation) for r in dq} == {
        (f"gold.{s.table}", rule.name) for s in specs for rule in gated[f"gold.{s.table}"].rules}

    assert {t.table: DeltaTable.forPath(spark, copy.table_path("gold", t.table)).history(1).first().version
            for t in TABLES} == versions, "a gold table got a commit"
    assert {s.table: _snapshot(spark, copy, s) for s in specs} == before
    assert books.stashed == {} and batch not in committed_batches(copy, GOLD)
    drop_names(spark)


def test_a_table_has_one_writer_and_reset_gold_rebuilds_it(spark, windowed, tmp_path):
    """Rows folded batch by batch are only right for the query that folded them: gold refuses
    another checkpoint and a table restored by hand, naming `lakehouse refresh gold`;
    `make reset-gold` drops the gold tables and checkpoints so the next run rebuilds the same
    rows from silver."""
    from audit.reset_gold import main as reset_gold

    cfg, _, _ = windowed
    copy = copy_lakehouse(cfg, tmp_path)
    try:
        with pytest.raises(JobError) as other:
            start(spark, copy, "gold", only={"sightings"})
        assert "written by query gold " in str(other.value) and "lakehouse refresh gold" in str(other.value)
        assert not Path(copy.checkpoint(ONLY["sightings"])).exists()
        spark.sql(f"RESTORE TABLE delta.`{copy.table_path('gold', 'device_activity')}` TO VERSION AS OF 1")
        with pytest.raises(JobError) as restored:
            start(spark, copy, "gold")
        assert "gold.device_activity was changed outside the pipeline (RESTORE at version" in str(restored.value)

        assert reset_gold(["--yes"], cfg=copy) == 0
        assert not Path(copy.checkpoint(GOLD)).exists()
        assert not any(Path(copy.table_path("gold", t.table)).exists() for t in TABLES)
        assert Path(copy.table_path("silver", "camera_events")).exists()
        run_gold(spark, copy)
        for spec in TABLES:
            if not spec.stateful:      # sessions' ids follow how batches were cut: one batch now
                values = lambda c: bag(read(spark, c, "gold", spec.table),   # noqa: E731
                                       [col for col in read(spark, c, "gold", spec.table).columns
                                        if col != "finalized"])     # one batch: watermark 0
                assert values(copy) == values(cfg), spec.table
    finally:
        drop_names(spark)


def test_a_table_new_to_a_running_checkpoint_is_refused_not_started_without_history(spark, windowed, tmp_path):
    """A table added to the profile after gold has run would begin at silver's current offset
    and miss every earlier event: gold refuses to start, naming the table and the rebuild."""
    import shutil

    cfg, _, _ = windowed
    copy = copy_lakehouse(cfg, tmp_path)
    shutil.rmtree(copy.table_path("gold", "zip_daily_devices"))     # as before the profile had it
    try:
        with pytest.raises(JobError) as new:
            start(spark, copy, "gold")
        message = str(new.value)
        assert "gold.zip_daily_devices is new" in message and "miss every earlier event" in message
        assert "lakehouse refresh gold" in message
        assert not Path(copy.table_path("gold", "zip_daily_devices")).exists()
    finally:
        drop_names(spark)


def test_combine_folds_a_batch_into_the_table_row_for_every_measure_kind(spark):
    """count and sum add (a NULL sum stays NULL until a value comes), min and max keep the
    extreme, max_by and min_by the value at the extreme of their ordering, kept beside it."""
    from gold import transform as T

    measures = (("n", "count(1)"), ("total", "sum(v)"), ("low", "min(v)"), ("high", "max(v)"),
                ("last", "max_by(tag, t)"), ("first", "min_by(tag, t)"))
    cols = ["k", "n", "total", "low", "high", "last", "last_as_of", "first", "first_as_of"]
    schema = "k STRING, n LONG, total LONG, low LONG, high LONG, last STRING, last_as_of LONG, first STRING, first_as_of LONG"
    table = spark.createDataFrame([("a", 2, 10, 3, 7, "a-late", 50, "a-early", 5),
                                   ("b", 1, None, None, None, "b", 9, "b", 9)], schema)
    part = spark.createDataFrame([("a", 3, 4, 1, 2, "a-later", 60, "a-mid", 20),
                                  ("b", 2, 6, 6, 6, "b-old", 1, "b-older", 0),
                                  ("c", 1, None, None, None, "c", 3, "c", 3)], schema)
    got = {r.k: tuple(r)[1:] for r in T.combine(part, table, ("k",), measures).select(*cols).collect()}
    assert got == {"a": (5, 14, 1, 7, "a-later", 60, "a-early", 5),
                   "b": (3, 6, 6, 6, "b", 9, "b-older", 0),
                   "c": (1, None, None, None, "c", 3, "c", 3)}
    # Folding batch by batch gives what one aggregation over all the events gives, for the
    # keys the batch touched (b is not in it: the table's row stays as it is).
    events = spark.createDataFrame([("a", 1, "x", 1), ("a", 5, "y", 7), ("a", None, "z", 3), ("b", 2, "w", 2)],
                                   "k STRING, v LONG, tag STRING, t LONG")
    parts = [c for m in measures for c in T.combinable(*m).parts]
    agg = lambda df: df.groupBy("k").agg(*[F.expr(e).alias(n) for n, e in parts])  # noqa: E731
    folded = T.combine(agg(events.where("t > 2")), agg(events.where("t <= 2")), ("k",), measures)
    assert bag(folded, cols) == bag(agg(events).where("k = 'a'"), cols)


def test_combine_returns_the_windows_a_watermark_closes_from_the_same_read_of_the_table(spark):
    """With the batch's watermark, combine also returns the table's rows that watermark makes
    final and that are not marked so yet, untouched and flagged CLOSING; a row the batch
    touched is never flagged, final or not, and a NULL group key is a key like any other."""
    from gold import transform as T

    measures = (("n", "count(1)"),)
    at = lambda minute: f"2026-01-01 00:{minute:02d}:00"  # noqa: E731
    table = spark.sql(f"""SELECT * FROM VALUES
        (timestamp'{at(0)}', timestamp'{at(10)}', 'z1', 4L, false),   -- closes: behind, not final
        (timestamp'{at(0)}', timestamp'{at(10)}', NULL, 2L, false),   -- closes, NULL zip
        (timestamp'{at(10)}', timestamp'{at(20)}', 'z1', 3L, true),   -- final already: left alone
        (timestamp'{at(20)}', timestamp'{at(30)}', 'z1', 5L, false),  -- ahead of the watermark
        (timestamp'{at(20)}', timestamp'{at(30)}', NULL, 1L, false)   -- touched by the batch
        AS t(window_start, window_end, zip, n, finalized)""")
    part = spark.sql(f"""SELECT * FROM VALUES
        (timestamp'{at(20)}', timestamp'{at(30)}', NULL, 2L),
        (timestamp'{at(30)}', timestamp'{at(40)}', 'z1', 1L)
        AS s(window_start, window_end, zip, n)""")
    watermark_ms = int(spark.sql(f"SELECT unix_millis(timestamp'{at(25)}')").first()[0])
    got = T.combine(part, table, ("window_start", "zip"), measures, watermark_ms)
    assert got.columns == [*part.columns, T.CLOSING]
    rows = {(r.window_start.minute, r.zip): (r.n, r[T.CLOSING]) for r in got.collect()}
    assert rows == {(0, "z1"): (4, True), (0, None): (2, True),
                    (20, None): (3, False), (30, "z1"): (1, False)}
    # Without a watermark: the batch's windows only, as before.
    assert sorted(T.combine(part, table, ("window_start", "zip"), measures).columns) == sorted(part.columns)
    assert T.combine(part, table, ("window_start", "zip"), measures).count() == 2


def test_the_fold_reads_the_open_windows_and_those_after_the_batch_earliest_event(spark):
    """Of a windowed table, a batch's fold reads the rows not finalized (the watermark may close
    them) and any ending after the batch's earliest event (the windows it can touch); the
    finalized past is filtered out at the scan."""
    from gold import transform as T

    table = spark.sql("""SELECT * FROM VALUES
        (timestamp'2026-01-01 00:10:00', true,  'old, final'),
        (timestamp'2026-01-01 00:20:00', false, 'open'),
        (timestamp'2026-01-01 00:40:00', true,  'final, ends after the earliest event')
        AS t(window_end, finalized, what)""")
    read = lambda earliest: {r.what for r in T.open_or_after(table, earliest).collect()}  # noqa: E731
    assert read("2026-01-01 00:30:00.000000") == {"open", "final, ends after the earliest event"}
    assert read("2026-01-01 00:45:00.000000") == {"open"}
    assert read(None) == {"open"}                   # a batch without events (sessions only)


def test_a_windowed_merge_skips_the_files_of_windows_the_batch_did_not_change(spark, cfg, tmp_path):
    """The MERGE's condition bounds the target's window_start by the earliest one the batch
    changes (implied by the keys): Delta skips the files of older windows by their stats in the
    log and never opens them. Here the file of the final past is deleted from under the table:
    the bounded MERGE does not notice, the unbounded one reads it and fails."""
    from gold.kinds import LITERAL_TS
    from gold.sinks import merge

    spec = SPEC["sightings"]

    def rows(hours, sightings, final):
        return spark.sql(f"""SELECT timestamp'2026-11-01 00:00:00' + make_interval(0, 0, 0, 0, h, 0, 0) AS window_start,
            timestamp'2026-11-01 01:00:00' + make_interval(0, 0, 0, 0, h, 0, 0) AS window_end,
            '94103' AS zip_code, false AS unknown_device, {sightings}L AS sightings, 10L AS events,
            {str(final).lower()} AS finalized FROM VALUES {", ".join(f"({h})" for h in hours)} AS v(h)""")

    def table_with_its_past_deleted(name: str) -> str:
        path = tmp_path / name
        rows(range(0, 5), 1, True).coalesce(1).write.format("delta").save(str(path))   # the final past
        (past,) = list(path.glob("*.parquet"))
        rows(range(5, 7), 2, False).coalesce(1).write.format("delta").mode("append").save(str(path))
        past.unlink()
        return str(path)

    updates = rows([6, 7], 3, False)
    first = updates.select(F.date_format(F.min("window_start"), LITERAL_TS)).first()[0]
    bounded = table_with_its_past_deleted("bounded")
    merge(spark, bounded, spec, updates, 0, None, hint=first)
    now = (spark.read.format("delta").load(bounded).where(f"window_start >= TIMESTAMP '2026-11-01 05:00:00'")
           .select(F.hour("window_start").alias("h"), "sightings").collect())
    assert sorted(map(tuple, now)) == [(5, 2), (6, 3), (7, 3)]
    unbounded = table_with_its_past_deleted("unbounded")
    with pytest.raises(Exception) as failed:
        merge(spark, unbounded, spec, updates, 0, None)
    assert "parquet" in str(failed.value) and ("not exist" in str(failed.value) or "FileNotFound" in str(failed.value))


def test_a_tables_entry_is_checked_by_its_kind_and_errors_name_the_entry(tmp_path):
    """A profile's `tables:` entry names its kind; an unknown kind, a key the kind does not
    know, a column silver does not have, or a second stateful table is refused at start, with
    the file and the entry."""
    from common.config import ConfigError
    from common.profile import ProfileError

    nest = (Path(__file__).resolve().parent.parent / "conf" / "profiles" / "nest.yaml").read_text()
    folder = tmp_path / "profiles"
    folder.mkdir()

    def declared(name: str, old: str, new: str):
        assert old in nest
        (folder / f"{name}.yaml").write_text(nest.replace(old, new))
        cfg = load_config(env={"PROFILE": name, "PROFILES_DIR": str(folder), "LAKEHOUSE_ROOT": str(tmp_path)})
        return gold_tables(cfg)

    with pytest.raises(ConfigError) as unknown:
        declared("unknown", "kind: distinct ", "kind: median ")
    assert "tables.0.kind" in str(unknown.value) and "unknown kind 'median'" in str(unknown.value)
    assert "distinct" in str(unknown.value) and "windowed" in str(unknown.value)
    with pytest.raises(ProfileError) as key:
        declared("key", "    count: devices\n", "    count: devices\n    distinct_by: zip\n")
    assert "tables.0" in str(key.value) and "distinct_by" in str(key.value)
    with pytest.raises(ProfileError) as column:
        declared("column", "value: device_id\n", "value: camera\n")
    assert "key 'value'" in str(column.value) and "'camera'" in str(column.value)
    second = "    count: devices\n  - {kind: sessions, table: more_sessions, key: device_id, gap: 1 hour}\n"
    with pytest.raises(ConfigError) as stateful:
        declared("stateful", "    count: devices\n", second)
    assert "device_sessions, more_sessions" in str(stateful.value)


def test_measures_that_cannot_be_folded_are_refused(tmp_path):
    """A profile measure gold cannot fold batch by batch is a configuration error at start."""
    from common.config import ConfigError
    from gold import transform as T

    for expression in ("avg(v)", "count(DISTINCT device_id)", "sum(a) / count(1)", "percentile(v, 0.5)"):
        with pytest.raises(ValueError):
            T.combinable("m", expression)
    for expression in ("count(1)", "sum(CAST(has_person AS LONG))", "max_by(zip_code, event_time)", "MIN(x)"):
        T.combinable("m", expression)
    profile = tmp_path / "profiles" / "avg.yaml"
    profile.parent.mkdir()
    text = (Path(__file__).resolve().parent.parent / "conf" / "profiles" / "nest.yaml").read_text()
    profile.write_text(text.replace("events: count(1)\n    publish", "events: avg(1)\n    publish"))
    cfg = load_config(env={"PROFILE": "avg", "PROFILES_DIR": str(profile.parent), "LAKEHOUSE_ROOT": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        gold_tables(cfg)
    assert "aggregations.sightings" in str(err.value) and "avg(1)" in str(err.value)


# --- sessions ----------------------------------------------------------------------------------

# Delivery cut-offs (ms since T0): an event is appended in the batch its delivery time falls in.
CUTS = [80 * MIN, 160 * MIN, 240 * MIN, 400 * MIN]
MAX_DELAY = 50 * MIN          # < the 1 hour watermark: nothing is late
BRIDGE = "cam-bridge"
EDGE = "cam-edge"
LAST_EVENT = 330 * MIN


def session_events(seed: int = 7) -> list[dict]:
    """Devices with gaps shorter and longer than 30 minutes, each event with a delivery delay."""
    rng = random.Random(seed)
    out = []
    for d in range(5):
        device = f"cam-{d}"
        zip_code, unknown = (None, True) if d == 3 else (f"9410{d}", False)
        t = rng.randrange(0, 20 * MIN, 1000)
        while t < 300 * MIN:
            e = ev(f"{device}-{len(out)}", device, t, person=rng.random() < 0.4,
                   motion=rng.random() < 0.7, zip_code=zip_code, unknown=unknown)
            # Half the events arrive at once, half up to MAX_DELAY late: out of order.
            delay = rng.randrange(0, 5 * MIN, 1000) if rng.random() < 0.5 else \
                rng.randrange(20 * MIN, MAX_DELAY, 1000)
            e["delivery"] = t + delay
            out.append(e)
            r = rng.random()
            if r < 0.55:
                t += rng.randrange(1 * MIN, 10 * MIN, 1000)
            elif r < 0.75:
                t += rng.randrange(15 * MIN, 30 * MIN, 1000)
            else:
                t += rng.randrange(31 * MIN, 80 * MIN, 1000)

    def scripted(device, minute, delay_min, **kw):
        e = ev(f"{device}-{minute}", device, minute * MIN, **kw)
        e["delivery"] = (minute + delay_min) * MIN
        out.append(e)

    # Two sessions 35 minutes apart arrive in batch 2; an event in between arrives in batch 3
    # and bridges them (17 and 18 minutes from either side): they must merge into one.
    for minute in (100, 105, 140, 150):
        scripted(BRIDGE, minute, 0, person=True)
    scripted(BRIDGE, 122, 45, motion=True)
    # A session that ends exactly one gap before the final watermark (LAST_EVENT - 1 hour):
    # the no-data batch after the fourth delivery times it out in the state but writes nothing;
    # the fifth delivery, a single event that moves no watermark, closes it in the table.
    for minute in (200, 215, 240):
        scripted(EDGE, minute, 0, motion=True)
    scripted("cam-last", LAST_EVENT // MIN, 0)
    scripted("cam-tail", LAST_EVENT // MIN, CUTS[-1] // MIN - LAST_EVENT // MIN)
    return out


def delivery_batches(events: list[dict]) -> list[list[dict]]:
    batches = [[] for _ in range(len(CUTS) + 1)]
    for e in events:
        batches[sum(e["delivery"] >= c for c in CUTS)].append(e)
    return batches


@pytest.fixture(scope="module")
def sessionized(spark, tmp_path_factory):
    cfg = lakehouse_cfg(tmp_path_factory.mktemp("gold-sessions"))
    batches = delivery_batches(session_events())
    snapshots, runs = [], []
    for i, events in enumerate(batches):
        append_silver(spark, cfg, events, batch_id=i, frontier_ms=frontier_before(batches, i))
        runs.append(run_gold(spark, cfg, only={"sessions"}, no_data_batch=i >= len(batches) - 2))
        snapshots.append(read(spark, cfg, "gold", "device_sessions").collect())
    yield cfg, batches, snapshots, runs
    drop_names(spark)


def test_session_batches_are_out_of_order_within_the_watermark(sessionized):
    """The input itself: what makes the streaming sessions test meaningful."""
    _, batches, _, _ = sessionized
    assert all(batches)
    out_of_order = 0
    for k in range(1, len(batches)):
        seen = max(e["t"] for b in batches[:k] for e in b)
        oldest = min(e["t"] for e in batches[k])
        assert oldest > seen - WATERMARK_MS + 5 * MIN, f"batch {k} would have late events"
        out_of_order += sum(e["t"] < seen for e in batches[k])
    assert out_of_order >= 5
    gaps = Counter()
    for device in {e["device_id"] for b in batches for e in b}:
        times = sorted(e["t"] for b in batches for e in b if e["device_id"] == device)
        gaps.update("long" if b - a > GAP_MS else "short" for a, b in zip(times, times[1:]))
    assert gaps["long"] >= 8 and gaps["short"] >= 20, gaps


def test_streaming_sessions_equal_batch_sessions(spark, sessionized):
    cfg, batches, _, runs = sessionized
    assert all(data_batch(r[ONLY["sessions"]]) is not None for r in runs)
    gold = read(spark, cfg, "gold", "device_sessions")
    expected = S.batch_sessions(silver(spark, cfg), nest_sessions())
    assert_same_bag(bag(gold, SESSION_COLS), bag(expected, SESSION_COLS), "gold vs batch sessions")
    assert gold.where("status NOT IN ('open', 'closed')").count() == 0
    assert_one_row_per_key(gold, SPEC["sessions"].keys)
    assert gold.agg(F.sum("events")).first()[0] == sum(len(b) for b in batches)
    bad = gold.where(F.abs(F.col("duration_seconds")
                           - (F.unix_millis("session_end") - F.unix_millis("session_start")) / 1000) > 0.001)
    assert bad.count() == 0
    # The location is the device's (the unknown device keeps a null zip code).
    zips = {r.device_id: (r.zip_code, r.unknown_device) for r in gold.collect()}
    assert zips["cam-3"] == (None, True) and zips["cam-0"] == ("94100", False)


def test_bridging_event_merges_sessions_and_deletes_the_superseded_row(spark, sessionized):
    cfg, batches, snapshots, _ = sessionized
    bridge_batch = next(i for i, b in enumerate(batches) if any(e["event_id"] == f"{BRIDGE}-122" for e in b))
    before = [r for r in snapshots[bridge_batch - 1] if r.device_id == BRIDGE]
    after = [r for r in snapshots[bridge_batch] if r.device_id == BRIDGE]
    assert len(before) == 2, f"two separate sessions before the bridging event, got {before}"
    assert len(after) == 1, f"one merged session after it, got {after}"
    merged = after[0]
    assert merged.session_id == min(r.session_id for r in before)  # the smaller id survives
    assert merged.events == 5 and merged.person_events == 4 and merged.motion_events == 1
    assert (merged.session_end - merged.session_start) == timedelta(minutes=50)
    final = [r for r in snapshots[-1] if r.device_id == BRIDGE]
    assert [r.session_id for r in final] == [merged.session_id]


def test_session_status_follows_the_final_watermark(spark, sessionized):
    cfg, _, snapshots, _ = sessionized
    wm = final_watermark(cfg, ONLY["sessions"])
    assert wm == T0_MS + LAST_EVENT - WATERMARK_MS
    rows = bag(read(spark, cfg, "gold", "device_sessions"), ["device_id", "session_end", "status"])
    wrong = [(d, (end - T0_MS) / MIN, status) for (d, end, status) in rows
             if status != ("closed" if end + GAP_MS <= wm else "open")]
    assert not wrong, f"status wrong for (device, end minute, status) {wrong} at watermark minute {(wm - T0_MS) / MIN}"
    statuses = Counter(s for (_, _, s) in rows)
    assert statuses["closed"] >= 5 and statuses["open"] >= 1, statuses
    # The edge session ends within a gap of the final watermark: the last batch with data closed
    # it already, by the watermark Spark gave the batch after it (its closing watermark), so the
    # no-data batch that timed it out in the state store found nothing left to write.
    no_data = [b for b in committed_batches(cfg, ONLY["sessions"]) if read_nothing(cfg.checkpoint(ONLY["sessions"]), b)]
    assert no_data, "the fourth run was to end with a no-data batch"
    assert [r.status for r in snapshots[-2] if r.device_id == EDGE] == ["closed"]
    commits = [parse(v["userMetadata"]) for v in DeltaTable.forPath(
        spark, cfg.table_path("gold", "device_sessions")).history().collect() if v["userMetadata"]]
    assert not {c["batch_id"] for c in commits} & set(no_data), "a watermark-only batch wrote"
    assert max(c["closes_ms"] for c in commits) == wm


def feed_gold(spark, cfg, first: list[dict], *steps) -> list[dict]:
    """Silver's first commit, then the gold query (cfg: processing-time) through each step, each
    followed by processAllAvailable: a list of events is silver's next commit (its frontier the
    latest event time of the commits before it), a callable runs as it is. Returns the query's
    progress."""
    append_silver(spark, cfg, first)
    fed = [first]
    (query,) = start(spark, cfg, "gold")
    try:
        query.processAllAvailable()
        for step in steps:
            if callable(step):
                step()
            else:
                append_silver(spark, cfg, step, batch_id=len(fed), frontier_ms=max(e["t"] for b in fed for e in b))
                fed.append(step)
            query.processAllAvailable()
        return list(query.recentProgress)
    finally:
        query.stop()


def test_sessions_close_as_the_watermark_moves_within_one_run(spark, tmp_path):
    """In a run that goes on (processing-time), each batch's watermark reaches the sessions'
    state function: sessions the watermark passed are closed by the next batch, in the table
    and in the state. (The first batch of a run alone would not show it: its watermark comes
    from the checkpoint.)"""
    cfg = lakehouse_cfg(tmp_path, TRIGGER="processing-time", TRIGGER_INTERVAL="1 second")
    early = [ev(f"e{i}", d, i * MIN, person=True) for i, d in enumerate(["a1", "a2", "b1"])]
    late = [ev(f"l{i}", d, 5 * HOUR + i * MIN) for i, d in enumerate(["a1", "b2"])]
    try:
        progress = [p for p in feed_gold(spark, cfg, early, late, [ev("x", "b2", 5 * HOUR + 10 * MIN)])
                    if p["numInputRows"]]
        assert len(progress) == 3, [(p["batchId"], p["numInputRows"]) for p in progress]
        wm = batch_watermark_ms(cfg.checkpoint(GOLD), progress[-1]["batchId"])
        assert wm == T0_MS + 4 * HOUR + MIN        # the second batch's latest event - 1 hour
        rows = bag(read(spark, cfg, "gold", "device_sessions"), ["device_id", "session_end", "status"])
        assert {(d, s) for d, _, s in rows} == {("a1", "closed"), ("a2", "closed"), ("b1", "closed"),
                                                ("a1", "open"), ("b2", "open")}, rows
        state = progress[-1]["stateOperators"][0]["numRowsTotal"]
        assert state == 2, f"state holds the open sessions only (a1 and b2), got {state} rows"
    finally:
        drop_names(spark)


def test_a_watermark_only_batch_closes_what_it_passed_and_one_over_a_compaction_writes_nothing(spark, tmp_path):
    """When the feed goes quiet, Spark runs a batch that only moves the watermark. Gold does not
    wait for it: the batch before, the last with data, closed the sessions and finalized the
    windows that watermark passes (its closing watermark), so the quiet batch writes nothing.
    OPTIMIZE of silver is a commit that changes no data: gold runs a batch over it, which reads
    no row under the watermark already applied, so it writes nothing (no gold version, no gate,
    no MERGE) and books its accounting row."""
    cfg = lakehouse_cfg(tmp_path, TRIGGER="processing-time", TRIGGER_INTERVAL="1 second")
    silver_path = cfg.table_path("silver", "camera_events")
    checkpoint = cfg.checkpoint(GOLD)
    quiet_wm = T0_MS + 4 * HOUR            # b1's event - 1 hour

    def watermark_only() -> list[int]:
        return [b for b in committed_batches(cfg, GOLD)
                if read_nothing(checkpoint, b) and batch_watermark_ms(checkpoint, b) == quiet_wm]

    def wait_for_the_quiet_batch():
        deadline = time.monotonic() + 120
        while not watermark_only():
            assert time.monotonic() < deadline, "no watermark-only batch ran after the feed went quiet"
            time.sleep(0.2)

    def compact_silver():
        spark.sql(f"OPTIMIZE delta.`{silver_path}`")
        assert DeltaTable.forPath(spark, silver_path).history(1).first().operation == "OPTIMIZE"

    try:
        progress = feed_gold(spark, cfg, [ev(f"e{i}", d, i * MIN, person=True) for i, d in enumerate(["a1", "a2"])],
                             [ev("l0", "b1", 5 * HOUR)], wait_for_the_quiet_batch, compact_silver,
                             [ev("x", "b1", 5 * HOUR + 10 * MIN)])
        (quiet,) = watermark_only()
        compaction = [p["batchId"] for p in progress
                      if not p["numInputRows"] and not read_nothing(checkpoint, p["batchId"])]
        assert len(compaction) == 1, [(p["batchId"], p["numInputRows"]) for p in progress]
        assert batch_watermark_ms(checkpoint, compaction[0]) == quiet_wm

        def commit_of(table: str, batch_id: int):
            return [v for v in DeltaTable.forPath(spark, cfg.table_path("gold", table)).history().collect()
                    if v.userMetadata and parse(v.userMetadata)["batch_id"] == batch_id]

        def closing_at(table: str, closes_ms: int):
            return [v for v in DeltaTable.forPath(spark, cfg.table_path("gold", table)).history().collect()
                    if v.userMetadata and parse(v.userMetadata).get("closes_ms") == closes_ms]

        # The batch that read b1's event closed the early sessions and finalized their hour by
        # the watermark the quiet batch then had; the quiet batch wrote nothing.
        for table in ("zip_hourly_sightings", "device_activity", "device_sessions"):
            assert not commit_of(table, quiet), f"the watermark-only batch wrote gold.{table}"
        (sessions_at,) = closing_at("device_sessions", quiet_wm)
        (hours_at,) = closing_at("zip_hourly_sightings", quiet_wm)
        assert parse(sessions_at.userMetadata)["batch_id"] < quiet
        at = lambda t, v: spark.read.format("delta").option("versionAsOf", v).load(cfg.table_path("gold", t))  # noqa: E731
        sessions = bag(at("device_sessions", sessions_at.version), ["device_id", "status"])
        assert sessions == Counter({("a1", "closed"): 1, ("a2", "closed"): 1, ("b1", "open"): 1}), sessions
        hours = bag(at("zip_hourly_sightings", hours_at.version), ["window_start", "finalized"])
        assert hours[(T0_MS, True)] >= 1 and not hours[(T0_MS, False)], hours
        # The batch over the compaction wrote nothing and booked its row.
        for table in ("zip_hourly_sightings", "device_activity", "device_sessions"):
            assert not commit_of(table, compaction[0]), f"the batch over the compaction wrote gold.{table}"
        books = {r.batch_id: r.rows_written for r in spark.read.format("delta").load(
            cfg.table_path("ops", "batch_accounting")).where(f"query = '{GOLD}'").collect()}
        assert books.get(compaction[0]) == 0, books
    finally:
        drop_names(spark)


# --- merge_events and the state function, in plain pandas -----------------------------------

def events_frame(*times_ms, person=False, motion=False, zip_code="94105", unknown=False):
    """What session_inputs hands the state function for nest: measures already per event."""
    n = len(times_ms)
    return pd.DataFrame({"event_ms": list(times_ms), "person_events": [int(person)] * n,
                         "motion_events": [int(motion)] * n, "zip_code": [zip_code] * n,
                         "unknown_device": [unknown] * n})


def session(sid, start, end, events=1, person=0, motion=0, zip_code="94105"):
    return {"id": sid, "start": start, "end": end, "events": events,
            "sums": {"person_events": person, "motion_events": motion},
            "latest": {"zip_code": zip_code, "unknown_device": False}, "latest_at": end}


def flat(s: dict) -> dict:
    """A session dict with its sums and latest values at the top, as the assertions read it."""
    return {**s, "person": s["sums"]["person_events"], "motion": s["sums"]["motion_events"],
            "zip": s["latest"]["zip_code"]}


def merge(sessions, events):
    """merge_events with nest's declaration, its sessions flattened for the assertions."""
    merged, absorbed = S.merge_events(sessions, events, nest_sessions())
    return [flat(m) for m in merged], absorbed


def test_merge_events_groups_by_gap():
    merged, absorbed = merge([], events_frame(50 * MIN, 0, 10 * MIN, 10 * MIN + GAP_MS, person=True))
    assert absorbed == set()
    assert [(s["start"], s["end"], s["events"], s["person"]) for s in merged] == \
        [(0, 50 * MIN, 4, 4)]
    merged, _ = merge([], events_frame(0, GAP_MS + 1, motion=True))
    assert [(s["start"], s["end"], s["events"], s["motion"], s["id"]) for s in merged] == \
        [(0, 0, 1, 1, None), (GAP_MS + 1, GAP_MS + 1, 1, 1, None)]


def test_merge_events_extends_existing_sessions_both_ways():
    mine = [session("d@600000", 10 * MIN, 20 * MIN, events=3, person=1, zip_code="10001")]
    merged, absorbed = merge(mine, events_frame(0, 45 * MIN, person=True, zip_code="94105"))
    assert absorbed == set()
    assert len(merged) == 1
    s = merged[0]
    assert (s["id"], s["start"], s["end"], s["events"], s["person"]) == ("d@600000", 0, 45 * MIN, 5, 3)
    assert s["zip"] == "94105"  # the latest event's location
    assert mine[0]["start"] == 10 * MIN and mine[0]["events"] == 3  # inputs are not mutated


def test_merge_events_bridge_keeps_the_smallest_id_and_returns_absorbed():
    a = session("d@1000", 0, 10 * MIN, events=2, person=1)
    b = session("d@4200000", 70 * MIN, 80 * MIN, events=3, motion=2)
    c = session("d@0999", 120 * MIN, 125 * MIN, events=1)     # smaller id, later start
    merged, absorbed = merge([c, b, a], events_frame(40 * MIN, 100 * MIN))
    assert [(s["id"], s["start"], s["end"], s["events"], s["person"], s["motion"]) for s in merged] == \
        [("d@0999", 0, 125 * MIN, 8, 1, 2)]
    assert absorbed == {"d@1000", "d@4200000"}
    # An event that bridges nothing absorbs nothing.
    merged, absorbed = merge([b, a], events_frame(200 * MIN))
    assert [s["id"] for s in merged] == ["d@1000", "d@4200000", None] and absorbed == set()


def test_merge_events_latest_values_come_from_the_latest_event_the_batch_s_at_a_tie():
    # Out of order within the batch: the latest event gives the location, whatever its row.
    both = pd.concat([events_frame(30 * MIN, zip_code="30303"), events_frame(0, 10 * MIN, zip_code="10001")])
    merged, _ = merge([], both)
    assert [(s["end"], s["zip"], s["events"]) for s in merged] == [(30 * MIN, "30303", 3)]
    # At one time, the batch's last row wins, and the batch wins over the session it extends,
    # even when its events start before the session does.
    tie = pd.concat([events_frame(5 * MIN, 20 * MIN, zip_code="a"), events_frame(20 * MIN, zip_code="b")])
    merged, _ = merge([session("d@600000", 10 * MIN, 20 * MIN, zip_code="old")], tie)
    assert [(s["id"], s["start"], s["zip"], s["events"]) for s in merged] == [("d@600000", 5 * MIN, "b", 4)]
    # A null measure counts as 0, as a null summed in SQL adds nothing.
    nulls = events_frame(0, MIN, person=True).astype({"person_events": "float64"})
    nulls.loc[0, "person_events"] = float("nan")
    assert [s["person"] for s in merge([], nulls)[0]] == [1]


class FakeState:
    """The GroupState surface make_session_updater uses."""

    def __init__(self, sessions=None, watermark=0, timed_out=False):
        self.value = None if sessions is None else (json.dumps(sessions),)
        self.watermark, self.hasTimedOut, self.timeout = watermark, timed_out, None

    @property
    def exists(self):
        return self.value is not None

    @property
    def get(self):
        return self.value

    def getCurrentWatermarkMs(self):
        return self.watermark

    def update(self, value):
        self.value = value

    def remove(self):
        self.value = None

    def setTimeoutTimestamp(self, ts):
        self.timeout = ts


def run_updater(state, *frames):
    out = list(S.make_session_updater(nest_sessions())(("d",), iter(frames), state))
    return pd.concat(out) if out else pd.DataFrame(columns=nest_sessions().columns)


def test_session_updater_emits_open_closed_and_merged():
    state = FakeState([session("d@1000", 0, 10 * MIN), session("d@4200000", 70 * MIN, 80 * MIN)],
                      watermark=5 * MIN)
    out = run_updater(state, events_frame(40 * MIN), events_frame(200 * MIN))
    got = sorted(zip(out.session_id, out.status, out.events))
    assert got == [("d@1000", "open", 3), (f"d@{200 * MIN}", "open", 1), ("d@4200000", "merged", 0)]
    assert state.exists and state.timeout is not None
    # Spark fires an event-time timeout once the watermark is strictly past it; the session
    # must close as soon as the watermark reaches end + gap, as a batch with data would close it.
    end = 80 * MIN
    assert state.timeout < end + GAP_MS
    state.watermark, state.hasTimedOut = end + GAP_MS, True
    out = run_updater(state)
    assert sorted(zip(out.session_id, out.status)) == [("d@1000", "closed"), (f"d@{200 * MIN}", "open")]
    state.watermark = 200 * MIN + GAP_MS
    out = run_updater(state)
    assert list(zip(out.session_id, out.status)) == [(f"d@{200 * MIN}", "closed")]
    assert not state.exists


# --- quality gate, Kafka stats, missing silver ------------------------------------------------

def small_silver(spark, cfg):
    events = [ev(f"q{i}", "a1", i * 7 * MIN, person=i % 2 == 0) for i in range(12)]
    events += [ev("u0", "u1", 15 * MIN, person=True, zip_code=None, unknown=True)]
    append_silver(spark, cfg, events)
    return events


def test_quality_gate_fail_stops_the_batch_and_resumes_after_the_fix(spark, cfg, tmp_path):
    small_silver(spark, cfg)
    strict = tmp_path / "strict.yaml"
    strict.write_text("""\
suite: gold-strict
tables:
  gold.zip_hourly_sightings:
    - name: sightings_non_negative
      expectation: expect_column_values_to_be_between
      kwargs: {column: sightings, min_value: 1000}
      policy: fail
    - name: window_is_one_hour
      expectation: expect_column_values_to_be_between
      kwargs: {column: window_seconds, min_value: 3600, max_value: 3600}
      policy: warn
""")
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as failed:
        run_gold(spark, cfg, only={"sightings"}, suites=load_suites(strict))
    message = str(failed.value)
    assert "quality gate failed: query 'gold_sightings', batch 0" in message
    assert "expectation 'sightings_non_negative'" in message
    dq = read(spark, cfg, "ops", "dq_results").where("query = 'gold_sightings'").collect()
    constraints = {(0, f"constraint:{c.name}", True, "fail") for c in SPEC["sightings"].checks()}
    assert {(r.batch_id, r.expectation, r.success, r.policy) for r in dq} == {
        (0, "sightings_non_negative", False, "fail"), (0, "window_is_one_hour", True, "warn"), *constraints}
    bad = next(r for r in dq if r.expectation == "sightings_non_negative")
    assert bad.unexpected_count == bad.element_count > 0
    assert read(spark, cfg, "gold", "zip_hourly_sightings").count() == 0  # nothing merged
    assert committed_batches(cfg, ONLY["sightings"]) == []

    # With the rule fixed, the same batch 0 is replayed and goes through.
    runs = run_gold(spark, cfg, only={"sightings"})
    assert data_batch(runs[ONLY["sightings"]]) == 0
    assert_dicts_equal(gold_sightings(spark, cfg), expected_sightings(silver_events(spark, cfg)),
                       "sightings after the replay")
    dq = read(spark, cfg, "ops", "dq_results").where("query = 'gold_sightings' AND batch_id = 0")
    assert dq.where("NOT success").count() == 1           # the failed attempt stays, for audit
    assert dq.where("success AND suite = 'gold'").count() == 3 + len(constraints)


@pytest.mark.kafka
def test_sightings_published_to_compacted_kafka_topic(spark, env, kafka_broker, tmp_path):
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    topic = f"nest-camera-stats-{uuid.uuid4().hex[:8]}"
    cfg = load_config(env={**env, "KAFKA_BOOTSTRAP": kafka_broker.bootstrap,
                           "LAKEHOUSE__GOLD__STATS_TO_KAFKA": "true",
                           "LAKEHOUSE__KAFKA__TOPICS__STATS": topic})
    try:
        small_silver(spark, cfg)
        run_gold(spark, cfg, only={"sightings"}, no_data_batch=False)
        iso = "yyyy-MM-dd'T'HH:mm:ss'Z'"
        gold = {(r.zip_code, r.ws, r.we): r.sightings
                for r in read(spark, cfg, "gold", "zip_hourly_sightings").select(
                    "zip_code", F.date_format("window_start", iso).alias("ws"),
                    F.date_format("window_end", iso).alias("we"), "sightings").collect()}
        assert len(gold) >= 3

        admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
        resource = ConfigResource(ResourceType.TOPIC, topic)
        configs = admin.describe_configs([resource])[resource].result(30)
        assert configs["cleanup.policy"].value == "compact"
        partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
        assert len(partitions) == cfg.kafka.topic_partitions

        consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap,
                             "group.id": f"test-{uuid.uuid4().hex}", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # 0 = from the start
            latest, deadline = {}, time.monotonic() + 120
            while time.monotonic() < deadline and len(latest) < len(gold):
                msg = consumer.poll(1.0)
                if msg is None or msg.error():
                    continue
                key = json.loads(msg.key())
                assert set(key) == {"zip_code", "window_start", "window_end"}, key
                latest[(key["zip_code"], key["window_start"], key["window_end"])] = int(msg.value())
        finally:
            consumer.close()
        assert latest == gold
    finally:
        drop_names(spark)


def test_missing_silver_is_a_clear_error(spark, cfg):
    with pytest.raises(JobError) as err:
        start(spark, cfg, "gold")
    assert "make run-silver" in str(err.value)
    assert cfg.table_path("silver", "camera_events") in str(err.value)
    assert not Path(cfg.table_path("gold", "zip_hourly_sightings")).exists()
