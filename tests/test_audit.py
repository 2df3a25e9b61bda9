"""make audit: lineage in every commit, prefix integrity of every gold version, accounting.

The lakehouse is built by the real jobs (bronze file source, silver, gold) in three rounds on
the same checkpoints. Later rounds carry events behind gold's one-hour watermark (dropped as
late by gold, kept by silver) and behind silver's two-hour dedup watermark (dropped by silver),
plus duplicates and a malformed line, so the audit has to account for every kind of drop.
Tampering happens on a copy of that lakehouse.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from delta.tables import DeltaTable

from audit.__main__ import _silver_rows, run_audit
from audit.history import table_history
from audit.report import render
from audit.restore import main as restore_main
from common.batch import EXPRESSIONS
from common.config import load_config
from common.lineage import parse

TABLES = load_config(env={}).tables    # the default (nest) profile's tables, by layer

NO_DATA_CHANGE = ("CREATE TABLE", "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES")

REPO = Path(__file__).resolve().parent.parent
GOLD = [f"gold.{t}" for t in TABLES["gold"]]
LOCATIONS = "device_id,zip_code,city,state\ncam-0001,02108,Boston,MA\ncam-0002,94105,San Francisco,CA\n" \
            "cam-0003,10001,New York,NY\n"


def at(hh_mm: str) -> str:
    return f"2026-11-01T{hh_mm}:00.000Z"


def record(*events: tuple[str, str], person: bool = True) -> str:
    cams = {d: {"device_id": d, "name": d, "is_online": True,
                "last_event": {"has_sound": False, "has_motion": True, "has_person": person,
                               "start_time": at(t), "end_time": at(t)}} for d, t in events}
    return json.dumps({"devices": {"cameras": cams}})


ROUNDS = [
    [record(("cam-0001", "10:00"), ("cam-0002", "10:00")), record(("cam-0001", "10:10")),
     record(("cam-0001", "10:10")),                                   # duplicate
     record(("cam-0003", "10:40"), ("cam-0002", "11:00")), record(("cam-0001", "11:30"), person=False)],
    # gold's watermark is now 10:30, silver's 09:30
    [record(("cam-0001", "12:00"), ("cam-0002", "12:20")), record(("cam-0003", "13:30")),
     record(("cam-0002", "10:20")),                                   # late for gold only
     record(("cam-0001", "09:00")),                                   # late for silver too
     record(("cam-0009", "12:50")),                                   # unknown device
     "{not json"],
    # gold's watermark is now 12:30
    [record(("cam-0001", "14:00"), ("cam-0002", "14:05")), record(("cam-0003", "12:45")),
     record(("cam-0001", "12:10")),                                   # late for gold
     record(("cam-0001", "12:10")),                                   # and a duplicate
     record(("cam-0002", "15:30"))],
]


def run_round(spark, cfg, n: int, lines: list[str], layers=("bronze", "silver", "gold")) -> None:
    from pipeline.runner import start

    landing = Path(cfg.landing)
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".round-{n}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(landing / f"round-{n}.json")
    # gold's quality gate is not what is audited here
    options = {"bronze": {"source": "files"}, "silver": {}, "gold": {"suites": {}}}
    for name in layers:
        for query in start(spark, cfg, name, **options[name]):
            query.awaitTermination()


def lakehouse_config(root: Path, **settings: str):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")
           and not k.startswith("LAKEHOUSE__")}
    return load_config(env={**env, "LAKEHOUSE_ROOT": str(root / "lakehouse"), "TRIGGER": "available-now",
                            **settings})


def forget_names(spark) -> None:
    for layer, tables in TABLES.items():
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{table}")


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    cfg = lakehouse_config(root)
    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text(LOCATIONS)
    for n, lines in enumerate(ROUNDS):
        run_round(spark, cfg, n, lines)
    # The report the tests read is the one `make audit` prints, from a process of its own.
    proc = cli(["make", "-s", "--no-print-directory", "audit", "JSON=1"], root)
    yield SimpleNamespace(root=root, cfg=cfg, report=json.loads(proc.stdout) if proc.stdout else {},
                          proc=proc)
    forget_names(spark)


def copy_lake(spark, lake, tmp_path):
    shutil.copytree(lake.root / "lakehouse", tmp_path / "lakehouse")
    forget_names(spark)
    return lakehouse_config(tmp_path)


def cli(args: list[str], root: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE__")}
    env["LAKEHOUSE_ROOT"] = str(root / "lakehouse")
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def prefix(report: dict, table: str) -> list[dict]:
    return next(t["prefix"] for t in report["tables"] if t["table"] == table)


# --- lineage -------------------------------------------------------------------------------

def test_every_streaming_commit_records_its_upstream_version_query_and_batch(spark, lake):
    # table -> its writers' upstream, by query (silver and gold both keep late events)
    by_silver, by_gold = {"silver": "bronze.events"}, {"gold": "silver.camera_events"}
    expected_upstream = {"silver.camera_events": by_silver, "silver.quarantine": by_silver,
                         "silver.late_events": {**by_silver, **by_gold}, **{g: by_gold for g in GOLD}}
    for name, upstreams in expected_upstream.items():
        history = table_history(spark, lake.cfg.table_path(*name.split(".")))
        # Compaction (auto or make maintain) and VACUUM change no rows and read no upstream.
        commits = [v for v in history if v.operation not in NO_DATA_CHANGE]
        assert {v.lineage["query"] for v in commits if v.lineage} == set(upstreams), name
        for v in commits:
            assert v.lineage is not None, f"{name} v{v.version} ({v.operation}) has no lineage"
            assert v.lineage["upstream"]["table"] == upstreams[v.lineage["query"]]
            assert v.lineage["query_id"] and isinstance(v.lineage["batch_id"], int)
            assert isinstance(v.lineage["upstream"]["version"], int)
        # the consumed prefix only grows, batch after batch, per writer
        for query in upstreams:
            ups = [v.lineage["upstream"]["version"] for v in commits if v.lineage["query"] == query]
            assert ups == sorted(ups)
    bronze = table_history(spark, lake.cfg.table_path("bronze", "events"))
    last_write = max(v.version for v in bronze if v.operation not in NO_DATA_CHANGE)
    silver_last = [v for v in table_history(spark, lake.cfg.table_path("silver", "camera_events"))
                   if v.operation not in NO_DATA_CHANGE][-1]
    # silver read everything bronze wrote (a compaction after bronze's last write may or may not be in its offset)
    assert last_write <= silver_last.lineage["upstream"]["version"] <= bronze[-1].version
    assert "silver.device_locations" in silver_last.lineage["dimensions"]


def test_bronze_commits_are_the_pipelines_and_a_hand_append_is_not(spark, lake, tmp_path):
    """Bronze reads files, not a table: its batches record query, batch and the source's offset
    but no upstream, and the audit names them as the pipeline's, not as made outside it. Each
    batch books its accounting row through the same runner as silver's and gold's: what it read
    is what it wrote, and the rows add up to bronze.events."""
    tables = {t["table"]: t for t in lake.report["tables"]}
    bronze = tables["bronze.events"]
    writes = [v for v in bronze["history"] if v["operation"] not in NO_DATA_CHANGE]
    assert writes
    for v in writes:
        assert v["made_by"] == f"bronze_files#{v['lineage']['batch_id']}", v
        assert v["lineage"]["query_id"] and v["upstream"] is None
        assert v["lineage"]["source"]["kind"] == "files", v
    offsets = [v["lineage"]["source"]["offset"]["logOffset"] for v in writes]   # the file source's log
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert "outside the pipeline" not in render({**lake.report, "tables": [bronze]})

    booked = [v for v in tables["ops.batch_accounting"]["history"]
              if v["lineage"] and v["lineage"]["query"] == "bronze_files"]
    assert sorted(v["lineage"]["batch_id"] for v in booked) == sorted(v["lineage"]["batch_id"] for v in writes)
    assert all(v["made_by"] == f"bronze_files#{v['lineage']['batch_id']}" for v in booked)
    rows = (spark.read.format("delta").load(lake.cfg.table_path("ops", "batch_accounting"))
            .where("layer = 'bronze'").collect())
    assert len(rows) == len(writes) and all(r.query == "bronze_files" and r.rows_in == r.rows_written for r in rows)
    assert sum(r.rows_written for r in rows) == spark.read.format("delta").load(
        lake.cfg.table_path("bronze", "events")).count() > 0

    cfg = copy_lake(spark, lake, tmp_path)
    path = cfg.table_path("bronze", "events")
    spark.read.format("delta").load(path).limit(1).write.format("delta").mode("append").save(path)
    last = table_history(spark, path)[-1]
    assert last.made_by == "outside the pipeline" and last.lineage is None
    forget_names(spark)


def test_lineage_is_plain_delta_user_metadata(spark, lake):
    """Any Delta reader sees it: DESCRIBE HISTORY's userMetadata column holds the JSON."""
    path = lake.cfg.table_path("gold", "device_sessions")
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where("operation = 'MERGE'").collect()
    assert rows and all(parse(r.userMetadata)["query"] == "gold" for r in rows)


# --- a clean run -----------------------------------------------------------------------------

def test_a_clean_pipeline_passes_every_audit(lake):
    report = lake.report
    assert report["ok"], report["failures"]
    for table in GOLD:
        checks = prefix(report, table)
        # (a version per batch that brought rows, and per closing no-data batch that closed any)
        assert len(checks) >= 4, f"{table}: expected a version per data batch, got {len(checks)}"
        assert {c["status"] for c in checks} == {"PASS"}, table
        assert any(c["actual_rows"] for c in checks)
    books = {a["name"]: a for a in report["accounting"]}
    assert set(books) == {"silver", "silver.late_events", "silver rescued events", "silver rescued keys", *GOLD}
    assert all(a["status"] == "PASS" for a in books.values())
    # the run exercised every kind of drop the identities account for
    assert books["silver"]["right"]["duplicates dropped"] >= 2
    assert books["silver"]["right"]["too late dropped"] >= 1
    assert books["silver"]["right"]["quarantine"] >= 1
    for table in GOLD:
        assert books[table]["right"]["too late dropped"] >= 2, books[table]
    assert books["silver.late_events"]["right"] == {"gold: kept": 2, "silver: kept": 1}, books["silver.late_events"]


def test_events_late_for_gold_are_kept_with_their_silver_row_and_who_found_them(spark, lake):
    """The rounds' two events behind gold's watermark (10:20 in round 1, 12:10 in round 2) are
    in silver.late_events as silver holds them, each once, with the gold batch that found it
    late and that batch's watermark, which it is behind. The 09:00 one, behind silver's
    watermark, never reached silver: the silver batch kept it there."""
    from pyspark.sql import functions as F

    late = spark.read.format("delta").load(lake.cfg.table_path("silver", "late_events"))
    silver = spark.read.format("delta").load(lake.cfg.table_path("silver", "camera_events"))
    rows = late.where("late_for = 'gold'").orderBy("event_time").collect()
    assert [(r.device_id, r.event_time.strftime("%H:%M")) for r in rows] == [("cam-0002", "10:20"),
                                                                                ("cam-0001", "12:10")]
    # byte for byte the silver row (every silver column)
    assert late.where("late_for = 'gold'").select(*silver.columns).exceptAll(silver).count() == 0
    for r in rows:
        assert r.found_by_query == "gold"
        assert r.event_time <= r.found_watermark
    [early] = late.where("late_for = 'silver'").collect()
    assert (early.device_id, early.event_time.strftime("%H:%M"), early.found_by_query) == ("cam-0001", "09:00", "silver")
    assert early.found_watermark.strftime("%H:%M") == "09:30" and early.zip_code is not None
    assert silver.where(F.col("event_id") == early.event_id).count() == 0
    # a gold table does not hold them: the sightings of 10:00-11:00 at cam-0002's zip count 10:00 only
    hour = (spark.read.format("delta").load(lake.cfg.table_path("gold", "zip_hourly_sightings"))
            .where((F.col("zip_code") == "94105") & (F.hour("window_start") == 10)).first())
    assert hour.events == 1


def test_gold_versions_differ_as_batches_advance(spark, lake):
    """Not one trivially equal snapshot: content changes across versions, and later rounds
    finalize windows that earlier ones left open."""
    path = lake.cfg.table_path("gold", "zip_hourly_sightings")
    checks = prefix(lake.report, "gold.zip_hourly_sightings")
    counts = [spark.read.format("delta").option("versionAsOf", c["version"]).load(path)
              .where("finalized").count() for c in checks]
    assert counts[-1] > counts[1] >= 0
    sizes = [c["actual_rows"] for c in checks]
    assert sizes == sorted(sizes) and len(set(sizes)) >= 3, sizes


def test_make_audit_exits_zero_and_prints_pass(lake):
    assert lake.proc.returncode == 0, lake.proc.stdout[-3000:] + lake.proc.stderr[-3000:]
    text = render(lake.report)
    assert text.splitlines()[-1].startswith("audit: PASS")
    assert all(name in text for name in GOLD + ["silver.camera_events", "bronze.events"])
    assert "FAIL (" not in text


# --- tampering ------------------------------------------------------------------------------

def test_deleted_gold_rows_fail_the_audit_naming_table_and_version(spark, lake, tmp_path):
    cfg = copy_lake(spark, lake, tmp_path)
    path = cfg.table_path("gold", "zip_hourly_sightings")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE zip_code = '02108'")
    tampered = DeltaTable.forPath(spark, path).history(1).first().version

    report = run_audit(spark, cfg, "gold.zip_hourly_sightings")
    assert not report["ok"]
    failed = [c for c in prefix(report, "gold.zip_hourly_sightings") if c["status"] == "FAIL"]
    assert [c["version"] for c in failed] == [tampered]
    assert failed[0]["operation"] == "DELETE" and failed[0]["made_by"] == "outside the pipeline"
    assert failed[0]["missing"] > 0 and failed[0]["unexpected"] == 0
    assert all(r["zip_code"] == "02108" for r in failed[0]["missing_sample"])
    assert any(f"gold.zip_hourly_sightings version {tampered} (DELETE" in f for f in report["failures"])
    forget_names(spark)


def test_a_changed_count_fails_make_audit_with_a_non_zero_exit(spark, lake, tmp_path):
    cfg = copy_lake(spark, lake, tmp_path)
    path = cfg.table_path("gold", "device_sessions")
    spark.sql(f"UPDATE delta.`{path}` SET events = events + 1 WHERE device_id = 'cam-0002'")
    tampered = DeltaTable.forPath(spark, path).history(1).first().version
    forget_names(spark)

    proc = cli(["make", "-s", "--no-print-directory", "audit", "TABLE=gold.device_sessions", "JSON=1"],
               tmp_path)
    assert proc.returncode != 0 and "Error 1" in proc.stderr, proc.stderr[-3000:]   # audit exited 1
    report = json.loads(proc.stdout)
    failed = [c for c in prefix(report, "gold.device_sessions") if c["status"] == "FAIL"]
    assert [c["version"] for c in failed] == [tampered]
    assert failed[0]["operation"] == "UPDATE"
    assert failed[0]["missing"] == failed[0]["unexpected"] > 0
    assert all(r["device_id"] == "cam-0002" for r in failed[0]["unexpected_sample"])


def test_restore_brings_back_the_old_content_and_the_audit_sees_it(spark, lake, tmp_path):
    cfg = copy_lake(spark, lake, tmp_path)
    path = cfg.table_path("gold", "device_activity")
    good = DeltaTable.forPath(spark, path).history(1).first().version
    before = sorted(spark.read.format("delta").load(path).collect())
    spark.sql(f"DELETE FROM delta.`{path}` WHERE device_id = 'cam-0001'")
    assert len(spark.read.format("delta").load(path).collect()) < len(before)
    forget_names(spark)

    assert restore_main(["gold.device_activity", str(good), "--yes"], spark=spark, cfg=cfg) == 0
    assert sorted(spark.read.format("delta").load(path).collect()) == before
    history = table_history(spark, path)
    assert history[-1].operation == "RESTORE"

    report = run_audit(spark, cfg, "gold.device_activity")
    checks = prefix(report, "gold.device_activity")
    assert checks[-1]["status"] == "PASS"                 # the restored content is right again
    assert [c["status"] for c in checks[-2:]] == ["FAIL", "PASS"]   # the edit stays on record
    forget_names(spark)


# --- many versions ----------------------------------------------------------------------------

# Two Delta log checkpoints (one every 10 commits: versions read before, between and after them)
# and seven steps with a late event: what the audit has to get right over many versions. How
# long it takes at 50 versions is `make bench-audit`'s figure; each version here is a gold batch
# and its audit (about 3 s in CI), so a third checkpoint would add half a minute and test nothing new.
MANY_VERSIONS = 21


# --- backfill of late events --------------------------------------------------------------

def _gold_snapshot(spark, cfg) -> dict:
    from common.delta import table_version
    return {t: table_version(spark, cfg.table_path("gold", t)) for t in TABLES["gold"]}


def test_a_backfill_folds_the_late_events_in_and_the_audit_proves_every_version(spark, lake, tmp_path, capsys):
    """The late events (cam-0002 10:20 and cam-0001 12:10 late for gold, cam-0001 09:00 late for
    silver too) reach their windows and sessions in one MERGE per table whose lineage names the
    backfill; the audit's recompute adds them in the order they were folded and every version
    passes; a second backfill finds nothing pending and writes nothing; then the stream goes on
    over the backfilled tables, still proven, and a backfill of what it found late for silver
    leaves out the repeat of an event silver holds."""
    from pyspark.sql import functions as F

    from gold.backfill import main as backfill_main

    cfg = copy_lake(spark, lake, tmp_path)
    sightings = cfg.table_path("gold", "zip_hourly_sightings")
    hour = lambda: (spark.read.format("delta").load(sightings)  # noqa: E731
                    .where((F.col("zip_code") == "94105") & (F.hour("window_start") == 10)).first())
    assert hour().events == 1 and hour().finalized
    before = _gold_snapshot(spark, cfg)

    assert backfill_main(["--json"], spark=spark, cfg=cfg) == 0
    late = spark.read.format("delta").load(cfg.table_path("silver", "late_events")).collect()
    ids = {r.backfilled_by for r in late}
    assert len(ids) == 1 and None not in ids
    (backfill_id,) = ids
    after = _gold_snapshot(spark, cfg)
    assert all(after[t] == before[t] + 1 for t in before), (before, after)
    assert hour().events == 2 and hour().finalized            # the 10:20 event, in its hour
    # cam-0002's 10:00 session took in its 10:20 event; cam-0001's 11:30-12:00 its 12:10 one
    sessions = {(r.device_id, r.session_start.strftime("%H:%M")): r for r in
                spark.read.format("delta").load(cfg.table_path("gold", "device_sessions")).collect()}
    assert sessions[("cam-0002", "10:00")].session_end.strftime("%H:%M") == "10:20"
    assert sessions[("cam-0002", "10:00")].events == 2 and sessions[("cam-0002", "10:00")].status == "closed"
    assert sessions[("cam-0001", "11:30")].session_end.strftime("%H:%M") == "12:10"
    assert sessions[("cam-0001", "09:00")].events == 1 and sessions[("cam-0001", "09:00")].status == "closed"
    # every gold event of silver is now in the hourly table, on time and backfilled, and the
    # one silver found late
    assert {(r.late_for, r.device_id) for r in late} == {("gold", "cam-0002"), ("gold", "cam-0001"),
                                                          ("silver", "cam-0001")}
    silver = spark.read.format("delta").load(cfg.table_path("silver", "camera_events")).count()
    total = lambda: spark.read.format("delta").load(sightings).agg(F.sum("events")).first()[0]  # noqa: E731
    assert total() == silver + 1

    # (the audit interprets its expressions on so small a silver, and leaves the session as it was)
    spark.conf.set(EXPRESSIONS, "FALLBACK")
    try:
        report = run_audit(spark, cfg)
        assert spark.conf.get(EXPRESSIONS) == "FALLBACK"
    finally:
        spark.conf.unset(EXPRESSIONS)
    assert report["ok"], report["failures"]
    for table in GOLD:
        checks = prefix(report, table)
        folded = [c for c in checks if c["made_by"] == f"backfill {backfill_id}"]
        assert len(folded) == 1 and folded[0]["status"] == "PASS", (table, checks)

    # a consumer of the change feed (docs/change-feed.md, as written) rebuilds each table from
    # version 0 through the batches and the backfill
    from audit.changes import mirror_differences

    assert mirror_differences(spark, cfg, str(tmp_path / "mirror")) == {t: 0 for t in TABLES["gold"]}

    # nothing pending: nothing written
    assert backfill_main([], spark=spark, cfg=cfg) == 0
    assert _gold_snapshot(spark, cfg) == after

    # the stream goes on: another round, its batches fold onto the backfilled rows; two of its
    # events are hours behind silver's watermark (13:30): a repeat of one silver holds, and a new one
    _next_round(spark, cfg, [record(("cam-0002", "16:00"), ("cam-0003", "16:10")),
                             record(("cam-0001", "10:10")), record(("cam-0003", "08:00")),
                             record(("cam-0003", "08:00"))])                        # twice
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    assert _gold_snapshot(spark, cfg)["zip_hourly_sightings"] > after["zip_hourly_sightings"]
    pending = (spark.read.format("delta").load(cfg.table_path("silver", "late_events"))
               .where("backfilled_by IS NULL").collect())
    assert sorted((r.late_for, r.device_id, r.event_time.strftime("%H:%M")) for r in pending) == [
        ("silver", "cam-0001", "10:10"), ("silver", "cam-0003", "08:00"), ("silver", "cam-0003", "08:00")]
    capsys.readouterr()
    assert backfill_main(["--json"], spark=spark, cfg=cfg) == 0
    outcome = json.loads(capsys.readouterr().out.splitlines()[-1])
    # 3 rows = 1 event folded + 1 repeat of silver's (left out) + 1 copy (its event folded once)
    assert (outcome["events"], outcome["duplicates"], outcome["copies"]) == (1, 1, 1), outcome
    assert total() == silver + 2 + 2                          # the round's two on time, 08:00 once
    repeat = (spark.read.format("delta").load(cfg.table_path("silver", "late_events"))
              .where("backfilled_by IS NULL").collect())
    assert [(r.device_id, r.event_time.strftime("%H:%M")) for r in repeat] == [("cam-0001", "10:10")]
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    books = {b["name"]: b for b in report["accounting"]}
    assert books["silver.late_events"]["status"] == "PASS", books
    forget_names(spark)


def test_a_backfill_killed_after_choosing_its_events_is_finished_by_the_next(spark, lake, tmp_path):
    """The events are marked first, then each table written once: a backfill that stopped after
    the mark and one table is completed, table by table, by the next run, before anything new."""
    from gold.backfill import Backfill, backfilled_ids

    cfg = copy_lake(spark, lake, tmp_path)
    job = Backfill(spark, cfg)
    pending = job.late()
    job.mark("backfill-killed", pending)
    first = job.specs[0]
    job.apply("backfill-killed", job.late().where("backfilled_by = 'backfill-killed'"),
              {spec.table: (set() if spec is first else {"backfill-killed"}) for spec in job.specs})
    assert "backfill-killed" in backfilled_ids(spark, cfg.table_path("gold", first.table))
    assert "backfill-killed" not in backfilled_ids(spark, cfg.table_path("gold", job.specs[1].table))

    outcome = Backfill(spark, cfg).run()
    assert outcome.resumed == ["backfill-killed"] and outcome.events == 0 and outcome.id is None
    for spec in job.specs:
        ids = backfilled_ids(spark, cfg.table_path("gold", spec.table))
        assert ids == {"backfill-killed"}, spec.table       # once each, the first table not twice
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    forget_names(spark)


def _next_round(spark, cfg, lines) -> None:
    """Another round on a copy of the lakehouse (its bronze starts a new file checkpoint: the
    copied one names the original's landing files)."""
    shutil.rmtree(cfg.checkpoint("bronze_files"), ignore_errors=True)
    for landed in Path(cfg.landing).glob("round-*.json"):
        landed.unlink()
    run_round(spark, cfg, len(ROUNDS), lines)


def _backfilled(spark, cfg) -> set:
    return {r.backfilled_by for r in spark.read.format("delta").load(cfg.table_path("silver", "late_events")).collect()}


def test_a_late_event_that_would_extend_an_open_session_waits_for_it_to_close(spark, lake, tmp_path):
    """cam-0002's 15:30 session is still open (gold's watermark is 14:30): a late event at 15:10
    would extend it, and a backfill cannot change the state store that holds it. The camera's
    late events stay pending (all of them: a key is held whole), with the watermark they wait
    for; the other camera's late event is folded in."""
    from pyspark.sql import functions as F

    from gold.backfill import Backfill

    cfg = copy_lake(spark, lake, tmp_path)
    late_path = cfg.table_path("silver", "late_events")
    template = spark.read.format("delta").load(late_path).limit(1)
    silver = spark.read.format("delta").load(cfg.table_path("silver", "camera_events"))
    extra = (silver.where((F.col("device_id") == "cam-0002") & (F.hour("event_time") == 15))
             .withColumn("event_id", F.lit("late-into-an-open-session"))
             .withColumn("event_time", F.col("event_time") - F.expr("INTERVAL 20 MINUTES"))
             .crossJoin(template.select("late_for", "found_by_query", "found_in_batch", "found_watermark",
                                        "backfilled_by", "backfilled_at")))
    extra.select(*spark.read.format("delta").load(late_path).columns).write.format("delta").mode("append").save(late_path)

    outcome = Backfill(spark, cfg).run()
    assert outcome.events == 2 and outcome.pending_open == 2      # cam-0001's 12:10 and 09:00
    assert outcome.retry_at_ms == int(datetime(2026, 11, 1, 16, 0, tzinfo=timezone.utc).timestamp() * 1000)
    pending = spark.read.format("delta").load(late_path).where("backfilled_by IS NULL").collect()
    assert {r.device_id for r in pending} == {"cam-0002"} and "late-into-an-open-session" in {r.event_id for r in pending}
    report = run_audit(spark, cfg)
    # (the row added by hand is no late event gold counted: the late books say so, nothing else)
    assert [f for f in report["failures"] if not f.startswith("accounting silver.late_events")] == []
    forget_names(spark)


def test_a_backfill_asked_while_gold_runs_is_folded_in_by_its_next_batch(spark, lake, tmp_path):
    """Gold holds its checkpoint: the command leaves a request instead, changes nothing itself,
    and the gold query's next batch folds the late events in before its own rows."""
    from common.checkpoint_lock import CheckpointLocks
    from gold.backfill import main as backfill_main, request_path

    cfg = copy_lake(spark, lake, tmp_path)
    before = _gold_snapshot(spark, cfg)
    with CheckpointLocks(cfg, ["gold"]):
        assert backfill_main([], spark=spark, cfg=cfg) == 0
    assert _gold_snapshot(spark, cfg) == before and _backfilled(spark, cfg) == {None}
    assert request_path(cfg).exists()

    _next_round(spark, cfg, [record(("cam-0002", "16:00"))])
    assert not request_path(cfg).exists()
    (backfill_id,) = _backfilled(spark, cfg)
    assert backfill_id is not None
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    checks = prefix(report, "gold.zip_hourly_sightings")
    made = [c["made_by"] for c in checks]
    # the backfill's commit comes before the batch's own
    assert made.index(f"backfill {backfill_id}") < len(made) - 1, made
    forget_names(spark)


def test_with_auto_backfill_gold_folds_late_events_in_after_the_delay(spark, lake, tmp_path):
    """gold.backfill: auto. The next run finds the kept late events at its start; its batch a
    second later (the watermark-only one that ends the run) folds them in."""
    cfg = copy_lake(spark, lake, tmp_path)
    auto = lakehouse_config(tmp_path, LAKEHOUSE__GOLD__BACKFILL="auto", LAKEHOUSE__GOLD__BACKFILL_DELAY="1 second")
    _next_round(spark, auto, [record(("cam-0003", "16:00")), record(("cam-0003", "16:20"))])
    assert None not in _backfilled(spark, cfg)
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    forget_names(spark)


def test_auto_backfill_due_before_gold_s_first_write_waits_for_the_next_batch(spark, tmp_path, caplog):
    """Gold's tables exist but no batch wrote them (a first run whose first batch read no row, or
    a restart after a kill before the first commit) while late events are pending and due: a
    backfill has no watermark to restate by. The batch's backfill waits, changing nothing,
    instead of failing the query (a chaos run's drain failed so, in the batch after a 0-row
    one). Then gold runs and the audit passes."""
    from common.delta import table_version
    from gold.backfill import InBatch
    from gold.job import prepare_gold
    from gold.tables import for_config

    cfg = lakehouse_config(tmp_path, LAKEHOUSE__GOLD__BACKFILL="auto", LAKEHOUSE__GOLD__BACKFILL_DELAY="1 millisecond")
    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text(LOCATIONS)
    try:
        for n, lines in enumerate(ROUNDS):
            run_round(spark, cfg, n, lines, layers=("bronze", "silver"))
        assert None in _backfilled(spark, cfg)              # silver kept late events; gold never ran
        specs = for_config(cfg)
        prepare_gold(spark, cfg, specs)                     # what gold's start does
        in_batch = InBatch(cfg)
        in_batch.found_late()
        time.sleep(0.01)                                    # the delay has passed: due
        caplog.set_level("INFO", logger="gold.backfill")
        assert in_batch(spark, 0) is None
        assert any("backfill waits for gold's first batch" in r.getMessage() for r in caplog.records)
        assert {table_version(spark, cfg.table_path("gold", s.table)) for s in specs} == {0}
        assert in_batch.late_since is not None              # still due: the next batch tries again
        run_round(spark, cfg, len(ROUNDS), [record(("cam-0001", "18:00"))], layers=("gold",))
        report = run_audit(spark, cfg)
        assert report["ok"], report["failures"]
    finally:
        forget_names(spark)


def test_audit_of_a_many_version_gold_table(spark, tmp_path):
    """Built by the real gold query over MANY_VERSIONS silver commits; the duration is reported
    by `make bench-audit`, here it is only printed."""
    from bench.audit_versions import bench_config, build

    cfg = bench_config(tmp_path)
    try:
        build(spark, cfg, MANY_VERSIONS)
        started = time.monotonic()
        report = run_audit(spark, cfg, "gold.zip_hourly_sightings")
        elapsed = time.monotonic() - started
        history = [r.asDict(recursive=True) for r in DeltaTable.forPath(
            spark, cfg.table_path("gold", "zip_hourly_sightings")).history().collect()][::-1]
    finally:
        forget_names(spark)
    checks = prefix(report, "gold.zip_hourly_sightings")
    print(f"\naudit of {len(checks)} gold versions: {elapsed:.1f} s")
    assert len(checks) >= MANY_VERSIONS
    assert report["ok"], report["failures"]
    assert all(c["status"] == "PASS" for c in checks), [(c["version"], c["status"], c["note"]) for c in checks]
    late = next(a for a in report["accounting"] if a["name"] == "gold.zip_hourly_sightings")
    assert late["status"] == "PASS" and late["right"]["too late dropped"] > 0
    # Each MERGE rewrites the files holding a changed window, not the table: the late MERGEs
    # leave files of the table untouched. (A rewritten file also copies its unchanged rows, and
    # the file a MERGE writes holds the finalized rows it copied beside the open ones, which the
    # next MERGE rewrites again: copy-on-write without deletion vectors, which delta-rs cannot
    # read. The copies grow with the table; see docs/gold.md.)
    path = cfg.table_path("gold", "zip_hourly_sightings")
    for h in [h for h in history if h["operation"] == "MERGE"][-5:]:
        files = len(spark.read.format("delta").option("versionAsOf", h["version"] - 1).load(path).inputFiles())
        assert 0 < int(h["operationMetrics"]["numTargetFilesRemoved"]) < files, (files, h["operationMetrics"])


def test_silver_size_for_the_audit_s_expressions_comes_from_its_whole_history():
    from audit.history import Version

    def v(n, added, removed=0):
        return Version(n, None, "WRITE", added, removed, None)

    assert _silver_rows([v(0, 0), v(1, 6), v(2, 5, 2)]) == 9
    assert _silver_rows([v(3, 6), v(4, 5)]) is None          # the log lost its first commits
    assert _silver_rows([v(0, 0), v(1, None)]) is None       # a commit without its row counts
    assert _silver_rows([]) is None and _silver_rows(None) is None
