"""Progress capture (ops.query_progress via a StreamingQueryListener) and `make status`."""
from __future__ import annotations

import logging
import re

import pytest
from pyspark.errors import StreamingQueryException

from tools import status
from common.progress import ProgressRecorder, log_line, source_lag

LINE = re.compile(r"^\S+\s+batch \d+  [\d,]+ rows  [\d,]+ rows/s  \d+\.\d s  wm (\d\d:\d\d|-)$")


def source_table(spark, cfg, versions: int) -> str:
    path = cfg.table_path("bronze", "events")       # any Delta table serves as a stream source
    for v in range(versions):
        spark.range(v * 10, v * 10 + 10).coalesce(1).write.format("delta").mode("append").save(path)
    return path


def run_query(spark, cfg, path, name, body=lambda df, batch_id: df.count()):
    query = (spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(path)
             .writeStream.queryName(name).foreachBatch(body)
             .option("checkpointLocation", cfg.checkpoint(name)).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return query


class Lines(logging.Handler):
    """The batch lines the recorder logs (logger common.progress), and their records."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record):
        self.records.append(record)
        self.lines.append(record.getMessage())

    def __len__(self):
        return len(self.lines)

    def __iter__(self):
        return iter(self.lines)

    def __getitem__(self, i):
        return self.lines[i]


@pytest.fixture
def recorded(spark, cfg):
    logger, captured = logging.getLogger("common.progress"), Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(captured)
    recorder = ProgressRecorder(spark, cfg)
    spark.streams.addListener(recorder)
    yield recorder, captured
    spark.streams.removeListener(recorder)
    logger.removeHandler(captured)
    logger.setLevel(level)


def progress(spark, cfg):
    return spark.read.format("delta").load(cfg.table_path("ops", "query_progress"))


def test_every_batch_is_recorded_with_its_rates_and_a_log_line(spark, cfg, recorded):
    recorder, lines = recorded
    path = source_table(spark, cfg, 3)
    query = run_query(spark, cfg, path, "silver")
    recorder.close()

    rows = progress(spark, cfg).where("event = 'progress'").orderBy("batch_id").collect()
    assert [r.batch_id for r in rows] == [0, 1, 2]
    assert sum(r.input_rows for r in rows) == 30
    assert all(r.query_name == "silver" and r.query_id == str(query.id) for r in rows)
    assert all(r.batch_duration_ms >= 0 and "addBatch" in r.duration_ms for r in rows)
    assert all(r.processed_rows_per_second > 0 for r in rows if r.input_rows)
    ended = progress(spark, cfg).where("event = 'terminated'").collect()
    assert [(r.run_id, r.error) for r in ended] == [(str(query.runId), None)]
    assert len(lines) == 3 and all(LINE.match(line) for line in lines), lines.lines
    assert lines[0].startswith("silver    batch 0  10 rows")
    # --log-json carries a batch's figures as fields of its record
    fields = [r.fields for r in lines.records]
    assert [(f["query"], f["batch_id"], f["rows"]) for f in fields] == [("silver", 0, 10), ("silver", 1, 10),
                                                                        ("silver", 2, 10)]
    assert all(f["event"] == "batch" and f["seconds"] >= 0 for f in fields)


def test_a_failed_query_records_its_error_and_status_shows_it(spark, cfg, recorded, capsys):
    recorder, _ = recorded
    path = source_table(spark, cfg, 2)
    run_query(spark, cfg, path, "silver")

    def broken(df, batch_id):
        raise ValueError("disk full on purpose")

    with pytest.raises(StreamingQueryException):
        run_query(spark, cfg, path, "gold", broken)
    recorder.close()

    capsys.readouterr()     # the batch log lines so far (on stdout once a test configured logging)
    assert status.main([], spark=spark, cfg=cfg) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"silver", "gold"}
    assert re.search(r"silver\s+stopped\s+1\s", rows["silver"])
    assert "1 committed" in rows["silver"]
    # The failed query finished no batch: its state and error come from its termination event,
    # and its checkpoint shows the batch it planned but never committed.
    failed = rows["gold"]
    assert re.search(r"gold\s+failed\s", failed)
    assert "batch 0 planned, None committed" in failed
    assert "disk full on purpose" in failed


def test_a_query_started_again_with_nothing_to_read_is_running(spark, cfg, recorded):
    """Its latest batch is its last run's, and that run ended: its start says it runs now. A
    run whose checkpoint nobody holds any more (its process killed) died."""
    import time

    from common.checkpoint_lock import CheckpointLocks

    recorder, _ = recorded
    path = source_table(spark, cfg, 1)
    run_query(spark, cfg, path, "silver")
    lock = CheckpointLocks(cfg, ["silver"]).__enter__()      # as a job holds it while it runs
    query = (spark.readStream.format("delta").load(path).writeStream.queryName("silver")
             .foreachBatch(lambda df, batch_id: None).option("checkpointLocation", cfg.checkpoint("silver"))
             .trigger(processingTime="1 second").start())
    try:
        deadline, state = time.monotonic() + 30, None
        while state != "running" and time.monotonic() < deadline:
            time.sleep(0.5)
            recorder.flush()
            (row,) = [r for r in status.query_status(spark, cfg) if r["query"] == "silver"]
            state = row["state"]
        assert state == "running" and row["batch"] == 0, row
        lock.__exit__()                  # what a kill -9 leaves: a start without an end, no holder
        (row,) = [r for r in status.query_status(spark, cfg) if r["query"] == "silver"]
        assert row["state"] == "died", row
    finally:
        lock.__exit__()
        query.stop()
    recorder.close()
    (row,) = [r for r in status.query_status(spark, cfg) if r["query"] == "silver"]
    assert row["state"] == "stopped", row


def test_a_run_whose_termination_the_bus_delivers_late_is_recorded_ended(spark, cfg):
    """Spark calls onQueryStarted in start(), but delivers terminations on its bus, later: the
    last run's end, arriving after the same query's next start, must not be taken for it (both
    runs share the checkpoint's query id), or close() stops waiting before the next run's end."""
    import time

    class LateBus(ProgressRecorder):
        def onQueryTerminated(self, event):
            time.sleep(2)
            super().onQueryTerminated(event)

    recorder = LateBus(spark, cfg)
    spark.streams.addListener(recorder)
    try:
        path = source_table(spark, cfg, 1)
        run_query(spark, cfg, path, "silver")
        query = (spark.readStream.format("delta").load(path).writeStream.queryName("silver")
                 .foreachBatch(lambda df, batch_id: None).option("checkpointLocation", cfg.checkpoint("silver"))
                 .trigger(processingTime="1 second").start())
        time.sleep(1)
        query.stop()
        recorder.close(wait_seconds=15)
    finally:
        spark.streams.removeListener(recorder)
    assert progress(spark, cfg).where("event = 'terminated'").count() == 2
    (row,) = [r for r in status.query_status(spark, cfg) if r["query"] == "silver"]
    assert row["state"] == "stopped", row


def test_status_reports_lag_behind_a_delta_source(spark, cfg, recorded, capsys):
    recorder, _ = recorded
    path = source_table(spark, cfg, 2)
    run_query(spark, cfg, path, "silver")
    recorder.close()
    source_table(spark, cfg, 3)                      # three more versions the query has not read
    rows = status.query_status(spark, cfg)
    assert [r["lag"] for r in rows if r["query"] == "silver"] == ["3 versions"]


def test_kafka_lag_is_latest_minus_end_offset():
    sources = [{"description": "KafkaV2[Subscribe[nest-logs]]",
                "endOffset": {"nest-logs": {"0": 40, "1": 10}},
                "latestOffset": {"nest-logs": {"0": 50, "1": 10}}}]
    assert source_lag(sources) == (10, "messages")


def test_log_line_shape():
    from datetime import datetime, timezone

    row = {"query_name": "silver", "query_id": "x", "batch_id": 42, "input_rows": 12345,
           "processed_rows_per_second": 8210.4, "batch_duration_ms": 1500,
           "watermark": datetime(2026, 11, 1, 12, 4, tzinfo=timezone.utc)}
    assert log_line(row) == "silver    batch 42  12,345 rows  8,210 rows/s  1.5 s  wm 12:04"


# --- one instance per checkpoint --------------------------------------------------------------

def test_a_second_instance_on_the_same_checkpoint_is_refused(cfg, env, lock_holder):
    import os
    import subprocess
    import sys

    from common.checkpoint_lock import CheckpointLocks, held

    repo = __import__("pathlib").Path(__file__).resolve().parent.parent
    # One layer alone, and the whole pipeline (which holds every layer's checkpoints), are both
    # refused before Spark starts.
    with CheckpointLocks(cfg, ["silver"]):
        for cmd in (["silver.job"], ["pipeline"], ["pipeline", "--layer", "silver"]):
            proc = subprocess.run([sys.executable, "-m", *cmd], cwd=repo, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2, (cmd, proc.stderr)
            assert f"in use by pid {os.getpid()}" in proc.stderr and "another instance" in proc.stderr
            assert "SparkSession" not in proc.stderr and "log4j" not in proc.stderr  # before Spark

    # a holder killed with -9 leaves no stale lock behind, and `held` (make status) tells both
    with lock_holder(env):
        assert held(cfg, "silver") is True
        with pytest.raises(Exception, match="another instance"):
            CheckpointLocks(cfg, ["silver"]).__enter__()
    assert held(cfg, "silver") is False
    with CheckpointLocks(cfg, ["silver"]):
        pass


# --- make report ------------------------------------------------------------------------------

def test_report_writes_readable_charts_and_a_page(spark, cfg, recorded, tmp_path):
    from tools.report import build_report

    recorder, _ = recorded
    run_query(spark, cfg, source_table(spark, cfg, 4), "silver")
    recorder.close()
    written = build_report(spark, cfg, tmp_path / "reports")
    names = {p.name for p in written}
    # no quality results or quarantine in this lakehouse: those charts are left out, not faked
    assert names == {"rates.png", "batch_duration.png", "index.html"}
    for p in written:
        if p.suffix == ".png":
            data = p.read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, p
    page = (tmp_path / "reports" / "index.html").read_text()
    assert '<img src="rates.png">' in page and '<img src="batch_duration.png">' in page
    assert "silver" in page                                 # the status table
