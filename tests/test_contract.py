"""The schema contract (issue 59 part 1): what silver does with a key the profile does not
declare, per level (record, element, nested), and with an optional field's wrong-typed value.

The batch functions first (static bronze rows, the very functions the stream runs), then the
three modes on a live silver query that meets a drifted file in a later micro-batch, then the
generator's drifting feed through bronze and silver with nothing missing.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from common.config import ConfigError, load_config
from silver import contract as C
from silver import transform as T
from tests.test_schema_drift import camera, line, live_config, write
from tests.test_silver_transform import bronze_df

REPO = Path(__file__).resolve().parent.parent
NEST = yaml.safe_load((REPO / "conf/profiles/nest.yaml").read_text())


def profile_dir(tmp_path: Path, name: str = "drifting", contract: dict | None = None,
                fields: list[dict] = (), schema_extra: str = "") -> Path:
    """A copy of the nest profile under another name, its contract and fields changed."""
    raw = json.loads(json.dumps(NEST))
    if contract is not None:
        raw["parse"]["contract"] = contract
    raw["parse"]["fields"] += list(fields)
    if schema_extra:    # nest declares its raw schema: a new camera field is read only if it is in it
        raw["parse"]["schema"] = raw["parse"]["schema"].replace("is_online: STRING,",
                                                                f"is_online: STRING, {schema_extra},")
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    return folder


def profile(tmp_path, **kw):
    return load_config(env={"PROFILE": "drifting", "PROFILES_DIR": str(profile_dir(tmp_path, **kw)),
                            "LAKEHOUSE_ROOT": str(tmp_path / "lh")}).profile


def parse(spark, prof, raws):
    silver = load_config(env={}).silver
    return T.parse_events(bronze_df(spark, raws), silver.min_event_time, silver.max_future.seconds, prof)


def drifted_record() -> str:
    cams = [camera("cam-0001", "10:30", firmware={"version": "5.2"}, last_event={"has_animal": True}),
            camera("cam-0002", "10:35", battery_level=0.81, is_online="yes")]
    return line(cams, schema_version=2).decode().rstrip("\n")


def by_device(parsed) -> dict:
    as_json = [F.to_json(C.RESCUED).alias("rescued"), F.to_json(C.EVOLVED).alias("evolved"),
               F.to_json(C.VIOLATIONS).alias("violations")]
    return {r.device_id: r for r in parsed.select("device_id", "reasons", "is_online", *as_json).collect()}


# --- the batch functions ---------------------------------------------------------------------

def test_the_shipped_contract_rescues_undeclared_keys_of_every_level_as_json(spark):
    nest = load_config(env={}).profile
    rows = by_device(parse(spark, nest, [drifted_record(), line([camera("cam-0003", "11:00")]).decode().strip()]))
    # Each key under the path a field would declare it by; the record's own keys with `$.`;
    # metadata is known (the profile's contract says so), so never rescued.
    assert json.loads(rows["cam-0001"].rescued) == {"$.schema_version": 2, "firmware": {"version": "5.2"},
                                                    "last_event.has_animal": True}
    assert rows["cam-0001"].reasons == []
    # The wrong-typed optional field keeps its reason (the default), beside the rescued key.
    assert rows["cam-0002"].reasons == ["wrong_type:is_online"]
    assert json.loads(rows["cam-0002"].rescued) == {"$.schema_version": 2, "battery_level": 0.81}
    assert rows["cam-0003"].rescued is None and rows["cam-0003"].reasons == []
    assert {r.evolved for r in rows.values()} == {None} and {r.violations for r in rows.values()} == {None}


def test_each_level_follows_its_own_mode(spark, tmp_path):
    prof = profile(tmp_path, contract={"record": "discard", "element": "evolve", "nested": "fail",
                                       "known": ["$.metadata"]})
    rows = by_device(parse(spark, prof, [drifted_record()]))
    assert rows["cam-0001"].rescued is None
    assert json.loads(rows["cam-0001"].evolved) == {"firmware": {"version": "5.2"}}
    assert json.loads(rows["cam-0001"].violations) == {"last_event.has_animal": True}
    assert json.loads(rows["cam-0002"].evolved) == {"battery_level": 0.81}


def test_a_wrong_typed_optional_value_can_be_rescued_instead_of_quarantined(spark, tmp_path):
    prof = profile(tmp_path, contract={"known": ["$.metadata"], "wrong_type": "rescue", "record": "discard"})
    bad_time = camera("cam-0004", "10:40", last_event={"start_time": 1793527920})    # required: still quarantined
    rows = by_device(parse(spark, prof, [drifted_record(), line([bad_time]).decode().strip()]))
    assert rows["cam-0002"].reasons == [] and rows["cam-0002"].is_online is None
    assert json.loads(rows["cam-0002"].rescued) == {"battery_level": 0.81, "is_online": "yes"}
    assert rows["cam-0004"].reasons == ["bad_timestamp:start_time"]


def test_a_newly_declared_field_fills_past_rows_from_bronzes_bytes(spark, tmp_path):
    """Declaring a field the feed has carried for a while: silver recomputed from bronze (the
    same batch functions) holds its value for every past event, and stops rescuing it."""
    past = [drifted_record(), line([camera("cam-0005", "09:00", battery_level=0.5)]).decode().strip(),
            line([camera("cam-0006", "09:10")]).decode().strip()]
    before = by_device(parse(spark, load_config(env={}).profile, past))
    assert json.loads(before["cam-0005"].rescued) == {"battery_level": 0.5}
    declared = profile(tmp_path, fields=[{"name": "battery_level", "type": "double"}],
                       schema_extra="battery_level: STRING")
    after = parse(spark, declared, past)
    values = {r.device_id: (r.battery_level, r.rescued) for r in
              after.select("device_id", "battery_level", F.to_json(C.RESCUED).alias("rescued")).collect()}
    assert values["cam-0005"] == (0.5, None)
    assert values["cam-0002"] == (0.81, '{"$.schema_version":2}')
    assert values["cam-0006"] == (None, None)


def test_a_contract_mode_or_key_that_does_not_exist_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"drifting.yaml: key 'parse.contract.element': expected one of "
                                          r"rescue, evolve, fail, discard, got 'freeze'"):
        profile(tmp_path, contract={"element": "freeze"})
    with pytest.raises(ConfigError, match=r"key 'parse.contract.levels': unknown key"):
        profile(tmp_path, contract={"levels": "rescue"})


# --- the modes on a live stream ----------------------------------------------------------------

DRIFTED = line([camera("cam-0001", "10:30", last_event={"has_animal": True}),
                camera("cam-0002", "10:35", battery_level=0.81)]) + line([camera("cam-0001", "10:50")])


def run_drift(spark, env, tmp_path, contract: dict):
    """bronze and silver live (processing time); the drifted file lands after silver's first
    batch. Returns (config, silver query, the first batch id, the error silver stopped on)."""
    from pipeline.runner import start

    folder = profile_dir(tmp_path, contract=contract)
    live = live_config(env, PROFILE="drifting", PROFILES_DIR=str(folder))
    bronze_q, = start(spark, live, "bronze", source="files")
    silver_q, error = None, None
    try:
        bronze_q.processAllAvailable()
        silver_q, = start(spark, live, "silver")
        silver_q.processAllAvailable()
        first = silver_q.lastProgress["batchId"]
        write(live.landing, "drifted.jsonl", DRIFTED)
        bronze_q.processAllAvailable()
        try:
            silver_q.processAllAvailable()
        except Exception as e:      # noqa: BLE001 - the fail mode's error, checked by the test
            error = e
    finally:
        for q in (silver_q, bronze_q):
            if q is not None:
                q.stop()
    return live, silver_q, first, error


def table(spark, cfg, layer, name):
    return spark.read.format("delta").load(cfg.table_path(layer, name))


def silver_books(spark, cfg) -> tuple:
    acc = table(spark, cfg, "ops", "batch_accounting").where("layer = 'silver'")
    booked = acc.agg(F.sum("events_rescued"), F.sum("fields_rescued")).first()
    silver = table(spark, cfg, "silver", "camera_events").where("_rescued_data IS NOT NULL")
    held = silver.agg(F.count(F.lit(1)), F.sum(F.size(F.json_object_keys("_rescued_data")))).first()
    return tuple(booked), tuple(held)


def test_rescue_keeps_new_keys_in_the_rescued_column_and_books_them(spark, env, cfg, tmp_path):
    live, silver_q, first, error = run_drift(spark, env, tmp_path, {"known": ["$.metadata"]})
    assert error is None and silver_q.exception() is None
    rows = {(r.device_id, r.hm): r._rescued_data for r in table(spark, live, "silver", "camera_events")
            .selectExpr("device_id", "date_format(start_time, 'HH:mm') AS hm", "_rescued_data").collect()}
    assert rows == {("cam-0001", "10:00"): None, ("cam-0002", "10:05"): None,
                    ("cam-0001", "10:30"): '{"last_event.has_animal":true}',
                    ("cam-0002", "10:35"): '{"battery_level":0.81}', ("cam-0001", "10:50"): None}
    # The accounting counts what silver holds: 2 events with rescued data, 2 keys among them.
    assert silver_books(spark, live) == ((2, 2), (2, 2))
    fields = {r.field: r for r in table(spark, live, "ops", "new_fields").collect()}
    assert sorted(fields) == ["battery_level", "last_event.has_animal"]
    animal = fields["last_event.has_animal"]
    assert (animal.level, animal.mode, animal.records, animal.events) == ("nested", "rescue", 1, 1)
    assert animal.batch_id > first and animal.first_at.endswith("drifted.jsonl line 1")
    assert fields["battery_level"].level == "element"
    # The audit's identities over the same tables, and what `make status` shows of the keys.
    from audit.books import rescued_books
    from tools.status import new_fields, render

    paths = {"silver.camera_events": live.table_path("silver", "camera_events"),
             "ops.batch_accounting": live.table_path("ops", "batch_accounting")}
    assert [(c.name, c.status) for c in rescued_books(spark, live, paths)] == [
        ("silver rescued events", "PASS"), ("silver rescued keys", "PASS")]
    shown = {f["field"]: f for f in new_fields(spark, live)}
    assert (shown["battery_level"]["records"], shown["battery_level"]["mode"]) == (1, "rescue")
    assert shown["battery_level"]["first_at"].endswith("drifted.jsonl line 1")
    text = render([{"query": "silver", "state": "stopped"}], list(shown.values()))
    assert "keys the profile does not declare" in text and "last_event.has_animal" in text


def test_evolve_grows_silver_by_a_column_in_the_running_stream(spark, env, cfg, tmp_path):
    live, silver_q, first, error = run_drift(spark, env, tmp_path, {"known": ["$.metadata"], "element": "evolve",
                                                                    "nested": "evolve"})
    assert error is None and silver_q.exception() is None
    silver = table(spark, live, "silver", "camera_events")
    assert dict(silver.dtypes)["battery_level"] == "string"
    assert dict(silver.dtypes)["last_event_has_animal"] == "string"
    rows = {(r.device_id, r.hm): (r.battery_level, r.last_event_has_animal, r._rescued_data) for r in
            silver.selectExpr("device_id", "date_format(start_time, 'HH:mm') AS hm", "battery_level",
                              "last_event_has_animal", "_rescued_data").collect()}
    assert rows == {("cam-0001", "10:00"): (None, None, None), ("cam-0002", "10:05"): (None, None, None),
                    ("cam-0001", "10:30"): (None, "true", None), ("cam-0002", "10:35"): ("0.81", None, None),
                    ("cam-0001", "10:50"): (None, None, None)}
    modes = {(r.field, r.mode, r.column) for r in table(spark, live, "ops", "new_fields").collect()}
    assert modes == {("battery_level", "evolve", "battery_level"),
                     ("last_event.has_animal", "evolve", "last_event_has_animal")}
    assert silver_books(spark, live) == ((0, 0), (0, None))


def test_fail_stops_the_batch_naming_the_field_and_where_it_came_from(spark, env, cfg, tmp_path):
    live, silver_q, first, error = run_drift(spark, env, tmp_path, {"known": ["$.metadata"], "nested": "fail"})
    assert error is not None
    message = str(silver_q.exception() or error)
    assert "'last_event.has_animal' (nested level, 1 records, first in" in message
    assert "drifted.jsonl line 1" in message
    # Nothing of the drifted batch was committed: silver holds the first file's events only,
    # and the accounting has no row past the first batch.
    assert table(spark, live, "silver", "camera_events").count() == 2
    assert table(spark, live, "silver", "quarantine").count() == 0
    failed = int(re.search(r"silver batch (\d+): profile drifting does not declare", message)[1])
    batches = [r.batch_id for r in table(spark, live, "ops", "batch_accounting").where("layer = 'silver'").collect()]
    assert failed > first and max(batches) < failed
    assert table(spark, live, "ops", "new_fields").count() == 0


# --- the generator's drifting feed --------------------------------------------------------------

def test_a_drifting_feed_loses_nothing_and_every_drifted_event_is_accounted_for(spark, env, cfg, tmp_path):
    """Generated events whose feed drifts half-way (a new field, a type change, a removed
    field, camera by camera in turn), through bronze and silver: every record in bronze byte
    for byte; each drifted event in silver with its rescued key, or in quarantine with the
    reason its change earns; the rest in silver untouched; nothing missing."""
    from pipeline.runner import start
    from tools.generator import events as gen

    run = load_config(env={**env, "TRIGGER": "available-now"})
    params = replace(gen.Params.from_config(run.generator), duplicate_rate=0.0, late_rate=0.0, malformed_rate=0.0,
                     unknown_device_rate=0.0, drift_at=0.5)
    batch = gen.generate(600, params, 21)
    files = gen.write_files(batch.records, run.landing, 21, 4)
    gen.write_locations(run.locations_csv, params.devices, run.silver.min_event_time)
    for name, options in (("bronze", {"source": "files"}), ("silver", {})):
        for q in start(spark, run, name, **options):
            q.awaitTermination()
            assert q.exception() is None

    raw = sorted(bytes(r.raw) for r in table(spark, run, "bronze", "events")
                 .selectExpr("coalesce(CAST(raw AS BINARY), raw_bytes) AS raw").collect())
    assert raw == sorted(r.value for r in batch.records) and len(files) == 4

    drift = batch.drift
    assert drift == {"new_field": 100, "type_change": 100, "removed_field": 100}
    silver = table(spark, run, "silver", "camera_events")
    quarantine = table(spark, run, "silver", "quarantine").select(F.explode("reasons").alias("reason"))
    reasons = {r.reason: r["count"] for r in quarantine.groupBy("reason").count().collect()}
    assert reasons == {"wrong_type:is_online": drift["type_change"], "missing_field:has_sound": drift["removed_field"]}
    rescued = {r._rescued_data: r["count"] for r in silver.groupBy("_rescued_data").count().collect()}
    assert sum(n for text, n in rescued.items() if text and json.loads(text).keys() == {"battery_level"}) \
        == drift["new_field"]
    assert rescued[None] == batch.counts["events"] - sum(drift.values())
    # Nothing missing: every generated event is a silver row or a quarantined one.
    assert silver.count() + sum(reasons.values()) == batch.counts["events"]
    fields = table(spark, run, "ops", "new_fields").groupBy("field").agg(F.sum("events").alias("events")).collect()
    assert {(r.field, r.events) for r in fields} == {("battery_level", drift["new_field"])}


def test_gold_streaming_from_silver_restarts_when_a_column_evolves(spark, env, cfg, tmp_path):
    """Delta's streaming source stops a running query whose table grew a column; gold's flow
    recovers by starting again on its checkpoint, which reads the new schema and goes on."""
    from gold.job import layer
    from pipeline.runner import start

    folder = profile_dir(tmp_path, contract={"known": ["$.metadata"], "element": "evolve"})
    live = live_config(env, PROFILE="drifting", PROFILES_DIR=str(folder))
    queries = []
    try:
        bronze_q, = start(spark, live, "bronze", source="files")
        bronze_q.processAllAvailable()
        silver_q, = start(spark, live, "silver")
        silver_q.processAllAvailable()
        gold_q, = start(spark, live, "gold", only={"sightings"})
        queries = [gold_q, silver_q, bronze_q]
        gold_q.processAllAvailable()
        write(live.landing, "drifted.jsonl", DRIFTED)
        bronze_q.processAllAvailable()
        silver_q.processAllAvailable()
        assert "battery_level" in table(spark, live, "silver", "camera_events").columns
        with pytest.raises(Exception, match="DELTA_SCHEMA_CHANGED"):
            gold_q.processAllAvailable()
        recovery = layer(live, only={"sightings"}).flows[0].recovery()
        again = recovery.resume(spark, gold_q.exception(), gold_q, None).query
        queries.append(again)
        again.processAllAvailable()
        assert again.isActive and again.exception() is None
    finally:
        for q in queries:
            q.stop()
    sightings = table(spark, live, "gold", "zip_hourly_sightings").agg(F.sum("events")).first()[0]
    assert sightings == 5        # the first file's 2 events and the drifted file's 3


# --- the key scan: which records silver reads again -------------------------------------------

def _records(name: str) -> list[str]:
    """Records of each shipped profile, as bronze holds them, with and without undeclared keys."""
    from tests.test_profiles import CLOUDTRAIL, EVENTS, need

    if name == "nest":
        corpus = sorted(line for f in sorted((REPO / "tests" / "corpus").glob("**/*.jsonl"))
                        for line in f.read_text(errors="replace").split("\n") if line.strip())
        quoted = ("{'devices': {'cameras': {'cam-0009': {'device_id': 'cam-0009', 'name': 'x', 'is_online': true, "
                  "'last_event': {'start_time': '2026-11-01T10:00:00Z', 'has_motion': NaN, 'new_key': 1}}}}}")
        return [*corpus, drifted_record(), quoted, quoted.replace(", 'new_key': 1", "")]
    if name == "events":
        lines = (need(EVENTS) / "file-0.json").read_text().splitlines()[:50]
        return [*lines, '{"time":1469501107,"action":"Open","device":{"id":7}}', '{"action":"Open","time":1}',
                '{"time":1469501107,"action":"Open","act\\u0069on":"Close"}', "[1, 2]", '"text"',
                '{"extra":null,"time":1469501107,"action":"Close"}', '{"time":1469501107,"action":"Open","\\u0078":[1]}']
    import gzip

    files = sorted(need(CLOUDTRAIL).glob("*.json.gz"))[:3]
    records = [gzip.decompress(f.read_bytes()).decode() for f in files]
    base = json.loads(records[0])
    first = base["Records"][0]

    def variant(top=None, **element):
        changed = json.loads(json.dumps(first))
        for path, value in element.items():
            node = changed
            *parents, leaf = path.split("__")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return json.dumps({"Records": [first, changed], **(top or {})})

    return [*records, variant(top={"digest": "abc"}), variant(newKey=1), variant(userIdentity__newKey=1),
            variant(userIdentity__sessionContext__attributes__newKey="x"), variant(sharedEventID="known"),
            variant(userIdentity__sessionContext="not an object"), variant(Records_=1)]


@pytest.mark.parametrize("name", ["nest", "events", "cloudtrail"])
def test_the_key_scan_sends_exactly_the_records_with_undeclared_keys_to_the_second_read(spark, monkeypatch, name):
    """silver_undeclared_keys (jvm/silver-keys) says which records silver reads again for their
    undeclared keys. Against the second read on every record (as before the scan): silver's rows
    are the same, and the scan says true for exactly the parsed records in which that read found
    a key (a false positive would cost a read, a false negative would lose a key silently)."""
    prof = load_config(env={"PROFILE": name}).profile
    raws = _records(name)
    bronze = bronze_df(spark, raws)
    as_json = {c: F.to_json(c) for c in C.BY_MODE.values()}
    scanned = parse(spark, prof, raws).withColumns(as_json)
    with monkeypatch.context() as m:
        m.setattr(C, "may_have_undeclared", lambda *a: None)
        every = parse(spark, prof, raws).withColumns(as_json)
    assert scanned.exceptAll(every).count() == 0 and every.exceptAll(scanned).count() == 0

    found = {r.bronze_line_number: r.found for r in every.groupBy("bronze_line_number").agg(
        F.max("parsed").alias("parsed"),
        F.max(F.greatest(*[F.col(c).isNotNull() for c in C.BY_MODE.values()])).alias("found"))
        .where("parsed").collect()}
    text = F.regexp_replace("raw", f"^{T.BOM}", "")
    flags = {r.line_number: r.flag for r in bronze.select(
        "line_number", C.may_have_undeclared(text, prof, spark).alias("flag")).collect()}
    assert sum(found.values()) >= 3 and len(found) - sum(found.values()) >= 3, "both kinds are in the test"
    assert {n: flags[n] for n in found} == found
