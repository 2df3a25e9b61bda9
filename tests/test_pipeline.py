"""The pipeline runner in this process, on the shared session: the failure policy against a
registry of small real flows (rate source, real checkpoints), and the whole nest pipeline
(bronze -> silver -> gold) as one application, available-now."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.config import load_config
from common.errors import KeptFailure
from common.flow import Flow, Layer, Started
from common.quality import Outcome, Rule, raise_on_failures
from common.errors import JobError
from pipeline.runner import Runner, declare, downstream, preflight

REPO = Path(__file__).resolve().parent.parent


def rate_flow(cfg, name: str, layer: str, body=None) -> Flow:
    """A real streaming query: a rate source into a noop sink, or into `body` per batch."""
    def start(spark):
        rows = spark.readStream.format("rate").option("rowsPerSecond", 20).load()
        writer = (rows.writeStream.queryName(name).option("checkpointLocation", cfg.checkpoint(name))
                  .trigger(processingTime="1 second"))
        return Started((writer.foreachBatch(body) if body else writer.format("noop")).start(), body)
    return Flow(name, layer, start)


def layers_with(cfg, silver_body=None, gold_body=None) -> list[Layer]:
    return [Layer("bronze", None, (rate_flow(cfg, "t_bronze", "bronze"),)),
            Layer("silver", "bronze", (rate_flow(cfg, "t_silver", "silver", silver_body),)),
            Layer("gold", "silver", (rate_flow(cfg, "t_gold_a", "gold"), rate_flow(cfg, "t_gold_b", "gold")))]


def active(spark, name: str) -> bool:
    return any(q.name == name for q in spark.streams.active)


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def run_in_thread(runner: Runner) -> tuple[threading.Thread, dict]:
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=runner.run()), daemon=True)
    thread.start()
    return thread, result


@pytest.fixture
def continuous(env):
    return load_config(env=dict(env, TRIGGER="processing-time"))


def test_downstream_follows_the_chain_of_reads(continuous):
    layers = layers_with(continuous)
    assert downstream(layers, "silver") == {"silver", "gold"}
    assert downstream(layers, "bronze") == {"bronze", "silver", "gold"}
    assert downstream(layers, "gold") == {"gold"}


def test_a_layer_whose_input_table_is_missing_is_refused_unless_its_writer_runs_too(env, tmp_path):
    """One check for every layer, from what each declares it reads."""
    cfg = load_config(env=dict(env, LAKEHOUSE_ROOT=str(tmp_path / "lakehouse")))
    bronze, silver, gold = declare(cfg, ("bronze", "silver", "gold"))
    assert (silver.reads, silver.reads_table) == ("bronze", cfg.table_path("bronze", "events"))
    assert (gold.reads, gold.reads_table) == ("silver", cfg.table_path("silver", "camera_events"))
    for layers, missing in (([silver], "bronze"), ([gold], "silver"), ([silver, gold], "bronze")):
        with pytest.raises(JobError) as err:
            preflight(layers)
        table = cfg.table_path(missing, "events" if missing == "bronze" else "camera_events")
        assert str(err.value) == (f"{missing} table {table} does not exist yet: "
                                  f"run `make run-{missing}` first")
    cfg.landing.mkdir(parents=True)
    preflight([bronze, silver, gold])          # each table is written before it is read


def test_a_fail_expectation_stops_its_layer_and_what_reads_it_upstream_runs_on(spark, continuous, logged):
    rule = Rule("ids_present", "expect_column_values_to_not_be_null", {"column": "id"}, "fail")

    class Gate:
        """Keeps its batch's typed error on itself, as every layer's body does (common.batch)."""
        failure = KeptFailure()

        def __call__(self, df, batch_id):
            if batch_id >= 1:
                with self.failure.keep():
                    raise_on_failures([Outcome(rule, False, 10, 3, None)], "t_silver", batch_id, "silver.t")

    runner = Runner(continuous, layers_with(continuous, silver_body=Gate()), spark=spark)
    thread, result = run_in_thread(runner)
    try:
        wait(lambda: active(spark, "t_gold_a") or "result" in result, 120, "the flows to start")
        wait(lambda: not active(spark, "t_silver") and not active(spark, "t_gold_a")
             and not active(spark, "t_gold_b"), 120, "silver and gold to stop")
        time.sleep(2)
        assert active(spark, "t_bronze"), logged.text        # upstream keeps ingesting
        assert thread.is_alive()
    finally:
        runner.stop_all.set()
        thread.join(120)
    assert result["code"] == 1
    text = logged.text
    assert "quality gate failed: query 't_silver', batch 1" in text
    assert "expectation 'ids_present' failed in batch 1 (policy fail)" in text
    assert "stopped: silver, gold" in text
    assert not spark.streams.active


def test_any_other_failure_stops_every_query_and_names_the_one_that_failed(spark, continuous, logged):
    def broken(df, batch_id):
        if batch_id >= 1:
            raise RuntimeError("disk on fire")

    runner = Runner(continuous, layers_with(continuous, silver_body=broken), spark=spark)
    thread, result = run_in_thread(runner)
    thread.join(240)
    assert not thread.is_alive() and result["code"] == 1, logged.text
    text = logged.text
    assert "query t_silver failed:" in text and "disk on fire" in text
    assert "every query stopped cleanly" not in text
    assert not spark.streams.active


def test_a_stop_request_stops_every_query_between_batches(spark, continuous, logged):
    runner = Runner(continuous, layers_with(continuous), spark=spark)
    thread, result = run_in_thread(runner)
    wait(lambda: all(active(spark, q) for q in ("t_bronze", "t_silver", "t_gold_a", "t_gold_b")),
         120, "every flow to start")
    runner.stop_all.set()
    thread.join(120)
    assert result["code"] == 0, logged.text
    assert "pipeline: every query stopped cleanly" in logged.messages
    assert not spark.streams.active


def test_the_pipeline_runs_every_layer_in_one_application(spark, env, cfg):
    """bronze -> silver -> gold available-now in this process: each layer reads all that the one
    before committed, and a second run finds nothing new."""
    from pipeline.cli import main

    gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "400", "--seed", "3",
                          "--files", "2"], cwd=REPO, env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr
    assert main([], spark=spark, env=env) == 0
    read = lambda layer, table: spark.read.format("delta").load(cfg.table_path(layer, table))
    assert read("bronze", "events").count() > 0
    silver = read("silver", "camera_events")
    assert silver.count() == 400
    for table in ("zip_hourly_sightings", "device_activity", "device_sessions"):
        assert read("gold", table).count() > 0, table
    versions = {t: spark.sql(f"DESCRIBE HISTORY delta.`{cfg.table_path('silver', 'camera_events')}`").count()
                for t in ("silver",)}
    assert main([], spark=spark, env=env) == 0               # nothing new: nothing appended
    assert read("silver", "camera_events").count() == 400
    assert spark.sql(f"DESCRIBE HISTORY delta.`{cfg.table_path('silver', 'camera_events')}`").count() \
        == versions["silver"]


def test_the_runner_waits_for_each_layer_s_background_work_before_the_session_stops(spark, env, tmp_path):
    """Silver reads its dimension ahead on a thread of its own; a run with nothing to read ends
    before it, and stopping the session under its job printed the cancelled job's and blocks'
    errors. The runner settles every layer before it stops the session, whatever the outcome."""
    from silver.job import Dimension

    cfg = load_config(env=dict(env, LAKEHOUSE_ROOT=str(tmp_path / "lakehouse")))
    settled = []
    layers = [Layer("bronze", None, (), settle=lambda: settled.append("bronze")),
              Layer("silver", "bronze", (), settle=lambda: settled.append("silver"))]
    assert Runner(cfg, layers, spark=spark).run() == 0
    assert settled == ["bronze", "silver"]
    silver = declare(cfg, ("silver",))[0]
    assert silver.settle.__func__ is Dimension.settle


def test_a_root_belongs_to_the_profile_that_first_ran_there_and_another_is_refused(spark, env, tmp_path, logged):
    """`make demo` then `make run-bronze PROFILE=events` on the same ./lakehouse would append the
    events feed to Nest's bronze: the first run marks the root, another profile's run is refused
    before any query, naming both; a root from before the marker is claimed only on evidence."""
    from pipeline import root_owner

    root = str(tmp_path / "lakehouse")
    nest = load_config(env=dict(env, LAKEHOUSE_ROOT=root))
    events = load_config(env=dict(env, LAKEHOUSE_ROOT=root, PROFILE="events"))
    ran = []
    bronze = lambda: [Layer("bronze", None, (), settle=lambda: ran.append("bronze"))]   # noqa: E731
    assert Runner(nest, bronze(), spark=spark).run() == 0
    assert root_owner.owner(nest) == "nest" and root_owner.problem(nest) is None
    assert Runner(events, bronze(), spark=spark).run() == 2
    assert ran == ["bronze"]                    # the refused run started nothing
    said = root_owner.problem(events)
    assert said.startswith(f"the lakehouse at {root} belongs to profile nest") and "LAKEHOUSE_ROOT=" in said
    assert said in logged.messages

    # Before the marker: a root holding bronze and nest's silver is nest's; bronze alone, nobody's.
    old = tmp_path / "old"
    legacy = load_config(env=dict(env, LAKEHOUSE_ROOT=str(old)))
    spark.range(1).write.format("delta").save(legacy.table_path("bronze", "events"))
    root_owner.claim(legacy)
    assert root_owner.owner(legacy) is None and root_owner.problem(legacy) is None
    spark.range(1).write.format("delta").save(legacy.table_path("silver", legacy.silver_table))
    root_owner.claim(legacy)
    assert root_owner.owner(legacy) == "nest"
