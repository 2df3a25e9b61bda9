"""Synthetic Nest camera feed for bronze: JSON lines into landing files or a Kafka topic.

The output is a pure function of (seed, arguments): no wall clock reaches the data or the
file names, so a run can be repeated byte for byte and tests can assert exact counts.
When cameras fire is tools/generator/activity.py: bursts of a few events, idle gaps, more by day than
by night. Defects (duplicates, late events, malformed lines, unknown devices) are injected at
the configured rates and counted in a manifest that downstream accounting is checked against,
beside the session lengths the feed holds for gold's session gap (tools/generator/session_stats.py).
With a drift point (--drift), the feed changes shape from there on, camera by camera in turn: a
new field (battery_level), a type change (is_online as a string) and a removed field (has_sound).
"""
from __future__ import annotations

import argparse
import heapq
import json
import logging
import re
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from random import Random
from time import gmtime, strftime, time
from typing import NamedTuple

from tools.generator import activity, session_stats
from common.errors import JobError
from common.config import ConfigError, load_config, parse_duration
from common.log import configure, fields
from common.storage import Location, write_atomic

log = logging.getLogger(__spec__.name)   # not "__main__" under python -m tools.generator

# very_long comes first so that any run with at least one malformed line has exactly one.
MALFORMED_KINDS = ("very_long", "truncated", "bad_type_person", "bad_type_time",
                   "missing_device_id", "empty_line", "non_utf8")
VERY_LONG_BYTES = 2 * 1024 * 1024
# Kafka's default 1 MB message limit would reject the very long line.
KAFKA_MAX_MESSAGE = 8 * 1024 * 1024
# Real tuples so per-zip aggregates look plausible; 02108 keeps a leading zero on purpose,
# which breaks any reader that infers zip_code as a number.
LOCATIONS = (("94105", "San Francisco", "CA"), ("10001", "New York", "NY"),
             ("60601", "Chicago", "IL"), ("98101", "Seattle", "WA"), ("78701", "Austin", "TX"),
             ("02108", "Boston", "MA"), ("80202", "Denver", "CO"), ("30303", "Atlanta", "GA"),
             ("97205", "Portland", "OR"), ("33131", "Miami", "FL"))
# Standard time (no daylight saving) by state, for the cameras' day/night rhythm.
UTC_OFFSETS = {"CA": -8, "NY": -5, "IL": -6, "WA": -8, "TX": -6, "MA": -5, "CO": -7, "GA": -5,
               "OR": -8, "FL": -5}
ROOMS = ("Front Door", "Backyard", "Garage", "Driveway", "Living Room", "Nursery", "Porch", "Side Gate")
_BOOL = ("false", "true")
# How the feed drifts after the drift point, one kind per camera in turn (docs/generator.md).
DRIFT_KINDS = ("new_field", "type_change", "removed_field")


class Record(NamedTuple):
    value: bytes        # one line without its "\n"; also the Kafka message value
    key: bytes | None   # Kafka key: first camera's device id (None for malformed lines)
    kind: str           # "valid", "late", "duplicate" or one of MALFORMED_KINDS


@dataclass(frozen=True)
class Params:
    devices: int
    unknown_devices: int
    cameras_per_record_max: int
    start_ms: int
    span_s: float | None          # None: as long as the activity model needs for the events
    max_lateness_s: float
    duplicate_rate: float
    late_rate: float
    malformed_rate: float
    unknown_device_rate: float
    rhythm: activity.Rhythm
    drift_at: float | None = None   # fraction of the events after which the feed drifts

    @classmethod
    def from_config(cls, g) -> Params:
        rhythm = activity.Rhythm(g.burst_events, g.burst_gap.seconds, g.idle_gap.seconds, g.day_night_factor)
        return cls(g.devices, max(0, g.unknown_devices), g.cameras_per_record_max,
                   round(g.start.timestamp() * 1000), g.span.seconds if g.span else None,
                   g.max_lateness.seconds, g.duplicate_rate, g.late_rate, g.malformed_rate,
                   g.unknown_device_rate, rhythm)


@dataclass
class Batch:
    records: list[Record]
    counts: dict[str, int]            # valid, duplicates, late, malformed, unknown_device, events
    malformed_kinds: dict[str, int]
    event_times: dict[str, list[int]]   # device -> start times (epoch ms) of its emitted events
    span_s: float                       # event time the timeline covers from the start
    drift: dict[str, int] | None = None  # drifted events by DRIFT_KINDS (None: no drift point)

    def sessions(self, gap_s: float) -> dict:
        return session_stats.summary(self.event_times, gap_s)


class SinkError(JobError):
    """The output could not be delivered."""


def known_ids(n: int) -> list[str]:
    return [f"cam-{i:04d}" for i in range(1, n + 1)]


def unknown_ids(n: int) -> list[str]:
    return [f"cam-x{i:03d}" for i in range(1, n + 1)]


@lru_cache(maxsize=1 << 12)
def _minute_text(minute: int) -> str:
    return strftime("%Y-%m-%dT%H:%M", gmtime(minute * 60))


def _iso(ms: int) -> str:
    # strftime per event would dominate the run time; events arrive nearly in order, and a
    # camera's events are sparse in time, so the cache is per minute rather than per second.
    minute, milli = divmod(ms, 60_000)
    return f"{_minute_text(minute)}:{milli // 1000:02d}.{milli % 1000:03d}Z"


def _camera(prefix: str, rng: Random, t_ms: int, person_episode: bool) -> str:
    person = person_episode and rng.random() < 0.85
    motion = person or rng.random() < 0.6
    return (f'{prefix}{_BOOL[rng.random() < 0.95]},"last_event":{{"has_sound":{_BOOL[rng.random() < 0.25]},'
            f'"has_motion":{_BOOL[motion]},"has_person":{_BOOL[person]},"start_time":"{_iso(t_ms)}",'
            f'"end_time":"{_iso(t_ms + rng.randint(5, 120) * 1000)}"}}}}')


def _drifted(camera: str, kind: str, j: int) -> str:
    """A camera's JSON changed in one of DRIFT_KINDS's ways; no randomness, so the rest of the
    feed is the same with or without a drift point."""
    if kind == "new_field":
        return f'{camera[:-1]},"battery_level":{0.5 + j % 50 / 100:.2f}}}'
    if kind == "type_change":
        return re.sub(r'"is_online":(true|false)', lambda m: f'"is_online":"{"online" if m[1] == "true" else "offline"}"',
                      camera, count=1)
    return re.sub(r'"has_sound":(true|false),', "", camera, count=1)


def _record(cameras: list[str], rng: Random) -> str:
    return ('{"devices":{"cameras":{' + ",".join(cameras) + '}},"metadata":{"access_token":"c.'
            + f'{rng.getrandbits(160):040x}","client_version":1}}}}')


def _malformed(kind: str, base: str, t_ms: int, rng: Random) -> bytes:
    if kind == "very_long":
        return b'{"devices":{"cameras":{"cam-0001":{"device_id":"cam-0001","name":"' + b"x" * VERY_LONG_BYTES
    if kind == "truncated":  # any proper prefix of a JSON object is invalid JSON
        return base[:rng.randint(10, len(base) - 1)].encode()
    if kind == "bad_type_person":
        return re.sub(r'"has_person":\w+', '"has_person":"maybe"', base).encode()
    if kind == "bad_type_time":
        return re.sub(r'"start_time":"[^"]*"', f'"start_time":{t_ms // 1000}', base).encode()
    if kind == "missing_device_id":
        return re.sub(r'"device_id":"[^"]*",', "", base).encode()
    if kind == "empty_line":
        return b""
    return b"\xff\xfe garbage " + base[:40].encode()


def generate(n_events: int, p: Params, seed: int) -> Batch:
    """Build every output line in memory, in stream order, with its defect counts."""
    if n_events <= 0:
        raise ValueError(f"n_events must be positive, got {n_events}")
    rng = Random(seed)
    known, unknown = known_ids(p.devices), unknown_ids(p.unknown_devices)
    prefix = {d: f'"{d}":{{"device_id":"{d}","name":"{ROOMS[i % len(ROOMS)]} {i + 1}","is_online":'
              for ids in (known, unknown) for i, d in enumerate(ids)}
    unknown_rate = p.unknown_device_rate if unknown else 0.0
    # Cap cameras per record by the devices that can fire, or a record could never fill.
    pool = (len(known) if unknown_rate < 1 else 0) + (len(unknown) if unknown_rate > 0 else 0)
    k_max = min(p.cameras_per_record_max, pool)
    devices = known + unknown
    events = activity.timeline(n_events, p.start_ms, [utc_offset(i) for ids in (known, unknown)
                                                      for i in range(len(ids))],
                               _weights(len(known), len(unknown), unknown_rate), p.rhythm, seed)
    if p.span_s is not None:
        events = activity.fit(events, p.start_ms, int(p.span_s * 1000))
    lateness = (min(60.0, p.max_lateness_s), p.max_lateness_s)
    records: list[Record] = []
    pending: list[tuple[int, int, Record]] = []   # duplicates waiting for their slot
    counts = dict.fromkeys(("valid", "duplicates", "late", "malformed", "unknown_device"), 0)
    kinds = dict.fromkeys(MALFORMED_KINDS, 0)
    drift_from = None if p.drift_at is None else int(p.drift_at * n_events)
    drifted = dict.fromkeys(DRIFT_KINDS, 0)
    emitted: dict[str, list[int]] = {d: [] for d in devices}
    latest = None    # first event time of the last on-time record: what the stream has shown
    j = 0
    while j < n_events:
        k = rng.randint(1, k_max)
        late = rng.random() < p.late_rate and latest is not None
        # A late record lands behind what the stream has shown, by up to max_lateness.
        shift = events[j][0] - latest + int(rng.uniform(*lateness) * 1000) if late else 0
        ids: list[str] = []
        cameras: list[str] = []
        # The next events in time order, as long as each is another camera (a record holds
        # one snapshot per camera).
        while len(ids) < k and j < n_events and devices[events[j][1]] not in ids:
            t, device, person = events[j]
            d = devices[device]
            ids.append(d)
            counts["unknown_device"] += device >= len(known)
            t -= shift
            emitted[d].append(t)
            cameras.append(_camera(prefix[d], rng, t, person))
            if drift_from is not None and j >= drift_from:
                kind = DRIFT_KINDS[(j - drift_from) % len(DRIFT_KINDS)]
                cameras[-1] = _drifted(cameras[-1], kind, j)
                drifted[kind] += 1
            j += 1
        if not late:
            latest = events[j - len(ids)][0]
        rec = Record(_record(cameras, rng).encode(), ids[0].encode(), "late" if late else "valid")
        records.append(rec)
        counts["valid"] += 1
        counts["late"] += late
        if rng.random() < p.duplicate_rate:
            heapq.heappush(pending, (len(records) + rng.randint(1, 50), counts["duplicates"],
                                     rec._replace(kind="duplicate")))
            counts["duplicates"] += 1
        if rng.random() < p.malformed_rate:
            m = counts["malformed"]
            kind = MALFORMED_KINDS[0] if m == 0 else MALFORMED_KINDS[1 + (m - 1) % (len(MALFORMED_KINDS) - 1)]
            base = _record([_camera(prefix[rng.choice(known)], rng, t, rng.random() < activity.PERSON_EPISODE)], rng)
            records.append(Record(_malformed(kind, base, t, rng), None, kind))
            counts["malformed"] += 1
            kinds[kind] += 1
        while pending and pending[0][0] <= len(records):
            records.append(heapq.heappop(pending)[2])
    records.extend(rec for _, _, rec in sorted(pending))
    counts["events"] = n_events
    span_ms = int(p.span_s * 1000) if p.span_s is not None else events[-1][0] - p.start_ms + 1
    return Batch(records, counts, kinds, emitted, span_ms / 1000, drifted if drift_from is not None else None)


def utc_offset(index: int) -> int:
    """A device's local standard time, from the location its index gives it (LOCATIONS)."""
    return UTC_OFFSETS[LOCATIONS[index % len(LOCATIONS)][2]]


def _weights(known: int, unknown: int, unknown_rate: float) -> list[float]:
    """Activity per camera: known cameras at 1, unknown ones busy enough that their share of
    the events is unknown_rate (all of them when it is 1)."""
    if unknown_rate >= 1:
        return [0.0] * known + [1.0] * unknown
    each = unknown_rate / (1 - unknown_rate) * known / unknown if unknown else 0.0
    return [1.0] * known + [each] * unknown


def write_files(records: list[Record], landing: Location, seed: int, n_files: int) -> list[Location]:
    """Split the stream into contiguous JSON-lines files named by seed and index. A file already
    there with the same bytes is left alone (the same seed and arguments again); one with other
    bytes is a SinkError before anything is written: bronze reads a landing file once by its
    name, so rewriting it would hide the new events from bronze for good."""
    n_files = max(1, min(n_files, len(records)))
    size, extra = divmod(len(records), n_files)
    chunks, pos = [], 0
    for i in range(n_files):
        chunk = records[pos:pos + size + (i < extra)]
        pos += len(chunk)
        chunks.append((landing / f"part-{seed}-{i:04d}.jsonl", chunk))

    def data(chunk) -> bytes:
        # Only "\n" ends a line: the data holds no "\r", which Spark's text source would also split on.
        return b"".join(r.value + b"\n" for r in chunk)

    there = {str(path) for path, _ in chunks if path.exists()}
    other = [path for path, chunk in chunks if str(path) in there and path.read_bytes() != data(chunk)]
    if other:
        raise SinkError(
            f"{len(other)} landing files of seed {seed} are already there with other events "
            f"({other[0]}{' and more' if len(other) > 1 else ''}): bronze reads a landing file once by "
            f"its name, so it would never read these. Give another seed to add files (make generate "
            f"SEED={seed + 1}), or start from an empty lakehouse (make clean-lakehouse)")
    for path, chunk in chunks:
        if str(path) not in there:
            write_atomic(path, data(chunk))
    return [path for path, _ in chunks]


def locations_csv(cfg) -> Path:
    """The device dimension these records join: the profile's (nest: device_locations.csv under
    paths.reference), or that same file when a profile without one is selected."""
    return cfg.locations_csv or cfg.reference / "device_locations.csv"


def write_locations(path: Location, devices: int, as_of: datetime) -> None:
    """The known devices' locations as of `as_of` (silver.min_event_time: silver joins each event
    to the location valid at its time, so the file holds since the earliest event it accepts)."""
    stamp = as_of.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = ["device_id,zip_code,city,state,as_of"]
    rows += [",".join((d, *LOCATIONS[i % len(LOCATIONS)], stamp)) for i, d in enumerate(known_ids(devices))]
    write_atomic(path, ("\n".join(rows) + "\n").encode())


def send_kafka(records: list[Record], kafka) -> str:
    """Send one message per record; return the topic. Raises SinkError on any failure."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    servers, topic, timeout = kafka.bootstrap_servers, kafka.topics.events, kafka.connect_timeout.seconds
    # Errors are reported once, by us; librdkafka would otherwise log every reconnect attempt.
    base = {"bootstrap.servers": servers, "log_level": 0}
    admin = AdminClient(base)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as e:
        raise SinkError(f"Kafka broker at {servers} not reachable within {timeout:g}s ({e.args[0].str()})") from None
    if topic not in existing:
        new = NewTopic(topic, num_partitions=kafka.topic_partitions, replication_factor=1,
                       config={"max.message.bytes": str(KAFKA_MAX_MESSAGE)})
        try:
            admin.create_topics([new], request_timeout=timeout)[topic].result()
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise SinkError(f"cannot create topic {topic} at {servers}: {e.args[0].str()}") from None
    # lz4 keeps the very long line small on the wire even if the topic kept the 1 MB default.
    producer = Producer({**base, "compression.type": "lz4", "linger.ms": 20,
                         "message.max.bytes": KAFKA_MAX_MESSAGE,
                         "message.timeout.ms": int(max(30.0, 3 * timeout) * 1000)})
    errors: list = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)

    for r in records:
        while True:
            try:
                producer.produce(topic, value=r.value, key=r.key, on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.5)
        producer.poll(0)
    undelivered = producer.flush()   # bounded by message.timeout.ms
    if errors or undelivered:
        first = f": {errors[0].str()}" if errors else ""
        raise SinkError(f"{len(errors) + undelivered} of {len(records)} messages not delivered "
                        f"to {topic} at {servers}{first}")
    return topic


def _arg(convert, what):
    def check(text):
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    return check


def _checked(kind, ok, what):
    def convert(text):
        v = kind(text)
        if not ok(v):
            raise ValueError(text)
        return v
    return _arg(convert, what)


def _parser(prog: str) -> argparse.ArgumentParser:
    pos = _checked(int, lambda v: v > 0, "a positive integer")
    rate = _checked(float, lambda v: 0 <= v <= 1, "a rate between 0 and 1")
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--events", type=pos, default=1000, help="camera events to generate (default 1000)")
    ap.add_argument("--seed", type=_checked(int, lambda v: v >= 0, "a non-negative integer"), default=7,
                    help="random seed; same seed and arguments give identical output (default 7)")
    ap.add_argument("--sink", choices=("files", "kafka"), default="files",
                    help="landing JSON-lines files, or messages to kafka.topics.events (default files)")
    ap.add_argument("--manifest", type=Path, help="write counts of what was generated to this JSON file")
    ap.add_argument("--devices", type=pos, help="known devices (default: generator.devices)")
    ap.add_argument("--files", type=pos, help="landing files per run (default: generator.files)")
    for name in ("duplicate", "late", "malformed", "unknown-device"):
        ap.add_argument(f"--{name}-rate", type=rate, help=f"default: generator.{name.replace('-', '_')}_rate")
    ap.add_argument("--drift", type=_checked(float, lambda v: 0 <= v <= 1, "a fraction between 0 and 1"),
                    help="the feed changes shape after this fraction of the events, camera by camera in "
                         "turn: a new field (battery_level), a type change (is_online as a string), a "
                         "removed field (has_sound); the manifest counts each (default: no drift)")
    ap.add_argument("--span", type=_arg(parse_duration, "a duration like '6 hours'"),
                    help="event-time span, e.g. '6 hours': the activity timeline is squeezed or "
                         "stretched to fill it (default: generator.span; null there: as long as "
                         "the cameras' rhythm takes for the events)")
    return ap


FEED = "nest"          # the profile whose records this generator writes


def main(argv: list[str] | None = None, prog: str = "python -m tools.generator") -> int:
    args = _parser(prog).parse_args(argv)
    configure()
    try:
        cfg = load_config()
    except ConfigError as e:
        log.error(f"config: {e}")
        return 2
    if cfg.profile.name != FEED:
        # Another profile's landing holds its own feed (a dataset, not ours to add to): Nest
        # records there would be quarantined by its silver, or pass as its rows.
        log.error(f"the generator writes the {FEED} feed, but PROFILE is {cfg.profile.name} (landing "
                  f"{cfg.landing}): run it with PROFILE={FEED}, the default")
        return 2
    overrides = {"devices": args.devices, "duplicate_rate": args.duplicate_rate, "late_rate": args.late_rate,
                 "malformed_rate": args.malformed_rate, "unknown_device_rate": args.unknown_device_rate,
                 "span_s": args.span.seconds if args.span else None, "drift_at": args.drift}
    params = replace(Params.from_config(cfg.generator), **{k: v for k, v in overrides.items() if v is not None})
    try:
        batch = generate(args.events, params, args.seed)
    except ValueError as e:   # e.g. more events than milliseconds in --span
        print(f"error: {e}", file=sys.stderr)
        return 2
    locations = locations_csv(cfg)
    write_locations(locations, params.devices, cfg.silver.min_event_time)
    files: list[Location] = []
    topic = None
    try:
        if args.sink == "kafka":
            topic = send_kafka(batch.records, cfg.kafka)
        else:
            files = write_files(batch.records, cfg.landing, args.seed, args.files or cfg.generator.files)
    except SinkError as e:
        log.error(str(e))
        return 1
    sessions = batch.sessions(cfg.gold.windows["session_gap"].seconds)   # nest's session gap
    manifest = {"records": len(batch.records), **batch.counts, "malformed_kinds": batch.malformed_kinds,
                "start": _iso(params.start_ms), "span_s": batch.span_s, "sessions": sessions,
                "seed": args.seed, "sink": args.sink, "files": [str(f) for f in files], "topic": topic,
                "locations": str(locations), "drift_at": params.drift_at, "drift": batch.drift}
    if args.manifest:
        args.manifest.parent.mkdir(parents=True, exist_ok=True)
        args.manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    where = f"topic {topic} at {cfg.kafka.bootstrap_servers}" if topic else f"{len(files)} files in {cfg.landing}"
    c = batch.counts
    log.info(f"wrote {len(batch.records)} records ({c['valid']} valid with {c['events']} events, "
             f"{c['duplicates']} duplicates, {c['malformed']} malformed, {c['late']} landing out of "
             f"order by up to {cfg.generator.max_lateness}) to {where}",
             extra=fields(event="generated", records=len(batch.records), **batch.counts, sink=args.sink,
                          files=len(files), topic=topic, landing=None if topic else str(cfg.landing)))
    log.info(f"event time {_iso(params.start_ms)} + {batch.span_s / 3600:.1f} h; {session_stats.describe(sessions)}",
             extra=fields(event="sessions", span_s=batch.span_s, sessions=sessions))
    end_ms = params.start_ms + batch.span_s * 1000
    if end_ms > (time() + cfg.silver.max_future.seconds) * 1000:   # the data itself never reads the clock
        log.warning(f"event time runs to {_iso(int(end_ms))}, more than silver.max_future "
                    f"({cfg.silver.max_future}) ahead of now: silver will quarantine the later events as "
                    f"time_out_of_range; give --span to fit them in less time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
