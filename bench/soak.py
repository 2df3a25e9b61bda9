"""make soak: the one-application pipeline at a steady feed for a while, sampled every minute.

    python -m bench.soak [--minutes 30] [--rate 200] [--no-maintenance] [--sample-interval '1 minute']
                         [--warmup '3 minutes'] [--out ./soak-results] [--seed 7] [--keep]

A fresh lakehouse under <out>/<UTC time>/lakehouse; the generator's events landed one file a
second at --rate, their event time running soak.event_time_speedup times faster than the clock
so windows, sessions and watermarks close within minutes; retention compressed the same way
(soak.retention, maintenance every soak.maintenance_interval). Every sample: driver RSS and
JVM heap, batches per query, state, files and bytes per table, Delta log, checkpoint folders.
At the end the pipeline stops cleanly and the audit runs in the same session.

Judged (exit 1 when one fails): every series marked judged in KINDS, second-half mean against
first-half mean over the samples after its settle time; live files per table at the end
against soak.max_files_per_table; the pipeline ran to the end; the audit passed.
Exit 0 pass, 1 a check failed, 2 usage or config error.
Writes samples.json, <kind>.png charts and index.html in the run folder.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from common.errors import JobError, command

MB = 1024 * 1024
STARTUP_TIMEOUT_S = 300
# The clock starts once every query has committed a batch that read rows (JVM start-up, the
# JIT's first minutes and empty first batches are not what a soak measures); the feed runs from
# the queries' start, so it is generated this much longer than the soak.
WARM_TIMEOUT_S = 600

# kind -> (scope, unit, absolute floor or None when only charted). A series fails when its
# second-half mean exceeds the first half's by more than growth_limit AND by more than the
# floor: below the floor a relative change is noise, not a leak (a 10-file table gaining 5
# files is +50%, a 0.4 s batch taking 0.6 s is +50% of nothing). Each floor is above what one
# sample moves by in a steady run and well below what would matter over weeks.
KINDS: dict[str, tuple[str, str, float | None]] = {
    # The JVM's RSS moves by hundreds of MB between samples as G1 commits and gives back heap
    # regions (up to spark.driver_memory); a leak that matters over weeks is GBs.
    "jvm_rss": ("process", "bytes", 256 * MB),
    "python_rss": ("process", "bytes", 64 * MB),
    # Sum over the JVM's Python workers: shared pages are counted once per worker, and workers
    # come and go with the pandas UDFs that need them, so the sum is a trace, not a figure.
    "workers_rss": ("process", "bytes", None),
    # Heap after a full GC still holds the batches in flight at that moment (a MERGE's rows, a
    # snapshot being rebuilt): it moves by a few hundred MB from one sample to the next.
    "heap_used": ("process", "bytes", 256 * MB),
    # Metaspace and code cache: the JIT keeps compiling for tens of minutes; charted only.
    "nonheap_used": ("process", "bytes", None),
    "batch_ms_mean": ("query", "ms", 1000),
    "batch_ms_max": ("query", "ms", None),
    "batches": ("query", "count", None),
    "input_rows": ("query", "rows", None),
    "state_rows": ("query", "rows", 2000),
    # RocksDB's memory figure includes block cache and memtables, which fill by the MB.
    "state_bytes": ("query", "bytes", 16 * MB),
    "live_files": ("table", "files", 50),
    # Data accumulates by design (bronze keeps every event): bytes are charted, files judged.
    "live_bytes": ("table", "bytes", None),
    "disk_files": ("table", "files", 100),
    "disk_bytes": ("table", "bytes", None),
    "log_files": ("table", "files", None),
    # Delta deletes expired log files only up to the UTC midnight before now - log_retention
    # (MetadataCleanup truncates its cut-off to the day), so within a day the log grows with
    # every commit whatever the retention: charted, with its growth per hour. What a reader
    # loads for the latest snapshot (last checkpoint + commits after it) is what must stay flat.
    "log_bytes": ("table", "bytes", None),
    "log_read_bytes": ("table", "bytes", 4 * MB),
    "checkpoint_bytes": ("checkpoint", "bytes", 8 * MB),
}
# Series bounded by retention can only flatten once a full retention has passed (VACUUM keeps
# removed files that long; Delta checkpoints keep their tombstones that long).
RETENTION_BOUND = {"disk_files", "log_read_bytes"}


class UsageError(JobError, ValueError):
    pass


def log(msg: str) -> None:
    print(f"soak {datetime.now(timezone.utc):%H:%M:%S} {msg}", flush=True)


# --- configuration -----------------------------------------------------------------------------

def soak_overrides(soak, maintenance: bool) -> dict[str, str]:
    """Retention compressed like event time, so one soak exercises log cleanup, VACUUM and
    checkpoint cleanup; with --no-maintenance nothing compacts or vacuums."""
    m = "LAKEHOUSE__MAINTENANCE__"
    env = {f"{m}AUDIT_HORIZON": soak.retention.text, f"{m}LOG_RETENTION": soak.retention.text,
           f"{m}OPS_RETENTION": soak.retention.text, f"{m}INTERVAL": soak.maintenance_interval.text,
           f"{m}MIN_BATCHES_TO_RETAIN": str(soak.min_batches_to_retain),
           f"{m}ENABLED": str(maintenance).lower()}
    if not maintenance:
        env[f"{m}AUTO_COMPACT"] = "false"
    return env


def settings(argv, prog: str = "python -m bench.soak") -> tuple[argparse.Namespace, dict, object]:
    """Options with conf defaults, the job environment and its config; UsageError when bad."""
    from common.config import ConfigError, load_config, parse_duration

    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, help="how long to feed and sample (default: soak.minutes)")
    p.add_argument("--rate", type=int, help="events per second landed (default: soak.rate)")
    p.add_argument("--no-maintenance", action="store_true",
                   help="no OPTIMIZE/VACUUM and no auto compaction, to compare files per table")
    p.add_argument("--sample-interval", help="e.g. '15 seconds' (default: soak.sample_interval)")
    p.add_argument("--warmup", help="samples before this are charted, not judged (default: soak.warmup, "
                                    "at most a third of the run)")
    p.add_argument("--out", help="results folder (default: soak.out)")
    p.add_argument("--seed", type=int, default=7, help="generator seed (default 7)")
    p.add_argument("--keep", action="store_true", help="keep the lakehouse after a passing soak")
    args = p.parse_args(argv)
    try:
        base = load_config()
        soak = base.soak
        args.minutes = soak.minutes if args.minutes is None else args.minutes
        args.rate = soak.rate if args.rate is None else args.rate
        args.interval = parse_duration(args.sample_interval) if args.sample_interval else soak.sample_interval
        warmup = parse_duration(args.warmup) if args.warmup else soak.warmup
    except (ConfigError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.minutes <= 0 or args.rate <= 0:
        raise UsageError("--minutes and --rate must be positive")
    if base.profile.name != "nest":
        raise UsageError(f"the soak feeds the nest generator's events; PROFILE={base.profile.name} does not read them")
    run_s = args.minutes * 60
    if args.interval.seconds * 4 > run_s:
        raise UsageError(f"--sample-interval {args.interval} leaves fewer than 4 samples in {args.minutes:g} min")
    # A short run keeps two thirds of its samples for judging, halves of a few samples each.
    args.warmup_s = min(warmup.seconds, run_s / 3)
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    args.run_dir = Path(args.out or soak.out).resolve() / (stamp + ("-no-maintenance" if args.no_maintenance else ""))
    env = {k: v for k, v in os.environ.items() if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR")}
    env.update(LAKEHOUSE_ROOT=str(args.run_dir / "lakehouse"), TRIGGER="processing-time", SOURCE="files",
               **soak_overrides(soak, not args.no_maintenance))
    try:
        cfg = load_config(env=env)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    return args, env, cfg


# --- sampling ----------------------------------------------------------------------------------

def _tree(path: Path, skip_hidden: bool = True) -> tuple[int, int]:
    """(files, bytes) under path; hidden files are Hadoop's .crc siblings and temp files."""
    files = size = 0
    for d, _, names in os.walk(path):
        for n in names:
            if skip_hidden and n.startswith("."):
                continue
            try:
                size += os.stat(os.path.join(d, n)).st_size
                files += 1
            except OSError:       # removed by VACUUM or log cleanup while we walk
                pass
    return files, size


def log_read_bytes(log_dir: Path) -> int:
    """Bytes a reader loads for the latest snapshot: the last checkpoint and the commits after it."""
    try:
        since = json.loads((log_dir / "_last_checkpoint").read_text())["version"]
    except (OSError, ValueError, KeyError):
        since = -1
    total = 0
    for f in log_dir.iterdir():
        head = f.name.split(".", 1)[0]
        if not head.isdigit() or f.name.startswith("."):
            continue
        v = int(head)
        if (v > since and f.name.endswith(".json")) or (v == since and ".checkpoint" in f.name):
            try:
                total += f.stat().st_size
            except OSError:
                pass
    sidecars = log_dir / "_sidecars"
    return total + (_tree(sidecars)[1] if since >= 0 and sidecars.is_dir() else 0)


class BatchTap:
    """Every micro-batch's duration, rows and state, from Spark's listener bus."""

    def __init__(self):
        from pyspark.sql.streaming import StreamingQueryListener

        tap = self
        self.lock = threading.Lock()
        self.batches: dict[str, list[tuple[int, int]]] = {}     # query -> [(trigger ms, rows)]
        self.state: dict[str, tuple[int, int]] = {}             # query -> latest (rows, bytes)
        self.rows_seen: dict[str, int] = {}                     # query -> rows read since its start

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                tap.add(event.progress)

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        self.listener = Listener()

    def add(self, p) -> None:
        name = p.name or str(p.id)[:8]
        ops = p.stateOperators or []
        with self.lock:
            self.batches.setdefault(name, []).append((int(p.durationMs.get("triggerExecution") or 0),
                                                      int(p.numInputRows or 0)))
            self.rows_seen[name] = self.rows_seen.get(name, 0) + int(p.numInputRows or 0)
            if ops:
                self.state[name] = (sum(int(o.numRowsTotal or 0) for o in ops),
                                    sum(int(o.memoryUsedBytes or 0) for o in ops))

    def take(self, names) -> dict[str, dict]:
        with self.lock:
            batches, self.batches = self.batches, {}
            state = dict(self.state)
        out = {}
        for q in sorted(set(names) | set(batches)):
            b = batches.get(q, [])
            ms = [d for d, _ in b]
            rows, mem = state.get(q, (None, None))
            out[q] = {"batches": len(b), "input_rows": sum(r for _, r in b),
                      "batch_ms_mean": round(sum(ms) / len(ms)) if ms else None,
                      "batch_ms_max": max(ms) if ms else None, "state_rows": rows, "state_bytes": mem}
        return out


class Sampler:
    """One sample: a few JVM calls, the listener's batches, and file listings; no Spark job."""

    def __init__(self, spark, cfg, tap: BatchTap, queries: list[str]):
        self.spark, self.cfg, self.tap, self.queries = spark, cfg, tap, queries
        jvm = spark._jvm
        self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        self.memory = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
        self.system = jvm.java.lang.System

    def process(self) -> dict:
        from tools.processes import descendants, rss

        # Heap used right after a full collection: the live set, not wherever G1 happened to be
        # between young collections (which swings by the size of the young generation).
        self.system.gc()
        return {"jvm_rss": rss(self.jvm_pid), "python_rss": rss(os.getpid()),
                "workers_rss": sum(rss(p) or 0 for p in descendants(self.jvm_pid)),
                "heap_used": int(self.memory.getHeapMemoryUsage().getUsed()),
                "nonheap_used": int(self.memory.getNonHeapMemoryUsage().getUsed())}

    def tables(self) -> dict:
        from common.catalog import existing_tables
        from pipeline.maintenance import files_on_disk

        out = {}
        for layer, table, path in existing_tables(self.cfg):
            folder = Path(path)
            live_files, live_bytes = self.live(path)
            log_files, log_bytes = _tree(folder / "_delta_log", skip_hidden=False)
            disk_bytes = _tree(folder, skip_hidden=False)[1] - log_bytes
            out[f"{layer}.{table}"] = {"live_files": live_files, "live_bytes": live_bytes,
                                       "disk_files": files_on_disk(folder), "disk_bytes": disk_bytes,
                                       "log_files": log_files, "log_bytes": log_bytes,
                                       "log_read_bytes": log_read_bytes(folder / "_delta_log")}
        return out

    @staticmethod
    def live(path: str) -> tuple[int | None, int | None]:
        """Files and bytes of the table, from the checksum Delta writes beside each commit: no
        Spark job, so sampling takes nothing from the pipeline's cores. The newest commit's is
        written just after the commit; until then the one before stands in (one commit old)."""
        log_dir = Path(path) / "_delta_log"
        for crc in sorted(log_dir.glob("[0-9]*.crc"), reverse=True):
            try:
                figures = json.loads(crc.read_text())
                return int(figures["numFiles"]), int(figures["tableSizeBytes"])
            except (OSError, ValueError, KeyError):
                continue
        return None, None

    def checkpoints(self) -> dict:
        root = Path(self.cfg.checkpoint_root)
        out = {q.name: _tree(q, skip_hidden=False)[1] for q in sorted(root.iterdir()) if q.is_dir()} \
            if root.is_dir() else {}
        out["total"] = sum(out.values())
        return out

    def sample(self, t0: float) -> dict:
        now = time.time()
        s = {"t": round(now - t0, 1), "at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
             "load1": round(os.getloadavg()[0], 2)}
        took = {}
        for part, fn in (("process", self.process), ("queries", lambda: self.tap.take(self.queries)),
                         ("tables", self.tables), ("checkpoints", lambda: {
                             k: {"checkpoint_bytes": v} for k, v in self.checkpoints().items()})):
            started = time.monotonic()
            s[part] = fn()
            took[part] = round(time.monotonic() - started, 2)
        s["took_s"] = took
        return s


# --- series and judgement ------------------------------------------------------------------------

def series(samples: list[dict]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(kind, subject) -> [(t seconds, value)]; subject '' for process figures."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in samples:
        for kind, v in s.get("process", {}).items():
            if v is not None:
                out.setdefault((kind, ""), []).append((s["t"], v))
        for group in ("queries", "tables", "checkpoints"):
            for subject, figures in s.get(group, {}).items():
                for kind, v in figures.items():
                    if v is not None:
                        out.setdefault((kind, subject), []).append((s["t"], v))
    return out


def judge(values: list[float], floor: float, limit: float) -> dict:
    """Second-half mean against first-half mean: grows when above it by more than `limit`
    (relative) and more than `floor` (absolute). Fewer than 4 values: too short to tell."""
    if len(values) < 4:
        return {"verdict": "short", "n": len(values)}
    half = len(values) // 2
    # With an odd count the middle value goes to neither half, so both halves weigh the same.
    first, second = values[:half], values[len(values) - half:]
    a, b = sum(first) / len(first), sum(second) / len(second)
    grows = b > a * (1 + limit) and b - a > floor
    return {"verdict": "GROWS" if grows else "pass", "n": len(values), "first_half": a, "second_half": b,
            "ratio": round(b / a, 3) if a else None}


# Spark's state stores snapshot every spark.sql.streaming.stateStore.minDeltasForSnapshot (10)
# batches and clean up only behind the snapshot before the oldest batch retained.
SNAPSHOT_DELTAS = 10


def settle_s(kind: str, ctx: dict) -> float:
    """When a kind's series can be flat: after warmup, and after a full retention (plus one
    maintenance round) for retention-bound ones, and for checkpoint folders once every stateful
    query has made min_batches_to_retain + SNAPSHOT_DELTAS batches (older ones are only then
    cleaned up): counted from the samples when known (a query slower than its trigger takes
    longer than its interval suggests), else estimated from the slowest trigger interval."""
    if kind in RETENTION_BOUND:
        return max(ctx["warmup_s"], ctx["retention_s"] + ctx["maintenance_interval_s"])
    if kind == "checkpoint_bytes":
        estimate = (ctx["min_batches_to_retain"] + SNAPSHOT_DELTAS) * ctx["slowest_interval_s"]
        return max(ctx["warmup_s"], ctx.get("checkpoint_settled_s", estimate))
    return ctx["warmup_s"]


def checkpoint_settled_s(samples: list[dict], batches_needed: int, never: float) -> float:
    """The first sample time by which every stateful query has made `batches_needed` batches
    since sampling began; `never` when one has not by the end."""
    done: dict[str, float] = {}
    counts: dict[str, int] = {}
    stateful = {q for s in samples for q, v in s.get("queries", {}).items() if v.get("state_rows") is not None}
    for s in samples:
        for q in stateful:
            counts[q] = counts.get(q, 0) + (s.get("queries", {}).get(q, {}).get("batches") or 0)
            if counts[q] >= batches_needed and q not in done:
                done[q] = s["t"]
    return max(done.values()) if stateful and len(done) == len(stateful) else never


def window_mean(points, lo: float, hi: float) -> float | None:
    v = [x for t, x in points if lo < t <= hi]
    return sum(v) / len(v) if v else None


def verdicts(samples: list[dict], ctx: dict, limit: float) -> list[dict]:
    """One row per series: first and last window means (the report's figures), the halves
    judged and the verdict (info for series that are only charted)."""
    run_s = ctx["run_s"]
    if "checkpoint_settled_s" not in ctx:
        ctx = dict(ctx, checkpoint_settled_s=checkpoint_settled_s(
            samples, ctx["min_batches_to_retain"] + SNAPSHOT_DELTAS, never=run_s + 1))
    win = 300 if run_s >= 20 * 60 else run_s / 4     # first vs last 5 min; a quarter for short runs
    rows = []
    for (kind, subject), points in sorted(series(samples).items()):
        if kind not in KINDS:
            continue
        scope, unit, floor = KINDS[kind]
        if scope == "checkpoint" and subject != "total":
            floor = None            # per query charted, the folder as a whole judged
        row = {"series": kind + (f"[{subject}]" if subject else ""), "kind": kind, "subject": subject,
               "unit": unit, "first_window": window_mean(points, -1, win),
               "last_window": window_mean(points, run_s - win, run_s + 1), "window_s": win}
        if floor is None:
            row["verdict"] = "info"
        else:
            start = settle_s(kind, ctx)
            row.update(judge([v for t, v in points if t >= start], floor, limit), judged_from_s=start, floor=floor)
        if kind == "log_bytes" and len(points) > 1 and points[-1][0] > points[0][0]:
            row["per_hour"] = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) * 3600
        rows.append(row)
    return rows


def fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return f"{value / MB:,.1f} MB"
    if unit == "ms":
        return f"{value / 1000:,.2f} s"
    return f"{value:,.0f}"


def summary_table(rows: list[dict], judged_only: bool = False) -> str:
    """The judged series (and the Delta log's growth per hour); every series with judged_only off."""
    if judged_only:
        rows = [r for r in rows if r["verdict"] != "info" or "per_hour" in r]
    win = rows[0]["window_s"] / 60 if rows else 5
    head = (f"{'series':<44} {'first ' + format(win, 'g') + ' min':>13} {'last ' + format(win, 'g') + ' min':>13} "
            f"{'2nd/1st half':>12}  verdict")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else ""
        verdict = r["verdict"] + (f" (from {r['judged_from_s'] / 60:g} min)" if r["verdict"] == "short" else "")
        if "per_hour" in r:
            verdict += f" (+{fmt(r['per_hour'], r['unit'])}/h)"
        lines.append(f"{r['series'][:44]:<44} {fmt(r['first_window'], r['unit']):>13} "
                     f"{fmt(r['last_window'], r['unit']):>13} {ratio:>12}  {verdict}")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------

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


def table_operations(spark, cfg) -> dict[str, dict[str, int]]:
    """Operations per table over the whole run (OPTIMIZE and VACUUM show maintenance ran)."""
    from common.catalog import existing_tables

    out = {}
    for layer, table, path in existing_tables(cfg):
        rows = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").groupBy("operation").count().collect()
        out[f"{layer}.{table}"] = {r["operation"]: r["count"] for r in sorted(rows, key=lambda r: r["operation"])}
    return out


def audit_summary(report: dict) -> dict:
    tables = {t["table"]: t.get("prefix_summary") for t in report["tables"] if t.get("prefix_summary")}
    return {"ok": report["ok"], "failures": report["failures"], "seconds": report["seconds"],
            "prefix": tables, "accounting": {a["name"]: a["status"] for a in report["accounting"]}}


def run(args, env: dict, cfg) -> int:
    from bench.contention import OtherCpu
    from bench.feeder import Feeder, stream_params
    from bench.soak_charts import write_charts, write_page
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


@command
def main(argv=None, prog: str = "python -m bench.soak") -> int:
    args, env, cfg = settings(argv, prog)
    return run(args, env, cfg)


if __name__ == "__main__":
    sys.exit(main())
