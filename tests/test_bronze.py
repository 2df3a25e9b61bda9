"""Bronze: landing files and Kafka -> bronze.events, byte for byte and exactly once.

Everything is real: the session Spark with Delta in-process, `python -m bronze.job` and `make` in
subprocesses, and the session's KRaft broker for tests marked `kafka`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tools.generator import events as gen
from common.config import load_config
from common.log import message_of
from pipeline.runner import start

REPO = Path(__file__).resolve().parent.parent
# The project's shared/ folder sits beside the repository (as in CI); SHARED_DATASETS overrides.
SHARED_EVENTS = Path(os.environ.get("SHARED_DATASETS") or REPO.parent / "shared" / "datasets") \
    / "structured-streaming-events"
JOB = [sys.executable, "-m", "bronze.job"]
# `make run-bronze` depends on `setup`; its stamps may be missing even where setup was done,
# and remaking setup from a test would pip-install and re-fetch (rm -rf) the shared jar cache
# under every other running test. -o treats the stamps as up to date.
MAKE = ["make", "--no-print-directory", "-o", ".venv/.installed", "-o", ".cache/jars/.fetched"]
DELTA_VERSION = re.compile(r"^\d{20}\.json$")


# --- helpers -------------------------------------------------------------------------------

def bronze_path(cfg) -> str:
    return cfg.table_path("bronze", "events")


def bronze_rows(spark, cfg):
    return spark.read.format("delta").load(bronze_path(cfg))


def delta_version(spark, cfg) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, bronze_path(cfg)).history(1).collect()[0].version


def assert_unique(df, *keys: str) -> None:
    dupes = df.groupBy(*keys).count().where("count > 1")
    examples = dupes.limit(5).collect()
    assert not examples, f"duplicate {keys}: {examples}"


def generate(monkeypatch, env: dict, tmp_path: Path, *args: str, **extra_env: str) -> dict:
    """Run the generator's main in-process; it reads os.environ, so mirror `env` into it."""
    for var in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"LAKEHOUSE_ROOT": env["LAKEHOUSE_ROOT"], **extra_env}.items():
        monkeypatch.setenv(var, value)
    manifest = tmp_path / f"manifest-{uuid.uuid4().hex[:8]}.json"
    assert gen.main([*args, "--manifest", str(manifest)]) == 0
    return json.loads(manifest.read_text())


def kafka_env(env: dict, broker, **extra: str) -> dict:
    # A topic per test: the broker lives for the whole session.
    return {**env, "KAFKA_BOOTSTRAP": broker.bootstrap,
            "LAKEHOUSE__KAFKA__TOPICS__EVENTS": f"bronze-{uuid.uuid4().hex[:10]}", **extra}


def ingest(spark, cfg, source: str) -> None:
    query, = start(spark, cfg, "bronze", source=source)
    query.awaitTermination()  # raises if the query failed


def file_lines(data: bytes) -> list[bytes]:
    """A file's lines as bronze defines them: a final newline ends the last line."""
    parts = data.split(b"\n")
    return parts[:-1] if data.endswith(b"\n") else parts


def local_path(uri: str) -> str:
    return unquote(urlparse(uri).path)


def assert_bronze_holds_files(spark, cfg, files) -> None:
    """Every line of every file is one bronze row, numbered 1..n, with its exact bytes."""
    rows = (bronze_rows(spark, cfg)
            .selectExpr("file_path", "line_number", "coalesce(CAST(raw AS BINARY), raw_bytes) AS raw").collect())
    got: dict[str, dict[int, bytes]] = defaultdict(dict)
    for r in rows:
        got[local_path(r.file_path)][r.line_number] = bytes(r.raw)
    expected = {str(Path(f).resolve()): file_lines(Path(f).read_bytes()) for f in files}
    assert set(got) == set(expected)
    for path, lines in expected.items():
        numbers = got[path]
        assert sorted(numbers) == list(range(1, len(lines) + 1)), path
        # Report line numbers, not a diff: one line is 2 MB.
        differ = [n for n in numbers if numbers[n] != lines[n - 1]]
        assert not differ, f"{path}: lines {differ[:10]} differ from the file's bytes"


def run_job(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*JOB, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The job's own message; stderr also carries Spark's log output."""
    lines = [message_of(line) for line in proc.stderr.splitlines() if message_of(line).startswith("error:")]
    assert lines, f"no 'error:' line in stderr:\n{proc.stderr[-3000:]}"
    return lines[-1]


def batch_ids(checkpoint: str, log: str) -> set[int]:
    folder = Path(checkpoint) / log
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def delta_versions(path: str) -> int:
    log = Path(path) / "_delta_log"
    return sum(bool(DELTA_VERSION.match(p.name)) for p in log.iterdir()) if log.is_dir() else 0


@pytest.fixture
def jobs(tmp_path):
    """Start `python -m bronze.job` in its own process group; kill leftovers at teardown."""
    started: list[subprocess.Popen] = []

    def launch(env: dict, *args: str) -> subprocess.Popen:
        log = open(tmp_path / f"job-{len(started)}.log", "wb")
        # Its own group, so a kill can take the Spark JVM down with the Python driver.
        proc = subprocess.Popen([*JOB, *args], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        proc.log_path = Path(log.name)
        log.close()
        started.append(proc)
        return proc

    yield launch
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_until(proc: subprocess.Popen, condition, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"job exited ({proc.returncode}) before {what}:\n"
                        f"{proc.log_path.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g}s:\n{proc.log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.01)


def mid_batch(checkpoint: str) -> bool:
    """A batch has committed and a later one is planned but not committed."""
    commits, offsets = batch_ids(checkpoint, "commits"), batch_ids(checkpoint, "offsets")
    return bool(commits) and max(offsets) > max(commits)


# --- files ---------------------------------------------------------------------------------

def test_files_land_in_bronze_byte_for_byte_and_a_rerun_adds_nothing(spark, cfg, env, tmp_path,
                                                                       monkeypatch):
    m = generate(monkeypatch, env, tmp_path, "-n", "3000", "--seed", "5", "--malformed-rate", "0.03")
    # The byte checks below only mean something if the awkward lines are really there.
    assert m["malformed_kinds"]["non_utf8"] >= 1 and m["malformed_kinds"]["empty_line"] >= 1
    assert m["malformed_kinds"]["very_long"] == 1
    lines = [line for f in m["files"] for line in file_lines(Path(f).read_bytes())]
    assert len(lines) == m["records"]
    assert b"" in lines
    assert any(not _is_utf8(line) for line in lines)
    # A landing laid out by date is read to its leaves (bronze.subfolders); a hidden folder,
    # an upload in flight, is not.
    nested = Path(cfg.landing) / "2026" / "11" / "01"
    nested.mkdir(parents=True)
    files = [str(Path(m["files"][0]).rename(nested / Path(m["files"][0]).name)), *m["files"][1:]]
    (Path(cfg.landing) / ".staging").mkdir()
    (Path(cfg.landing) / ".staging" / "half.jsonl").write_bytes(b'{"device_id": "cam-')

    ingest(spark, cfg, "files")

    df = bronze_rows(spark, cfg)
    assert df.count() == m["records"]
    assert_unique(df, "file_path", "line_number")
    assert_bronze_holds_files(spark, cfg, files)
    lineage = df.selectExpr(
        "count_if(source <> 'file') AS not_file",
        "count_if(ingest_time IS NULL OR ingest_date IS NULL OR file_modification_time IS NULL) AS no_time",
        "count_if(ingest_date <> to_date(ingest_time)) AS bad_date",
        "count_if(kafka_topic IS NOT NULL OR kafka_offset IS NOT NULL) AS kafka_set").first()
    assert lineage.asDict() == {"not_file": 0, "no_time": 0, "bad_date": 0, "kafka_set": 0}

    # Each batch's commit carries its lineage, and a batch this run planned appended blind:
    # no Delta transaction lookup on the way (only a replay after a crash makes one).
    from common.lineage import parse

    log = Path(bronze_path(cfg)) / "_delta_log"
    infos = [json.loads(line)["commitInfo"] for f in sorted(log.glob("*.json"))
             for line in f.read_text().splitlines() if "commitInfo" in line]
    lineages = [parse(i.get("userMetadata")) for i in infos if i["operation"] == "WRITE"]
    assert lineages and all(x["query"] == "bronze_files" for x in lineages)
    assert [x["batch_id"] for x in lineages] == sorted(batch_ids(cfg.checkpoint("bronze_files"), "commits"))
    actions = [json.loads(line) for f in log.glob("*.json") for line in f.read_text().splitlines()]
    assert not any("txn" in action for action in actions), "a first run looked up its key"
    # Delta's per-file statistics are for the lineage columns reads pick rows by, not the bytes.
    stats = [json.loads(a["add"]["stats"])["minValues"] for a in actions if "add" in a]
    assert stats and all({"file_path", "line_number", "ingest_time"} <= set(s) for s in stats), stats
    assert not any({"raw", "raw_bytes", "kafka_key"} & set(s) for s in stats), stats

    version = delta_version(spark, cfg)
    ingest(spark, cfg, "files")
    assert bronze_rows(spark, cfg).count() == m["records"]
    assert delta_version(spark, cfg) == version

    # Each batch booked its accounting row through the same runner as silver's and gold's, with
    # its lineage: the file source's log offset, and what it read is what it wrote.
    assert [x["source"]["kind"] for x in lineages] == ["files"] * len(lineages)
    assert all(isinstance(x["source"]["offset"]["logOffset"], int) for x in lineages)
    assert_booked(spark, cfg, "bronze_files", m["records"], [x["batch_id"] for x in lineages])

    # A crash after the last batch's append, before its accounting row and its checkpoint commit:
    # the restart replays the batch, finds the append (no new bronze version), and books the
    # batch's rows, which the append found there evaluated nothing to count (a fresh process).
    last = max(x["batch_id"] for x in lineages)
    books = Path(cfg.table_path("ops", "batch_accounting")) / "_delta_log"
    newest = max(int(f.name[:20]) for f in books.glob("*.json"))
    for f in books.glob(f"*{newest:020d}*"):
        f.unlink()
    for name in (str(last), f".{last}.crc"):
        (Path(cfg.checkpoint("bronze_files")) / "commits" / name).unlink(missing_ok=True)
    done = run_job(env, "--source", "files", "--trigger", "available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    assert delta_version(spark, cfg) == version
    assert_booked(spark, cfg, "bronze_files", m["records"], [x["batch_id"] for x in lineages])


def assert_booked(spark, cfg, query: str, records: int, batches: list[int]) -> None:
    """One ops.batch_accounting row per bronze batch, rows_in = rows_written, adding up to `records`."""
    rows = (spark.read.format("delta").load(cfg.table_path("ops", "batch_accounting"))
            .where(f"query = '{query}'").collect())
    assert sorted(r.batch_id for r in rows) == sorted(batches)
    assert all(r.layer == "bronze" and r.rows_in == r.rows_written for r in rows), rows
    assert sum(r.rows_written for r in rows) == records


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_shared_dataset_files_without_final_newline_keep_their_last_line(spark, cfg):
    assert SHARED_EVENTS.is_dir(), f"shared dataset not found at {SHARED_EVENTS}; set SHARED_DATASETS"
    files = [SHARED_EVENTS / f"file-{i}.json" for i in range(5)]
    assert all(not f.read_bytes().endswith(b"\n") for f in files)
    cfg.landing.mkdir(parents=True)
    copies = []
    for f in files:
        copies.append(cfg.landing / f.name)
        shutil.copyfile(f, copies[-1])  # copyfile: the shared originals are read-only

    ingest(spark, cfg, "files")

    df = bronze_rows(spark, cfg)
    assert df.count() == 10_000
    assert_unique(df, "file_path", "line_number")
    last = {local_path(r.file_path): bytes(r.raw) for r in
            df.where("line_number = 2000").selectExpr("file_path", "coalesce(CAST(raw AS BINARY), raw_bytes) AS raw").collect()}
    assert last == {str(c.resolve()): c.read_bytes().rsplit(b"\n", 1)[1] for c in copies}
    assert_bronze_holds_files(spark, cfg, copies)


AWKWARD_FILES = {
    "empty": b"",
    "one newline": b"\n",
    "no final newline": b'{"a":1}\n{"b":2}',
    "blank lines kept": b'{"a":1}\n\n\n{"b":2}\n\n',
    "crlf and lone cr stay in the line": b'{"a":1}\r\n{"b":\r2}\r\n',
    "bom, bad utf-8, nul": b'\xef\xbb\xbf{"a":1}\n{"b":"\xff\xfe\x80"}\n\x00\n',
    "long line": b"x" * 3_000_000 + b"\n" + b"y",
}


def test_the_splitter_cuts_on_newline_only_and_keeps_every_byte(spark):
    """bronze_split_lines (jvm/bronze-lines) against the line definition in Python, on the
    awkward files; and a `record: file` profile's whole file as one record (none if empty)."""
    from datetime import datetime

    from bronze.transform import lines_from_files
    from bronze.job import BINARY_FILE_SCHEMA

    when = datetime(2026, 11, 1)
    files = spark.createDataFrame([(name, when, len(data), bytearray(data))
                                   for name, data in AWKWARD_FILES.items()], BINARY_FILE_SCHEMA)
    for whole_file in (False, True):
        rows = (lines_from_files(files, whole_file=whole_file)
                .selectExpr("file_path", "line_number", "coalesce(CAST(raw AS BINARY), raw_bytes) AS raw").collect())
        got = defaultdict(list)
        for r in sorted(rows, key=lambda r: (r.file_path, r.line_number)):
            got[r.file_path].append((r.line_number, bytes(r.raw)))
        for name, data in AWKWARD_FILES.items():
            lines = ([data] if data else []) if whole_file else (file_lines(data) if data else [])
            assert got.get(name, []) == list(enumerate(lines, 1)), (name, whole_file)


def test_a_splitter_missing_from_the_classpath_names_make_setup(spark, monkeypatch):
    from bronze import transform as T
    from bronze.job import BINARY_FILE_SCHEMA
    from common.jars import MissingJarsError

    monkeypatch.setattr(T, "SPLIT_LINES", "bronze_split_lines_not_built")
    monkeypatch.setattr(T, "_SPLIT_LINES_CLASS", "bronzelines.NotBuilt")
    with pytest.raises(MissingJarsError, match=r"bronzelines\.NotBuilt .*run `make setup`"):
        T.lines_from_files(spark.createDataFrame([], BINARY_FILE_SCHEMA))


# --- Kafka ---------------------------------------------------------------------------------

@pytest.mark.kafka
def test_kafka_lands_in_bronze_as_kafka_holds_it_and_a_rerun_adds_nothing(spark, cfg, env, tmp_path,
                                                                           monkeypatch, kafka_broker):
    kenv = kafka_env(env, kafka_broker)
    kcfg = load_config(env=kenv)
    topic = kcfg.kafka.topics.events
    m = generate(monkeypatch, env, tmp_path, "-n", "3000", "--seed", "9", "--sink", "kafka",
                 KAFKA_BOOTSTRAP=kenv["KAFKA_BOOTSTRAP"],
                 LAKEHOUSE__KAFKA__TOPICS__EVENTS=topic)
    assert m["topic"] == topic

    ingest(spark, kcfg, "kafka")

    df = bronze_rows(spark, kcfg)
    assert df.count() == m["records"]
    assert_unique(df, "kafka_topic", "kafka_partition", "kafka_offset")
    assert df.where("source <> 'kafka' OR kafka_timestamp IS NULL OR ingest_time IS NULL "
                    "OR ingest_date IS NULL OR file_path IS NOT NULL").count() == 0
    bronze = {(r.kafka_topic, r.kafka_partition, r.kafka_offset): (bytes(r.raw), r.kafka_key)
              for r in df.selectExpr("kafka_topic", "kafka_partition", "kafka_offset",
                                     "coalesce(CAST(raw AS BINARY), raw_bytes) AS raw", "kafka_key").collect()}
    held = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("endingOffsets", "latest").load()
            .selectExpr("topic", "partition", "offset", "value", "CAST(key AS STRING) AS key").collect())
    assert bronze == {(r.topic, r.partition, r.offset): (bytes(r.value), r.key) for r in held}
    # And Kafka holds what the generator meant to send, awkward bytes included.
    sent = gen.generate(3000, gen.Params.from_config(kcfg.generator), 9).records
    assert Counter(v for v, _ in bronze.values()) == Counter(r.value for r in sent)
    assert any(not _is_utf8(v) for v, _ in bronze.values())

    version = delta_version(spark, kcfg)
    ingest(spark, kcfg, "kafka")
    assert bronze_rows(spark, kcfg).count() == m["records"]
    assert delta_version(spark, kcfg) == version


# --- crashes and stops ---------------------------------------------------------------------

@pytest.mark.parametrize("source", ["files", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_kill_9_mid_run_then_restart_is_exactly_once(source, spark, cfg, env, tmp_path, monkeypatch,
                                                      jobs, request):
    if source == "files":
        m = generate(monkeypatch, env, tmp_path, "-n", "4000", "--seed", "4", "--files", "20")
        job_env = {**env, "LAKEHOUSE__BRONZE__MAX_FILES_PER_TRIGGER": "1"}
        keys = ("file_path", "line_number")
    else:
        job_env = kafka_env(env, request.getfixturevalue("kafka_broker"),
                            LAKEHOUSE__KAFKA__SOURCE__MAX_OFFSETS_PER_TRIGGER="100")
        m = generate(monkeypatch, env, tmp_path, "-n", "4000", "--seed", "4", "--sink", "kafka",
                     KAFKA_BOOTSTRAP=job_env["KAFKA_BOOTSTRAP"],
                     LAKEHOUSE__KAFKA__TOPICS__EVENTS=job_env["LAKEHOUSE__KAFKA__TOPICS__EVENTS"])
        keys = ("kafka_topic", "kafka_partition", "kafka_offset")
    checkpoint = cfg.checkpoint(f"bronze_{source}")
    table = bronze_path(cfg)

    proc = jobs(job_env, "--source", source, "--trigger", "available-now")
    wait_until(proc, lambda: mid_batch(checkpoint), "committed batch followed by one in flight")

    # The sharpest moment is a batch already in Delta but not yet in the checkpoint's commit
    # log: the restart replays it and only the append's key (query id, batch id) stops a second
    # copy. That window is short, so settle for any in-flight batch once two have committed.
    def kill_point() -> bool:
        commits = batch_ids(checkpoint, "commits")
        in_delta_only = delta_versions(table) - 1 > len(commits)  # version 0 is the CREATE
        return in_delta_only or (len(commits) >= 2 and mid_batch(checkpoint))

    wait_until(proc, kill_point, "kill point")
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL

    rows_at_kill = bronze_rows(spark, cfg).count()
    assert 0 < rows_at_kill < m["records"], "the kill did not land mid-run"

    # Default batch sizes for the restart: the replayed batch keeps the bounds in its offset
    # log entry whatever the new limits, and the rest goes in one batch instead of a dozen.
    restart_env = {k: v for k, v in job_env.items() if not k.endswith("_PER_TRIGGER")}
    done = run_job(restart_env, "--source", source, "--trigger", "available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    df = bronze_rows(spark, cfg)
    assert_unique(df, *keys)
    assert df.count() == m["records"]
    if source == "files":
        assert_bronze_holds_files(spark, cfg, m["files"])
    # The accounting row is exactly once too: one per committed batch, adding up to every record.
    assert_booked(spark, cfg, f"bronze_{source}", m["records"], sorted(batch_ids(checkpoint, "commits")))


def test_sigterm_finishes_the_running_batch_and_exits_0(spark, cfg, env, tmp_path, monkeypatch, jobs):
    m = generate(monkeypatch, env, tmp_path, "-n", "4000", "--seed", "6", "--files", "20")
    checkpoint = cfg.checkpoint("bronze_files")
    job_env = {**env, "LAKEHOUSE__BRONZE__MAX_FILES_PER_TRIGGER": "1"}
    proc = jobs(job_env, "--trigger", "processing-time", "--interval", "1 second")
    # Signal while a batch is under way: that batch must still commit before the exit.
    wait_until(proc, lambda: mid_batch(checkpoint), "committed batch followed by one in flight")
    in_flight = max(batch_ids(checkpoint, "offsets"))
    os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 60 s of SIGTERM:\n{proc.log_path.read_text(errors='replace')[-3000:]}")
    log = proc.log_path.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "pipeline: every query stopped cleanly" in log
    committed, planned = batch_ids(checkpoint, "commits"), batch_ids(checkpoint, "offsets")
    assert in_flight in committed, (in_flight, committed)
    # The stop lands after the batch's commit; Spark's trigger loop may have planned the next
    # batch by then (a batch slower than the interval starts the next at once). That one is not
    # committed, and the restart below replays it.
    assert planned - committed <= {max(committed) + 1}, (planned, committed)
    # One file per batch: stopping must not wait for the backlog to drain first.
    assert len(committed) < len(m["files"])
    assert_unique(bronze_rows(spark, cfg), "file_path", "line_number")

    done = run_job(env, "--source", "files", "--trigger", "available-now")
    assert done.returncode == 0, done.stderr[-3000:]
    df = bronze_rows(spark, cfg)
    assert_unique(df, "file_path", "line_number")
    assert df.count() == m["records"]


# --- errors --------------------------------------------------------------------------------

def test_missing_landing_folder_exits_2_naming_it(env, tmp_path):
    missing = tmp_path / "no-such-landing"
    proc = run_job({**env, "LANDING": str(missing)}, "--source", "files", timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(missing) in error_line(proc)


def test_unreachable_broker_exits_2_naming_the_bootstrap(env):
    from tools.processes import free_port

    bootstrap = f"127.0.0.1:{free_port()}"
    proc = run_job({**env, "KAFKA_BOOTSTRAP": bootstrap, "LAKEHOUSE__KAFKA__CONNECT_TIMEOUT": "3 seconds"},
                   "--source", "kafka", timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert bootstrap in error_line(proc)


# --- make ----------------------------------------------------------------------------------

def test_make_generate_then_run_bronze_twice(spark, cfg, env, tmp_path):
    manifest = tmp_path / "m.json"

    def make(*args: str) -> None:
        proc = subprocess.run([*MAKE, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"make {' '.join(args)}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"

    make("generate", "N=2000", "SEED=3", f"MANIFEST={manifest}")
    records = json.loads(manifest.read_text())["records"]
    make("run-bronze")
    assert bronze_rows(spark, cfg).count() == records
    version = delta_version(spark, cfg)
    make("run-bronze")
    assert bronze_rows(spark, cfg).count() == records
    assert delta_version(spark, cfg) == version


def test_a_table_from_before_raw_bytes_is_migrated_and_reads_outside_spark(spark, cfg):
    """bronze.events written when raw held any bytes: the next start adds raw_bytes and moves the
    rows that are not UTF-8 there, so delta-rs (pandas, DuckDB) can read the table again."""
    from deltalake import DeltaTable as RsTable
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from bronze.job import prepare
    from common.delta import ensure_table
    from common.lineage import parse
    from common.raw_bytes import as_binary
    from common.schemas import BRONZE_EVENTS, BRONZE_PARTITION

    old = StructType([f for f in BRONZE_EVENTS.fields if f.name not in ("raw_bytes", "kafka_key_bytes")])
    path = ensure_table(spark, cfg, "bronze", "events", old, BRONZE_PARTITION)
    garbage, good = b"\xff\xfe not utf-8 \xe9", b'{"ok": "caf\xc3\xa9"}'
    rows = (spark.range(2).select(
        F.when(F.col("id") == 0, F.unhex(F.lit(garbage.hex()))).otherwise(F.unhex(F.lit(good.hex())))
        .cast("string").alias("raw"),
        F.lit("file").alias("source"), F.lit("file:///old.jsonl").alias("file_path"),
        (F.col("id") + 1).alias("line_number"), *[F.lit(None).cast(f.dataType).alias(f.name) for f in old.fields[4:10]],
        F.current_timestamp().alias("ingest_time"), F.current_date().alias("ingest_date")))
    rows.write.format("delta").mode("append").save(path)

    prepare(spark, cfg)

    got = {r.line_number: r for r in spark.read.format("delta").load(path)
           .select("line_number", "raw", "raw_bytes", as_binary().alias("bytes")).collect()}
    assert got[1].raw is None and bytes(got[1].raw_bytes) == garbage == bytes(got[1].bytes)
    assert got[2].raw == good.decode() and got[2].raw_bytes is None
    assert len(RsTable(path).to_pandas()) == 2
    migration = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where("operation = 'UPDATE'").collect()
    assert len(migration) == 1 and parse(migration[0].userMetadata)["migration"] == "raw_bytes"
    prepare(spark, cfg)                                     # once: a second start changes nothing
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where("operation = 'UPDATE'").count() == 1
