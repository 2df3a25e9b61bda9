"""lakehouse refresh silver: silver recomputed from bronze's raw records with a profile that now
declares a field the old one only rescued, while bronze keeps ingesting; gold rebuilt from the
refreshed silver; readers never see an empty or smaller table; the live stream goes on from the
refresh's checkpoints; the audit's books, attribution and gold prefixes all pass.

The lakehouse is built by the real jobs (bronze file source, silver, gold) from test_audit's
rounds (duplicates, events late for silver and for gold, an unknown device, a record that is no
JSON), with `battery_level` on some cameras: a key the default profile does not declare, so
silver keeps it in _rescued_data until the refresh gives it a column, for past events too."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from delta.tables import DeltaTable

from common.internals import checkpoint_id
from pipeline.refresh import refresh
from silver.logic import logic_hash, other_logic
from tests.test_audit import LOCATIONS, REPO, ROUNDS, forget_names, record
from tests import test_refresh
from tests.test_refresh import (Reader, config, kill_refresh, kill_run_all, run, start_run_all, stop_run_all,
                                waiter)


def charged(level: float, *events, **kw) -> str:
    """A record whose first camera reports its battery level."""
    rec = json.loads(record(*events, **kw))
    first = next(iter(rec["devices"]["cameras"].values()))
    first["battery_level"] = level
    return json.dumps(rec)


FEED = [
    ROUNDS[0] + [charged(0.5, ("cam-0002", "10:30"))],
    ROUNDS[1] + [charged(0.25, ("cam-0003", "12:00"), ("cam-0001", "12:40"))],
    ROUNDS[2],
    [charged(0.75, ("cam-0001", "16:00")), record(("cam-0002", "16:10"))],       # lands during the refresh
    [record(("cam-0003", "18:00"), ("cam-0002", "18:05"))],                      # lands after it
]


def land(cfg, n: int) -> None:
    test_refresh.land(cfg, n, FEED)


def declaring_battery(folder: Path) -> Path:
    """A profile folder holding the nest profile with battery_level declared (make demo-day2's)."""
    from console.day2 import declare_battery

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nest.yaml").write_text((REPO / "conf" / "profiles" / "nest.yaml").read_text())
    declare_battery(folder)
    return folder


def switch_commit(spark, path: str) -> tuple[int, dict]:
    from common.lineage import parse

    rows = DeltaTable.forPath(spark, path).history().select("version", "userMetadata").collect()
    found = [(r.version, parse(r.userMetadata)) for r in rows
             if ((parse(r.userMetadata) or {}).get("refresh") or {}).get("layer") == "silver"]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def refreshed(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("refresh-silver")
    old = config(root)
    new = config(root, PROFILES_DIR=str(declaring_battery(root / "profiles")))
    old.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    old.locations_csv.write_text(LOCATIONS)
    for n in range(3):
        land(old, n)
        run(spark, old, "bronze", "silver", "gold")
    events = old.table_path("silver", old.silver_table)
    before = {
        "events": spark.read.format("delta").load(events).count(),
        "quarantine": spark.read.format("delta").load(old.table_path("silver", "quarantine")).count(),
        "rescued": spark.read.format("delta").load(events).where("_rescued_data IS NOT NULL").count(),
        "silver_id": checkpoint_id(old.checkpoint("silver")), "gold_id": checkpoint_id(old.checkpoint("gold")),
        "sessions": spark.read.format("delta").load(old.table_path("gold", "device_sessions")).count(),
        "other_logic": other_logic(spark, new),     # what silver's next start on `new` warns of
    }
    reader = Reader(spark, events)
    reader.start()

    def feed():                   # bronze ingests while the refresh builds
        land(new, 3)
        run(spark, new, "bronze")
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    done = refresh(spark, new, "silver", wait_s=120)
    feeder.join()
    switched = dict(done["tables"])[f"silver.{new.silver_table}"]
    reader.read_through(switched)
    land(new, 4)
    run(spark, new, "bronze", "silver", "gold")
    from audit.__main__ import run_audit

    yield dict(old=old, new=new, done=done, before=before, profiles=root / "profiles", reader=reader.seen, events=events,
               audit=run_audit(spark, new), other_logic_after=other_logic(spark, new))
    forget_names(spark)


def test_silver_switches_in_one_commit_per_table_and_gold_follows(spark, refreshed):
    new, done, before = refreshed["new"], refreshed["done"], refreshed["before"]
    assert done["query_id"] == checkpoint_id(new.checkpoint("silver")) != before["silver_id"]
    at, lineage = switch_commit(spark, refreshed["events"])
    r = lineage["refresh"]
    assert r["id"] == done["id"] and r["made_by"] == "lakehouse refresh" and r["code"]
    assert r["replaced_query_id"] == before["silver_id"] and lineage["query_id"] == done["query_id"]
    assert r["bronze_version"] >= 0 and r["pins"]
    for table in ("quarantine",):
        assert switch_commit(spark, new.table_path("silver", table))[1]["refresh"]["id"] == done["id"]
    # Gold was rebuilt from the refreshed silver, and runs on the rebuild's checkpoint.
    assert done["gold"] and checkpoint_id(new.checkpoint("gold")) == done["gold"]["query_id"] != before["gold_id"]
    assert {f"gold.{t}" for t in new.tables["gold"]} <= dict(done["tables"]).keys()
    assert not (Path(str(new.root)) / "silver" / "_refresh").exists()
    assert not (Path(str(new.checkpoint_root)) / "_refresh" / "silver").exists()


def test_silver_started_on_a_changed_profile_warns_of_the_old_parsing_until_the_refresh(refreshed):
    """Each silver commit carries the hash of its parsing: started on the profile that declares
    battery_level, silver's set-up names the old one; after the refresh, nothing."""
    assert refreshed["before"]["other_logic"] == logic_hash(refreshed["old"]) != logic_hash(refreshed["new"])
    assert refreshed["other_logic_after"] is None


def test_the_newly_declared_field_is_filled_for_past_events_from_bronze(spark, refreshed):
    rows = spark.read.format("delta").load(refreshed["events"])
    charged_rows = {(r.device_id, r.battery_level) for r in rows.where("battery_level IS NOT NULL").collect()}
    # Before the refresh (rounds 0, 1), during it (3) and after it (4, which has none).
    assert charged_rows == {("cam-0002", 0.5), ("cam-0003", 0.25), ("cam-0001", 0.75)}, charged_rows
    assert refreshed["before"]["rescued"] == 2
    assert rows.where("_rescued_data IS NOT NULL").count() == 0
    # Nothing lost, nothing doubled: every event once, every reject still in quarantine.
    assert rows.count() == rows.select("event_id").distinct().count() >= refreshed["before"]["events"] + 5
    quarantine = spark.read.format("delta").load(refreshed["new"].table_path("silver", "quarantine")).count()
    assert quarantine == refreshed["before"]["quarantine"] > 0


def test_readers_never_see_an_empty_or_smaller_silver_and_the_old_one_stays_readable(spark, refreshed):
    seen, events = refreshed["reader"], refreshed["events"]
    at, _ = switch_commit(spark, events)
    assert seen and min(v for v, _ in seen) < at <= max(v for v, _ in seen), seen
    counts = [n for _, n in seen]
    assert all(b >= a for a, b in zip(counts, counts[1:])) and min(counts) >= refreshed["before"]["events"], seen
    old = spark.read.format("delta").option("versionAsOf", at - 1).load(events)
    assert "battery_level" not in old.columns and old.count() == refreshed["before"]["events"]


def test_the_audit_proves_the_books_the_zip_codes_and_every_gold_version_since(spark, refreshed):
    report = refreshed["audit"]
    assert report["ok"], report["failures"]
    books = {b["name"]: b for b in report["accounting"]}
    assert books and all(b["status"] in ("PASS", "SKIP") for b in books.values()), books
    assert books["silver"]["status"] == "PASS" and books["silver.late_events"]["status"] == "PASS", books
    silver = next(t for t in report["tables"] if t["table"] == f"silver.{refreshed['new'].silver_table}")
    assert silver["attribution"]["status"] == "PASS", silver["attribution"]
    for t in report["tables"]:
        if t["table"].startswith("gold."):
            assert t["prefix"] and t["prefix"][-1]["status"] == "PASS", t


def test_a_refresh_killed_in_silver_s_switch_then_in_gold_s_rebuild_is_finished_by_running_it_again(
        spark, refreshed, tmp_path):
    """kill -9 of a silver refresh once its switch has begun, then of the next one while it
    rebuilds gold (on a copy of the refreshed lakehouse): meanwhile silver and gold refuse to
    start, naming the refresh; running it again finishes it, each table switched once, nothing
    lost or doubled, and the audit passes."""
    import shutil

    from audit.__main__ import run_audit
    from common.errors import JobError
    from common.lineage import parse
    from pipeline.runner import start

    shutil.copytree(Path(str(refreshed["new"].root)), tmp_path / "lakehouse")
    forget_names(spark)
    env = {"PROFILES_DIR": str(refreshed["profiles"])}
    cfg = config(tmp_path, **env)
    events = cfg.table_path("silver", cfg.silver_table)
    ids = spark.read.format("delta").load(events).select("event_id").distinct().count()
    state_file = Path(str(cfg.checkpoint_root)) / "_refresh" / "silver" / "refresh.json"

    def phase() -> str | None:
        try:
            return json.loads(state_file.read_text()).get("phase")
        except (OSError, ValueError):
            return None
    kill_refresh(tmp_path, env, lambda: phase() == "switching", "silver's switch began", "silver")
    refresh_id = json.loads(state_file.read_text())["id"]
    for layer in ("silver", "gold"):
        with pytest.raises(JobError, match=f"refresh of silver \\({refresh_id}\\) was stopped while switching"):
            start(spark, cfg, layer, **({"suites": {}} if layer == "gold" else {}))
    kill_refresh(tmp_path, env, lambda: phase() == "gold" and (Path(str(cfg.checkpoint_root)) / "_refresh" / "gold").is_dir(),
                 "gold's rebuild began", "silver")
    with pytest.raises(JobError, match="while switching gold, after silver's switch"):
        start(spark, cfg, "gold", suites={})
    done = refresh(spark, cfg, "silver", wait_s=5)
    assert done["id"] == refresh_id and not state_file.exists()
    for table in (cfg.silver_table, "quarantine"):
        rows = DeltaTable.forPath(spark, cfg.table_path("silver", table)).history().select("userMetadata").collect()
        switches = [m for m in map(parse, (r.userMetadata for r in rows))
                    if m and (m.get("refresh") or {}).get("id") == refresh_id]
        assert len(switches) == 1, (table, switches)
    rows = spark.read.format("delta").load(events)
    assert rows.count() == rows.select("event_id").distinct().count() == ids
    report = run_audit(spark, cfg)
    assert report["ok"], report["failures"]
    forget_names(spark)


def test_a_running_pipeline_hands_silver_and_gold_over_and_parses_by_the_new_profile_after(spark, tmp_path):
    """run-all streams in a process of its own (processing-time) with a profile folder of its
    own. The profile on disk is changed to declare battery_level and silver refreshed: the
    process hands silver's and gold's checkpoints over between batches, bronze never stopping,
    reloads the profile, and its live silver fills the new column for what lands next."""
    from audit.__main__ import run_audit

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nest.yaml").write_text((REPO / "conf" / "profiles" / "nest.yaml").read_text())
    old = config(tmp_path, PROFILES_DIR=str(profiles))
    old.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    old.locations_csv.write_text(LOCATIONS)
    land(old, 0)
    proc, log_path = start_run_all(tmp_path, PROFILES_DIR=str(profiles))
    events = old.table_path("silver", old.silver_table)
    wait_for = waiter(proc, log_path)

    def charged(level: float) -> int:
        return spark.read.format("delta").load(events).where(f"battery_level = {level}").count()

    try:
        wait_for("gold to fold round 0", lambda: spark.read.format("delta").load(
            old.table_path("gold", "device_sessions")).count() > 0)
        declaring_battery(profiles)
        new = config(tmp_path, PROFILES_DIR=str(profiles))
        done = refresh(spark, new, "silver", wait_s=240)
        text = log_path.read_text()
        assert f"silver: handing the checkpoint over to refresh {done['id']}" in text
        assert f"gold: handing the checkpoint over to refresh {done['id']}" in text
        assert charged(0.5) == 1                                  # round 0's, from bronze's raw bytes
        wait_for("the process to take silver back by the new profile",
                 lambda: "silver: checkpoint back from refresh" in log_path.read_text(), 60)
        land(new, 3)
        wait_for("the live silver to parse round 3 by the new profile", lambda: charged(0.75) == 1)
        stop_run_all(proc, log_path)
    finally:
        kill_run_all(proc)
    assert "runs its logic from now on" in log_path.read_text()
    report = run_audit(spark, new)
    assert report["ok"], report["failures"]
    forget_names(spark)
