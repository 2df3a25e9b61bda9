"""Silver transforms on static DataFrames: the very functions the streaming job runs per batch.

Bronze rows are built by hand (raw JSON text + file lineage); nothing here starts a stream.
"""
from __future__ import annotations

import json
import random
import re
import sys
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F

from common.config import load_config
from common.quality import SuiteError, load_suites
from tests.support.bronze_rows import bronze_row as support_bronze_row
from common.schemas import BRONZE_EVENTS
from silver import transform as T
from silver.locations import load

INGEST = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
FILE = "file:///landing/nest/part-7-0000.jsonl"


# --- helpers -------------------------------------------------------------------------------

def camera(device_id="cam-0001", start="2026-11-01T10:00:00.000Z", end="2026-11-01T10:00:30.000Z",
           *, name="Front Door 1", is_online=True, has_sound=False, has_motion=True,
           has_person=False, drop=(), **override) -> dict:
    """One camera of a Nest record; `drop` removes keys (also of last_event), `override` sets
    any key of last_event or the camera to an arbitrary JSON value."""
    last = {"has_sound": has_sound, "has_motion": has_motion, "has_person": has_person,
            "start_time": start, "end_time": end}
    cam = {"device_id": device_id, "name": name, "is_online": is_online, "last_event": last}
    for key, value in override.items():
        (last if key in last else cam)[key] = value
    for key in drop:
        (last if key in last else cam).pop(key)
    return cam


def record(*cameras: dict) -> str:
    cams = {c.get("device_id") or f"cam-{i}": c for i, c in enumerate(cameras)}
    return json.dumps({"devices": {"cameras": cams},
                       "metadata": {"access_token": "c.abc", "client_version": 1}})


def bronze_row(raw: str | bytes | None, line: int, file: str = FILE, ingest: datetime = INGEST) -> tuple:
    return support_bronze_row(raw, line, file, ingest)


def bronze_df(spark, raws, ingest: datetime = INGEST):
    return spark.createDataFrame([bronze_row(r, i + 1, ingest=ingest) for i, r in enumerate(raws)],
                                 BRONZE_EVENTS)

# The transforms take the feed's profile; these tests are about the default (nest) one.
NEST = load_config(env={}).profile


@pytest.fixture(scope="module")
def silver_conf():
    return load_config(env={}).silver


def parse(spark, silver_conf, raws, ingest: datetime = INGEST, carry_bytes: int = 0):
    bronze = raws if not isinstance(raws, list) else bronze_df(spark, raws, ingest)
    return T.parse_events(bronze, silver_conf.min_event_time, silver_conf.max_future.seconds, NEST,
                          carry_bytes=carry_bytes)


def millis(ts_column: str):
    return F.unix_millis(F.col(ts_column)).alias(ts_column)


def reasons_by_line(parsed) -> dict[int, list[str]]:
    return {r.bronze_line_number: list(r.reasons)
            for r in parsed.select("bronze_line_number", "reasons").collect()}


def utc_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


# --- parse and explode ---------------------------------------------------------------------

def test_a_record_with_three_cameras_gives_three_flat_typed_rows(spark, silver_conf):
    raw = record(
        camera("cam-0001", "2026-11-01T10:00:00.000Z", "2026-11-01T10:00:30.000Z",
               has_sound=True, has_person=True),
        camera("cam-0002", "2026-11-01T12:00:00+02:00", "2026-11-01T10:01:00.5Z",
               name="Garage 2", is_online=False, has_motion=False),
        camera("cam-0003", "2026-11-01T10:02:00Z", "2026-11-01T10:02:07.25Z"),
    )
    parsed = parse(spark, silver_conf, [raw])
    assert parsed.columns == T.parsed_columns(NEST)
    types = dict(parsed.dtypes)
    assert types["start_time"] == types["end_time"] == types["event_time"] == "timestamp"
    assert types["has_person"] == types["is_online"] == "boolean"
    assert types["duration_seconds"] == "double"

    rows = {r.device_id: r for r in parsed.select(
        "device_id", "name", "is_online", "has_sound", "has_motion", "has_person",
        millis("start_time"), millis("end_time"), millis("event_time"), "duration_seconds",
        "camera_index", "parsed", "reasons", "event_id", "raw",
        *[c for c in T.LINEAGE_COLUMNS if c != "bronze_ingest_time"], millis("bronze_ingest_time")).collect()}
    assert sorted(rows) == ["cam-0001", "cam-0002", "cam-0003"]
    assert sorted(r.camera_index for r in rows.values()) == [0, 1, 2]

    one, two, three = rows["cam-0001"], rows["cam-0002"], rows["cam-0003"]
    assert (one.name, one.is_online, one.has_sound, one.has_motion, one.has_person) == \
        ("Front Door 1", True, True, True, True)
    assert (two.name, two.is_online, two.has_sound, two.has_motion, two.has_person) == \
        ("Garage 2", False, False, False, False)
    # Times are instants in UTC: "+02:00" is normalised, fractions of a second are kept.
    assert one.start_time == one.event_time == utc_ms("2026-11-01T10:00:00Z")
    assert two.start_time == utc_ms("2026-11-01T10:00:00Z")
    assert two.end_time == utc_ms("2026-11-01T10:01:00.500Z")
    assert (one.duration_seconds, two.duration_seconds, three.duration_seconds) == (30.0, 60.5, 7.25)
    for r in rows.values():
        assert r.parsed and r.reasons == []
        assert r.raw is None and r.bronze_line_number == 1   # the position, not the bytes
        assert len(r.event_id) == 64
        assert (r.bronze_source, r.bronze_file_path, r.bronze_line_number) == ("file", FILE, 1)
        assert r.bronze_ingest_time == int(INGEST.timestamp() * 1000)
        assert (r.bronze_kafka_topic, r.bronze_kafka_partition, r.bronze_kafka_offset) == (None,) * 3
    assert len({r.event_id for r in rows.values()}) == 3


def test_event_id_depends_on_device_start_and_end_only(spark, silver_conf):
    base = camera("cam-0001", "2026-11-01T10:00:00.000Z", "2026-11-01T10:00:30.000Z")
    raws = [
        record(base),
        # Same event in another record: other cameras around it, other flags, other name, and
        # the same instants written differently.
        record(camera("cam-0009"), camera("cam-0001", "2026-11-01T11:00:00+01:00",
                                          "2026-11-01T10:00:30Z", name="Renamed",
                                          has_person=True, is_online=False)),
        record(camera("cam-0001", "2026-11-01T10:00:00.000Z", "2026-11-01T10:00:31.000Z")),
        record(camera("cam-0002", "2026-11-01T10:00:00.000Z", "2026-11-01T10:00:30.000Z")),
        record(camera("cam-0001", "2026-11-01T10:00:00.001Z", "2026-11-01T10:00:30.000Z")),
    ]
    ids = {(r.bronze_line_number, r.device_id): r.event_id
           for r in parse(spark, silver_conf, raws).collect()}
    same = ids[(1, "cam-0001")]
    assert ids[(2, "cam-0001")] == same
    assert ids[(3, "cam-0001")] != same      # another end
    assert ids[(4, "cam-0002")] != same      # another device
    assert ids[(5, "cam-0001")] != same      # another start (1 ms)
    assert len(set(ids.values())) == len(ids) - 1


def test_good_and_bad_cameras_of_one_record_are_judged_one_by_one(spark, silver_conf):
    raw = record(camera("cam-0001"), camera("cam-0002", has_person="maybe"))
    parsed = parse(spark, silver_conf, [raw])
    by_device = {r.device_id: r for r in parsed.collect()}
    assert by_device["cam-0001"].reasons == []
    assert by_device["cam-0002"].reasons == ["wrong_type:has_person"]
    assert [r.device_id for r in T.accepted(parsed).collect()] == ["cam-0001"]
    assert [r.device_id for r in T.rejected(parsed).collect()] == ["cam-0002"]


# --- reason codes --------------------------------------------------------------------------

LATER = (INGEST + timedelta(days=1, seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
AT_LIMIT = (INGEST + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

REASON_CASES = [
    ("empty line", "", ["empty_record"]),
    ("blank line", "   ", ["empty_record"]),
    ("null raw", None, ["empty_record"]),
    ("truncated", record(camera())[:57], ["malformed_json"]),
    ("json array", "[1, 2, 3]", ["malformed_json"]),
    ("array of records", f"[{record(camera())}]", ["malformed_json"]),
    ("json scalar", "42", ["malformed_json"]),
    ("no devices", json.dumps({"metadata": {"client_version": 1}}), ["missing_cameras"]),
    ("no cameras", json.dumps({"devices": {}}), ["missing_cameras"]),
    ("null cameras", json.dumps({"devices": {"cameras": None}}), ["missing_cameras"]),
    ("empty cameras", json.dumps({"devices": {"cameras": {}}}), ["missing_cameras"]),
    ("no device_id", record(camera(drop=("device_id",))), ["missing_field:device_id"]),
    ("blank device_id", record(camera(device_id=" ")), ["missing_field:device_id"]),
    ("no last_event", record(camera(drop=("last_event",))), ["missing_field:last_event"]),
    ("null last_event", record(camera(last_event=None)), ["missing_field:last_event"]),
    *[(f"no {f}", record(camera(drop=(f,))), [f"missing_field:{f}"])
      for f in ("has_sound", "has_motion", "has_person", "start_time", "end_time")],
    ("person maybe", record(camera(has_person="maybe")), ["wrong_type:has_person"]),
    ("sound 1", record(camera(has_sound=1)), ["wrong_type:has_sound"]),
    ("start epoch", record(camera(start=1793527200)), ["bad_timestamp:start_time"]),
    ("start garbage", record(camera(start="yesterday at noon")), ["bad_timestamp:start_time"]),
    ("start no zone", record(camera(start="2026-11-01T10:00:00")), ["bad_timestamp:start_time"]),
    ("end garbage", record(camera(end="soon")), ["bad_timestamp:end_time"]),
    ("before 2000", record(camera(start="1999-12-31T23:59:59.999Z")), ["time_out_of_range:start_time"]),
    ("over a day ahead", record(camera(start=LATER, end=LATER)), ["time_out_of_range:start_time"]),
    ("two problems", record(camera(drop=("has_sound",), start="x")),
     ["missing_field:has_sound", "bad_timestamp:start_time"]),
]


RECORD_LEVEL = ("empty_record", "invalid_utf8", "malformed_json", "missing_cameras")


def test_every_reason_code_one_case_per_line(spark, silver_conf):
    """Each case is one bronze line of the same DataFrame, as a micro-batch would hold them;
    each must get exactly its own reason code(s), nothing more."""
    parsed = parse(spark, silver_conf, [raw for _, raw, _ in REASON_CASES])
    assert T.accepted(parsed).count() == 0
    rows = parsed.select("bronze_line_number", "reasons", "parsed", "event_id").collect()
    assert sorted(r.bronze_line_number for r in rows) == list(range(1, len(REASON_CASES) + 1))
    got = {REASON_CASES[r.bronze_line_number - 1][0]: list(r.reasons) for r in rows}
    assert got == {case: expected for case, _, expected in REASON_CASES}
    for r in rows:
        case, _, expected = REASON_CASES[r.bronze_line_number - 1]
        record_level = expected[0] in RECORD_LEVEL
        assert r.parsed is (not record_level), case
        # An unparsed record has no event identity; a rejected camera event keeps its own.
        assert (r.event_id is None) is record_level, case


def test_lines_the_byte_tests_cannot_decide_get_the_regexes_answer(spark, silver_conf):
    """parse_records looks at a line's first and last bytes before its regexes: whatever those
    cannot decide (whitespace around the object, a BOM, a second value) still gets the regex's
    answer."""
    good = record(camera())
    cases = [(good + " \t", []), (" " + good, []), ("\ufeff" + good, []), (" \t ", ["empty_record"]),
             (good + " " + good, ["malformed_json"]), (good + "\n" + good, ["malformed_json"]),
             (good + "x", ["malformed_json"]), ("\ufeff", ["malformed_json"])]
    got = reasons_by_line(parse(spark, silver_conf, [raw for raw, _ in cases]))
    assert got == {i: reasons for i, (_, reasons) in enumerate(cases, start=1)}


def test_reason_checks_are_not_under_a_higher_order_function(spark, silver_conf):
    """Spark evaluates a higher-order function row by row outside generated code, and every
    expression under it too: reason lists built as filter(array(checks...)) cost 30% of the
    parse's CPU. Only the checks of a record the schema rejected (its shape) may use one."""
    plan = parse(spark, silver_conf, [record(camera())])._jdf.queryExecution().executedPlan().toString()
    assert not re.search(r"\bfilter\(", plan), "a reason list is built with filter()"


def test_non_utf8_bytes_are_quarantined_as_invalid_utf8(spark, silver_conf):
    # Bronze keeps bytes that are not UTF-8 in raw_bytes, raw NULL (common/raw_bytes.py).
    good = record(camera())
    garbage = b"\xff\xfe garbage " + good[:40].encode()
    bronze = bronze_df(spark, [good, garbage])
    row = bronze.where("line_number = 2").first()
    assert row.raw is None and bytes(row.raw_bytes) == garbage
    parsed = parse(spark, silver_conf, bronze)
    assert reasons_by_line(parsed) == {1: [], 2: ["invalid_utf8"]}
    q = T.to_quarantine(T.rejected(parsed), 1, NEST).first()
    assert q.raw is None and bytes(q.raw_bytes) == garbage


def test_a_record_over_the_size_limit_is_quarantined_unparsed(spark, silver_conf):
    small, big = record(camera("cam-0001")), record(*[camera(f"cam-{i:04d}") for i in range(40)])
    parsed = T.parse_events(bronze_df(spark, [small, big]), silver_conf.min_event_time,
                            silver_conf.max_future.seconds, NEST, max_record_bytes=len(small) + 10)
    assert reasons_by_line(parsed) == {1: [], 2: ["record_too_large"]}
    assert parsed.where("bronze_line_number = 2").first().raw == big


def test_events_carry_their_bronze_position_not_the_record(spark, silver_conf):
    """A record's bytes ride only on the row of a record that did not parse: on every event of a
    record of n elements they made silver's cost grow with size x n."""
    wide = record(*[camera(f"cam-{i:04d}") for i in range(50)])
    parsed = parse(spark, silver_conf, ["{oops", wide])
    rows = parsed.collect()
    assert [r.raw for r in rows if r.bronze_line_number == 1] == ["{oops"]
    events = [r for r in rows if r.bronze_line_number == 2]
    assert len(events) == 50 and all(r.raw is None and r.raw_bytes is None for r in events)
    # ... and the generator never sees them for a parsed record: they are NULLed beneath it (above
    # it, Spark would copy the bytes onto every element's row first, and NULL them after).
    plan = parsed._jdf.queryExecution().executedPlan().toString()
    below = plan[plan.index("Generate"):]
    assert "CASE WHEN NOT parsed" in below and "CASE WHEN NOT parsed" not in plan[:plan.index("Generate")]


@pytest.mark.parametrize("carry", ["none", "small", "all"])
def test_quarantined_events_get_their_record_bytes_once_per_record(spark, silver_conf, carry):
    """Carried from the parse (a record small enough: `carry`) or fetched from bronze, a
    record's bytes reach the quarantine once, on its first quarantined element."""
    two_bad = record(camera("cam-0001"), camera("cam-0002", has_person="maybe"),
                     camera("cam-0003", start="later"))
    one_bad = record(camera("cam-0004", has_person="maybe"))
    # "small": one_bad (1 element) is carried, two_bad (3 elements) is fetched
    carry_bytes = {"none": 0, "small": len(one_bad) + 1, "all": 3 * len(two_bad)}[carry]
    bronze = bronze_df(spark, ["{oops", two_bad, one_bad, record(camera("cam-0005"))])
    parsed = parse(spark, silver_conf, bronze, carry_bytes=carry_bytes)
    carried = {r.bronze_line_number for r in parsed.where("parsed AND raw IS NOT NULL").collect()}
    assert carried == {"none": set(), "small": {3}, "all": {2, 3}}[carry]
    assert parsed.where("parsed AND raw IS NOT NULL AND size(reasons) = 0").count() == 0
    fetch = parsed.agg(*T.fetch_window(~T.is_accepted())).first()
    # every event carried its bytes: bronze is not read at all
    source = None if carry == "all" else bronze
    assert (fetch[0] is None) == (carry == "all")
    q = T.to_quarantine(T.with_record_bytes(T.rejected(parsed), source, NEST, *fetch), 1, NEST).collect()
    by_line = {}
    for r in q:
        by_line.setdefault(r.bronze_line_number, []).append(r)
    assert sorted((line, len(rs)) for line, rs in by_line.items()) == [(1, 1), (2, 2), (3, 1)]
    assert by_line[1][0].raw == "{oops"
    assert sorted(r.raw for r in by_line[2] if r.raw) == [two_bad]     # once, not on both events
    assert sum(r.raw is None for r in by_line[2]) == 1
    assert by_line[3][0].raw == one_bad


def test_a_records_bytes_reach_its_first_quarantined_row_from_a_later_one(spark, silver_conf):
    """An event the quality gate quarantines carried no bytes (it parsed clean), and may come
    before a rejected event of its record that did: the record's first row gets them from it,
    without a read of bronze, and the later row keeps only its position."""
    rec = record(camera("cam-0001"), camera("cam-0002", has_person="maybe"))
    parsed = parse(spark, silver_conf, [rec], carry_bytes=2**20)
    rows = parsed.withColumn("reasons", F.when(F.size("reasons") == 0, F.array(F.lit("dq:x")))
                             .otherwise(F.col("reasons")))
    assert sorted((r.camera_index, r.raw is not None) for r in rows.collect()) == [(0, False), (1, True)]
    fetch = rows.agg(*T.fetch_window()).first()      # the gate's row lacks bytes: a fetch is set up
    assert fetch[0] is not None
    # a bronze holding other bytes at the record's position: the bytes must not come from it
    other = bronze_df(spark, [record(camera("cam-0009"))])
    q = T.with_record_bytes(rows, other, NEST, *fetch)
    assert sorted((r.camera_index, r.raw) for r in q.collect()) == [(0, rec), (1, None)]


def _iso_texts(n: int, seed: int) -> list[str]:
    """Texts of ISO_SHAPE with every part drawn near its edges (month 00 and 13, day 31 of
    April, hour 24, second 60, offsets past 18 h, lower-case t and z), most of them invalid."""
    rnd = random.Random(seed)

    def two(edges):
        return rnd.choice(edges) if rnd.random() < 0.7 else f"{rnd.randrange(100):02d}"

    texts = set()
    while len(texts) < n:
        year = rnd.choice(["0000", "0001", "1582", "1900", "2000", "2024", "2026", "9999",
                           f"{rnd.randrange(10000):04d}"])
        fraction = rnd.choice(["", "." + "".join(rnd.choice("0123456789") for _ in range(rnd.randint(1, 6)))])
        zone = rnd.choice(["Z", "z", f"{rnd.choice('+-')}{two(['00', '05', '14', '18', '19'])}:"
                                     f"{two(['00', '30', '59', '60'])}"])
        texts.add(f"{year}-{two(['00', '01', '02', '04', '12', '13'])}-{two(['00', '01', '29', '30', '31', '32'])}"
                  f"{rnd.choice('Tt')}{two(['00', '23', '24'])}:{two(['00', '59', '60'])}:"
                  f"{two(['00', '59', '60'])}{fraction}{zone}")
    return sorted(texts)


def test_iso_timestamps_read_by_the_fast_cast_equal_the_pattern_s_reading(spark):
    """Silver reads text of ISO_SHAPE with a cast instead of ISO_PATTERN's formatter: on every
    such text both give the same instant, to the microsecond, or both NULL; text of any other
    shape is read by the pattern itself."""
    texts = _iso_texts(60_000, seed=11)
    edges = ["2026-11-01T10:00:00Z\n", " 2026-11-01T10:00:00Z", "-0001-01-01T00:00:00Z", "-0000-01-01T00:00:00Z",
             "+12026-01-01T00:00:00Z", "-10000-01-01T00:00:00Z", "2026-11-01 10:00:00Z", "2026-11-01T10:00:00",
             "2026-11-01T10:00:00.1234567Z", "2026-11-01T10:00:00+0530", "2026-11-01T10:00:00+05:30:00",
             "2026-11-01T10:00:00UTC", "1793527200", "", "2026-11-01T10:00Z"]
    df = spark.createDataFrame([(t,) for t in texts + edges], "s string")
    shaped = F.col("s").rlike(T.ISO_SHAPE)
    assert df.where(shaped).count() == len(texts)
    pattern = F.unix_micros(F.try_to_timestamp("s", F.lit(T.ISO_PATTERN)))
    ours = F.unix_micros(T._timestamp(F.col("s")))
    counts = df.agg(F.count_if(~pattern.eqNullSafe(ours)).alias("differ"),
                    F.count_if(shaped & ours.isNotNull()).alias("read"),
                    F.count_if(shaped & ours.isNull()).alias("null")).first()
    assert counts.differ == 0
    assert counts.read > 1_000 and counts.null > 1_000     # both outcomes well represented
    read = {r.s: r.t for r in df.where(F.col("s").isin(edges)).select("s", ours.alias("t")).collect()}
    assert read["-0001-01-01T00:00:00Z"] is not None and read["-10000-01-01T00:00:00Z"] is not None
    assert read["2026-11-01T10:00:00Z\n"] is None and read["-0000-01-01T00:00:00Z"] is None


def test_boolean_text_reads_as_lower_case_comparison_would_read_it(spark, silver_conf):
    """Silver maps no case through ICU (lower(), upper(): their first use in a JVM loads ICU's
    tables, 1.5-2 s of a fresh run's silver batch). Its boolean fields read text in any case,
    look-alike letters and other text as lower(text) = 'true' / 'false' would."""
    plan = parse(spark, silver_conf, [record(camera())])._jdf.queryExecution().executedPlan().toString()
    assert not re.search(r"\b(lower|upper|initcap|ilike)\(", plan), "the parse maps case through ICU"
    # translate() folds only the compared letters: no other character's lower case is made of
    # them (Python's Unicode tables; the timestamps' T and Z the same for upper case).
    assert [c for c in map(chr, range(sys.maxunicode + 1)) if c not in "TRUEFALStruefals"
            and all(x in "truefals" for x in c.lower())] == []
    assert [c for c in map(chr, range(sys.maxunicode + 1)) if c not in "TZtz" and all(x in "TZ" for x in c.upper())] == []
    words = ["true", "false", "TRUE", "False", "tRuE", "fALSE", "truE", "true ", " false", "t", "f", "yes",
             "no", "1", "0", "", "truee", "fals", "\u0131", "\u0130", "\u212a", "\uff54\uff52\uff55\uff45",
             "tru\u00e9", "TRU\u00c9", "fa\u0142se", "\u017ftrue", "true\u0307", "FAL\u017fE"]
    df = spark.createDataFrame([(w,) for w in words] + [(None,)], "s string")
    lowered = F.lower("s")
    reference = F.when(lowered == "true", True).when(lowered == "false", False)
    ours = T._bool(F.col("s"))
    assert df.where(~reference.eqNullSafe(ours)).count() == 0
    read = {r.s: r.b for r in df.select("s", ours.alias("b")).collect()}
    assert (read["TRUE"], read["fALSE"], read["yes"], read["\u212a"], read[None]) == (True, False, None, None, None)


def test_time_range_edges_are_accepted(spark, silver_conf):
    raws = [record(camera(start="2000-01-01T00:00:00.000Z", end="2000-01-01T00:00:10.000Z")),
            record(camera(start=AT_LIMIT, end=AT_LIMIT))]
    assert reasons_by_line(parse(spark, silver_conf, raws)) == {1: [], 2: []}


def test_future_limit_follows_each_rows_ingest_time(spark, silver_conf):
    raw = record(camera(start=LATER, end=LATER))
    later_ingest = INGEST + timedelta(hours=1)
    assert reasons_by_line(parse(spark, silver_conf, [raw], ingest=later_ingest)) == {1: []}


# --- dedup, metrics, locations, output shapes ---------------------------------------------

def test_the_late_prefilter_lets_through_every_record_with_a_late_event_and_little_else(spark, silver_conf):
    """Silver's second read of a batch (the events its deduplication dropped as late) parses only
    the records may_hold_late lets through: the late events found must be exactly those found by
    parsing every record, at any watermark, and a record whose events are all newer is skipped."""
    t = lambda hhmm, zone="Z": f"2026-11-01T{hhmm}:00.000{zone}"  # noqa: E731
    cases = [
        ("on time", record(camera("cam-a", t("10:00")))),
        ("one late among on time", record(camera("cam-b", t("08:00")), camera("cam-c", t("10:00")))),
        ("late by its offset", record(camera("cam-d", t("10:00", "+02:00")))),
        ("at the watermark", record(camera("cam-e", t("09:30")))),
        ("late but rejected", record(camera("cam-f", t("08:00"), has_person="maybe"))),
        ("late after a BOM", "\ufeff" + record(camera("cam-g", t("07:00")))),
        ("late, second value", record(camera("cam-h", t("07:00"))) + record(camera())),
        *((case, raw) for case, raw, _ in REASON_CASES),
    ]
    bronze = bronze_df(spark, [raw for _, raw in cases])
    old = "before 2000"                         # rejected (time_out_of_range), but old enough
    expected = {  # watermark: (the records let through, how many late events they hold)
        "09:30": ({"one late among on time", "late by its offset", "at the watermark", "late but rejected",
                   "late after a BOM", "late, second value", old}, 4),    # cam-b, d, e, g
        "07:30": ({"late after a BOM", "late, second value", old}, 1),     # cam-g
        "06:00": ({old}, 0),
    }
    for hhmm, (through, n_late) in expected.items():
        ms = utc_ms(t(hhmm))
        late = lambda rows: sorted(r.event_id for r in T.late_for_dedup(  # noqa: E731
            parse(spark, silver_conf, rows), ms).collect())
        kept = bronze.where(T.may_hold_late(NEST, ms))
        assert {cases[r.line_number - 1][0] for r in kept.collect()} == through, hhmm
        assert late(kept) == late(bronze) and len(late(bronze)) == n_late, hhmm


def test_the_late_prefilter_reads_an_array_of_elements_too(spark, silver_conf):
    """The cloudtrail profile explodes an array (nest: a map): the same prefilter, the same answer."""
    trail = load_config(env={"PROFILE": "cloudtrail"}).profile
    call = lambda i, at: {"eventID": f"e-{i}", "eventTime": at, "eventSource": "s3.amazonaws.com",  # noqa: E731
                          "eventName": "GetObject"}
    files = [json.dumps({"Records": [call(1, "2026-11-01T10:00:00Z"), call(2, "2026-11-01T08:00:00Z")]}),
             json.dumps({"Records": [call(3, "2026-11-01T10:00:00Z")]}),
             json.dumps({"Records": [call(4, "2026-11-01T11:00:00+03:00")]})]
    bronze, ms = bronze_df(spark, files), utc_ms("2026-11-01T09:30:00Z")
    late = lambda rows: sorted(r.event_id for r in T.late_for_dedup(T.parse_events(  # noqa: E731
        rows, silver_conf.min_event_time, silver_conf.max_future.seconds, trail), ms).collect())
    kept = bronze.where(T.may_hold_late(trail, ms))
    assert sorted(r.line_number for r in kept.collect()) == [1, 3]
    assert late(kept) == late(bronze) and len(late(bronze)) == 2

def test_deduplicate_in_batch_mode_drops_repeated_event_ids_only(spark, silver_conf):
    e = camera("cam-0001")
    raws = [record(e, camera("cam-0002")),
            record(camera("cam-0003"), e),     # E again, in another record
            record(e),                          # and again
            "", "",                             # two identical rejects on different lines
            record(camera("cam-0004", has_person="maybe")),
            record(camera("cam-0004", has_person="maybe"))]
    parsed = parse(spark, silver_conf, raws)
    assert T.accepted(parsed).count() == 5
    deduped = T.deduplicate(parsed, silver_conf.dedup_watermark.spark(), NEST)
    assert deduped.columns == T.parsed_columns(NEST)
    good = T.accepted(deduped).collect()
    assert sorted(r.device_id for r in good) == ["cam-0001", "cam-0002", "cam-0003"]
    assert len({r.event_id for r in good}) == 3
    bad = T.rejected(deduped).collect()
    assert sorted(r.bronze_line_number for r in bad) == [4, 5, 6, 7]
    # Rejected rows keep their NULL-free reasons and event_time is untouched for good rows.
    assert all(r.event_time is not None for r in good)


def test_input_metrics_count_records_and_events(spark, silver_conf):
    raws = [record(camera("cam-0001"), camera("cam-0002"), camera("cam-0003", has_person="maybe")),
            record(camera("cam-0004")),
            "{not json",
            "",
            json.dumps({"devices": {}})]
    parsed = parse(spark, silver_conf, raws)
    m = parsed.select(*T.input_metrics(parsed, NEST)).first().asDict()
    assert m == {"records_parsed": 2, "records_quarantined_unparsed": 3, "events_parsed": 4}
    assert m["records_parsed"] + m["records_quarantined_unparsed"] == len(raws)


def test_join_locations_keeps_unknown_devices_and_zip_codes_as_text(spark, cfg, tmp_path, silver_conf):
    csv = tmp_path / "locations.csv"
    csv.write_text("device_id,zip_code,city,state\n"
                   "cam-0001,02108,Boston,MA\n"
                   "cam-0002,94105,San Francisco,CA\n"
                   "cam-0003,,Springfield,\n")
    assert load(spark, cfg, csv) == 0
    locations = spark.read.format("delta").load(cfg.table_path("silver", "device_locations"))
    assert dict(locations.dtypes)["zip_code"] == "string"

    parsed = parse(spark, silver_conf, [record(camera("cam-0001"), camera("cam-x001"), camera("cam-0003"))])
    joined = T.join_dimension(T.accepted(parsed), locations, NEST)
    rows = {r.device_id: r for r in joined.collect()}
    assert sorted(rows) == ["cam-0001", "cam-0003", "cam-x001"]
    known, unknown = rows["cam-0001"], rows["cam-x001"]
    assert (known.zip_code, known.city, known.state, known.unknown_device) == ("02108", "Boston", "MA", False)
    assert (unknown.zip_code, unknown.city, unknown.state, unknown.unknown_device) == (None, None, None, True)
    # A listed device whose row lacks a zip code is known, just without a zip.
    assert (rows["cam-0003"].zip_code, rows["cam-0003"].city, rows["cam-0003"].unknown_device) == \
        (None, "Springfield", False)

    silver = T.to_silver(joined, 42, NEST)
    types = dict(silver.dtypes)
    assert types["zip_code"] == "string" and types["event_date"] == "date"
    out = {r.device_id: r for r in silver.collect()}
    assert out["cam-0001"].silver_batch_id == 42 and out["cam-0001"].zip_code == "02108"
    assert str(out["cam-0001"].event_date) == "2026-11-01"


def test_a_batch_joins_the_dimension_once_and_only_its_accepted_rows_look_it_up(spark, silver_conf):
    """Silver joins a whole batch in the pass that caches it: a reject must come out as it went
    in, one row, even when the dimension (edited by hand) lists its device twice."""
    locations = spark.createDataFrame([("cam-0001", "02108", "Boston", "MA"), ("cam-0005", "1", "A", "B"),
                                       ("cam-0005", "2", "C", "D")], "device_id string, zip_code string, "
                                      "city string, state string").selectExpr(
        "*", "CAST(NULL AS TIMESTAMP) AS valid_from", "CAST(NULL AS TIMESTAMP) AS valid_to")
    parsed = parse(spark, silver_conf, [record(camera("cam-0001"), camera("cam-0005", start="later"))])
    joined = T.join_dimension(parsed, locations, NEST, only=T.is_accepted())
    rows = joined.collect()
    assert len(rows) == 2, rows
    by_device = {r.device_id: r for r in rows}
    assert by_device["cam-0001"].reasons == [] and by_device["cam-0001"].zip_code == "02108"
    reject = by_device["cam-0005"]
    assert reject.reasons == ["bad_timestamp:start_time"] and reject.zip_code is None
    # The batch's rows keep their columns: to_quarantine and to_silver read them as before.
    assert [r.reasons for r in T.to_quarantine(T.rejected(joined), 1, NEST).collect()] == [["bad_timestamp:start_time"]]


def test_to_quarantine_carries_reasons_and_lineage(spark, silver_conf):
    parsed = parse(spark, silver_conf, ["{oops", record(camera("cam-0005", start="later"))])
    q = {r.bronze_line_number: r for r in T.to_quarantine(T.rejected(parsed), 3, NEST).collect()}
    assert q[1].reasons == ["malformed_json"] and q[1].event_id is None and q[1].raw == "{oops"
    assert q[2].reasons == ["bad_timestamp:start_time"] and q[2].device_id == "cam-0005"
    assert all(r.batch_id == 3 and r.bronze_file_path == FILE and r.quarantined_at for r in q.values())


# --- suite files ---------------------------------------------------------------------------

GOOD_RULE = {"name": "event_id_present", "expectation": "expect_column_values_to_not_be_null",
             "kwargs": {"column": "event_id"}, "policy": "fail"}


def write_suite(tmp_path, rules, row_id="event_id"):
    doc = {"suite": "s", "table": "silver.camera_events", "expectations": rules}
    if row_id:
        doc["row_id"] = row_id
    import yaml

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_shipped_suite_loads(silver_conf):
    suite = load_suites(silver_conf.expectations)["silver.camera_events"]
    assert suite.row_id == "event_id"
    assert {r.policy for r in suite.rules} == {"warn", "quarantine", "fail"}


@pytest.mark.parametrize("rule,row_id,message", [
    ({**GOOD_RULE, "policy": "block"}, "event_id", "expected one of warn, quarantine, fail"),
    ({**GOOD_RULE, "expectation": "expect_column_to_be_purple"}, "event_id",
     "unknown Great Expectations expectation 'expect_column_to_be_purple'"),
    ({k: v for k, v in GOOD_RULE.items() if k != "name"}, "event_id", "name': missing"),
    ({**GOOD_RULE, "policy": "quarantine"}, None, "policy 'quarantine' needs the suite's 'row_id'"),
], ids=["unknown policy", "unknown expectation", "missing name", "quarantine without row_id"])
def test_bad_suites_name_the_file_and_the_problem(tmp_path, rule, row_id, message):
    path = write_suite(tmp_path, [GOOD_RULE | {"name": "first"}, rule], row_id)
    with pytest.raises(SuiteError) as e:
        load_suites(path)
    assert str(path) in str(e.value)
    assert message in str(e.value)
    assert "[1]" in str(e.value)   # the entry's position in the list
