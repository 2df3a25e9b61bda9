"""The bad-input corpus (tests/corpus/kinds.yaml) through the real jobs.

Files: the whole corpus lands in one landing folder; bronze and silver run through the pipeline
runner in this process (exit code 0 = nothing crashed), then the phase-2
files land and both run again, a later micro-batch on the same checkpoints. Kafka kinds go to a
one-partition topic of the session broker and through the same bronze and silver queries,
in-process. One run covers every kind; each kind is then checked on its own, so a failure names it.

How bronze holds awkward bytes: the line's exact bytes are in `raw` (a string) when they are
valid UTF-8 and in `raw_bytes` (binary) when not (common/raw_bytes.py), read back with
coalesce(CAST(raw AS BINARY), raw_bytes): a UTF-8 BOM stays as EF BB BF at the start of the
file's first line, a CRLF line keeps its trailing '\\r' (lines are split on '\\n' only),
non-UTF-8 bytes are kept as they are, a Kafka message with a null value has both NULL and an
empty value has raw ''. Every table stays readable outside Spark (delta-rs, DuckDB, pandas), and
quarantine holds each rejected record's bytes once, equal to bronze's.
"""
from __future__ import annotations

import json
import os
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlparse

import pytest
import yaml

from common.config import load_config
from common.raw_bytes import as_binary

TABLES = load_config(env={}).tables    # the default (nest) profile's tables, by layer

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"
KINDS: dict[str, dict] = yaml.safe_load((CORPUS / "kinds.yaml").read_text())
FILE_KINDS = [k for k, v in KINDS.items() if "kafka" not in v]
KAFKA_KINDS = [k for k, v in KINDS.items() if "kafka" in v]
LOCATIONS = "device_id,zip_code,city,state\ncam-0001,02108,Boston,MA\ncam-0002,94105,San Francisco,CA\n" \
            "cam-0003,10001,New York,NY\ncam-0004,60601,Chicago,IL\n"


def _record(minute: int, device: str = "cam-0001", **extra) -> dict:
    start = f"2026-11-01T10:{minute:02d}:00.000Z"
    return {"devices": {"cameras": {device: {
        "device_id": device, "name": f"Room {minute}", "is_online": True,
        "last_event": {"has_sound": False, "has_motion": True, "has_person": True,
                       "start_time": start, "end_time": start.replace(":00.000Z", ":30.000Z")}}}},
        **extra}


def _line(minute: int, device: str = "cam-0001", **extra) -> bytes:
    return json.dumps(_record(minute, device, **extra), separators=(",", ":")).encode()


def _wide(minute: int, cameras: int, bad_every: int) -> bytes:
    """One record of `cameras` cameras (a CloudTrail-sized file holds thousands of records);
    every `bad_every`-th has has_person "maybe" (quarantined), the rest are events."""
    cams = {}
    for i in range(cameras):
        device = f"cam-w{minute}-{i:06d}"
        cam = _record(minute, device)["devices"]["cameras"][device]
        if i % bad_every == bad_every - 1:
            cam["last_event"]["has_person"] = "maybe"
        cams[device] = cam
    return json.dumps({"devices": {"cameras": cams}}, separators=(",", ":")).encode()


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# Kinds too big or too binary to check in. Minutes 45.. of the test day are theirs.
GENERATED = {
    "line_10mb": lambda: _line(45, "cam-0002", padding="x" * (10 * 1024 * 1024)) + b"\n",
    "non_utf8_bytes": lambda: (b"\xff\xfe garbage " + _line(46)[:30] + b"\n"
                               + _line(46, "cam-0003").replace(b"Room 46", b"Caf\xe9 46") + b"\n"),
    "utf8_bom": lambda: b"\xef\xbb\xbf" + _line(47) + b"\n" + _line(48) + b"\n",
    "crlf_line_ends": lambda: _line(49, "cam-0004") + b"\r\n\r\n" + _line(51, "cam-0004") + b"\r\n",
    "nul_bytes": lambda: b"\x00\x00\x00\n" + _line(52).replace(b"Room 52", b"Ro\x00m 52") + b"\n",
    "deeply_nested_junk": lambda: (_line(53)[:-1] + b',"junk":' + _nested(5000) + b"}\n"
                                   + _nested(100_000) + b"\n"),
    "wide_record_2000": lambda: _wide(54, 2000, 500) + b"\n",
    "wide_record_20000": lambda: _wide(55, 20000, 5000) + b"\n",
}


def kind_bytes(kind: str) -> bytes:
    return GENERATED[kind]() if KINDS[kind].get("generated") else (CORPUS / f"{kind}.jsonl").read_bytes()


def file_lines(data: bytes) -> list[bytes]:
    """A file's lines as bronze defines them: split on '\\n', a final newline ends the last line."""
    if not data:
        return []
    parts = data.split(b"\n")
    return parts[:-1] if data.endswith(b"\n") else parts


def fates(expect: list) -> list[list[str]]:
    """kinds.yaml `expect` -> per line, the sorted fates of its rows ('quarantine' reasons sorted;
    "<n> x <fate>" stands for n rows of that fate)."""
    def norm(fate: str) -> list[str]:
        count, times, rest = fate.partition(" x ")
        if times and count.isdigit():
            return norm(rest) * int(count)
        word, *reasons = fate.split()
        return [" ".join([word, *sorted(reasons)])]
    return [sorted(n for f in (line if isinstance(line, list) else [line]) for n in norm(f)) for line in expect]


def run(spark, env: dict, layer: str, *args: str) -> SimpleNamespace:
    """One layer through the pipeline runner, in this process on the shared session: its exit
    code and what it wrote to stderr (0 = no query crashed on the corpus)."""
    import contextlib
    import io

    from pipeline.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["--trigger", "available-now", *args], layer=layer, spark=spark, env=env)
    return SimpleNamespace(returncode=code, stderr=err.getvalue())


def table(spark, cfg, layer: str, name: str):
    return spark.read.format("delta").load(cfg.table_path(layer, name))


def outcomes(spark, cfg, key: str) -> dict:
    """(bronze position) -> fates found in silver and quarantine; key names the position column."""
    found: dict = defaultdict(list)
    silver_rows: dict = defaultdict(list)
    for r in table(spark, cfg, "silver", "camera_events").collect():
        found[r["bronze_" + key[0]], r["bronze_" + key[1]]].append("silver")
        silver_rows[r["bronze_" + key[0]]].append(r)
    for r in table(spark, cfg, "silver", "quarantine").collect():
        found[r["bronze_" + key[0]], r["bronze_" + key[1]]].append(
            " ".join(["quarantine", *sorted(r.reasons)]))
    return {"fates": found, "silver": silver_rows}


def by_kind(file_uri: str) -> str:
    """Each kind is its own landing file, named for it."""
    return Path(unquote(urlparse(file_uri).path)).stem


def accounting_by_batch(spark, cfg) -> dict[int, dict]:
    return {r.batch_id: r.asDict() for r in
            table(spark, cfg, "ops", "batch_accounting").where("layer = 'silver'").collect()}


def drop_tables(spark) -> None:
    for layer, names in TABLES.items():
        for name in names:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{name}")


def isolated_env(root: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")}
    return {**env, "LAKEHOUSE_ROOT": str(root / "lakehouse"), **extra}


# --- files: two runs of the real jobs over the whole corpus ----------------------------------

@pytest.fixture(scope="module")
def files_run(spark, tmp_path_factory):
    env = isolated_env(tmp_path_factory.mktemp("corpus"))
    cfg = load_config(env=env)
    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text(LOCATIONS)
    cfg.landing.mkdir(parents=True)
    procs, accounting_runs, phase_of = [], [], {}
    for phase in (1, 2):
        before = set(accounting_by_batch(spark, cfg)) if phase == 2 else set()
        for kind in FILE_KINDS:
            if KINDS[kind].get("phase", 1) == phase:
                # Written under a hidden name and renamed: the file source never sees half a file.
                tmp = cfg.landing / f".{kind}.tmp"
                tmp.write_bytes(kind_bytes(kind))
                tmp.rename(cfg.landing / f"{kind}.jsonl")
                phase_of[kind] = phase
        procs.append((f"bronze phase {phase}", run(spark, env, "bronze", "--source", "files")))
        procs.append((f"silver phase {phase}", run(spark, env, "silver")))
        accounting_runs.append(sorted(set(accounting_by_batch(spark, cfg)) - before))
    bronze = defaultdict(dict)
    for r in table(spark, cfg, "bronze", "events").selectExpr(
            "file_path", "line_number", "coalesce(CAST(raw AS BINARY), raw_bytes) AS raw").collect():
        bronze[by_kind(r.file_path)][r.line_number] = bytes(r.raw)
    quarantined = defaultdict(list)     # (kind, line) -> the bytes of each of its quarantine rows
    for r in table(spark, cfg, "silver", "quarantine").select(
            "bronze_file_path", "bronze_line_number", as_binary().alias("raw")).collect():
        quarantined[by_kind(r.bronze_file_path), r.bronze_line_number].append(
            None if r.raw is None else bytes(r.raw))
    found = outcomes(spark, cfg, ("file_path", "line_number"))
    yield SimpleNamespace(
        cfg=cfg, procs=procs, bronze=bronze, runs=accounting_runs, books=accounting_by_batch(spark, cfg),
        quarantined=quarantined, counts={f"{layer}.{name}": table(spark, cfg, layer, name).count()
                                         for layer, name in READABLE},
        fates={(by_kind(p), n): v for (p, n), v in found["fates"].items()},
        silver={by_kind(p): rows for p, rows in found["silver"].items()})
    drop_tables(spark)


def test_every_job_run_exits_0(files_run):
    for what, proc in files_run.procs:
        assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_kind_lands_where_declared(files_run, kind):
    lines = file_lines(kind_bytes(kind))
    # Bronze kept every line, numbered, with its exact bytes.
    held = files_run.bronze.get(kind, {})
    assert sorted(held) == list(range(1, len(lines) + 1)), f"{kind}: bronze holds lines {sorted(held)}"
    differ = [n for n in held if held[n] != lines[n - 1]]
    assert not differ, f"{kind}: bronze lines {differ} differ from the file's bytes"

    expected = fates(KINDS[kind]["expect"])
    assert len(expected) == len(lines), f"{kind}: kinds.yaml declares {len(expected)} lines, file has {len(lines)}"
    for n, want in enumerate(expected, start=1):
        landed = [f for f in want if f not in ("duplicate", "late")]
        got = sorted(files_run.fates.get((kind, n), []))
        assert got == landed, f"{kind} line {n}: expected {want}, found {got or 'nothing'}"
    for row in files_run.silver.get(kind, []):
        for field, value in (KINDS[kind].get("fields") or {}).items():
            got = row[field]
            got = str(got) if field == "start_time" else got
            assert got == value, f"{kind}: silver {field} = {got!r}, declared {value!r}"


def test_every_row_belongs_to_a_declared_line(files_run):
    """Nothing in silver or quarantine that the corpus did not declare (no row made up twice)."""
    stray = {k for k in files_run.fates if k[0] not in KINDS or k[1] > len(KINDS[k[0]]["expect"])}
    assert not stray
    assert set(files_run.bronze) == {k for k in FILE_KINDS if file_lines(kind_bytes(k))}


def test_quarantine_holds_each_records_bytes_once_equal_to_bronze(files_run):
    """One copy per quarantined record (its own row, or its first quarantined element), never
    one per element: a record of 20,000 cameras with rejects would be stored 20,000 times."""
    assert files_run.quarantined
    for (kind, line), copies in files_run.quarantined.items():
        held = [c for c in copies if c is not None]
        assert held == [files_run.bronze[kind][line]], f"{kind} line {line}: {len(held)} copies"


READABLE = [("bronze", "events"), ("silver", "quarantine"), ("silver", "camera_events")]


@pytest.mark.parametrize("layer,name", READABLE)
def test_tables_with_awkward_bytes_read_outside_spark(files_run, layer, name):
    """Non-UTF-8 bytes in a string column made delta-rs, DuckDB and pandas refuse the whole table."""
    from deltalake import DeltaTable

    from tools.embedded_sql import EmbeddedEngine
    from tools.sql import Runner

    full = f"{layer}.{name}"
    assert len(DeltaTable(files_run.cfg.table_path(layer, name)).to_pandas()) == files_run.counts[full]
    _, rows = EmbeddedEngine(files_run.cfg).query(f"SELECT * FROM {full}", 10**6)
    assert len(rows) == files_run.counts[full]
    # `lakehouse sql`'s path, with no fallback to Spark: the embedded engine reads it itself.
    out = Runner(files_run.cfg, "embedded", fallback=False).run(f"SELECT count(*) AS n FROM {full}", 10)
    assert f"| {files_run.counts[full]} " in out


def test_duplicates_and_late_events_are_counted_per_run(files_run):
    for phase, batches in enumerate(files_run.runs, start=1):
        assert batches, f"phase {phase}: silver recorded no batch"
        declared = Counter(f for k in FILE_KINDS if KINDS[k].get("phase", 1) == phase
                           for line in fates(KINDS[k]["expect"]) for f in line)
        books = [files_run.books[b] for b in batches]
        for b in books:
            assert b["records_in"] == b["records_parsed"] + b["records_quarantined_unparsed"], b
            assert b["events_parsed"] == (b["events_written"] + b["events_quarantined"]
                                          + b["duplicates_dropped"] + b["late_dropped"]), b
        assert sum(b["duplicates_dropped"] for b in books) == declared["duplicate"], f"phase {phase}"
        assert sum(b["late_dropped"] for b in books) == declared["late"], f"phase {phase}"
        assert sum(b["events_written"] for b in books) == declared["silver"], f"phase {phase}"


# --- Kafka: null and empty values and keys ---------------------------------------------------

@pytest.fixture(scope="module")
def kafka_run(spark, tmp_path_factory, kafka_broker):
    from confluent_kafka import Producer

    from common.kafka import ensure_topic
    from pipeline.runner import start

    topic = f"corpus-{uuid.uuid4().hex[:10]}"
    env = isolated_env(tmp_path_factory.mktemp("corpus-kafka"), SOURCE="kafka",
                       KAFKA_BOOTSTRAP=kafka_broker.bootstrap, LAKEHOUSE__KAFKA__TOPICS__EVENTS=topic)
    cfg = load_config(env=env)
    cfg.locations_csv.parent.mkdir(parents=True, exist_ok=True)
    cfg.locations_csv.write_text(LOCATIONS)
    ensure_topic(kafka_broker.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    sent = []   # (kind, index in the kind, key bytes, value bytes), in offset order
    for kind in KAFKA_KINDS:
        for i, m in enumerate(KINDS[kind]["kafka"]):
            value = m["value"]
            value = None if value is None else value.encode("latin-1" if m.get("latin1") else "utf-8")
            key = None if m["key"] is None else m["key"].encode("latin-1" if m.get("latin1_key") else "utf-8")
            producer.produce(topic, value=value, key=key, partition=0)
            producer.flush(30)   # one at a time: offsets follow the corpus order
            sent.append((kind, i, key, value))
    for name, options in (("bronze", {"source": "kafka"}), ("silver", {})):
        for query in start(spark, cfg, name, **options):
            query.awaitTermination()   # raises if the query failed
    bronze = {r.kafka_offset: (None if r.raw is None else bytes(r.raw), None if r.key is None else bytes(r.key))
              for r in table(spark, cfg, "bronze", "events").select(
                  "kafka_offset", as_binary().alias("raw"), as_binary("kafka_key", "kafka_key_bytes").alias("key"))
              .collect()}
    found = outcomes(spark, cfg, ("kafka_topic", "kafka_offset"))
    yield SimpleNamespace(cfg=cfg, sent=sent, bronze=bronze, fates={o: v for (_, o), v in found["fates"].items()},
                          books=accounting_by_batch(spark, cfg))
    drop_tables(spark)


@pytest.mark.kafka
@pytest.mark.parametrize("kind", KAFKA_KINDS)
def test_kafka_kind_lands_where_declared(kafka_run, kind):
    expected = fates(KINDS[kind]["expect"])
    offsets = [o for o, s in enumerate(kafka_run.sent) if s[0] == kind]
    assert len(expected) == len(offsets)
    for want, offset in zip(expected, offsets):
        _, _, key, value = kafka_run.sent[offset]
        assert offset in kafka_run.bronze, f"{kind}: offset {offset} not in bronze"
        assert kafka_run.bronze[offset] == (value, key), kind
        assert sorted(kafka_run.fates.get(offset, [])) == want, f"{kind}: found {kafka_run.fates.get(offset)}"


@pytest.mark.kafka
def test_kafka_corpus_accounting_adds_up(kafka_run):
    assert len(kafka_run.bronze) == len(kafka_run.sent)
    for b in kafka_run.books.values():
        assert b["records_in"] == b["records_parsed"] + b["records_quarantined_unparsed"], b
        assert b["events_parsed"] == (b["events_written"] + b["events_quarantined"]
                                      + b["duplicates_dropped"] + b["late_dropped"]), b
    assert sum(b["records_in"] for b in kafka_run.books.values()) == len(kafka_run.sent)


@pytest.mark.kafka
def test_kafka_bronze_with_non_utf8_keys_and_values_reads_outside_spark(kafka_run):
    from deltalake import DeltaTable

    rows = DeltaTable(kafka_run.cfg.table_path("bronze", "events")).to_pandas()
    assert len(rows) == len(kafka_run.sent)
    assert rows.kafka_key_bytes.notna().sum() == sum(1 for k in KAFKA_KINDS if KINDS[k]["kafka"][0].get("latin1_key"))
