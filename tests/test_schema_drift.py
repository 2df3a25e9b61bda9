"""Schema drift: new fields in the raw JSON (top level, inside devices, a camera, last_event; a
field silver does not read changing type) must not break silver. Bronze keeps them in `raw`,
silver keeps flowing and the known fields reach silver and gold.

The drifted file arrives while bronze and silver are running (processing-time queries on their
checkpoints), so silver meets it in a later micro-batch of a live query; gold then runs over it.
"""
from __future__ import annotations

import json

from common.config import load_config

LOCATIONS = "device_id,zip_code,city,state\ncam-0001,02108,Boston,MA\ncam-0002,94105,San Francisco,CA\n"


def camera(device: str, start: str, **drift) -> dict:
    last = {"has_sound": False, "has_motion": True, "has_person": True,
            "start_time": f"2026-11-01T{start}:00.000Z", "end_time": f"2026-11-01T{start}:30.000Z"}
    last.update(drift.pop("last_event", {}))
    return {"device_id": device, "name": f"Room {device}", "is_online": True, "last_event": last, **drift}


def line(cameras: list[dict], **top) -> bytes:
    record = {"devices": {"cameras": {c["device_id"]: c for c in cameras}},
              "metadata": {"access_token": "c.abc", "client_version": 1}, **top}
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


BEFORE = line([camera("cam-0001", "10:00")]) + line([camera("cam-0002", "10:05")])
DRIFTED = line([camera("cam-0001", "10:30", firmware={"version": "5.2", "channels": [1, 2]},
                       last_event={"has_animal": True, "zones": [{"id": 3, "name": "porch"}],
                                   "image_url": None}),
                camera("cam-0002", "10:35", battery_level=0.81)],
               schema_version=2, sent_at=1793527920,
               metadata={"access_token": "c.abc", "client_version": {"major": 2, "minor": 0}},
               structures={"s1": {"name": "home"}}) \
    .replace(b'"devices":{', b'"devices":{"doorbells":[{"device_id":"bell-1"}],', 1)


def write(landing, name: str, data: bytes) -> None:
    tmp = landing / f".{name}.tmp"   # renamed when complete: the file source never reads half a file
    tmp.write_bytes(data)
    tmp.rename(landing / name)


def live_config(env, **settings: str):
    """A processing-time config (`settings`: more of its environment), its locations written
    and the feed's first file landed."""
    live = load_config(env={**env, "TRIGGER": "processing-time", "TRIGGER_INTERVAL": "1 second", **settings})
    live.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    live.locations_csv.write_text(LOCATIONS)
    live.landing.mkdir(parents=True)
    write(live.landing, "before.jsonl", BEFORE)
    return live


def test_new_fields_arriving_in_a_running_stream_flow_through_silver_and_gold(spark, env, cfg):
    # `cfg` is asked for its teardown: it forgets this test's table names.
    from pipeline.runner import start

    live = live_config(env)

    bronze_q, = start(spark, live, "bronze", source="files")
    silver_q = None
    try:
        bronze_q.processAllAvailable()
        silver_q, = start(spark, live, "silver")
        silver_q.processAllAvailable()
        first_batch = silver_q.lastProgress["batchId"]

        write(live.landing, "drifted.jsonl", DRIFTED)
        bronze_q.processAllAvailable()
        silver_q.processAllAvailable()
        assert bronze_q.isActive and silver_q.isActive, "a query stopped on the drifted file"
    finally:
        for q in (silver_q, bronze_q):
            if q is not None:
                q.stop()
    assert silver_q.exception() is None and bronze_q.exception() is None

    read = lambda layer, name: spark.read.format("delta").load(live.table_path(layer, name))  # noqa: E731
    # Bronze: the drifted line byte for byte, new fields and all.
    raw = [bytes(r.raw) for r in read("bronze", "events").where("file_path LIKE '%drifted.jsonl'")
           .selectExpr("coalesce(CAST(raw AS BINARY), raw_bytes) AS raw").collect()]
    assert raw == [DRIFTED.rstrip(b"\n")]

    # Silver: the drifted events with their known fields, from a later batch of the same query.
    silver = {(r.device_id, r.start_hm): r for r in read("silver", "camera_events")
              .selectExpr("*", "date_format(start_time, 'HH:mm') AS start_hm").collect()}
    assert sorted(silver) == [("cam-0001", "10:00"), ("cam-0001", "10:30"),
                              ("cam-0002", "10:05"), ("cam-0002", "10:35")]
    for key in (("cam-0001", "10:30"), ("cam-0002", "10:35")):
        r = silver[key]
        assert r.bronze_file_path.endswith("drifted.jsonl")
        assert r.silver_batch_id > first_batch
        assert (r.has_person, r.has_motion, r.has_sound, r.is_online) == (True, True, False, True)
        assert r.duration_seconds == 30 and not r.unknown_device and r.zip_code
    assert read("silver", "quarantine").count() == 0
    accounting = read("ops", "batch_accounting").where("layer = 'silver'").collect()
    assert sum(r.events_written for r in accounting) == 4
    assert all(r.events_parsed == r.events_written for r in accounting)

    # Gold: the drifted events are counted like any other.
    gold_cfg = load_config(env={**env, "TRIGGER": "available-now"})
    for query in start(spark, gold_cfg, "gold", only={"sightings", "activity"}):
        query.awaitTermination()
    sightings = {(r.zip_code, r.hour): r.sightings for r in read("gold", "zip_hourly_sightings")
                 .selectExpr("zip_code", "date_format(window_start, 'HH:mm') AS hour", "sightings").collect()}
    assert sightings == {("02108", "10:00"): 2, ("94105", "10:00"): 2}
    activity = {r.window: r.person_events for r in read("gold", "device_activity")
                .where("device_id = 'cam-0002'")
                .selectExpr("date_format(window_start, 'HH:mm') AS window", "person_events").collect()}
    assert activity["10:30"] == 1 and activity["10:35"] == 1   # 10:35 falls in both windows
