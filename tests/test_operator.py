"""The operator's view: `lakehouse state` (what the stateful queries hold, from their
checkpoints), against the events fed to real streaming queries."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipeline import state as state_cmd
from tools import status
from gold import sessions as S

from test_gold import (GAP_MS, HOUR, MIN, T0_MS, append_silver, drop_names, ev, final_watermark,
                       lakehouse_cfg, nest_sessions, run_gold, silver)
from test_silver_job import (append_bronze, at, camera, isolated_config, record, run_silver,
                             write_locations)

SESSIONS_QUERY = "gold_sessions"        # gold with --only sessions


@pytest.fixture(scope="module")
def gold_state(spark, tmp_path_factory):
    """Two gold batches: the first's sessions of cam-a and cam-b are closed by the second's
    watermark (3 h - 1 h); cam-a and cam-b start new ones, cam-c its first: three open."""
    cfg = lakehouse_cfg(tmp_path_factory.mktemp("operator-gold"))
    append_silver(spark, cfg, [ev("a1", "cam-a", 0), ev("a2", "cam-a", 10 * MIN), ev("b1", "cam-b", 5 * MIN)])
    run_gold(spark, cfg, only={"sessions"}, no_data_batch=False)
    append_silver(spark, cfg, [ev("c1", "cam-c", 3 * HOUR), ev("a3", "cam-a", 170 * MIN),
                               ev("a4", "cam-a", 175 * MIN), ev("b2", "cam-b", 160 * MIN)],
                  batch_id=1, frontier_ms=10 * MIN)
    run_gold(spark, cfg, only={"sessions"})
    yield cfg
    drop_names(spark)


def test_state_lists_the_open_sessions_of_the_events_fed(spark, gold_state, capsys):
    cfg = gold_state
    wm = final_watermark(cfg, SESSIONS_QUERY) - T0_MS
    assert wm == 2 * HOUR
    everything = S.batch_sessions(silver(spark, cfg), nest_sessions())
    still_open = everything.where(F.unix_millis("session_end") - T0_MS + GAP_MS > wm)
    expected = {(r.device_id, r.session_start, r.session_end, r.events) for r in still_open.collect()}
    assert len(expected) == 3 and everything.count() == 5

    held, = state_cmd.read_held(spark, cfg, SESSIONS_QUERY)
    assert held.operator == "applyInPandasWithState"
    assert held.summary["open_sessions"] == 3 and held.keys == 3
    assert {(r["device_id"], r["session_start"], r["last_event"], r["events"]) for r in held.rows} == expected
    # What the watermark closed left the state, and the run's watermark-only batch wrote it closed.
    table_open = set(spark.read.format("delta").load(cfg.table_path("gold", "device_sessions"))
                     .where("status = 'open'").toPandas()["session_id"])
    assert {r["session_id"] for r in held.rows} == table_open

    assert state_cmd.main([SESSIONS_QUERY, "--json"], spark=spark, cfg=cfg) == 0
    out, = json.loads(capsys.readouterr().out)
    assert out["query"] == SESSIONS_QUERY and len(out["rows"]) == 3
    assert state_cmd.main([SESSIONS_QUERY, "--limit", "1"], spark=spark, cfg=cfg) == 0
    text = capsys.readouterr().out
    assert "3 open sessions of 3 device_id values" in text and "2 more (--limit)" in text
    assert "cam-b" in text.splitlines()[2]          # the earliest open session first
    assert status.held_keys(spark, cfg.checkpoint(SESSIONS_QUERY)) == "3 keys with open sessions"


def test_state_reads_the_state_of_a_running_query(spark, tmp_path):
    """Read-only, from the checkpoint: beside a processing-time gold query, each read sees the
    state of the latest committed batch, and the query runs on."""
    import time

    from pipeline.runner import start

    cfg = lakehouse_cfg(tmp_path, TRIGGER="processing-time")

    def after_batch(query, n: int) -> None:
        deadline = time.monotonic() + 120
        while sum(p["numInputRows"] > 0 for p in query.recentProgress) < n:
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.5)

    append_silver(spark, cfg, [ev("a1", "cam-a", 0), ev("b1", "cam-b", 5 * MIN)])
    query, = start(spark, cfg, "gold", only={"sessions"})
    try:
        after_batch(query, 1)
        held, = state_cmd.read_held(spark, cfg, SESSIONS_QUERY)
        assert {(r["device_id"], r["events"]) for r in held.rows} == {("cam-a", 1), ("cam-b", 1)}
        append_silver(spark, cfg, [ev("a2", "cam-a", 10 * MIN), ev("c1", "cam-c", 20 * MIN)], batch_id=1,
                      frontier_ms=5 * MIN)
        after_batch(query, 2)
        held, = state_cmd.read_held(spark, cfg, SESSIONS_QUERY)
        assert {(r["device_id"], r["events"]) for r in held.rows} == {("cam-a", 2), ("cam-b", 1), ("cam-c", 1)}
        assert query.isActive
    finally:
        query.stop()
        drop_names(spark)


def test_state_of_a_query_without_state_is_refused_naming_it(spark, gold_state, capsys):
    assert state_cmd.main(["nothing_here"], spark=spark, cfg=gold_state) == 2
    assert "query nothing_here: no state at" in capsys.readouterr().err


def test_state_counts_silver_dedup_keys_with_their_event_times(spark, tmp_path, capsys):
    cfg = isolated_config(tmp_path)
    write_locations(cfg.locations_csv)
    fed = [record(camera("cam-0001", at("10:00")), camera("cam-0002", at("10:05"))),
           record(camera("cam-0001", at("10:00"))),                   # a duplicate
           record(camera("cam-0003", at("11:30"))), "{not json"]      # a reject
    append_bronze(spark, cfg, fed)
    run_silver(spark, cfg, no_data_batch=False)      # a watermark-only batch would drop the reject's key
    try:
        events = spark.read.format("delta").load(cfg.table_path("silver", "camera_events"))
        seen = events.agg(F.count_distinct("event_id"), F.min("event_time"), F.max("event_time")).first()
        held, = state_cmd.read_held(spark, cfg, "silver")
        assert held.operator == "dedupeWithinWatermark"
        assert seen[0] == 3 and held.keys == 4 and held.summary["reject_keys"] == 1   # and the reject's
        assert (held.summary["oldest_event"], held.summary["newest_event"]) == tuple(seen[1:])
        assert state_cmd.main([], spark=spark, cfg=cfg) == 0
        assert ("silver: dedupeWithinWatermark (batch 0): 4 dedup keys (1 of rejected rows), events from "
                "2026-11-01 10:00:00 to 2026-11-01 11:30:00") in capsys.readouterr().out
        silver_row, = [r for r in status.query_status(spark, cfg) if r["query"] == "silver"]
        assert silver_row["held"] == "4 dedup keys"
    finally:
        drop_names(spark)


def test_a_checkpoint_killed_in_its_first_batch_holds_no_state_and_starts_again(spark, tmp_path):
    """Killed before its first commit, a stateful query leaves its operators described in the
    checkpoint with no committed batch (-1): the state check and `state` pass over them (no
    state read takes batch -1), and the query starts again. A run that refused here would
    refuse for good."""
    from common import state
    from pipeline.checks import state_problems
    from pipeline.runner import declare

    cfg = isolated_config(tmp_path)
    write_locations(cfg.locations_csv)
    append_bronze(spark, cfg, [record(camera("cam-0001", at("10:00")))])
    run_silver(spark, cfg, no_data_batch=False)
    try:
        checkpoint = Path(cfg.checkpoint("silver"))
        for f in (checkpoint / "commits").iterdir():
            f.unlink()                                  # batch 0 never committed
        assert [f.name for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()] == ["0"]
        assert state.operators(spark, str(checkpoint)) == []
        assert state_problems(spark, cfg, declare(cfg, ["silver"])) == []
        assert run_silver(spark, cfg, no_data_batch=False) == [0]       # replayed, and committed
        assert [op.batch for op in state.operators(spark, str(checkpoint))] == [0]
    finally:
        drop_names(spark)


# --- lakehouse check -------------------------------------------------------------------------

def checked(capsys, argv, **kw) -> tuple[int, list[str]]:
    from pipeline import check

    code = check.main(argv, **kw)
    out = capsys.readouterr().out.splitlines()
    return code, [line[4:] for line in out if line.startswith("  - ")]


def test_check_a_config_error_names_the_key_and_starts_no_spark(env, capsys):
    code, problems = checked(capsys, [], env=dict(env, LAKEHOUSE__STREAMING__SILVER_INTERVAL="soon"))
    assert code == 2
    assert len(problems) == 1 and "key 'streaming.silver_interval'" in problems[0], problems
    assert "LAKEHOUSE__STREAMING__SILVER_INTERVAL" in problems[0]


def test_check_an_unreachable_object_store_names_the_root_and_the_error(env, capsys):
    from tools.processes import free_port

    code, problems = checked(capsys, [], env=dict(env, LAKEHOUSE_ROOT="s3a://lake/lh", AWS_ACCESS_KEY_ID="k",
                                                  AWS_SECRET_ACCESS_KEY="s",
                                                  S3_ENDPOINT=f"http://127.0.0.1:{free_port()}"))
    assert code == 2
    assert len(problems) == 1, problems
    assert "key 'paths.lakehouse_root': s3a://lake/lh:" in problems[0] and "connect" in problems[0], problems


def test_check_passes_on_a_fresh_lakehouse_with_its_landing_folder(spark, env, cfg, capsys):
    code, problems = checked(capsys, ["bronze"], spark=spark, env=env)
    assert code == 2 and problems == [f"landing folder {cfg.landing} does not exist (set LANDING, or write "
                                      "files there with `make generate`)"]
    cfg.landing.mkdir(parents=True)
    from pipeline import check

    assert check.main([], spark=spark, env=env) == 0
    out = capsys.readouterr().out
    assert out.startswith("check: OK") and "\n  - " not in out
    # It lists each gold table's constraints with the gate's rule that checks each.
    assert "gold: table constraints, each checked by the gate" in out
    lines = {" ".join(line.split()) for line in out.splitlines()}
    assert "gold.device_activity events_not_negative covered by counts_non_negative" in lines
    assert "gold.device_sessions device_id_not_null derived rule constraint:device_id_not_null" in lines
    # An `after` rule checks a column of the gate's view: the line says which, and what it holds.
    assert ("gold.device_activity window_end_after_window_start derived rule constraint:window_end_after_window_start: "
            "view column window_end_after_window_start = `window_end` > `window_start` (NULL: false) in [true]"
            in lines)


def _foreign_state(spark, root, checkpoint: str) -> None:
    """A checkpoint whose sessions state is keyed by another column than gold's key."""
    import json as js

    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    feed = root / "foreign"
    feed.mkdir()
    (feed / "a.json").write_text(js.dumps({"camera": "c1", "t": "2026-11-01T00:00:00Z"}) + "\n")

    def update(key, frames, state):
        state.update((js.dumps([sum(len(f) for f in frames)]),))
        yield pd.DataFrame({"camera": [key[0]]})

    query = (spark.readStream.schema("camera STRING, t TIMESTAMP").json(str(feed)).withWatermark("t", "1 hour")
             .groupBy("camera").applyInPandasWithState(update, "camera STRING", S.STATE_SCHEMA, "update",
                                                       GroupStateTimeout.NoTimeout)
             .writeStream.format("noop").outputMode("update").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()


def test_check_a_layer_that_cannot_declare_is_one_problem_not_a_missing_table_downstream(spark, env, cfg,
                                                                                         tmp_path, capsys):
    """A suite without the profile's table stops silver before it starts: that is the problem,
    and gold, reading the silver table the run would create, has none of its own."""
    suite = tmp_path / "other.yaml"
    suite.write_text(Path("conf/expectations/events.yaml").read_text())      # silver.actions's
    cfg.landing.mkdir(parents=True)
    code, problems = checked(capsys, [], spark=spark, env=dict(env, LAKEHOUSE__SILVER__EXPECTATIONS=str(suite)))
    assert code == 2 and len(problems) == 1, problems
    assert problems[0].startswith(f"{suite}: no suite for table silver.camera_events (profile nest): write "
                                  "one with `table: silver.camera_events`"), problems


def test_check_lists_every_problem_each_naming_its_file_key_table_or_checkpoint(
        spark, env, tmp_path, lock_holder, capsys, logged):
    """One lakehouse with a problem of each kind; one check lists them all, and a run refuses
    to start on the same ones."""
    import shutil

    from pipeline.cli import main as run
    from tools.processes import free_port

    from test_gold import lakehouse_cfg

    suite = tmp_path / "silver_suite.yaml"
    suite.write_text((Path("conf/expectations/silver_camera_events.yaml").read_text()
                      .replace("{column: device_id, regex", "{column: device_name, regex")))
    bad_gold = tmp_path / "gold_suite.yaml"
    bad_gold.write_text("suite: gold\ntables:\n  gold.device_sessions:\n    - name: x\n"
                        "      expectation: expect_no_such_thing\n      policy: warn\n")
    env = dict(env, LAKEHOUSE__SILVER__EXPECTATIONS=str(suite), LAKEHOUSE__GOLD__EXPECTATIONS=str(bad_gold),
               KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}", LAKEHOUSE__KAFKA__CONNECT_TIMEOUT="1 second")
    cfg = lakehouse_cfg(tmp_path)
    try:
        # gold.device_sessions with a column of another type than gold writes
        (spark.createDataFrame([], "device_id STRING, events STRING").write.format("delta")
         .save(cfg.table_path("gold", "device_sessions")))
        # gold's sessions checkpoint holding state keyed by another column; gold's full query's
        # checkpoint holding silver's dedup state instead of sessions
        _foreign_state(spark, tmp_path, cfg.checkpoint(SESSIONS_QUERY))
        append_bronze(spark, cfg, [record(camera("cam-0001", at("10:00")))])
        write_locations(cfg.locations_csv)
        run_silver(spark, cfg)
        shutil.copytree(cfg.checkpoint("silver"), cfg.checkpoint("gold"))
        with lock_holder(env, "silver"):
            code, problems = checked(capsys, ["--source", "kafka"], spark=spark, env=env)
            code_sessions, sessions = checked(capsys, ["gold", "--only", "sessions"], spark=spark, env=env)
        ran = run(["--only", "sessions"], layer="gold", spark=spark, env=env)
    finally:
        drop_names(spark)
    assert code == 2
    text = "\n".join(problems)
    expected = [
        "no Kafka broker answered at",                                          # the source
        f"{bad_gold}: key 'tables.gold.device_sessions[0].expectation': unknown Great Expectations",
        f"{suite}: key 'expectations[1].kwargs.column': device_id_well_formed names column 'device_name'",
        f"checkpoint {cfg.checkpoint('silver')} is in use by",                   # the lock
        f"table gold.device_sessions ({cfg.table_path('gold', 'device_sessions')}): column events is string, "
        "the pipeline writes bigint",
        f"checkpoint {cfg.checkpoint('gold')}: holds the state of a dedupeWithinWatermark operator",
        f"checkpoint {cfg.checkpoint('gold')}: query gold now has a applyInPandasWithState operator",
    ]
    for piece in expected:
        assert piece in text, (piece, problems)
    assert code_sessions == 2
    assert any(f"checkpoint {cfg.checkpoint(SESSIONS_QUERY)}: the applyInPandasWithState state's key is "
               "(camera string), query gold_sessions now keeps (device_id string)" in p for p in sessions), sessions
    # A run makes the same check before its queries start, and says the same.
    assert ran == 2
    assert any("the applyInPandasWithState state's key is (camera string)" in m for m in logged.messages)


# --- lakehouse graph -------------------------------------------------------------------------

def test_graph_is_the_declared_flows_with_their_checkpoints_suites_and_triggers(env, capsys):
    from common.config import load_config
    from gold.tables import for_config
    from pipeline import graph
    from pipeline.runner import declare

    cfg = load_config(env=dict(env, TRIGGER="processing-time", LAKEHOUSE__GOLD__STATS_TO_KAFKA="true"))
    nodes = graph.flows(cfg, source="kafka")
    assert [n.name for n in nodes] == [f.name for layer in declare(cfg, ("bronze", "silver", "gold"),
                                                                   {"bronze": {"source": "kafka"}})
                                       for f in layer.flows] == ["bronze_kafka", "silver", "gold"]
    bronze, silver, gold = nodes
    assert bronze.sources == ("kafka topic nest-logs",) and bronze.sinks == ("bronze.events",)
    assert silver.sources == ("bronze.events", "silver.device_locations")
    assert silver.sinks == ("silver.camera_events", "silver.quarantine", "silver.late_events")
    assert silver.transform == "silver/transform.py + dedupeWithinWatermark"
    assert gold.sources == ("silver.camera_events",)
    assert gold.sinks == (*(f"gold.{t}" for t in cfg.tables["gold"]), "silver.late_events",
                          "kafka topic nest-camera-stats")
    assert gold.transform.endswith("applyInPandasWithState")
    assert [n.checkpoint for n in nodes] == [cfg.checkpoint(n.name) for n in nodes]
    assert silver.suite == "silver_camera_events.yaml (silver.camera_events)" and bronze.suite == "-"
    assert gold.suite.startswith("gold.yaml (gold.device_activity, gold.device_sessions")
    # Each gold table's constraints, with the gate's rule checking each: a suite rule, or derived.
    assert bronze.constraints == silver.constraints == ()
    assert len(gold.constraints) == sum(len(t.checks()) for t in for_config(cfg))
    lines = {" ".join(c.split()) for c in gold.constraints}
    assert "gold.device_activity events_not_negative covered by counts_non_negative" in lines
    assert ("gold.zip_hourly_sightings events_not_negative derived rule constraint:events_not_negative"
            in lines)
    assert ("gold.zip_daily_devices window_end_after_window_start derived rule constraint:window_end_after_window_start: "
            "view column window_end_after_window_start = `window_end` > `window_start` (NULL: false) in [true]"
            in lines)
    assert [n.trigger for n in nodes] == ["processingTime 5 seconds", "processingTime 1 seconds",
                                          "processingTime 1 seconds"]

    assert graph.main([], cfg=cfg) == 0
    text = capsys.readouterr().out
    assert "silver (silver, processingTime 1 seconds)\n  bronze.events + silver.device_locations\n" in text
    assert f"  checkpoint {cfg.checkpoint('gold')}\n" in text
    assert "  constraints (each checked by the gate" in text
    assert "\n    gold.device_sessions session_end_at_or_after_session_start  covered by session_end_after_start\n" in text


def test_the_report_draws_the_flows(spark, cfg, tmp_path):
    from pipeline.graph import picture
    from tools.report import build_report

    written = build_report(spark, cfg, tmp_path / "report", [picture])
    flows = tmp_path / "report" / "flows.png"
    assert flows in written and flows.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and flows.stat().st_size > 10_000
    assert '<img src="flows.png">' in (tmp_path / "report" / "index.html").read_text()
