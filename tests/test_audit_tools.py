"""audit.diff and audit.restore against a real Delta table with a few versions.

Most tests call the modules in-process with the shared session; one subprocess per CLI checks
the real entry points (the make targets only call them)."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from audit import diff as D
from audit import restore as R

REPO = Path(__file__).resolve().parent.parent
TABLE = "gold.zip_hourly_sightings"
SCHEMA = "zip_code STRING, window_start TIMESTAMP, sightings BIGINT"
T0 = datetime(2024, 1, 1, 10, tzinfo=timezone.utc)

V0 = [("94043", T0, 5), ("10001", T0, 2), ("60601", T0, 7)]
# v1 appends a copy of an existing row: multiset semantics must count it as added.
V1 = V0 + [("94043", T0, 5), ("73301", T0, 1)]
V2 = [r for r in V1 if r[0] != "60601"]
V3 = [(z, t, 3 if z == "10001" else n) for z, t, n in V2]


class TTYInput(io.StringIO):
    """Answers typed at a terminal."""

    def isatty(self):
        return True


@pytest.fixture(scope="module")
def template(spark, tmp_path_factory) -> str:
    """Versions 0..3: create, append, delete, update. Built once; each test gets a copy."""
    from delta.tables import DeltaTable

    path = str(tmp_path_factory.mktemp("audit-template") / "table")
    spark.createDataFrame(V0, SCHEMA).coalesce(1).write.format("delta").save(path)
    spark.createDataFrame(V1[3:], SCHEMA).coalesce(1).write.format("delta").mode("append").save(path)
    DeltaTable.forPath(spark, path).delete("zip_code = '60601'")
    DeltaTable.forPath(spark, path).update("zip_code = '10001'", {"sightings": "3"})
    return path


@pytest.fixture
def table(template, cfg) -> str:
    # Delta logs hold relative file paths, so a copied folder is the same table.
    path = cfg.table_path("gold", "zip_hourly_sightings")
    shutil.copytree(template, path)
    return path


def rows_at(spark, path, version=None) -> Counter:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return Counter((r.zip_code, r.window_start.astimezone(timezone.utc), r.sightings)
                   for r in reader.load(path).collect())


def as_tuples(sample) -> Counter:
    return Counter((r["zip_code"], r["window_start"], r["sightings"]) for r in sample)


def run_cli(module, *args, env, stdin=subprocess.DEVNULL):
    return subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=REPO, stdin=stdin,
                          capture_output=True, text=True, timeout=180)


# --- diff ---------------------------------------------------------------------------------------

def test_diff_counts_and_samples_both_directions(spark, table):
    assert rows_at(spark, table, 3) == Counter(V3)

    fwd = D.diff(spark, table, 0, 3)
    added = Counter(V3) - Counter(V0)
    removed = Counter(V0) - Counter(V3)
    assert fwd["added"]["count"] == 3 and as_tuples(fwd["added"]["sample"]) == added
    assert fwd["removed"]["count"] == 2 and as_tuples(fwd["removed"]["sample"]) == removed
    assert fwd["columns"] == ["zip_code", "window_start", "sightings"] and fwd["schema_change"] is None

    back = D.diff(spark, table, 3, 0, sample=2)
    assert back["added"]["count"] == 2 and as_tuples(back["added"]["sample"]) == removed
    assert back["removed"]["count"] == 3 and len(back["removed"]["sample"]) == 2
    assert as_tuples(back["removed"]["sample"]) - added == Counter()

    same = D.diff(spark, table, 2, 2)
    assert same["added"]["count"] == same["removed"]["count"] == 0


def test_report_operations_text_and_json(spark, table):
    rep = D.report(spark, TABLE, table, 3, 0)
    assert [(o["version"], o["operation"]) for o in rep["operations"]] == [
        (1, "WRITE"), (2, "DELETE"), (3, "UPDATE")]
    assert all(datetime.fromisoformat(o["timestamp"].replace("Z", "+00:00")).tzinfo for o in rep["operations"])

    text = D.to_text(rep)
    assert "gold.zip_hourly_sightings: version 3 -> 0" in text
    assert "commits being undone" in text and "DELETE" in text
    assert "added: 2 rows" in text and "removed: 3 rows" in text and "60601" in text

    obj = json.loads(D.to_json(rep))
    assert set(obj) == {"table", "from", "to", "added", "removed", "operations"}
    assert obj["added"]["count"] == 2 and obj["removed"]["count"] == 3
    assert {r["window_start"] for r in obj["added"]["sample"]} == {T0.isoformat()}


def test_diff_errors_exit_2_naming_the_problem(spark, cfg, table, capsys):
    def err(*argv):
        code = D.main(list(argv), spark=spark, cfg=cfg)
        out = capsys.readouterr()
        assert "Traceback" not in out.err
        return code, out.err

    code, msg = err("gold.nope", "0", "1")
    assert code == 2 and "unknown table 'gold.nope'" in msg
    code, msg = err("gold.device_activity", "0", "1")
    assert code == 2 and "gold.device_activity does not exist" in msg
    code, msg = err(TABLE, "0", "7")
    assert code == 2 and "no version 7" in msg and "0..3" in msg
    code, msg = err(TABLE, "one", "2")
    assert code == 2 and "FROM must be an integer" in msg and "'one'" in msg
    code, msg = err(TABLE, "0", "-1")
    assert code == 2 and "TO must be a version >= 0" in msg


def test_cli_rejects_bad_input_before_starting_spark(env):
    done = run_cli("audit.restore", TABLE, "v3", env=env)
    assert done.returncode == 2 and "VERSION must be an integer" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_cli("audit.diff", "silver.nope", "1", "2", env=env)
    assert done.returncode == 2 and "unknown table 'silver.nope'" in done.stderr
    assert "Traceback" not in done.stderr


# --- restore ------------------------------------------------------------------------------------

def test_stream_warnings_follow_readers_writers_and_checkpoints(cfg):
    reader = R.stream_warnings(cfg, "silver.camera_events", files_removed=2, files_readded=0)
    # gold reads silver but has not run yet: nothing to delete.
    assert reader == ["gold reads silver.camera_events as a stream (and writes gold.zip_hourly_sightings, "
                      "gold.device_activity, gold.device_sessions, gold.zip_daily_devices, silver.late_events). "
                      "It has not run yet, so its first run "
                      "reads the restored table.",
                      "silver writes silver.camera_events as a stream (`make run-silver`)."]
    Path(cfg.checkpoint("gold")).mkdir(parents=True)
    text = "\n".join(R.stream_warnings(cfg, "silver.camera_events", files_removed=2, files_readded=0))
    # Its checkpoint on disk is offered for deletion, with every table it writes.
    assert cfg.checkpoint("gold") in text
    assert "will stop on its next run" in text and "skipChangeCommits" in text
    for t in ("zip_hourly_sightings", "device_activity", "device_sessions"):
        assert cfg.table_path("gold", t) in text

    only_adds = "\n".join(R.stream_warnings(cfg, "silver.camera_events", 0, 1))
    assert "read their rows again" in only_adds

    writer = R.stream_warnings(cfg, TABLE, 1, 0)
    assert len(writer) == 1 and cfg.checkpoint("gold") in writer[0]
    assert "refuse to start on a restored table" in writer[0] and "lakehouse refresh gold" in writer[0]


def test_restore_asks_and_brings_back_the_old_content(spark, cfg, table, capsys):
    before = rows_at(spark, table)

    assert R.main([TABLE, "1"], spark=spark, cfg=cfg, stdin=TTYInput("n\n")) == 1
    out = capsys.readouterr().out
    assert "Restore gold.zip_hourly_sightings to version 1? [y/N] " in out and "aborted" in out
    assert "current version 3: 4 rows" in out and "target version  1: 5 rows" in out
    assert D.version_range(spark, table) == (0, 3) and rows_at(spark, table) == before

    assert R.main([TABLE, "1"], spark=spark, cfg=cfg, stdin=io.StringIO("y\n")) == 2
    assert "stdin is not a terminal" in capsys.readouterr().err
    assert D.version_range(spark, table) == (0, 3)

    assert R.main([TABLE, "1"], spark=spark, cfg=cfg, stdin=TTYInput("y\n")) == 0
    assert "new version 4 (RESTORE), 5 rows" in capsys.readouterr().out
    assert rows_at(spark, table) == rows_at(spark, table, 1) == Counter(V1)
    assert D.history(spark, table, after=3)[0]["operation"] == "RESTORE"

    assert R.main([TABLE, "4"], spark=spark, cfg=cfg, stdin=TTYInput("")) == 0
    assert "already at version 4" in capsys.readouterr().out

    assert R.main([TABLE, "9"], spark=spark, cfg=cfg, stdin=TTYInput("y\n")) == 2
    assert "no version 9; versions 0..4 exist" in capsys.readouterr().err


def test_both_clis_end_to_end(spark, cfg, table, env):
    """One subprocess per CLI, run side by side to halve the Spark start-up wait. They share the
    table safely: the diff reads versions 0 and 3 explicitly, the restore only adds version 4."""
    Path(cfg.checkpoint("gold")).mkdir(parents=True)
    cmd = lambda module, *args: subprocess.Popen(     # (env: C1 JIT, spark.jit=c1)
        [sys.executable, "-m", module, *args], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    diff_p = cmd("audit.diff", TABLE, "0", "3", "--json", "--sample", "2")
    restore_p = cmd("audit.restore", TABLE, "0", "--yes")
    diff_out, diff_err = diff_p.communicate(timeout=240)
    restore_out, restore_err = restore_p.communicate(timeout=240)

    assert diff_p.returncode == 0, diff_err
    obj = json.loads(diff_out)   # stdout holds nothing but the JSON: no Spark log lines
    assert obj["table"] == TABLE and (obj["from"], obj["to"]) == (0, 3)
    assert obj["added"]["count"] == 3 and len(obj["added"]["sample"]) == 2
    assert obj["removed"]["count"] == 2
    assert [o["operation"] for o in obj["operations"]] == ["WRITE", "DELETE", "UPDATE"]

    assert restore_p.returncode == 0, restore_err
    assert "removes 2 data file(s) and adds back 1" in restore_out
    assert cfg.checkpoint("gold") in restore_out
    assert "new version 4 (RESTORE), 3 rows" in restore_out
    assert rows_at(spark, table) == Counter(V0)


# --- which silver version added a row ---------------------------------------------------------

SILVER_SCHEMA = "event_id STRING, silver_batch_id LONG"


def silver_appender(spark, path: str):
    """append(batch, ids, app): one silver commit of `ids` for `batch`, keyed (app, batch) as
    silver keys its commits, or with no key when `app` is None."""
    from common.delta import idempotent_append

    def append(batch: int, ids: list[str], app: str | None = "silver-q1-events") -> None:
        df = spark.createDataFrame([(i, batch) for i in ids], SILVER_SCHEMA).coalesce(1)
        if app is None:
            df.write.format("delta").mode("append").save(path)
        else:
            idempotent_append(df, path, app, batch, replay=False)
    return append


def test_silver_rows_are_placed_by_their_batch_key_and_fall_back_when_a_commit_has_none(spark, tmp_path):
    """Silver has no row tracking: the audit places each row by its silver_batch_id and the key
    of the commit that appended that batch. OPTIMIZE keeps the placement; an append without a
    key, or a second checkpoint's batch ids, make it compare snapshots instead."""
    from delta.tables import DeltaTable

    from audit import prefix as P

    path = str(tmp_path / "silver")
    append = silver_appender(spark, path)

    spark.createDataFrame([], SILVER_SCHEMA).write.format("delta").save(path)  # version 0, no rows
    append(0, ["a", "b"])                                                    # version 1
    append(1, ["c"])                                                         # version 2
    DeltaTable.forPath(spark, path).optimize().executeCompaction()           # version 3: same rows
    append(2, ["d"])                                                         # version 4
    stamps = P.row_versions_of(spark, path)
    assert stamps == {0: 1, 1: 2, 2: 4}
    placed = {r.event_id: r[P.ROW_VERSION] for r in P.silver_rows(spark, path, 4, [], stamps).collect()}
    assert placed == {"a": 1, "b": 1, "c": 2, "d": 4}
    # As of version 2, batch 2 is not there yet, and nothing is placed after the version read.
    assert {r.event_id: r[P.ROW_VERSION] for r in P.silver_rows(spark, path, 2, [], stamps).collect()} \
        == {"a": 1, "b": 1, "c": 2}
    # A batch whose commit the log no longer holds sorts before every batch it still knows.
    older = {1: 2, 2: 4}
    assert {r.event_id: r[P.ROW_VERSION] for r in P.silver_rows(spark, path, 4, [], older).collect()}["a"] == -1

    append(3, ["e"], app="silver-q2-events")       # a second checkpoint's batch ids
    assert P.row_versions_of(spark, path) is None
    other = str(tmp_path / "hand")
    spark.createDataFrame([("x", 0)], SILVER_SCHEMA).write.format("delta").save(other)
    assert P.row_versions_of(spark, other) is None  # rows appended without a key

    # Fallback: the first batch bound whose snapshot holds the event.
    batches = [P.Batch(0, 2, 0), P.Batch(1, 4, 0)]
    placed = {r.event_id: r[P.ROW_VERSION] for r in P.silver_rows(spark, path, 4, batches, None).collect()}
    assert placed == {"a": 2, "b": 2, "c": 2, "d": 4}


def test_each_silver_prefix_read_from_one_cached_snapshot_equals_its_own_version(spark, tmp_path):
    """A silver table of keyed appends is read once for the whole audit; each version's rows are
    then a filter of that read, and must be the rows that version holds, placed the same. A
    schema change between the versions asked for, or a table the keys cannot place, makes each
    prefix read on its own again."""
    from audit import prefix as P

    path = str(tmp_path / "silver")
    append = silver_appender(spark, path)

    def rows(frame) -> Counter:
        return Counter((r.event_id, r[P.ROW_VERSION]) for r in frame.select("event_id", P.ROW_VERSION).collect())

    spark.createDataFrame([], SILVER_SCHEMA).write.format("delta").save(path)  # version 0, no rows
    append(0, ["a", "b"])                                                    # version 1
    append(1, ["c"])                                                         # version 2
    spark.sql(f"OPTIMIZE delta.`{path}`")                                    # version 3: same rows
    append(2, ["d", "e"])                                                    # version 4
    stamps = P.row_versions_of(spark, path)
    prefixes = P.SilverPrefixes(spark, path, [1, 2, 3, 4], [], stamps)
    try:
        assert prefixes.cached is not None
        for version in (0, 1, 2, 3, 4):
            assert rows(prefixes.at(version)) == rows(P.silver_rows(spark, path, version, [], stamps)), version
        assert rows(prefixes.at(1)) == Counter({("a", 1): 1, ("b", 1): 1})
    finally:
        prefixes.release()

    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (zone STRING)")       # version 5
    append(3, ["f"])                                                         # version 6
    stamps = P.row_versions_of(spark, path)
    before_change = P.SilverPrefixes(spark, path, [2, 4], [], stamps)
    assert before_change.cached is not None
    before_change.release()
    apart = P.SilverPrefixes(spark, path, [2, 6], [], stamps)
    assert apart.cached is None
    assert rows(apart.at(2)) == Counter({("a", 1): 1, ("b", 1): 1, ("c", 2): 1})
    assert P.SilverPrefixes(spark, path, [2, 4], [], None).cached is None    # placed by snapshots
