"""One soak: the pipeline in this process on a fresh lakehouse, fed at a steady rate, sampled
until the time is up, stopped cleanly, audited in the same session, judged and written up."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.soak.judge import SNAPSHOT_DELTAS, checkpoint_settled_s, fmt, summary_table, verdicts
from bench.soak.sample import BatchTap, Sampler, table_operations

STARTUP_TIMEOUT_S = 300
# The clock starts once every query has committed a batch that read rows (JVM start-up, the
# JIT's first minutes and empty first batches are not what a soak measures); the feed runs from
# the queries' start, so it is generated this much longer than the soak.
WARM_TIMEOUT_S = 600


def log(msg: str) -> None:
    print(f"soak {datetime.now(timezone.utc):%H:%M:%S} {msg}", flush=True)


class _JvmOutput:
    """The JVM (and the Python workers it forks) inherit the file descriptors open when it
    starts: point stdout and stderr at spark.log for that moment, so Spark's own logging goes
    there and the soak prints one line per sample."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)


def _wait(predicate, timeout: float, runner_thread, stop: threading.Event) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and runner_thread.is_alive() and not stop.is_set():
        if predicate():
            return True
        time.sleep(1)
    return False


def audit_summary(report: dict) -> dict:
    tables = {t["table"]: t.get("prefix_summary") for t in report["tables"] if t.get("prefix_summary")}
    return {"ok": report["ok"], "failures": report["failures"], "seconds": report["seconds"],
            "prefix": tables, "accounting": {a["name"]: a["status"] for a in report["accounting"]}}


def run(args, env: dict, cfg) -> int:
    from bench.contention import OtherCpu
    from bench.feeder import Feeder, stream_params
    from bench.soak.charts import write_charts, write_page
    from tools.generator.events import Params, write_locations
    from common.log import LogToFile
    from common.spark import build_spark
    from common.streaming import interval
    from pipeline.cli import declare
    from common.flow import ORDER
    from pipeline.runner import Runner

    run_dir = args.run_dir
    run_dir.mkdir(parents=True)
    # Anything in this process that loads the config (workers, helpers) sees the soak's settings.
    os.environ.update({k: v for k, v in env.items() if k.startswith("LAKEHOUSE") or k in ("TRIGGER", "SOURCE")})
    soak = cfg.soak
    run_s = args.minutes * 60
    feed_s = run_s + WARM_TIMEOUT_S
    span = feed_s * soak.event_time_speedup
    maintenance = not args.no_maintenance
    log(f"run folder {run_dir}")
    log(f"generating {args.rate * feed_s:,.0f} events, event time spanning {span / 3600:g} h "
        f"({soak.event_time_speedup:g}x the clock)")
    started = time.monotonic()
    params = stream_params(Params.from_config(cfg.generator), span)
    feeder = Feeder(cfg.landing, params, args.seed, args.rate, feed_s)
    gen_s = time.monotonic() - started
    write_locations(cfg.locations_csv, params.devices)
    cfg.landing.mkdir(parents=True, exist_ok=True)
    specs = declare(cfg, ORDER)
    queries = [f.name for layer in specs for f in layer.flows]
    meta = {"minutes": args.minutes, "rate": args.rate, "maintenance": maintenance, "seed": args.seed,
            "sample_interval_s": args.interval.seconds, "warmup_s": args.warmup_s,
            "event_time_speedup": soak.event_time_speedup, "event_time_span_h": span / 3600,
            "feed_s": feed_s, "events_generated": feeder.events, "generated_in_s": round(gen_s, 1), "feed_counts": feeder.counts,
            "retention": soak.retention.text, "maintenance_interval": soak.maintenance_interval.text,
            "min_batches_to_retain": soak.min_batches_to_retain, "growth_limit": soak.growth_limit,
            "max_files_per_table": soak.max_files_per_table, "cores": os.cpu_count(),
            "intervals_s": {layer: interval(cfg, layer).seconds for layer in ORDER},
            "lakehouse": str(cfg.root), "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    log(f"generated in {gen_s:.1f} s; starting the pipeline "
        f"(maintenance {'on every ' + soak.maintenance_interval.text if maintenance else 'off'}; "
        f"Spark output in spark.log, pipeline's in pipeline.log)")

    with _JvmOutput(run_dir / "spark.log"):
        spark = build_spark(cfg, f"{cfg.spark.app_name}:soak")
    tap = BatchTap()
    spark.streams.addListener(tap.listener)
    # The pipeline's log lines (batches, maintenance rounds) go to pipeline.log, the soak's own to stdout.
    pipeline_log = LogToFile(run_dir / "pipeline.log")
    runner = Runner(cfg, specs, spark=spark)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(code=runner.run()), name="soak-pipeline", daemon=True)
    interrupted = threading.Event()

    def on_signal(*_):
        if interrupted.is_set():        # a second one: give up on a clean stop and the report
            raise KeyboardInterrupt
        interrupted.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    samples: list[dict] = []
    problems: list[str] = []
    doc = {"meta": meta, "samples": samples}

    def save():
        (run_dir / "samples.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")

    try:
        thread.start()
        warm = False
        if not _wait(lambda: len(spark.streams.active) >= len(queries), STARTUP_TIMEOUT_S, thread, interrupted):
            problems.append(f"the pipeline did not start its {len(queries)} queries "
                            f"(exit {result.get('code')}; see pipeline.log)")
        else:
            feeder.start()
            log(f"feeding {args.rate}/s; waiting for every query to commit a batch with rows")
            warm = _wait(lambda: all(tap.rows_seen.get(q) for q in queries), WARM_TIMEOUT_S, thread, interrupted)
            if interrupted.is_set():
                problems.append("interrupted while warming up")
            elif not warm:
                problems.append(f"not every query read rows within {WARM_TIMEOUT_S} s of the feed's start "
                                f"(read: {tap.rows_seen}; see pipeline.log)")
        if warm:
            sampler = Sampler(spark, cfg, tap, queries)
            tap.take(queries)            # batches of the warm-up are not the first sample's
            t0 = time.time()
            meta.update(jvm_pid=sampler.jvm_pid, warm_after_s=round(t0 - feeder.started_at, 1))
            log(f"warm after {meta['warm_after_s']:g} s of feed; sampling every {args.interval} "
                f"for {args.minutes:g} min")
            n = int(run_s // args.interval.seconds)
            # On a shared machine the figures mean little if others took the cores meanwhile.
            with OtherCpu() as other:
                for k in range(1, n + 1):
                    if interrupted.wait(max(0.0, t0 + k * args.interval.seconds - time.time())):
                        problems.append(f"interrupted after {len(samples)} samples")
                        break
                    if not thread.is_alive():
                        problems.append(f"the pipeline exited early (exit {result.get('code')}; see pipeline.log)")
                        break
                    s = sampler.sample(t0)
                    samples.append(s)
                    save()
                    log(progress_line(k, n, s))
            meta["others_cpu_share"] = other.share(time.time() - t0)
    finally:
        feeder.stop_requested.set()
        runner.request_stop()
        thread.join(cfg.streaming.stop_timeout.seconds + 60)
        spark.streams.removeListener(tap.listener)
    code = result.get("code")
    if thread.is_alive():
        problems.append("the pipeline did not stop within streaming.stop_timeout")
    elif code:
        problems.append(f"the pipeline exited {code} (see pipeline.log)")
    meta["landed"] = {"files": len(feeder.landed), "events": round(feeder.events * len(feeder.landed) / feeder.ticks),
                      "bytes": sum(len(c) for c in feeder.chunks[:len(feeder.landed)])}
    log(f"pipeline stopped (exit {code}); {meta['landed']['events']:,} events landed in {len(feeder.landed)} files")

    end = {}
    if samples:
        end["tables"] = Sampler(spark, cfg, tap, queries).tables()
        over = {t: f["live_files"] for t, f in end["tables"].items()
                if (f["live_files"] or 0) > soak.max_files_per_table}
        for t, files in over.items():
            problems.append(f"{t}: {files} live files at the end (soak.max_files_per_table {soak.max_files_per_table})")
        end["operations"] = table_operations(spark, cfg)
    if not thread.is_alive():
        from audit.__main__ import run_audit

        log("audit: running")
        try:
            doc["audit"] = audit_summary(run_audit(spark, cfg))
        except Exception as e:  # noqa: BLE001 - reported as a failed audit, the report still written
            doc["audit"] = {"ok": False, "failures": [f"audit raised {type(e).__name__}: {e}"]}
        if not doc["audit"]["ok"]:
            problems += [f"audit: {f}" for f in doc["audit"]["failures"]]
        log(f"audit: {'PASS' if doc['audit']['ok'] else 'FAIL'} ({doc['audit'].get('seconds', '-')} s)")
    spark.stop()
    pipeline_log.close()

    ctx = {"run_s": run_s, "warmup_s": args.warmup_s, "retention_s": soak.retention.seconds,
           "maintenance_interval_s": soak.maintenance_interval.seconds,
           "min_batches_to_retain": soak.min_batches_to_retain,
           "slowest_interval_s": max(meta["intervals_s"].values())}
    ctx["checkpoint_settled_s"] = checkpoint_settled_s(samples, soak.min_batches_to_retain + SNAPSHOT_DELTAS,
                                                       never=run_s + 1)
    rows = verdicts(samples, ctx, soak.growth_limit)
    problems += [f"{r['series']} grows: {fmt(r['first_half'], r['unit'])} -> {fmt(r['second_half'], r['unit'])} "
                 f"(x{r['ratio']})" for r in rows if r["verdict"] == "GROWS"]
    meta["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    doc.update(end=end, verdicts=rows, problems=problems, ok=not problems, judge=ctx)
    save()
    charts = write_charts(samples, rows, ctx, run_dir)
    write_page(doc, charts, run_dir)

    print()
    print(summary_table(rows, judged_only=True))
    if end.get("tables"):
        print("\nat the end: " + ", ".join(f"{t} {f['live_files']} live / {f['disk_files']} on disk"
                                           for t, f in end["tables"].items()))
    for p in problems:
        print(f"FAIL {p}")
    if meta.get("others_cpu_share") is not None:
        print(f"other processes took {meta['others_cpu_share']:.0%} of the machine's CPU while sampling")
    print(f"\nsoak {'PASS' if not problems else 'FAIL'}: {len(samples)} samples, "
          f"{run_dir / 'samples.json'}, {run_dir / 'index.html'}")
    if not problems and not args.keep:
        shutil.rmtree(cfg.root, ignore_errors=True)
    return 0 if not problems else 1


def progress_line(k: int, n: int, s: dict) -> str:
    p, tables, q = s["process"], s["tables"], s["queries"]
    files = {t: f["live_files"] or 0 for t, f in tables.items()}
    top = max(files, key=files.get) if files else "-"
    state = sum(v["state_rows"] or 0 for v in q.values())
    slow = max((v["batch_ms_mean"] or 0 for v in q.values()), default=0)
    return (f"[{k:>3}/{n}] jvm rss {fmt(p['jvm_rss'], 'bytes')}  heap {fmt(p['heap_used'], 'bytes')}  "
            f"batches {sum(v['batches'] for v in q.values())} (slowest mean {slow / 1000:.1f} s)  "
            f"state {state:,} rows  files {sum(files.values())} (max {top} {files.get(top, 0)})  "
            f"ckpt {fmt(s['checkpoints']['total']['checkpoint_bytes'], 'bytes')}  sampled in {sum(s['took_s'].values()):.1f} s")

