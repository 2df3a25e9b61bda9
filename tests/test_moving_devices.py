"""Cameras move mid-stream (issue 59 part 2): gold's hourly sightings per zip, through real
streaming runs (bronze -> silver -> gold on their checkpoints), equal an independent
point-in-time recount cell by cell, and the audit proves every gold version.

Round 1 carries events from 08:00 to 10:00. Then two locations files arrive, out of order: as
of 11:00, then as of 10:00 (cam-0001 and cam-0002 move, cam-0003 is gone, cam-0007 is new at
10:00; cam-0004 moves at 11:00). Round 2 carries events from 10:00 to 12:00, and events from
before the move that arrive late (they keep the zip valid at their time).
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from random import Random

from audit.__main__ import run_audit
from audit.history import table_history
from silver.locations import load

DAY = datetime(2026, 11, 1, tzinfo=timezone.utc)
HEAD = "device_id,zip_code,city,state,as_of\n"
ZIPS = {"02108": ("Boston", "MA"), "94105": ("San Francisco", "CA"), "10001": ("New York", "NY")}
# as-of hour -> the full snapshot: device -> zip. The recount below reads these and nothing else.
SNAPSHOTS = {
    0: {"cam-0001": "02108", "cam-0002": "02108", "cam-0003": "94105", "cam-0004": "94105",
        "cam-0005": "10001", "cam-0006": "10001"},
    10: {"cam-0001": "10001", "cam-0002": "94105", "cam-0004": "94105", "cam-0005": "10001",
         "cam-0006": "10001", "cam-0007": "02108"},
    11: {"cam-0001": "10001", "cam-0002": "94105", "cam-0004": "10001", "cam-0005": "10001",
         "cam-0006": "10001", "cam-0007": "02108"},
}
DEVICES = [f"cam-000{i}" for i in range(1, 8)] + ["cam-0009"]      # cam-0009 is never located


def snapshot_csv(hour: int) -> str:
    stamp = (DAY + timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return HEAD + "".join(f"{d},{z},{','.join(ZIPS[z])},{stamp}\n" for d, z in SNAPSHOTS[hour].items())


def located(device: str, t: datetime):
    """The zip valid at `t`: the latest snapshot as of t or before; None: no location then."""
    hours = [h for h in SNAPSHOTS if DAY + timedelta(hours=h) <= t]
    return SNAPSHOTS[max(hours)].get(device) if hours else None


def events(rng: Random, start: str, end: str, devices=DEVICES, second: int = 0) -> list[tuple]:
    """(device, time, has_person): each device every 6 to 9 minutes in [start, end)."""
    out = []
    lo, hi = (DAY + timedelta(hours=int(x[:2]), minutes=int(x[3:])) for x in (start, end))
    for device in devices:
        t = lo + timedelta(minutes=rng.randint(0, 5), seconds=second)
        while t < hi:
            out.append((device, t, rng.random() < 0.6))
            t += timedelta(minutes=rng.randint(6, 9))
    return out


def record(device: str, t: datetime, person: bool) -> str:
    iso = lambda x: x.strftime("%Y-%m-%dT%H:%M:%S.000Z")  # noqa: E731
    last = {"has_sound": False, "has_motion": True, "has_person": person,
            "start_time": iso(t), "end_time": iso(t + timedelta(seconds=30))}
    return json.dumps({"devices": {"cameras": {device: {"device_id": device, "name": device, "is_online": True,
                                                        "last_event": last}}}})


def run_round(spark, cfg, n: int, batch: list[tuple]) -> None:
    from pipeline.runner import start

    landing = Path(cfg.landing)
    landing.mkdir(parents=True, exist_ok=True)
    tmp = landing / f".round-{n}.tmp"
    tmp.write_text("".join(record(*e) + "\n" for e in batch))
    tmp.rename(landing / f"round-{n}.json")
    for name, options in (("bronze", {"source": "files"}), ("silver", {}), ("gold", {"suites": {}})):
        for query in start(spark, cfg, name, **options):
            query.awaitTermination()


def recount(all_events: list[tuple]) -> dict:
    """(hour, zip, unknown_device) -> (sightings, events), each event at its location then."""
    sightings, counts = Counter(), Counter()
    for device, t, person in all_events:
        zip_code = located(device, t)
        cell = (t.replace(minute=0, second=0).strftime("%H:%M"), zip_code, zip_code is None)
        sightings[cell] += person
        counts[cell] += 1
    return {cell: (sightings[cell], counts[cell]) for cell in counts}


def test_gold_per_zip_equals_a_point_in_time_recount_across_moves_and_every_version_is_proven(spark, cfg):
    rng = Random(59)
    first = events(rng, "08:00", "10:00")
    # Late, from before the move, with times round 1 did not have (second 17): the old zip.
    late = events(rng, "09:10", "10:00", devices=["cam-0001", "cam-0002", "cam-0003", "cam-0007"], second=17)
    second = events(rng, "10:00", "12:00") + late
    assert len(first) + len(second) > 250

    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text(snapshot_csv(0))                    # the first run's seed
    run_round(spark, cfg, 0, first)
    for hour in (11, 10):                                            # out of order
        path = cfg.locations_csv.parent / f"as-of-{hour}.csv"
        path.write_text(snapshot_csv(hour))
        assert load(spark, cfg, path) is not None
    run_round(spark, cfg, 1, second)

    gold = spark.read.format("delta").load(cfg.table_path("gold", "zip_hourly_sightings")).collect()
    table = {(r.window_start.strftime("%H:%M"), r.zip_code, r.unknown_device): (r.sightings, r.events)
             for r in gold}
    expected = recount(first + second)
    differ = {c: (table.get(c), expected.get(c)) for c in table.keys() | expected.keys() if table.get(c) != expected.get(c)}
    assert differ == {}, differ
    # The moves show in the cells: cam-0001's zip before and after 10:00, the late events included.
    assert located("cam-0001", DAY + timedelta(hours=9, minutes=59)) == "02108"
    assert ("10:00", "02108", False) in expected and ("11:00", None, True) in expected

    # Silver's batches pinned the dimension version they joined: the seed, then both loads.
    pins = [v.lineage["dimensions"]["silver.device_locations"]
            for v in table_history(spark, cfg.table_path("silver", "camera_events"))
            if v.lineage and "dimensions" in v.lineage]
    assert pins[0] == 0 and pins[-1] == 2, pins

    # Every gold version equals the batch recompute over the silver prefix it read.
    report = run_audit(spark, cfg, only="gold.zip_hourly_sightings")
    checks = report["tables"][0]["prefix"]
    assert len(checks) >= 2 and {c["status"] for c in checks} == {"PASS"}, checks
    # Silver's zips equal the join, at each event's time, with the dimension version each batch pinned.
    silver_rows = spark.read.format("delta").load(cfg.table_path("silver", "camera_events")).count()
    attribution = run_audit(spark, cfg, only="silver.camera_events")["tables"][0]["attribution"]
    assert (attribution["status"], attribution["rows_checked"], attribution["rows_unpinned"]) == \
        ("PASS", silver_rows, 0), attribution
    assert attribution["dimension_versions"] == [0, 2]
    # ... and a zip edited by hand is found.
    spark.sql(f"UPDATE delta.`{cfg.table_path('silver', 'camera_events')}` SET zip_code = '00000' "
              "WHERE device_id = 'cam-0002' AND event_time >= '2026-11-01 10:00:00'")
    edited = spark.read.format("delta").load(cfg.table_path("silver", "camera_events")).where("zip_code = '00000'").count()
    attribution = run_audit(spark, cfg, only="silver.camera_events")["tables"][0]["attribution"]
    assert (attribution["status"], attribution["rows_differ"]) == ("FAIL", edited) and edited > 10
