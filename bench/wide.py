"""Wide records: silver's cost for one record of many elements against the same events in
normal records, time and peak JVM memory, each case in fresh processes on a fresh lakehouse.

    python -m bench.wide [--cases wide20k,normal20k,wide200k,cloudtrail1,cloudtrail50]
    (make bench-wide)

  wide20k      one Nest record of 20,000 cameras (4.4 MB)
  normal20k    the same 20,000 cameras in 1,000 records of 20
  wide200k     one record of 200,000 cameras (about 45 MB), default spark.driver_memory
  cloudtrail1  one CloudTrail file of 5,000 records (profile cloudtrail)
  cloudtrail50 the same 5,000 records in 50 files

Each case runs bronze, then silver, as `make run-bronze` / `make run-silver` do. Silver's time
is the sum of its batches' batch_ms (ops.batch_accounting); its memory is the peak resident
size of the silver process's JVM, sampled every 0.1 s. Prints one JSON line per case and a
table of the ratios the issue's targets name (wide / normal <= 2x time and <= 1.5x memory;
cloudtrail1 / cloudtrail50 <= 2x time).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = ("wide20k", "normal20k", "wide200k", "cloudtrail1", "cloudtrail50")


def camera(i: int) -> tuple[str, dict]:
    device = f"cam-{i:06d}"
    minute, second = divmod(i % 3600, 60)
    start = f"2026-11-01T10:{minute % 60:02d}:{second:02d}.000Z"
    return device, {"device_id": device, "name": f"Room {i}", "is_online": True,
                    "last_event": {"has_sound": False, "has_motion": True, "has_person": i % 3 == 0,
                                   "start_time": start, "end_time": start.replace(".000Z", ".500Z")}}


def nest_lines(events: int, per_record: int) -> bytes:
    lines = []
    for first in range(0, events, per_record):
        cams = dict(camera(i) for i in range(first, min(first + per_record, events)))
        lines.append(json.dumps({"devices": {"cameras": cams}}, separators=(",", ":")).encode())
    return b"\n".join(lines) + b"\n"


def cloudtrail_records(n: int) -> list[dict]:
    return [{"eventVersion": "1.05", "eventID": f"ev-{i:06d}", "eventTime": f"2026-11-01T{i % 24:02d}:{i % 60:02d}:00Z",
             "eventSource": "s3.amazonaws.com", "eventName": "GetObject", "awsRegion": "us-east-1",
             "sourceIPAddress": "10.0.0.1", "userAgent": "aws-cli/2", "requestID": f"r{i}",
             "userIdentity": {"type": "IAMUser", "arn": f"arn:aws:iam::1:user/u{i % 7}", "accountId": "1"},
             "requestParameters": {"bucketName": "b", "key": f"k/{i}"}, "readOnly": True}
            for i in range(n)]


def land(case: str, landing: Path) -> dict:
    landing.mkdir(parents=True)
    if case.startswith("cloudtrail"):
        records, files = cloudtrail_records(5000), 1 if case == "cloudtrail1" else 50
        per = len(records) // files
        for f in range(files):
            body = json.dumps({"Records": records[f * per:(f + 1) * per]}).encode()
            (landing / f"ct-{f:03d}.json.gz").write_bytes(gzip.compress(body))
        return {"PROFILE": "cloudtrail", "events": len(records)}
    events = {"wide20k": 20_000, "normal20k": 20_000, "wide200k": 200_000}[case]
    per = 20 if case == "normal20k" else events
    data = nest_lines(events, per)
    (landing / "part-0.jsonl").write_bytes(data)
    return {"PROFILE": "nest", "events": events, "record_bytes": len(data) // max(1, events // per)}


class PeakRss(threading.Thread):
    """The largest resident size of any JVM below `pid`, sampled until stopped."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self):
        import psutil

        root = psutil.Process(self.pid)
        while not self.done.wait(0.1):
            try:
                for p in root.children(recursive=True):
                    if "java" in p.name():
                        self.peak = max(self.peak, p.memory_info().rss)
            except psutil.Error:
                pass


def run_layer(layer: str, env: dict, log: Path) -> tuple[float, int]:
    start = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "--layer", layer, "--trigger", "available-now"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        peak = PeakRss(proc.pid)
        peak.start()
        code = proc.wait()
        peak.done.set()
        peak.join()
    if code != 0:
        raise SystemExit(f"{layer} exited {code}: see {log}")
    return time.monotonic() - start, peak.peak


def silver_batch_ms(root: Path) -> int:
    from deltalake import DeltaTable

    books = DeltaTable(str(root / "ops" / "batch_accounting")).to_pandas()
    return int(books[books.layer == "silver"].batch_ms.sum())


def measure(case: str, work: Path) -> dict:
    root = work / case
    shutil.rmtree(root, ignore_errors=True)
    landing = root / "landing"
    facts = land(case, landing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE__") and k not in ("TRIGGER", "SOURCE")}
    env.update(LAKEHOUSE_ROOT=str(root / "lakehouse"), LANDING=str(landing), PROFILE=facts.pop("PROFILE"),
               SOURCE="files")
    if env["PROFILE"] == "nest":   # silver's dimension: a few of the cameras have a location
        reference = root / "lakehouse" / "reference"
        reference.mkdir(parents=True)
        (reference / "device_locations.csv").write_text(
            "device_id,zip_code,city,state\n" + "".join(f"cam-{i:06d},0210{i % 10},Boston,MA\n" for i in range(100)))
    log = root / "run.log"
    bronze_s, _ = run_layer("bronze", env, log)
    silver_s, rss = run_layer("silver", env, log)
    return {"case": case, **facts, "bronze_wall_s": round(bronze_s, 1), "silver_wall_s": round(silver_s, 1),
            "silver_batch_s": round(silver_batch_ms(root / "lakehouse") / 1000, 2),
            "silver_peak_jvm_rss_mb": rss // 2**20}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wide", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {','.join(CASES)}")
    p.add_argument("--work", help="folder for the lakehouses (default: a temporary one, removed after)")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown case(s) {unknown}: use {','.join(CASES)}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-wide-"))
    results = {}
    for case in cases:
        results[case] = measure(case, work)     # a failure keeps the folder, for its run.log
        print(json.dumps(results[case]), flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    for wide, normal, what in (("wide20k", "normal20k", "time <= 2x, memory <= 1.5x"),
                               ("cloudtrail1", "cloudtrail50", "time <= 2x")):
        if wide in results and normal in results:
            w, n = results[wide], results[normal]
            print(f"{wide} / {normal}: silver batches {w['silver_batch_s'] / n['silver_batch_s']:.2f}x, "
                  f"peak JVM memory {w['silver_peak_jvm_rss_mb'] / n['silver_peak_jvm_rss_mb']:.2f}x "
                  f"(targets: {what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
