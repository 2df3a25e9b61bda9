"""One soak, step by step (run() reads as the list): prepare the run folder and the feed; open
the Spark session with the pipeline's listener and runner; start the queries and the feed; wait
until every query has read rows; sample every interval until the time is up; stop the pipeline;
audit in the same session; judge the series; write samples.json, the charts and the page.

Imported only after the options are parsed (bench.soak.__main__), so --help and a usage error
start neither Spark nor matplotlib.
"""
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

from audit.__main__ import run_audit
from bench.contention import OtherCpu
from bench.feeder import Feeder, stream_params
from bench.soak.charts import write_charts, write_page
from bench.soak.judge import SNAPSHOT_DELTAS, checkpoint_settled_s, fmt, summary_table, verdicts
from bench.soak.sample import BatchTap, Sampler, table_operations
from common.flow import ORDER
from common.log import LogToFile
from common.spark import build_spark, stop as stop_spark
from common.streaming import interval
from pipeline.runner import Runner, declare
from tools.generator.events import Params, write_locations

STARTUP_TIMEOUT_S = 300
# The clock starts once every query has committed a batch that read rows (JVM start-up, the
# JIT's first minutes and empty first batches are not what a soak measures); the feed runs from
# the queries' start, so it is generated this much longer than the soak.
WARM_TIMEOUT_S = 600


def state_horizon_s(cfg) -> float:
    """Clock seconds until the stateful queries' state can be full (bench.soak.judge.STATE)."""
    gold = (cfg.gold.watermark.seconds if cfg.gold.watermark else 0) + cfg.gold.windows["session_gap"].seconds
    return max(cfg.silver.dedup_watermark.seconds, gold) / cfg.soak.event_time_speedup


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
    """True once predicate holds; False at the timeout, when the pipeline thread has exited, or
    when a signal asked to stop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and runner_thread.is_alive() and not stop.is_set():
        if predicate():
            return True
        time.sleep(1)
    return False


def audit_summary(report: dict) -> dict:
    """What samples.json and the page keep of the audit's report."""
    tables = {t["table"]: t.get("prefix_summary") for t in report["tables"] if t.get("prefix_summary")}
    return {"ok": report["ok"], "failures": report["failures"], "seconds": report["seconds"],
            "prefix": tables, "accounting": {a["name"]: a["status"] for a in report["accounting"]}}


def run(args, env: dict, cfg) -> int:
    """Exit 0 when every check passed, 1 when one failed."""
    soak = Soak(args, cfg)
    soak.prepare(env)
    soak.open_session()
    try:
        if soak.start() and soak.warm_up():
            soak.sample()
    finally:
        # Whatever happened (an interrupt, an exception), the pipeline and the feed stop.
        soak.stop()
    soak.check_exit()
    soak.audit()
    soak.judge()
    soak.write()
    return soak.report()


class Soak:
    """One soak's state, shared by its steps: what failed (problems) and what the run's
    samples.json holds (doc: meta, samples, then end, audit and verdicts)."""

    def __init__(self, args, cfg):
        self.args, self.cfg, self.soak = args, cfg, cfg.soak
        self.run_dir: Path = args.run_dir
        self.run_s = args.minutes * 60
        self.samples: list[dict] = []
        self.problems: list[str] = []
        self.end: dict = {}
        self.result: dict = {}                  # the pipeline thread's exit code
        self.interrupted = threading.Event()

    # --- before the pipeline ---------------------------------------------------------------------

    def prepare(self, env: dict) -> None:
        """The run folder, the whole feed generated up front (so generating takes nothing from
        the pipeline's cores later), the locations it joins with, and the run's facts."""
        args, cfg, soak = self.args, self.cfg, self.soak
        self.run_dir.mkdir(parents=True)
        # Anything in this process that loads the config (workers, helpers) sees the soak's settings.
        os.environ.update({k: v for k, v in env.items() if k.startswith("LAKEHOUSE") or k in ("TRIGGER", "SOURCE")})
        feed_s = self.run_s + WARM_TIMEOUT_S
        span = feed_s * soak.event_time_speedup
        maintenance = not args.no_maintenance
        log(f"run folder {self.run_dir}")
        log(f"generating {args.rate * feed_s:,.0f} events, event time spanning {span / 3600:g} h "
            f"({soak.event_time_speedup:g}x the clock)")
        started = time.monotonic()
        params = stream_params(Params.from_config(cfg.generator), span)
        self.feeder = Feeder(cfg.landing, params, args.seed, args.rate, feed_s)
        gen_s = time.monotonic() - started
        write_locations(cfg.locations_csv, params.devices, cfg.silver.min_event_time)
        cfg.landing.mkdir(parents=True, exist_ok=True)
        self.specs = declare(cfg, ORDER)
        self.queries = [f.name for layer in self.specs for f in layer.flows]
        self.meta = self._meta(feed_s, span, gen_s)
        self.doc = {"meta": self.meta, "samples": self.samples}
        log(f"generated in {gen_s:.1f} s; starting the pipeline "
            f"(maintenance {'on every ' + soak.maintenance_interval.text if maintenance else 'off'}; "
            f"Spark output in spark.log, pipeline's in pipeline.log)")

    def _meta(self, feed_s: float, span: float, gen_s: float) -> dict:
        args, cfg, soak, feeder = self.args, self.cfg, self.soak, self.feeder
        return {"minutes": args.minutes, "rate": args.rate, "maintenance": not args.no_maintenance,
                "seed": args.seed, "sample_interval_s": args.interval.seconds, "warmup_s": args.warmup_s,
                "event_time_speedup": soak.event_time_speedup, "event_time_span_h": span / 3600,
                "feed_s": feed_s, "events_generated": feeder.events, "generated_in_s": round(gen_s, 1),
                "feed_counts": feeder.counts, "retention": soak.retention.text,
                "maintenance_interval": soak.maintenance_interval.text,
                "min_batches_to_retain": soak.min_batches_to_retain, "growth_limit": soak.growth_limit,
                "max_files_per_table": soak.max_files_per_table, "cores": os.cpu_count(),
                "intervals_s": {layer: interval(cfg, layer).seconds for layer in ORDER},
                "lakehouse": str(cfg.root), "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def open_session(self) -> None:
        """The Spark session, the listener that counts batches, the runner and its thread (not
        started yet), and signal handlers that ask for a clean stop."""
        cfg = self.cfg
        with _JvmOutput(self.run_dir / "spark.log"):
            self.spark = build_spark(cfg, f"{cfg.spark.app_name}:soak")
        self.tap = BatchTap()
        self.spark.streams.addListener(self.tap.listener)
        # The pipeline's log lines (batches, maintenance rounds) go to pipeline.log, the soak's own to stdout.
        self.pipeline_log = LogToFile(self.run_dir / "pipeline.log")
        self.runner = Runner(cfg, self.specs, spark=self.spark)
        self.thread = threading.Thread(target=lambda: self.result.update(code=self.runner.run()),
                                       name="soak-pipeline", daemon=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, *_) -> None:
        if self.interrupted.is_set():        # a second one: give up on a clean stop and the report
            raise KeyboardInterrupt
        self.interrupted.set()

    def save(self) -> None:
        (self.run_dir / "samples.json").write_text(json.dumps(self.doc, indent=1, default=str) + "\n")

    # --- the pipeline running --------------------------------------------------------------------

    def start(self) -> bool:
        """The pipeline's queries, then the feed; False when not every query started."""
        self.thread.start()
        if not _wait(lambda: len(self.spark.streams.active) >= len(self.queries), STARTUP_TIMEOUT_S,
                     self.thread, self.interrupted):
            self.problems.append(f"the pipeline did not start its {len(self.queries)} queries "
                                 f"(exit {self.result.get('code')}; see pipeline.log)")
            return False
        self.feeder.start()
        log(f"feeding {self.args.rate}/s; waiting for every query to commit a batch with rows")
        return True

    def warm_up(self) -> bool:
        """True once every query has committed a batch that read rows (see WARM_TIMEOUT_S)."""
        tap, queries = self.tap, self.queries
        warm = _wait(lambda: all(tap.rows_seen.get(q) for q in queries), WARM_TIMEOUT_S,
                     self.thread, self.interrupted)
        if self.interrupted.is_set():
            self.problems.append("interrupted while warming up")
        elif not warm:
            self.problems.append(f"not every query read rows within {WARM_TIMEOUT_S} s of the feed's start "
                                 f"(read: {tap.rows_seen}; see pipeline.log)")
        return warm

    def sample(self) -> None:
        """A sample every interval for --minutes, saved as it is taken (an interrupted or
        crashed soak still leaves its samples); stops early on a signal or a pipeline exit."""
        args, meta = self.args, self.meta
        sampler = Sampler(self.spark, self.cfg, self.tap, self.queries)
        self.tap.take(self.queries)            # batches of the warm-up are not the first sample's
        t0 = time.time()
        meta.update(jvm_pid=sampler.jvm_pid, warm_after_s=round(t0 - self.feeder.started_at, 1))
        log(f"warm after {meta['warm_after_s']:g} s of feed; sampling every {args.interval} "
            f"for {args.minutes:g} min")
        n = int(self.run_s // args.interval.seconds)
        # On a shared machine the figures mean little if others took the cores meanwhile.
        with OtherCpu() as other:
            busy, at = 0.0, time.time()
            for k in range(1, n + 1):
                # Sample times are fixed from t0, so a slow sample does not push the rest later.
                if self.interrupted.wait(max(0.0, t0 + k * args.interval.seconds - time.time())):
                    self.problems.append(f"interrupted after {len(self.samples)} samples")
                    break
                if not self.thread.is_alive():
                    self.problems.append(f"the pipeline exited early (exit {self.result.get('code')}; "
                                         f"see pipeline.log)")
                    break
                s = sampler.sample(t0)
                # What others took of the machine since the last sample: a batch time measured
                # while the suite (or anything) held the cores says nothing about the pipeline.
                now, seconds = time.time(), other.seconds_so_far()
                s["others_cpu_share"] = round((seconds - busy) / ((now - at) * (os.cpu_count() or 1)), 3)
                busy, at = seconds, now
                self.samples.append(s)
                self.save()
                log(progress_line(k, n, s))
        meta["others_cpu_share"] = other.share(time.time() - t0)

    def stop(self) -> None:
        self.feeder.stop_requested.set()
        self.runner.request_stop()
        self.thread.join(self.cfg.streaming.stop_timeout.seconds + 60)
        self.spark.streams.removeListener(self.tap.listener)

    # --- after the pipeline ----------------------------------------------------------------------

    def check_exit(self) -> None:
        """A pipeline still running or exiting non-zero fails the soak; what landed goes in meta."""
        code, feeder = self.result.get("code"), self.feeder
        if self.thread.is_alive():
            self.problems.append("the pipeline did not stop within streaming.stop_timeout")
        elif code:
            self.problems.append(f"the pipeline exited {code} (see pipeline.log)")
        self.meta["landed"] = {"files": len(feeder.landed),
                               "events": round(feeder.events * len(feeder.landed) / feeder.ticks),
                               "bytes": sum(len(c) for c in feeder.chunks[:len(feeder.landed)])}
        log(f"pipeline stopped (exit {code}); {self.meta['landed']['events']:,} events landed "
            f"in {len(feeder.landed)} files")

    def audit(self) -> None:
        """The tables at the end (files per table judged against soak.max_files_per_table), the
        operations each saw, and the audit, run in the same session once the pipeline has
        stopped; then the session closes."""
        spark, cfg, limit = self.spark, self.cfg, self.soak.max_files_per_table
        if self.samples:
            self.end["tables"] = Sampler(spark, cfg, self.tap, self.queries).tables()
            over = {t: f["live_files"] for t, f in self.end["tables"].items() if (f["live_files"] or 0) > limit}
            for t, files in over.items():
                self.problems.append(f"{t}: {files} live files at the end (soak.max_files_per_table {limit})")
            self.end["operations"] = table_operations(spark, cfg)
        if not self.thread.is_alive():
            log("audit: running")
            try:
                audit = audit_summary(run_audit(spark, cfg))
            except Exception as e:  # noqa: BLE001 - reported as a failed audit, the report still written
                audit = {"ok": False, "failures": [f"audit raised {type(e).__name__}: {e}"]}
            self.doc["audit"] = audit
            if not audit["ok"]:
                self.problems += [f"audit: {f}" for f in audit["failures"]]
            log(f"audit: {'PASS' if audit['ok'] else 'FAIL'} ({audit.get('seconds', '-')} s)")
        stop_spark(spark)
        self.pipeline_log.close()

    def judge(self) -> None:
        """A verdict per series (bench.soak.judge); a growing one is a problem."""
        soak, run_s = self.soak, self.run_s
        ctx = {"run_s": run_s, "warmup_s": self.args.warmup_s, "retention_s": soak.retention.seconds,
               "maintenance_interval_s": soak.maintenance_interval.seconds,
               "min_batches_to_retain": soak.min_batches_to_retain,
               "slowest_interval_s": max(self.meta["intervals_s"].values()),
               "state_horizon_s": state_horizon_s(self.cfg)}
        ctx["checkpoint_settled_s"] = checkpoint_settled_s(self.samples, soak.min_batches_to_retain + SNAPSHOT_DELTAS,
                                                           never=run_s + 1)
        rows = verdicts(self.samples, ctx, soak.growth_limit)
        self.problems += [f"{r['series']} grows: {fmt(r['first_half'], r['unit'])} -> "
                          f"{fmt(r['second_half'], r['unit'])} (x{r['ratio']})" for r in rows if r["verdict"] == "GROWS"]
        self.ctx, self.rows = ctx, rows

    def write(self) -> None:
        """samples.json with everything the run found, a chart per kind, and index.html."""
        self.meta["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.doc.update(end=self.end, verdicts=self.rows, problems=self.problems, ok=not self.problems,
                        judge=self.ctx)
        self.save()
        charts = write_charts(self.samples, self.rows, self.ctx, self.run_dir)
        write_page(self.doc, charts, self.run_dir)

    def report(self) -> int:
        """The judged series and the problems on stdout; a passing soak's lakehouse removed
        (unless --keep), a failing one's kept to look into."""
        problems, end, meta, run_dir = self.problems, self.end, self.meta, self.run_dir
        print()
        print(summary_table(self.rows, judged_only=True))
        if end.get("tables"):
            print("\nat the end: " + ", ".join(f"{t} {f['live_files']} live / {f['disk_files']} on disk"
                                               for t, f in end["tables"].items()))
        for p in problems:
            print(f"FAIL {p}")
        if meta.get("others_cpu_share") is not None:
            print(f"other processes took {meta['others_cpu_share']:.0%} of the machine's CPU while sampling")
        print(f"\nsoak {'PASS' if not problems else 'FAIL'}: {len(self.samples)} samples, "
              f"{run_dir / 'samples.json'}, {run_dir / 'index.html'}")
        if not problems and not self.args.keep:
            shutil.rmtree(self.cfg.root, ignore_errors=True)
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

