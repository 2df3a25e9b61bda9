"""What the chaos run writes into the landing folder, and what it therefore expects downstream.

Each wave is one generator run (tools/generator/events.py, a pure function of its seed) moved later in
event time, so the stream keeps advancing and watermarks move as in production. Every record is
remembered by (file name, line number); every camera event of a well-formed record by the
event_id silver derives from it (sha256 of device | start | end, times to the microsecond).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools.generator.events import Params, generate, write_files, write_locations

WELL_FORMED = ("valid", "late", "duplicate")


@dataclass
class Expected:
    records: dict[tuple[str, int], bytes] = field(default_factory=dict)   # (file name, line) -> raw
    events: set[str] = field(default_factory=set)                         # event_ids of every event
    waves: int = 0
    event_count: int = 0            # events the generator says it made (re-sends not counted)


def _micros(iso: str) -> str:
    # Generator times are "...SS.mmmZ"; silver formats them as yyyy-MM-dd'T'HH:mm:ss.SSSSSS.
    return iso.rstrip("Z") + "000"


def event_ids(raw: bytes) -> list[str]:
    cams = json.loads(raw)["devices"]["cameras"]
    out = []
    for cam in cams.values():
        e = cam["last_event"]
        key = f"{cam['device_id']}|{_micros(e['start_time'])}|{_micros(e['end_time'])}"
        out.append(hashlib.sha256(key.encode()).hexdigest())
    return out


class Feeder:
    """Writes wave after wave of landing files, each shifted `wave_span` later in event time."""

    def __init__(self, cfg, seed: int, events_per_wave: int, files_per_wave: int, wave_span_s: float):
        self.cfg, self.seed = cfg, seed
        self.events_per_wave, self.files_per_wave = events_per_wave, files_per_wave
        self.params = replace(Params.from_config(cfg.generator), span_s=wave_span_s)
        self.expected = Expected()
        write_locations(cfg.locations_csv, self.params.devices, cfg.silver.min_event_time)

    def wave(self) -> int:
        n = self.expected.waves
        params = replace(self.params, start_ms=self.params.start_ms + int(n * self.params.span_s * 1000))
        wave_seed = self.seed * 1000 + n   # distinct file names (part-<seed>-<i>) and data per wave
        batch = generate(self.events_per_wave, params, wave_seed)
        paths = write_files(batch.records, self.cfg.landing, wave_seed, self.files_per_wave)
        self._remember(batch, paths)
        self.expected.waves += 1
        return len(batch.records)

    def _remember(self, batch, paths: list[Path]) -> None:
        # write_files splits the records into contiguous chunks in order; replay that split.
        e = self.expected
        chunks = [p.read_bytes().split(b"\n")[:-1] for p in paths]
        lines = [(p.name, i + 1, raw) for p, chunk in zip(paths, chunks) for i, raw in enumerate(chunk)]
        assert len(lines) == len(batch.records)
        for (name, line, raw), rec in zip(lines, batch.records):
            assert raw == rec.value
            e.records[(name, line)] = raw
            if rec.kind in WELL_FORMED:
                e.events.update(event_ids(raw))
        e.event_count += batch.counts["events"]
