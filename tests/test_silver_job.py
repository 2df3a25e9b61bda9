"""Silver as a real streaming query: bronze.events (Delta) -> silver.camera_events, quarantine,
ops.dq_results and ops.batch_accounting, with checkpoints under cfg.checkpoint_root.

Bronze rows are appended to the bronze Delta table directly (no bronze job) so each test says
exactly what every micro-batch holds; an append followed by another available-now run of
silver (started through `pipeline.runner.start`) is a new micro-batch on the same checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException

from common import accounting
from common import delta as common_delta
from common.config import load_config
from common.delta import ensure_table
from common.lineage import read_nothing
from common.quality import load_suites
from tests.support.bronze_rows import bronze_row as support_bronze_row
from common.schemas import BRONZE_EVENTS, BRONZE_PARTITION
from common.spark import NO_DATA_BATCHES
from pipeline.runner import start
from common import outputs
from silver import transform as T
from silver.job import QUERY, SilverBatch
from silver.locations import load
from silver.locations_file import LocationsFileError

TABLES = load_config(env={}).tables    # the default (nest) profile's tables, by layer

INGEST = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
KNOWN = [("cam-0001", "02108", "Boston", "MA"), ("cam-0002", "94105", "San Francisco", "CA"),
         ("cam-0003", "10001", "New York", "NY"), ("cam-0004", "60601", "Chicago", "IL")]
SUITE_RULES = ["event_id_present", "device_id_well_formed", "event_ends_after_start",
               "event_duration_plausible", "device_location_known"]


# --- helpers -------------------------------------------------------------------------------

def at(hh_mm: str, seconds: float = 0) -> str:
    """An ISO instant on the test day, 'HH:MM' plus seconds."""
    t = datetime.fromisoformat(f"2026-11-01T{hh_mm}:00+00:00") + timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def camera(device_id: str, start: str, end: str | None = None, **last_event) -> dict:
    """A camera whose event starts at `start` (ISO text) and lasts 30 s unless `end` is given."""
    end = end or at(start[11:16], float(start[17:23]) + 30)
    last = {"has_sound": False, "has_motion": True, "has_person": False,
            "start_time": start, "end_time": end, **last_event}
    return {"device_id": device_id, "name": f"Room {device_id}", "is_online": True, "last_event": last}


def record(*cameras: dict) -> str:
    return json.dumps({"devices": {"cameras": {c["device_id"]: c for c in cameras}},
                       "metadata": {"access_token": "c.abc", "client_version": 1}})


def bronze_row(raw: str | bytes | None, line: int, file: str, ingest: datetime = INGEST) -> tuple:
    return support_bronze_row(raw, line, file, ingest)


def append_bronze(spark, cfg, raws: list[str | None], file: str | None = None) -> str:
    """Append one file's lines to bronze.events (one Delta commit); returns the file path."""
    file = file or f"file:///landing/nest/part-{uuid.uuid4().hex[:8]}.jsonl"
    path = ensure_table(spark, cfg, "bronze", "events", BRONZE_EVENTS, BRONZE_PARTITION)
    rows = [bronze_row(raw, i + 1, file) for i, raw in enumerate(raws)]
    spark.createDataFrame(rows, BRONZE_EVENTS).write.format("delta").mode("append").save(path)
    return file


def write_locations(path: Path, rows=KNOWN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("device_id,zip_code,city,state\n" + "".join(",".join(r) + "\n" for r in rows))
    return path


def run_silver(spark, cfg, suite=None, no_data_batch: bool | None = None) -> list[int]:
    """One available-now run of the silver query; returns the ids of the micro-batches it
    executed. Raises StreamingQueryException if the query failed. `no_data_batch`: whether the
    run ends with a watermark-only batch (default: conf streaming.no_data_batches, on); the
    query copies the session conf when it starts."""
    previous = spark.conf.get(NO_DATA_BATCHES)
    if no_data_batch is not None:
        spark.conf.set(NO_DATA_BATCHES, str(no_data_batch).lower())
    try:
        query, = start(spark, cfg, "silver", suite=suite)
    finally:
        spark.conf.set(NO_DATA_BATCHES, previous)
    query.awaitTermination()
    return [p["batchId"] for p in accounting.executed_batches(query)]


def table(spark, cfg, layer: str, name: str):
    return spark.read.format("delta").load(cfg.table_path(layer, name))


def books_by_batch(spark, cfg) -> dict[int, dict]:
    rows = table(spark, cfg, "ops", "batch_accounting").where("layer = 'silver'").collect()
    by_batch = {r.batch_id: r.asDict() for r in rows}
    assert len(by_batch) == len(rows), "more than one accounting row for a batch"
    return by_batch


def assert_identities(books: dict[int, dict]) -> None:
    assert books, "no accounting rows"
    for batch_id, b in books.items():
        assert b["records_in"] == b["records_parsed"] + b["records_quarantined_unparsed"], (batch_id, b)
        assert b["events_parsed"] == (b["events_written"] + b["events_quarantined"]
                                      + b["duplicates_dropped"] + b["late_dropped"]), (batch_id, b)


def totals(books: dict[int, dict], batch_ids) -> dict[str, int]:
    """Sums over the batches' rows (a no-data batch books no row: it counted nothing; that every
    batch that read rows has one is test_accounting_adds_up_for_every_batch's)."""
    keys = ("records_in", "records_parsed", "records_quarantined_unparsed", "events_parsed",
            "events_written", "events_quarantined", "duplicates_dropped", "late_dropped")
    return {k: sum(books[b][k] for b in batch_ids if b in books) for k in keys}


def event_id(spark, cfg, device_id: str, start: str, end: str) -> str:
    """The id silver gives an event, computed by the transform itself on a one-row batch."""
    raw = record(camera(device_id, start, end))
    df = spark.createDataFrame([bronze_row(raw, 1, "file:///x")], BRONZE_EVENTS)
    return T.parse_events(df, cfg.silver.min_event_time, cfg.silver.max_future.seconds, cfg.profile).first().event_id


def snapshot(spark, cfg) -> dict:
    """Contents and Delta versions of what a silver batch writes."""
    out = {}
    for layer, name, key in (("silver", "camera_events", "event_id, silver_batch_id"),
                             ("silver", "quarantine", "raw, batch_id"),
                             ("ops", "dq_results", "batch_id, expectation, success")):
        path = cfg.table_path(layer, name)
        rows = table(spark, cfg, layer, name).selectExpr(*key.split(", ")).collect()
        out[name] = (sorted(map(tuple, rows), key=repr),
                     DeltaTable.forPath(spark, path).history(1).first().version)
    return out


def write_suite(path: Path, rules: list[dict]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"suite": "test_suite", "table": "silver.camera_events",
                                    "row_id": "event_id", "expectations": rules}))
    return path


@pytest.fixture
def lake(spark, cfg):
    """The test's lakehouse with device locations for cam-0001..cam-0004."""
    write_locations(cfg.locations_csv)
    return cfg


# --- one messy stream, three available-now runs, looked at from several sides --------------

E = camera("cam-0001", at("10:00"))
BATCH_1 = [
    record(E, camera("cam-0002", at("10:00"))),
    record(E),                                                      # duplicate within the batch
    "",
    "{broken",
    record(camera("cam-0004", at("10:05"), has_person="maybe"), camera("cam-0003", at("10:04"))),
    record(camera("cam-0003", at("10:10"), at("10:09")),             # ends before it starts
           camera("cam-0004", at("10:20"), "2026-11-03T10:20:00.000Z")),   # lasts two days
    record(camera("cam 0005", at("10:30"))),                        # malformed device id
    record(camera("cam-x001", at("10:40"))),                        # device without a location
    json.dumps({"devices": {}}),
]
# Batch 1 moves event time to 10:40, so the 2 hour watermark reaches 08:40.
BATCH_2 = [
    record(E, camera("cam-0002", at("13:00"))),                     # E again, a batch later
    record(camera("cam-0004", at("07:40"))),                        # 3 h behind: late
    record(camera("cam-0003", at("09:00"))),                        # 1 h 40 behind: in time
    "[]",
    None,
]
# bronze line -> reasons of its quarantine rows (one per row)
QUARANTINED_1 = {3: [["empty_record"]], 4: [["malformed_json"]], 5: [["wrong_type:has_person"]],
                 6: [["dq:event_duration_plausible"],
                     ["dq:event_duration_plausible", "dq:event_ends_after_start"]],
                 7: [["dq:device_id_well_formed"]], 9: [["missing_cameras"]]}
QUARANTINED_2 = {4: [["malformed_json"]], 5: [["empty_record"]]}


def isolated_config(root: Path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")}
    return load_config(env={**env, "LAKEHOUSE_ROOT": str(root / "lakehouse")})


class Said(logging.Handler):
    """What the accounting said during a run, at every level."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def stream(spark, tmp_path_factory):
    """BATCH_1, an available-now silver run, BATCH_2, another run on the same checkpoint, which
    ends with a watermark-only batch (the first is told to run none)."""
    cfg = isolated_config(tmp_path_factory.mktemp("silver-stream"))
    write_locations(cfg.locations_csv)
    files = [append_bronze(spark, cfg, BATCH_1)]
    bronze_version = DeltaTable.forPath(spark, cfg.table_path("bronze", "events")).history(1).first().version
    runs = [run_silver(spark, cfg, no_data_batch=False)]
    files.append(append_bronze(spark, cfg, BATCH_2))
    said, books_log = Said(), logging.getLogger("common.accounting")
    level = books_log.level
    books_log.addHandler(said)
    books_log.setLevel(logging.INFO)
    try:
        runs.append(run_silver(spark, cfg, no_data_batch=True))
    finally:
        books_log.removeHandler(said)
        books_log.setLevel(level)
    yield SimpleNamespace(
        cfg=cfg, files=files, runs=runs, bronze_version=bronze_version, said=said.lines,
        silver=table(spark, cfg, "silver", "camera_events")
        .selectExpr("*", "date_format(start_time, 'HH:mm') AS start_hm").collect(),
        quarantine=table(spark, cfg, "silver", "quarantine").collect(),
        dq=table(spark, cfg, "ops", "dq_results").collect(),
        late=table(spark, cfg, "silver", "late_events").collect(),
        books=books_by_batch(spark, cfg))
    for layer, name in [(layer, name) for layer, names in TABLES.items() for name in names]:
        spark.sql(f"DROP TABLE IF EXISTS {layer}.{name}")


def test_a_duplicate_is_dropped_within_and_across_micro_batches(spark, stream):
    e_id = event_id(spark, stream.cfg, "cam-0001", E["last_event"]["start_time"], E["last_event"]["end_time"])
    ids = [r.event_id for r in stream.silver]
    assert len(ids) == len(set(ids)) == 6
    assert ids.count(e_id) == 1
    kept = next(r for r in stream.silver if r.event_id == e_id)
    assert (kept.bronze_file_path, kept.bronze_line_number) == (stream.files[0], 1)  # first sighting wins
    first, second = stream.runs
    assert totals(stream.books, first)["duplicates_dropped"] == 1
    assert totals(stream.books, second)["duplicates_dropped"] == 1


def test_an_event_behind_the_watermark_is_kept_apart_and_counted_late(spark, stream):
    starts = {(r.device_id, r.start_hm) for r in stream.silver}
    assert ("cam-0003", "09:00") in starts
    assert not any(r.device_id == "cam-0004" and r.bronze_file_path == stream.files[1] for r in stream.silver)
    assert not any(r.bronze_file_path == stream.files[1] and r.bronze_line_number == 2
                   for r in stream.quarantine)                       # late is not quarantined
    first, second = stream.runs
    assert totals(stream.books, first)["late_dropped"] == 0
    assert totals(stream.books, second)["late_dropped"] == 1
    # ... but kept in silver.late_events: its silver row (location joined at its time, its
    # lineage), the batch that found it and the watermark it missed (10:40 - 2 h).
    [kept] = stream.late
    found_in = next(b for b in second if stream.books.get(b, {}).get("late_dropped"))
    assert (kept.device_id, kept.bronze_file_path, kept.bronze_line_number) == ("cam-0004", stream.files[1], 2)
    assert (kept.late_for, kept.found_by_query, kept.found_in_batch) == ("silver", QUERY, found_in)
    edge = max(r.event_time for r in stream.silver if r.bronze_file_path == stream.files[0])
    assert kept.found_watermark == edge - timedelta(hours=2)
    assert kept.event_time == edge - timedelta(hours=3)
    assert (kept.zip_code, kept.unknown_device, kept.silver_batch_id) == ("60601", False, found_in)
    assert kept.backfilled_by is None
    # ... and the batch says so, with what folds it into gold.
    assert f"{QUERY} batch {found_in}: 1 late event, behind silver's watermark, kept in silver.late_events; " \
           "`lakehouse backfill` (make backfill) folds them into gold" in stream.said, stream.said
    # `make status` lists it as waiting for a backfill, until one folds it in.
    from common import late
    from tools.status import render

    waiting = late.pending(spark, stream.cfg)
    assert waiting == {"events": 1, "late_for": {"silver": 1}, "first_event_time": kept.event_time,
                       "last_event_time": kept.event_time}
    text = render([{"query": QUERY, "state": "stopped"}], [], waiting, late.folded_by(stream.cfg))
    assert "late events not yet in gold (silver.late_events): 1 (1 behind silver's watermark)" in text, text


def test_rows_carry_the_event_time_frontier_silver_had_reached_before_their_batch(stream):
    first = [r for r in stream.silver if r.bronze_file_path == stream.files[0]]
    second = [r for r in stream.silver if r.bronze_file_path == stream.files[1]]
    assert first and second
    assert {r.silver_frontier_time for r in first} == {None}          # nothing read before them
    # The watermark is the latest event time read minus the dedup delay; the frontier adds it back.
    assert {r.silver_frontier_time for r in second} == {max(r.event_time for r in first)}


def test_delta_keeps_file_statistics_only_for_the_columns_reads_filter_on(spark, stream):
    """Delta's min/max statistics of silver's files are for the id, the event time, the columns
    gold groups by and the lineage positions: the ones reads skip files by. A name or a boolean
    costs the write its statistics for nothing."""
    path = stream.cfg.table_path("silver", "camera_events")
    wanted = T.stats_columns(stream.cfg.profile, spark.read.format("delta").load(path).schema)
    assert {"event_id", "event_time", "device_id", "zip_code", "silver_batch_id", "bronze_file_path"} <= set(wanted)
    assert not {"name", "has_person", "unknown_device", "_rescued_data", "event_date"} & set(wanted)
    assert common_delta.table_properties(spark, path)["delta.dataSkippingStatsColumns"] == ",".join(wanted)
    actions = [json.loads(line) for log in sorted(Path(path, "_delta_log").glob("*.json"))
               for line in log.read_text().splitlines()]
    adds = [a["add"] for a in actions if "add" in a]
    assert adds
    for add in adds:
        stats = json.loads(add["stats"])
        assert stats["numRecords"] > 0
        assert set(stats["minValues"]) <= set(wanted) and {"event_id", "event_time"} <= set(stats["minValues"])


def test_accounting_adds_up_for_every_batch(stream):
    first, second = stream.runs
    assert first and second and set(first).isdisjoint(second)
    # A row for every batch that read rows; a watermark-only no-data batch books nothing. The
    # first run ends without one, the second with one.
    no_data = [b for b in first + second if read_nothing(stream.cfg.checkpoint(QUERY), b)]
    assert no_data and set(no_data) <= set(second) and second[-1] in no_data
    read_rows = [b for b in first + second if b not in no_data]
    assert sorted(stream.books) == sorted(read_rows)
    assert_identities(stream.books)
    assert totals(stream.books, first) == {
        "records_in": 9, "records_parsed": 6, "records_quarantined_unparsed": 3, "events_parsed": 9,
        "events_written": 4, "events_quarantined": 4, "duplicates_dropped": 1, "late_dropped": 0}
    assert totals(stream.books, second) == {
        "records_in": 5, "records_parsed": 3, "records_quarantined_unparsed": 2, "events_parsed": 4,
        "events_written": 2, "events_quarantined": 0, "duplicates_dropped": 1, "late_dropped": 1}
    for b in stream.books.values():
        assert b["rows_written"] == b["events_written"] and b["batch_ms"] is not None
    # The books agree with the tables.
    assert len(stream.silver) == 6
    assert len(stream.quarantine) == 9
    for run in stream.runs:
        for batch in run:
            written = sum(r.silver_batch_id == batch for r in stream.silver)
            assert (stream.books[batch]["events_written"] if batch in stream.books else 0) == written


def test_rejects_and_quarantine_rules_land_in_quarantine_with_their_reasons(stream):
    got = {}
    for r in stream.quarantine:
        got.setdefault((r.bronze_file_path, r.bronze_line_number), []).append(list(r.reasons))
    expected = {(stream.files[i], line): reasons
                for i, lines in enumerate((QUARANTINED_1, QUARANTINED_2)) for line, reasons in lines.items()}
    assert {k: sorted(v) for k, v in got.items()} == expected
    by_device = {r.device_id: r for r in stream.quarantine if r.reasons[0].startswith("dq:")}
    assert sorted(by_device) == ["cam 0005", "cam-0003", "cam-0004"]
    for r in by_device.values():                     # quarantined events keep their identity
        assert r.event_id and r.batch_id == min(stream.runs[0])
    # A record's bytes are on exactly one of its quarantine rows (its first element there).
    by_line = {}
    for r in stream.quarantine:
        if r.bronze_file_path == stream.files[0]:
            by_line.setdefault(r.bronze_line_number, []).append(r.raw)
    for line, raws in by_line.items():
        if BATCH_1[line - 1]:
            assert [x for x in raws if x is not None] == [BATCH_1[line - 1]], line
    assert not {r.event_id for r in by_device.values()} & {r.event_id for r in stream.silver}
    # The warn rule on locations keeps its rows: the unknown device is in silver, flagged.
    unknown = next(r for r in stream.silver if r.device_id == "cam-x001")
    assert (unknown.zip_code, unknown.unknown_device) == (None, True)
    boston = next(r for r in stream.silver if r.device_id == "cam-0001")
    assert (boston.zip_code, boston.city, boston.unknown_device) == ("02108", "Boston", False)


def test_dq_results_hold_one_row_per_expectation_per_batch_with_rows(stream):
    batches = [b for run in stream.runs for b in run]
    with_rows = [b for b in batches if b in stream.books and stream.books[b]["rows_in"]]
    assert sorted((r.batch_id, r.expectation) for r in stream.dq) == \
        sorted((b, name) for b in with_rows for name in SUITE_RULES)
    # The batches that only moved the watermark were not gated and recorded no result.
    assert len(with_rows) == 2 and len(batches) > len(with_rows)
    first = {r.expectation: r for r in stream.dq if r.batch_id == min(stream.runs[0])}
    assert {name: (r.policy, r.success) for name, r in first.items()} == {
        "event_id_present": ("fail", True), "device_id_well_formed": ("quarantine", False),
        "event_ends_after_start": ("quarantine", False), "event_duration_plausible": ("quarantine", False),
        "device_location_known": ("warn", False)}
    assert first["event_duration_plausible"].unexpected_count == 2
    assert all(r.element_count == 7 and r.query == QUERY and r.table_name == "silver.camera_events"
               and r.suite == "silver_camera_events" for r in first.values())


def test_a_retried_micro_batch_writes_nothing_twice(spark, stream, monkeypatch):
    cfg = stream.cfg
    before = snapshot(spark, cfg)
    appends = []

    def spy(df, path, app_id, version, metadata=None, replay=False):
        appends.append((Path(path).name, app_id.rsplit("-", 1)[-1], version))
        assert metadata["batch_id"] == version and metadata["upstream"]["table"] == "bronze.events"
        assert replay, "a batch the checkpoint logged before this run is a replay"
        return real_append(df, path, app_id, version, metadata, replay)

    real_append = common_delta.idempotent_append
    monkeypatch.setattr(outputs, "idempotent_append", spy)     # the declared appends
    monkeypatch.setattr(common_delta, "idempotent_append", spy)    # the quality gate's ops writes

    # The foreachBatch body as the silver flow builds it, fed batch 0 again (bronze as it was then),
    # as Spark does when a batch is retried after a crash between the writes and the commit.
    # Outside a running query there are no Spark metrics to account; the replayed accounting
    # row is covered by test_a_batch_replayed_after_a_crash_before_its_commit_is_accounted_once.
    suite = load_suites(cfg.silver.expectations)["silver.camera_events"]
    body = SilverBatch(spark, cfg, suite, SimpleNamespace(record=lambda *_, **__: None, late_dropped=lambda *_: 0))
    bronze = (spark.read.format("delta").option("versionAsOf", stream.bronze_version)
              .load(cfg.table_path("bronze", "events")))
    batch = T.deduplicate(T.parse_events(bronze, cfg.silver.min_event_time, cfg.silver.max_future.seconds, cfg.profile),
                          cfg.silver.dedup_watermark.spark(), cfg.profile)
    data_batch = min(stream.runs[0])
    body(batch, data_batch)
    body(batch, data_batch)

    # Every write was attempted again, under the same key, and found its first commit.
    assert sorted(set(appends)) == [("camera_events", "events", data_batch),
                                    ("dq_results", "dq", data_batch),
                                    ("quarantine", "quarantine", data_batch)]
    assert len(appends) == 6
    assert snapshot(spark, cfg) == before


def accounting_commit_mtimes(cfg, query: str) -> dict[int, int]:
    """batch id -> mtime (ns) of the ops.batch_accounting commit that recorded it."""
    log = Path(cfg.table_path("ops", "batch_accounting")) / "_delta_log"
    found = {}
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            lineage = json.loads(info["userMetadata"]) if info and info.get("userMetadata") else None
            if lineage and lineage["query"] == query:
                found[lineage["batch_id"]] = commit.stat().st_mtime_ns
    return found


def test_a_batch_replayed_after_a_crash_before_its_commit_is_accounted_once(spark, lake):
    """A kill can land after foreachBatch wrote everything but before Spark's commit-log entry:
    the batch runs again on restart. A kill just after that entry cannot lose the batch's
    accounting either, because the row (with Spark's drop counts) is written inside the batch."""
    cfg = lake
    append_bronze(spark, cfg, BATCH_1)
    run_silver(spark, cfg)
    append_bronze(spark, cfg, BATCH_2)
    second = run_silver(spark, cfg)
    before = books_by_batch(spark, cfg)
    commits = Path(cfg.checkpoint(QUERY)) / "commits"
    recorded = accounting_commit_mtimes(cfg, QUERY)
    assert sorted(recorded) == sorted(before)
    for batch_id, mtime in recorded.items():     # each row was committed before its batch was
        assert mtime <= (commits / str(batch_id)).stat().st_mtime_ns, batch_id

    # The crash, in the batch that read BATCH_2: its commit-log entry never landed, nor did the
    # no-data batch that followed it (watermark moved) get planned.
    data = min(second)
    assert before[data]["duplicates_dropped"] == 1 and before[data]["late_dropped"] == 1
    for batch_id in second:
        for log in ("commits",) + (("offsets",) if batch_id > data else ()):
            for name in (str(batch_id), f".{batch_id}.crc"):
                (commits.parent / log / name).unlink(missing_ok=True)
    replayed = run_silver(spark, cfg)
    assert replayed[0] == data, "the uncommitted batch was not run again"

    after = books_by_batch(spark, cfg)           # asserts one row per batch
    assert after == before
    assert (commits / str(data)).exists()
    assert_identities(after)


# --- quality gate --------------------------------------------------------------------------

def strict_rules(regex: str) -> list[dict]:
    return [{"name": "event_id_present", "expectation": "expect_column_values_to_not_be_null",
             "kwargs": {"column": "event_id"}, "policy": "fail"},
            {"name": "registered_cameras_only", "expectation": "expect_column_values_to_match_regex",
             "kwargs": {"column": "device_id", "regex": regex}, "policy": "fail"}]


def test_a_fail_rule_stops_the_query_and_the_batch_is_replayed_after_the_fix(spark, lake, tmp_path):
    cfg = lake
    strict = load_suites(write_suite(tmp_path / "strict.yaml", strict_rules("^cam-[0-9]{4}$")))
    fixed = load_suites(write_suite(tmp_path / "fixed.yaml", strict_rules("^cam-x?[0-9]{3,4}$")))
    strict, fixed = strict["silver.camera_events"], fixed["silver.camera_events"]

    append_bronze(spark, cfg, [record(camera("cam-0001", at("10:00")), camera("cam-x001", at("10:06"))),
                               "{broken",
                               record(camera("cam-0002", at("10:07")))])
    with pytest.raises(StreamingQueryException) as failure:
        run_silver(spark, cfg, strict)
    message = str(failure.value)
    assert "quality gate failed" in message
    assert "registered_cameras_only" in message
    assert "batch 0," in message
    assert "cam-x001" in message                              # a sample of the offending rows
    assert "1 of 3 rows unexpected" in message
    # Nothing of the failed batch was written, not even its rejects.
    assert table(spark, cfg, "silver", "camera_events").count() == 0
    assert table(spark, cfg, "silver", "quarantine").count() == 0
    assert not (Path(cfg.checkpoint(QUERY)) / "commits" / "0").exists()

    # More data arrives while the job is down; then the rule is fixed and the job restarted.
    append_bronze(spark, cfg, [record(camera("cam-0003", at("10:08")))])
    resumed = run_silver(spark, cfg, fixed)
    assert 0 in resumed

    silver = table(spark, cfg, "silver", "camera_events").collect()
    assert sorted(r.device_id for r in silver) == ["cam-0001", "cam-0002", "cam-0003", "cam-x001"]
    assert len({r.event_id for r in silver}) == 4
    # The failed batch itself was replayed (same batch id, same rows), not folded into a new one.
    assert {r.device_id for r in silver if r.silver_batch_id == 0} == {"cam-0001", "cam-0002", "cam-x001"}
    assert [list(r.reasons) for r in table(spark, cfg, "silver", "quarantine").collect()] == [["malformed_json"]]

    dq = table(spark, cfg, "ops", "dq_results").where("batch_id = 0")
    attempts = sorted((r.expectation, r.success) for r in dq.collect())
    assert attempts == [("event_id_present", True), ("event_id_present", True),
                        ("registered_cameras_only", False), ("registered_cameras_only", True)]
    books = books_by_batch(spark, cfg)
    assert_identities(books)
    assert totals(books, resumed)["events_written"] == 4


# --- device locations ----------------------------------------------------------------------

def test_a_first_load_creates_the_table_in_one_commit_and_a_reload_replaces_its_rows(spark, cfg, tmp_path):
    path = cfg.table_path("silver", "device_locations")
    keyless = write_locations(tmp_path / "keyless.csv", [*KNOWN, ("", "99999", "Nowhere", "NA")])
    with pytest.raises(LocationsFileError, match=f"{keyless} line 6: empty device_id"):
        load(spark, cfg, keyless)
    assert not DeltaTable.isDeltaTable(spark, path)      # a bad file changes nothing
    first = write_locations(tmp_path / "first.csv")
    assert load(spark, cfg, first) == 0
    assert load(spark, cfg, first) is None               # nothing changes: no version
    history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE")]
    assert json.loads(history[0].userMetadata)["made_by"] == f"locations load {first}"
    # The lakehouse's retention and compaction properties come with that one commit.
    props = common_delta.table_properties(spark, path)
    assert {k: props.get(k) for k in common_delta.retention_properties(cfg)} == common_delta.retention_properties(cfg)

    # An undated file says where devices always were: a second one replaces the first.
    assert load(spark, cfg, write_locations(tmp_path / "second.csv", KNOWN[:2])) == 1
    history = DeltaTable.forPath(spark, path).history().orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE"), (1, "WRITE")]
    assert sorted(r.device_id for r in spark.read.format("delta").load(path).collect()) == [k for k, *_ in KNOWN[:2]]
    assert DeltaTable.forPath(spark, path).history(1).first().userMetadata.count("second.csv") == 1


def test_a_locations_update_applies_to_later_batches_of_a_running_query(spark, cfg, env, tmp_path):
    live = load_config(env={**env, "TRIGGER": "processing-time", "TRIGGER_INTERVAL": "1 second"})
    write_locations(live.locations_csv)
    append_bronze(spark, live, [record(camera("cam-x001", at("10:00")), camera("cam-0001", at("10:00")))])
    query, = start(spark, live, "silver")
    try:
        query.processAllAvailable()
        assert load(spark, live, write_locations(tmp_path / "more.csv",
                                                 [*KNOWN, ("cam-x001", "02108", "Boston", "MA")])) == 1
        append_bronze(spark, live, [record(camera("cam-x001", at("10:30")))])
        query.processAllAvailable()
        assert query.isActive
    finally:
        query.stop()

    rows = {r.key: r for r in table(spark, live, "silver", "camera_events")
            .selectExpr("concat(date_format(start_time, 'HH:mm'), ' ', device_id) AS key", "*").collect()}
    assert sorted(rows) == ["10:00 cam-0001", "10:00 cam-x001", "10:30 cam-x001"]
    before, after = rows["10:00 cam-x001"], rows["10:30 cam-x001"]
    assert (before.zip_code, before.unknown_device) == (None, True)
    assert (after.zip_code, after.city, after.unknown_device) == ("02108", "Boston", False)
    assert after.silver_batch_id > before.silver_batch_id
    assert rows["10:00 cam-0001"].zip_code == "02108"
    assert_identities(books_by_batch(spark, live))


# --- end to end on generated data ----------------------------------------------------------

def test_generated_data_end_to_end(spark, cfg, env, tmp_path, monkeypatch):
    from tools.generator import events as gen

    for var in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LAKEHOUSE_ROOT", env["LAKEHOUSE_ROOT"])
    manifest_path = tmp_path / "manifest.json"
    assert gen.main(["-n", "3000", "--seed", "11", "--malformed-rate", "0.03",
                     "--manifest", str(manifest_path)]) == 0
    m = json.loads(manifest_path.read_text())
    assert m["duplicates"] > 0 and m["late"] > 0 and m["malformed"] >= 7

    bronze, = start(spark, cfg, "bronze", source="files")
    bronze.awaitTermination()
    assert table(spark, cfg, "bronze", "events").count() == m["records"]
    batches = run_silver(spark, cfg)

    silver = table(spark, cfg, "silver", "camera_events")
    n = silver.count()
    assert silver.select("event_id").distinct().count() == n, "duplicate event_id in silver"
    # Every generated event is valid (malformed lines are extra records): with all of bronze in
    # one micro-batch nothing is behind the watermark, so silver holds every event exactly once.
    assert n == m["events"]
    unknown = silver.where("unknown_device").collect()
    assert unknown and all(r.device_id.startswith("cam-x") and r.zip_code is None for r in unknown)
    assert silver.where("NOT unknown_device AND zip_code IS NULL").count() == 0

    quarantine = table(spark, cfg, "silver", "quarantine")
    assert quarantine.where("size(reasons) = 0").count() == 0
    assert quarantine.count() == m["malformed"]
    reasons = {r.reason: r.n for r in quarantine.selectExpr("explode(reasons) AS reason")
               .groupBy("reason").count().withColumnRenamed("count", "n").collect()}
    k = m["malformed_kinds"]
    assert reasons == {key: value for key, value in {
        "malformed_json": k["very_long"] + k["truncated"],
        "invalid_utf8": k["non_utf8"],
        "empty_record": k["empty_line"],
        "wrong_type:has_person": k["bad_type_person"],
        "bad_timestamp:start_time": k["bad_type_time"],
        "missing_field:device_id": k["missing_device_id"]}.items() if value}

    books = books_by_batch(spark, cfg)
    assert sorted(books) == [b for b in batches if not read_nothing(cfg.checkpoint(QUERY), b)]
    assert_identities(books)
    sums = totals(books, batches)
    assert sums["records_in"] == m["records"]
    assert sums["records_parsed"] == m["valid"] + m["duplicates"] + k["bad_type_person"] \
        + k["bad_type_time"] + k["missing_device_id"]
    assert sums["events_written"] == m["events"]
    assert sums["late_dropped"] == 0
    assert sums["events_quarantined"] == k["bad_type_person"] + k["bad_type_time"] + k["missing_device_id"]
    assert sums["duplicates_dropped"] >= m["duplicates"]
