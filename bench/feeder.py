"""A steady feed for the latency and state phases: the generator's records, pre-built, landed
as one file per tick at a fixed rate, each file's landing time recorded when its rename makes
it visible to the file source.

The whole stream is generated in one call so its defects (duplicates, late events, one very
long line) occur at the configured rates across the stream, not once per file.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from tools.generator.events import Params, generate
from common.storage import write_atomic


class Feeder(threading.Thread):
    def __init__(self, landing: Path, params: Params, seed: int, rate: int, seconds: float,
                 tick: float = 1.0, prefix: str = "part-bench-"):
        super().__init__(name="bench-feeder", daemon=True)
        # `prefix`: the files' names start with it, so feeds landed one after another in one
        # folder (the throughput steps, bench/steady.py) never reuse a name.
        self.landing, self.tick, self.prefix = landing, tick, prefix
        self.ticks = max(1, int(seconds / tick))
        self.events = max(1, int(rate * seconds))
        batch = generate(self.events, params, seed)
        self.counts = batch.counts
        records = batch.records
        size, extra = divmod(len(records), self.ticks)
        self.chunks, pos = [], 0
        for i in range(self.ticks):
            n = size + (i < extra)
            self.chunks.append(b"".join(r.value + b"\n" for r in records[pos:pos + n]))
            pos += n
        self.landed: dict[str, float] = {}     # file name -> epoch seconds it became visible
        self.stop_requested = threading.Event()
        self.started_at = self.finished_at = None

    def run(self) -> None:
        self.landing.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        for i, chunk in enumerate(self.chunks):
            due = self.started_at + i * self.tick
            if self.stop_requested.wait(max(0.0, due - time.time())):
                break
            name = f"{self.prefix}{i:05d}.jsonl"
            write_atomic(self.landing / name, chunk)
            self.landed[name] = time.time()
        self.finished_at = time.time()


def stream_params(params: Params, span_seconds: float) -> Params:
    return replace(params, span_s=span_seconds)
