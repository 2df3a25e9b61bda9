"""The synthetic Nest feed: deterministic bytes, exact accounting, and defects at their rates."""
from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from tools.generator import activity, events as gen
from common.config import load_config

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
EVENT_KEYS = {"has_sound", "has_motion", "has_person", "start_time", "end_time"}
RATES = dict(duplicate_rate=0.05, late_rate=0.05, malformed_rate=0.03, unknown_device_rate=0.05)


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    """A lakehouse under tmp_path; main() reads the same environment through load_config()."""
    for var in list(os.environ):
        if var.startswith("LAKEHOUSE__") or var in ("LAKEHOUSE_CONF", "LANDING", "REFERENCE_DIR",
                                                     "KAFKA_BOOTSTRAP", "CHECKPOINT_ROOT"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path))
    return load_config(env=dict(os.environ))


@pytest.fixture
def params(cfg):
    return replace(gen.Params.from_config(cfg.generator), **RATES)


def run(tmp_path, *args: str) -> dict:
    manifest = tmp_path / "manifest.json"
    assert gen.main([*args, "--manifest", str(manifest)]) == 0
    return json.loads(manifest.read_text())


def lines_in(paths) -> list[bytes]:
    return [line for p in paths for line in open(p, "rb").read().split(b"\n")[:-1]]


def test_same_seed_gives_identical_bytes_and_another_seed_differs(params):
    a, b, c = (gen.generate(2000, params, seed) for seed in (11, 11, 12))
    assert [r.value for r in a.records] == [r.value for r in b.records]
    assert a.counts == b.counts
    assert [r.value for r in a.records] != [r.value for r in c.records]


def test_files_match_the_manifest(tmp_path, cfg):
    rates = [f"--{k.replace('_', '-')}={v}" for k, v in RATES.items()]
    m = run(tmp_path, "-n", "3000", "--seed", "3", "--files", "4", *rates)
    first = [open(p, "rb").read() for p in m["files"]]
    assert [os.path.basename(p) for p in m["files"]] == [f"part-3-{i:04d}.jsonl" for i in range(4)]
    assert sum(data.count(b"\n") for data in first) == m["records"]
    assert all(data.endswith(b"\n") for data in first)
    assert m["records"] == m["valid"] + m["duplicates"] + m["malformed"]
    assert m["events"] == 3000 and m["sink"] == "files" and m["topic"] is None and m["seed"] == 3
    assert sum(m["malformed_kinds"].values()) == m["malformed"]

    # Same seed and arguments: the same names, left as they were; a new seed adds files beside them.
    stamps = [os.stat(p).st_mtime_ns for p in m["files"]]
    assert run(tmp_path, "-n", "3000", "--seed", "3", "--files", "4", *rates)["files"] == m["files"]
    assert [open(p, "rb").read() for p in m["files"]] == first
    assert [os.stat(p).st_mtime_ns for p in m["files"]] == stamps
    other = run(tmp_path, "-n", "3000", "--seed", "4", "--files", "4", *rates)
    assert set(other["files"]).isdisjoint(m["files"])
    names = sorted(os.listdir(cfg.landing))
    assert len(names) == 8 and not [n for n in names if n.startswith(".") or n.endswith(".tmp")]


def test_defects_at_roughly_their_rates(params):
    batch = gen.generate(20000, params, 5)
    c, values = batch.counts, [r.value for r in batch.records]
    assert len(values) == c["valid"] + c["duplicates"] + c["malformed"]
    assert sum(r.kind in ("valid", "late") for r in batch.records) == c["valid"]
    for count, rate in ((c["duplicates"], RATES["duplicate_rate"]), (c["late"], RATES["late_rate"]),
                        (c["malformed"], RATES["malformed_rate"])):
        assert 0.6 * rate * c["valid"] < count < 1.4 * rate * c["valid"]
    assert 0.6 * 0.05 * c["events"] < c["unknown_device"] < 1.4 * 0.05 * c["events"]

    # A duplicate re-sends an earlier line exactly and arrives a little after it.
    for i, r in enumerate(batch.records):
        if r.kind == "duplicate":
            original = values.index(r.value)
            assert original < i <= original + 120 and batch.records[original].kind in ("valid", "late")


def test_every_malformed_kind_is_present_and_unusable(params):
    batch = gen.generate(20000, params, 5)
    malformed = [r for r in batch.records if r.kind in gen.MALFORMED_KINDS]
    assert {r.kind for r in malformed} == set(gen.MALFORMED_KINDS)
    assert batch.malformed_kinds["very_long"] == 1
    assert all(r.key is None for r in malformed)
    for r in malformed:
        if r.kind == "very_long":
            assert len(r.value) >= 2 * 1024 * 1024
        if r.kind == "empty_line":
            assert r.value == b""
        elif r.kind == "non_utf8":
            with pytest.raises(UnicodeDecodeError):
                r.value.decode("utf-8")
        elif r.kind in ("very_long", "truncated"):
            with pytest.raises(json.JSONDecodeError):
                json.loads(r.value)
        else:  # valid JSON, wrong content
            cam = next(iter(json.loads(r.value)["devices"]["cameras"].values()))
            assert ("device_id" not in cam or cam["last_event"]["has_person"] == "maybe"
                    or isinstance(cam["last_event"]["start_time"], int))
    assert not any(b"\r" in r.value or b"\n" in r.value for r in batch.records)


def test_valid_records_have_the_nest_shape(params):
    batch = gen.generate(5000, params, 9)
    start = datetime.fromtimestamp(params.start_ms / 1000, timezone.utc)
    events = unknown = 0
    latest, late_seen = start - timedelta(days=1), 0
    for r in batch.records:
        if r.kind not in ("valid", "late"):
            continue
        # Compact, canonical JSON: re-serialising gives back the very same bytes.
        doc = json.loads(r.value)
        assert json.dumps(doc, separators=(",", ":")).encode() == r.value
        assert set(doc) == {"devices", "metadata"} and set(doc["devices"]) == {"cameras"}
        assert doc["metadata"]["client_version"] == 1 and doc["metadata"]["access_token"].startswith("c.")
        cams = doc["devices"]["cameras"]
        assert 1 <= len(cams) <= params.cameras_per_record_max and r.key == next(iter(cams)).encode()
        for device_id, cam in cams.items():
            assert set(cam) == {"device_id", "name", "is_online", "last_event"}
            assert cam["device_id"] == device_id and re.fullmatch(r"cam-(\d{4}|x\d{3})", device_id)
            assert isinstance(cam["name"], str) and isinstance(cam["is_online"], bool)
            ev = cam["last_event"]
            assert set(ev) == EVENT_KEYS
            assert all(isinstance(ev[k], bool) for k in ("has_sound", "has_motion", "has_person"))
            assert ISO_Z.match(ev["start_time"]) and ISO_Z.match(ev["end_time"])
            t0, t1 = (datetime.fromisoformat(ev[k].replace("Z", "+00:00")) for k in ("start_time", "end_time"))
            assert 5 <= (t1 - t0).total_seconds() <= 120
            assert t0 < start + timedelta(seconds=batch.span_s)
            events += 1
            unknown += device_id.startswith("cam-x")
        first = datetime.fromisoformat(next(iter(cams.values()))["last_event"]["start_time"].replace("Z", "+00:00"))
        if r.kind == "late":  # out of order: behind what the stream has already shown
            assert latest - timedelta(seconds=params.max_lateness_s) <= first < latest
            late_seen += 1
        else:  # on-time records move forward
            assert first > latest and first >= start
            latest = first
    assert (events, unknown, late_seen) == (5000, batch.counts["unknown_device"], batch.counts["late"])


def test_locations_list_only_known_devices(tmp_path, cfg):
    m = run(tmp_path, "-n", "2000", "--devices", "12", "--unknown-device-rate", "0.2")
    with open(cfg.locations_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["device_id", "zip_code", "city", "state", "as_of"]
    # Dated at the earliest event silver accepts: the locations hold for every event.
    assert {r["as_of"] for r in rows} == {cfg.silver.min_event_time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert [r["device_id"] for r in rows] == [f"cam-{i:04d}" for i in range(1, 13)]
    assert all(re.fullmatch(r"\d{5}", r["zip_code"]) and r["city"] and len(r["state"]) == 2 for r in rows)
    seen = set(re.findall(rb'"device_id":"(cam-[^"]+)"', b"\n".join(lines_in(m["files"]))))
    assert m["unknown_device"] > 0 and {d for d in seen if d.startswith(b"cam-x")}
    assert not {r["device_id"].encode() for r in rows} & {d for d in seen if d.startswith(b"cam-x")}


def test_bad_arguments_and_config_fail_with_status_2(cfg, monkeypatch, capsys):
    for bad in (["-n", "0"], ["--late-rate", "1.5"], ["--span", "soon"], ["--sink", "s3"]):
        with pytest.raises(SystemExit) as e:
            gen.main(bad)
        assert e.value.code == 2
    assert gen.main(["-n", "100", "--span", "50 ms"]) == 2
    assert "100 events do not fit in a span of 50 ms" in capsys.readouterr().err
    monkeypatch.setenv("LAKEHOUSE__GENERATOR__DUPLICATE_RATE", "2")
    assert gen.main(["-n", "10"]) == 2
    assert "generator.duplicate_rate" in capsys.readouterr().err


def test_the_same_seed_with_other_events_is_refused_and_rewrites_no_landing_file(tmp_path, cfg, capsys):
    """Bronze reads a landing file once by its name: `make generate N=500` after `make generate`
    (same seed, same names, other events) would hide its events from bronze for good. The
    generator refuses before writing, names a file and the way out, and leaves every file."""
    m = run(tmp_path, "-n", "2000", "--files", "4")
    before = {p: open(p, "rb").read() for p in m["files"]}
    assert gen.main(["-n", "500", "--files", "4"]) == 1
    err = capsys.readouterr().err
    assert "4 landing files of seed 7 are already there with other events" in err, err
    assert m["files"][0] in err and "SEED=8" in err and "make clean-lakehouse" in err
    assert {p: open(p, "rb").read() for p in m["files"]} == before
    assert sorted(os.listdir(cfg.landing)) == sorted(os.path.basename(p) for p in m["files"])


def test_another_profile_s_landing_is_refused_and_left_untouched(cfg, tmp_path, monkeypatch, capsys):
    """The events profile's landing is a dataset of its own: Nest records written there would be
    read as its feed. The generator refuses, naming the profile, and writes nothing."""
    landing = tmp_path / "events-landing"
    landing.mkdir()
    monkeypatch.setenv("PROFILE", "events")
    monkeypatch.setenv("LANDING", str(landing))
    assert gen.main(["-n", "10"]) == 2
    err = capsys.readouterr().err
    assert "PROFILE is events" in err and "PROFILE=nest" in err and str(landing) in err
    assert not any(landing.iterdir())


def test_unreachable_kafka_fails_fast_naming_the_servers(cfg, monkeypatch, capsys):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("LAKEHOUSE__KAFKA__CONNECT_TIMEOUT", "1 second")
    assert gen.main(["-n", "10", "--sink", "kafka"]) == 1
    assert "127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.kafka
def test_kafka_sink_sends_one_message_per_record(tmp_path, cfg, monkeypatch, kafka_broker):
    from confluent_kafka import Consumer

    broker = kafka_broker
    monkeypatch.setenv("KAFKA_BOOTSTRAP", broker.bootstrap)
    monkeypatch.setenv("LAKEHOUSE__KAFKA__TOPICS__EVENTS", "generator-test")
    m = run(tmp_path, "-n", "1500", "--sink", "kafka", "--malformed-rate", "0.02")
    assert m["topic"] == "generator-test" and m["files"] == []
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "generator-test",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["generator-test"])
    values = []
    while len(values) < m["records"]:
        # consume() returns once it has as many messages as asked for, or at the timeout: ask for
        # what is still missing, so the last call does not wait out the timeout for a full 1,000.
        batch = consumer.consume(min(1000, m["records"] - len(values)), timeout=10)
        assert batch, f"only {len(values)} of {m['records']} messages arrived"
        values += [msg.value() for msg in batch if msg.error() is None]
    consumer.close()
    assert len(values) == m["records"]
    assert b"" in values and max(map(len, values)) >= 2 * 1024 * 1024


# --- when cameras fire: bursts, idle gaps, day and night -------------------------------------

SESSION_GAP_MS = 30 * 60_000


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _gaps_by_camera(batch) -> list[int]:
    return [b - a for times in batch.event_times.values() for a, b in zip(sorted(times), sorted(times)[1:])]


def test_gaps_within_a_camera_are_bimodal_short_in_bursts_long_when_idle(params):
    gaps = _gaps_by_camera(gen.generate(5000, params, 3))
    share = lambda lo, hi: sum(lo < g <= hi for g in gaps) / len(gaps)  # noqa: E731
    short, middle, idle = share(-1, 3 * 60_000), share(5 * 60_000, SESSION_GAP_MS), share(SESSION_GAP_MS, 1e15)
    # Most gaps are inside a burst (mean 45 s); idle gaps longer than gold's session gap, which
    # end sessions, are common; between the two the density is low: two humps, not one.
    assert short > 0.6, short
    assert idle > 0.08 and sum(g > 3 * 3_600_000 for g in gaps) > 0, idle
    assert middle / 25 < short / 3 / 10 and middle < short / 4, (short, middle, idle)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sessions_last_minutes_to_an_hour_or_two(params, cfg, seed):
    batch = gen.generate(3000, params, seed)
    s = batch.sessions(cfg.gold.windows["session_gap"].seconds)
    assert s["gap_minutes"] == 30
    # Cameras come back to life many times over the span (the old every-70-s feed: one session
    # per camera, lasting the whole 6 hours).
    assert s["count"] > 5 * (params.devices + params.unknown_devices), s
    assert 2 <= s["minutes"]["p50"] <= 60, s
    assert s["minutes"]["p90"] <= 90 and s["minutes"]["max"] <= 240, s
    assert 2 <= s["events"]["p50"] <= 20 and s["events"]["max"] <= 100, s


def test_session_rule_is_gold_s_gap_at_most_the_session_gap():
    from tools.generator.session_stats import sessions, summary

    minute = 60_000
    times = [50 * minute, 0, 10 * minute, 80 * minute, 81 * minute + 1]   # unordered on purpose
    # 10 -> 50 is 40 min apart: a new session; 50 -> 80 is exactly the gap: the same session.
    assert sessions(times, 30 * minute) == [(10 * minute, 2), (31 * minute + 1, 3)]
    s = summary({"a": times, "b": [5 * minute]}, 1800)
    assert s["count"] == 3 and s["minutes"] == {"p50": 10.0, "p90": 31.0, "max": 31.0}
    assert s["events"] == {"p50": 2, "max": 3}


def _day_night_rates(batch, params) -> tuple[float, float]:
    """Events per camera-hour in local daytime and at night, over whole days from the start."""
    days = int(batch.span_s // 86400)
    assert days >= 3, batch.span_s
    end = params.start_ms + days * 86_400_000
    ids = gen.known_ids(params.devices) + gen.unknown_ids(params.unknown_devices)
    day = night = 0
    for index, device in enumerate(ids):
        for t in batch.event_times.get(device, ()):
            if params.start_ms <= t < end:
                if activity_is_day(t, gen.utc_offset(index)):
                    day += 1
                else:
                    night += 1
    hours_day = (activity.DAY_END_H - activity.DAY_START_H) * days * len(ids)
    return day / hours_day, night / (24 * days * len(ids) - hours_day)


def activity_is_day(t_ms: int, offset_h: int) -> bool:
    # Written out here rather than imported, so the test does not trust the model's own clock.
    local = datetime.fromtimestamp(t_ms / 1000, timezone.utc) + timedelta(hours=offset_h)
    return 7 <= local.hour < 22


def test_more_events_by_day_than_by_night_and_the_factor_sets_how_many(params):
    few = replace(params, devices=5, unknown_devices=1, late_rate=0.0)
    by_day, at_night = _day_night_rates(gen.generate(3000, few, 4), few)
    # Idle gaps 4x longer at night: about 3.5x fewer events an hour once bursts are counted.
    assert by_day > 2.5 * at_night, (by_day, at_night)
    flat = replace(few, rhythm=replace(few.rhythm, day_night_factor=1.0))
    by_day, at_night = _day_night_rates(gen.generate(3000, flat, 4), flat)
    assert 0.75 < by_day / at_night < 1.33, (by_day, at_night)


def test_an_explicit_span_squeezes_the_same_timeline_into_it(params):
    natural = gen.generate(2000, replace(params, late_rate=0.0), 8)
    hour = gen.generate(2000, replace(params, late_rate=0.0, span_s=3600.0), 8)
    assert natural.span_s > 6 * 3600 and hour.span_s == 3600
    for device, times in hour.event_times.items():
        assert all(params.start_ms <= t < params.start_ms + 3_600_000 for t in times)
        assert len(times) == len(natural.event_times[device])
    # The order of events across cameras is kept, so the records are cut the same way.
    assert [r.key for r in hour.records] == [r.key for r in natural.records]


def test_written_files_hold_exactly_the_defects_and_sessions_the_manifest_counts(tmp_path, cfg, capsys):
    rates = [f"--{k.replace('_', '-')}={v}" for k, v in RATES.items()]
    m = run(tmp_path, "-n", "4000", "--seed", "6", "--files", "3", *rates)
    printed = capsys.readouterr().out
    assert f"sessions (gap 30 min): {m['sessions']['count']:,}," in printed
    seen: set[bytes] = set()
    found = dict.fromkeys(("valid", "duplicates", "late", "malformed", "unknown_device", "events"), 0)
    times: dict[str, list[int]] = {}
    latest = None
    for line in lines_in(m["files"]):
        try:
            cams = json.loads(line)["devices"]["cameras"]
            events = [(c["device_id"], _ms(c["last_event"]["start_time"])) for c in cams.values()]
            assert all(isinstance(c["last_event"]["has_person"], bool) for c in cams.values())
        except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
            found["malformed"] += 1
            continue
        if line in seen:           # a re-send: byte for byte an earlier line
            found["duplicates"] += 1
            continue
        seen.add(line)
        found["valid"] += 1
        found["events"] += len(events)
        found["unknown_device"] += sum(d.startswith("cam-x") for d, _ in events)
        if latest is not None and events[0][1] < latest:
            found["late"] += 1
        else:
            latest = events[0][1]
        for d, t in events:
            times.setdefault(d, []).append(t)
    assert found == {k: m[k] for k in found}
    assert all(found[k] > 0 for k in found), found
    assert m["sessions"] == session_summary(times, cfg.gold.windows["session_gap"].seconds)
    assert m["span_s"] * 1000 > max(t for ts in times.values() for t in ts) - _ms(m["start"])


def session_summary(times, gap_s):
    from tools.generator.session_stats import summary

    return summary(times, gap_s)


def test_rhythm_comes_from_conf_and_bad_values_name_the_key(tmp_path, cfg, monkeypatch, capsys):
    default = run(tmp_path, "-n", "1000", "--seed", "2")
    monkeypatch.setenv("LAKEHOUSE__GENERATOR__IDLE_GAP", "5 minutes")
    monkeypatch.setenv("LANDING", str(tmp_path / "busy"))     # the same seed's names, other events
    busy = run(tmp_path, "-n", "1000", "--seed", "2")
    # Idle gaps a ninth as long: the same events in far less time, and bursts run together.
    assert busy["span_s"] < default["span_s"] / 4
    assert busy["sessions"]["count"] < default["sessions"]["count"]
    assert busy["sessions"]["events"]["p50"] > 2 * default["sessions"]["events"]["p50"]
    for key, bad in (("BURST_EVENTS", "0.5"), ("DAY_NIGHT_FACTOR", "0"), ("BURST_GAP", "soon")):
        monkeypatch.setenv(f"LAKEHOUSE__GENERATOR__{key}", bad)
        capsys.readouterr()
        assert gen.main(["-n", "10"]) == 2
        assert f"generator.{key.lower()}" in capsys.readouterr().err
        monkeypatch.delenv(f"LAKEHOUSE__GENERATOR__{key}")
