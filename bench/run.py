"""Benchmark: nine figures measured in one run on this machine.

    python -m bench.run -n 1000000 [--only a,b,...] [--rate 5000] [--light-rate 200] [--stream-seconds 90]
    (make bench BENCH_N=1000000, or make bench BENCH_N=20000)

  a  engine ceiling: the landing files, raw schema and explode into Spark's noop sink, read
     both with spark.read.text and with bronze's binaryFile split; the faster is the ceiling
     (information: issue 60 retired (b)'s target against it)
  b  throughput of bronze, silver, gold and of `make run-all` (available-now), events/s;
     end-to-end against (g)'s plain Structured Streaming rate, and as a multiple of (a)
  c  after the full run, +1% data: the incremental `make run-all` against a from-scratch batch
     recompute of all layers with the same transforms (bench/recompute.py)
  d  landing -> silver and landing -> gold latency, p50/p95, with processing-time triggers and a
     steady feed, at two rates: --rate (heavy) and --light-rate (at which neither run saturates
     the cores, with --light-interval's triggers); after each, the plain counterpart over the same
     feed at the same intervals (bench/baseline_stream.py: bronze and silver appended, fresh gold
     upserted by foreachBatch + MERGE in update mode), and the ratios pipeline / plain
  e  gold state rows over a stream whose event time spans 10x the gold watermark
  f  the quality gate's share of silver batch time (ops.batch_accounting.quality_ms)
  g  the same three layers as plain Structured Streaming (bench/baseline.py: one session,
     available-now, append, no gates/accounting/lineage/MERGE) on its own fresh lakehouse over
     the same landing files, run after (b); `make run-all`'s wall over the baseline's wall
  h  the median duration of batches that read no row, per query, in (b)'s run-all, in the
     streaming run of (d, e), and in a quiet feed (a small file every --quiet-gap seconds, so
     each query closes what its watermark passed in a batch of its own on idle cores)
  i  sustained throughput: the feed stepped up (--throughput-rates, each step
     --throughput-seconds or longer when the run's commits are far apart), the highest rate
     the pipeline keeps up with (backlog and latency not growing, bench/steady.py), the same
     for the plain run, and the ratio pipeline / plain

d and e come from the same streaming run (fresh lakehouse; e and h from the heavy rate's); a, b,
c, f and g read the first one's landing files (g runs before c appends to them); i runs the
pipeline and the plain layers on lakehouses of their own.
Results: bench-results/bench-<time>-<N>.json and .md; the summary line is printed last. Then
docs/benchmark.md is rewritten from the JSON just saved (bench/docs_page.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench import docs_page, summary
from bench.contention import OtherCpu, feed_measured
from bench.latency import file_latencies, summarize
from common.errors import LakehouseError
from common.log import message_of, parseable_env

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench-results"
SECTIONS = "abcdefghi"
# (h) times the batches that read no row in (b)'s run-all and in the streaming run of (d, e):
# `--only h` runs both, and the figures they give on the way are kept too.
RUN_ALL_FIGURES, STREAM_FIGURES = set("bcfh"), set("deh")
# How the bench runs the pipeline end to end; the one place to point it at another runner.
RUN_ALL = [sys.executable, "-m", "pipeline"]
GOLD = ("zip_hourly_sightings", "device_activity", "device_sessions")
# Event time of the bench's data whatever N: the figures measured so far had 6 hours, and the
# generator's own span (as long as the cameras' rhythm takes) would put 1M events half a year
# ahead, past silver.max_future.
SPAN = "6 hours"
# (d)'s light rate and the intervals both runs get at it (docs/benchmark.md says how they were
# picked), and (i)'s steps.
LIGHT_RATE = 200
# (h)'s quiet feed: files of this many events, --quiet-files of them, --quiet-gap seconds apart.
QUIET_EVENTS = 500
LIGHT_INTERVAL = "30 seconds"
THROUGHPUT_RATES = "4000,8000,16000,32000"


class BenchError(LakehouseError, RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"bench {datetime.now(timezone.utc):%H:%M:%S} {msg}", flush=True)


def base_env(root: Path, **extra) -> dict:
    # Plain log lines at INFO or finer: run_logged matches them.
    env = {k: v for k, v in parseable_env(os.environ).items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "TRIGGER", "TRIGGER_INTERVAL")}
    env.update({"LAKEHOUSE_ROOT": str(root), "SOURCE": "files", "TRIGGER": "available-now", **extra})
    return env


def provenance() -> dict:
    """What the results need to be read later: the commit measured and the machine's memory."""
    out = {"platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"}
    try:
        out["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):
        pass
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True,  # noqa: E731
                                        timeout=10)
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode == 0:
            # The page a previous run rewrote does not change what is measured.
            dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                        ":(exclude)docs/benchmark.md").stdout.strip()
            out["commit"] = head.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def run_logged(cmd: list[str], env: dict, log_path: Path, marks=()) -> tuple[float, dict]:
    """Run cmd, its output to log_path; returns wall seconds and when each line starting with
    one of `marks` appeared after its timestamp (seconds since start)."""
    seen: dict[str, float] = {}
    started = time.monotonic()
    with open(log_path, "a", buffering=1) as out:   # line-buffered: the log can be followed live
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        for line in proc.stdout:
            out.write(line)
            for m in marks:
                if message_of(line).startswith(m) and m not in seen:
                    seen[m] = time.monotonic() - started
        code = proc.wait()
    if code != 0:
        raise BenchError(f"{' '.join(cmd[1:])} failed (exit {code}); see {log_path}")
    return time.monotonic() - started, seen


def result_line(log_path: Path, tag: str) -> dict:
    """The JSON a bench process printed on its `<tag> {...}` line."""
    for line in log_path.read_text().splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    raise BenchError(f"no {tag} line in {log_path}")


class Session:
    """One Spark session for the bench's own reads and the ceiling, built on first use."""

    def __init__(self, cfg):
        self.cfg, self._spark = cfg, None

    def __call__(self):
        if self._spark is None:
            from common.spark import build_spark
            self._spark = build_spark(self.cfg, "bench")
        return self._spark

    def sql(self, query: str) -> list[dict]:
        return [r.asDict() for r in self().sql(query).collect()]

    def stop(self):
        if self._spark is not None:
            from common.spark import stop

            stop(self._spark)


def layer_of(query: str) -> str:
    return "gold" if query.startswith("gold") else "bronze" if query.startswith("bronze") else query


def processing_spans(session: Session, cfg, since_ms: int = 0) -> dict[str, float]:
    """Per layer, seconds from its first batch's trigger to its last batch's end (a layer's
    queries, e.g. gold `--only` subsets, run side by side: their span is not the sum of their
    batches)."""
    path = cfg.table_path("ops", "query_progress")
    rows = session.sql(
        f"SELECT query_name, min(unix_millis(timestamp)) AS t0, "
        f"max(unix_millis(timestamp) + batch_duration_ms) AS t1 FROM delta.`{path}` "
        f"WHERE event = 'progress' AND input_rows > 0 AND unix_millis(timestamp) >= {since_ms} "
        f"GROUP BY query_name")
    spans: dict[str, list] = {}
    for r in rows:
        s = spans.setdefault(layer_of(r["query_name"]), [r["t0"], r["t1"]])
        s[0], s[1] = min(s[0], r["t0"]), max(s[1], r["t1"])
    return {k: round((t1 - t0) / 1000, 2) for k, (t0, t1) in spans.items()}


# --- a, b, c, f: one lakehouse, available-now ---------------------------------------------

def generate(env: dict, run_dir: Path, n: int, seed: int, extra=()) -> dict:
    manifest = run_dir / f"manifest-{seed}.json"
    run_logged([sys.executable, "-m", "tools.generator", "-n", str(n), "--seed", str(seed),
                "--manifest", str(manifest), *extra], env, run_dir / "generate.log")
    return json.loads(manifest.read_text())


def throughput(session, cfg, env, run_dir, events: int, ceiling: dict | None) -> dict:
    log(f"(b) make run-all over {events:,} events")
    started_ms = int(time.time() * 1000)
    with OtherCpu(by_part=True) as other:
        wall, marks = run_logged(RUN_ALL, env, run_dir / "run-all.log",
                                 marks=("bronze: done", "silver: done"))
    ends = {"bronze": marks.get("bronze: done"), "silver": marks.get("silver: done"), "gold": wall}
    spans = processing_spans(session, cfg, started_ms)
    layers, previous = {}, 0.0
    for layer in ("bronze", "silver", "gold"):
        end = ends[layer] if ends[layer] is not None else wall
        w, p = end - previous, spans.get(layer)
        previous = end
        layers[layer] = {"wall_s": round(w, 1), "events_per_s_wall": round(events / w) if w > 0 else None,
                         "processing_s": p, "events_per_s_processing": round(events / p) if p else None}
    out = {"layers": layers, "end_to_end_s": round(wall, 1), "end_to_end_events_per_s": round(events / wall),
           "others_cpu_share": other.share(wall), "cpu_parts_s": other.own_parts()}
    if ceiling:
        out["end_to_end_vs_ceiling"] = round(out["end_to_end_events_per_s"] / ceiling["events_per_s"], 3)
    return out


def quality(session, cfg) -> dict:
    path = cfg.table_path("ops", "batch_accounting")
    rows = {r["layer"]: r for r in session.sql(
        f"SELECT layer, count(*) AS batches, sum(batch_ms) AS batch_ms, sum(quality_ms) AS quality_ms "
        f"FROM delta.`{path}` GROUP BY layer")}
    s, g = rows.get("silver") or {}, rows.get("gold") or {}
    share = lambda r: round((r.get("quality_ms") or 0) / r["batch_ms"], 3) if r.get("batch_ms") else None  # noqa: E731
    return {"silver_share": share(s), "silver_batches": s.get("batches"),
            "silver_quality_s": round((s.get("quality_ms") or 0) / 1000, 1),
            "silver_batch_s": round((s.get("batch_ms") or 0) / 1000, 1),
            "gold_share": share(g)}


def incremental(session, cfg, env, run_dir, manifest: dict, seed: int) -> dict:
    """+1% events, continuing in event time where the first run ended, at the same event rate."""
    g = cfg.generator
    n = max(1, manifest["events"] // 100)
    span = manifest["span_s"] / 100
    start = datetime.fromtimestamp(g.start.timestamp() + manifest["span_s"], timezone.utc)
    gen_env = {**env, "LAKEHOUSE__GENERATOR__START": start.strftime("%Y-%m-%dT%H:%M:%SZ")}
    log(f"(c) appending {n:,} events, then incremental run-all and batch recompute")
    generate(gen_env, run_dir, n, seed + 1, ("--span", f"{span:g} seconds", "--files", "2"))
    started_ms = int(time.time() * 1000)
    inc_wall, _ = run_logged(RUN_ALL, env, run_dir / "run-all-incremental.log")
    spans = processing_spans(session, cfg, started_ms)
    out_dir = run_dir / "recompute"
    rec_wall, _ = run_logged([sys.executable, "-m", "bench.recompute", "--out", str(out_dir)], env,
                             run_dir / "recompute.log")
    rec = result_line(run_dir / "recompute.log", "RECOMPUTE")
    inc_proc = round(sum(spans.values()), 2)
    rec_proc = round(sum(rec.values()), 2)
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"appended_events": n, "incremental_wall_s": round(inc_wall, 1), "recompute_wall_s": round(rec_wall, 1),
            "ratio_wall": round(inc_wall / rec_wall, 3),
            "incremental_processing_s": inc_proc, "incremental_processing_by_layer": spans,
            "recompute_processing_s": rec_proc, "recompute_by_layer": rec,
            "ratio_processing": round(inc_proc / rec_proc, 3) if rec_proc else None}


def baseline(session, cfg, run_dir: Path, events: int, throughput: dict | None) -> dict:
    """(g) bench/baseline.py in its own process and fresh lakehouse, over the same landing files
    and reference CSV; its wall includes Python and JVM start-up, as run-all's does."""
    env = base_env(run_dir / "lakehouse-baseline", LANDING=str(cfg.landing), REFERENCE_DIR=str(cfg.reference))
    log(f"(g) plain Structured Streaming baseline over the same {events:,} events")
    with OtherCpu(by_part=True) as other:
        wall, _ = run_logged([sys.executable, "-m", "bench.baseline"], env, run_dir / "baseline.log")
    out = {"wall_s": round(wall, 1), "events_per_s": round(events / wall),
           "steps_s": result_line(run_dir / "baseline.log", "BASELINE"),
           # Where each run's CPU went: run-all's extra work, part by part, against plain Spark's.
           "cpu_parts_s": other.own_parts(),
           # The machine may be shared: how much of it others took during each of the two runs.
           "others_cpu_share": other.share(wall)}
    # Row counts next to run-all's, read after the clock stopped: both should hold the same events.
    from common.config import load_config
    bcfg = load_config(env=env)
    count = lambda path: session().read.format("delta").load(path).count()  # noqa: E731
    out["silver_rows"] = count(bcfg.table_path("silver", bcfg.silver_table))
    if throughput:
        out["run_all_silver_rows"] = count(cfg.table_path("silver", cfg.silver_table))
        out["run_all_wall_s"] = throughput["end_to_end_s"]
        out["run_all_others_cpu_share"] = throughput.get("others_cpu_share")
        out["run_all_cpu_parts_s"] = throughput.get("cpu_parts_s")
        out["run_all_over_baseline"] = round(throughput["end_to_end_s"] / out["wall_s"], 2)
    return out


# --- d, e: a streaming run with a steady feed ----------------------------------------------

def _wait(predicate, timeout: float, proc=None, what="") -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"run-all exited ({proc.returncode}) while waiting for {what}")
        time.sleep(1)
    return False


def _watch(proc, seconds: float, what: str) -> None:
    """Let run-all work for `seconds`; a BenchError if it exits meanwhile."""
    _wait(lambda: False, seconds, proc, what)


def interval_env(spec: str | None) -> dict:
    """The environment that gives the pipeline and the plain runs the same trigger intervals:
    None -> conf's per-layer intervals; '10 seconds' -> TRIGGER_INTERVAL for every layer;
    'bronze=10 seconds,silver=5 seconds,gold=5 seconds' -> each named layer's own interval
    (LAKEHOUSE__STREAMING__<LAYER>_INTERVAL; the others keep conf's)."""
    from common.spec import parse_duration

    if not spec:
        return {}
    if "=" not in spec:
        parse_duration(spec)
        return {"TRIGGER_INTERVAL": spec}
    out = {}
    for part in spec.split(","):
        layer, _, value = part.partition("=")
        layer = layer.strip().lower()
        if layer not in ("bronze", "silver", "gold"):
            raise ValueError(f"interval {part!r}: expected <bronze|silver|gold>=<duration>")
        parse_duration(value.strip())
        out[f"LAKEHOUSE__STREAMING__{layer.upper()}_INTERVAL"] = value.strip()
    return out


def pipeline_env(root: Path, intervals: str | None) -> tuple[dict, "object"]:
    """The environment and config of a processing-time run-all on the lakehouse at `root`."""
    from common.config import load_config

    env = base_env(root, TRIGGER="processing-time", **interval_env(intervals))
    return env, load_config(env=env)


def start_pipeline(env: dict, log_path: Path):
    """run-all --trigger processing-time in its own process group; returns (process, log file)."""
    log_file = open(log_path, "w")
    proc = subprocess.Popen([*RUN_ALL, "--trigger", "processing-time"],
                            env=env, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log_file


def wait_for_gold(proc, cfg, startup_timeout: float, log_file) -> None:
    gold_log = Path(cfg.table_path("gold", GOLD[0])) / "_delta_log"
    if not _wait(gold_log.is_dir, startup_timeout, proc, "the gold job to start"):
        raise BenchError(f"gold did not start within {startup_timeout} s; see {log_file.name}")


def stop_pipeline(proc, log_file) -> None:
    if proc.poll() is None:
        # To the driver only: it stops every query after its batch. The JVM in the same group
        # would run its shutdown hooks at once and abort the batches mid-way.
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log_file.close()


def stream_phase(args, run_dir: Path, rate: int | None = None, seconds: float | None = None,
                 intervals: str | None = None, tag: str = "") -> tuple[dict, dict, "object"]:
    """(d, e): run-all with processing-time triggers on a fresh lakehouse, fed at `rate` for
    `seconds` (default --rate, --stream-seconds and --interval); `tag` names the light run's
    lakehouse and logs apart."""
    from tools.generator.events import Params, write_locations
    from bench.feeder import Feeder, stream_params

    rate = args.rate if rate is None else rate
    seconds = args.stream_seconds if seconds is None else seconds
    intervals = args.interval if intervals is None else intervals
    env, cfg = pipeline_env(run_dir / f"lakehouse-stream{tag}", intervals)
    span = args.watermark_multiple * cfg.gold.watermark.seconds
    params = stream_params(Params.from_config(cfg.generator), span)
    feeder = Feeder(cfg.landing, params, args.seed, rate, seconds)
    write_locations(cfg.locations_csv, params.devices, cfg.silver.min_event_time)
    cfg.landing.mkdir(parents=True, exist_ok=True)
    log(f"(d{'' if tag else ', e'}) run-all --trigger processing-time; feeding {feeder.events:,} events at "
        f"{rate:,}/s for {seconds:g} s, event time spanning {span / 3600:g} h, intervals {intervals or 'conf'}")
    proc, log_file = start_pipeline(env, run_dir / f"run-all-stream{tag}.log")
    try:
        wait_for_gold(proc, cfg, args.startup_timeout, log_file)
        busy, others, own = feed_measured(feeder)
        log(f"(d) feed done; the cores were {busy:.0%} busy (others {others:.0%}, this run {own:.0%}); "
            f"waiting for gold to catch up" if None not in (busy, others, own) else "(d) feed done; waiting for gold")

        def caught_up():
            rows = file_latencies(cfg, dict(feeder.landed), [GOLD[0]])
            return bool(rows) and all(r[GOLD[0]] is not None for r in rows)

        drained = _wait(caught_up, args.drain_seconds, proc, "gold to catch up")
        observed_until = time.time()
    finally:
        stop_pipeline(proc, log_file)
    rows = file_latencies(cfg, feeder.landed, list(GOLD))
    warm = feeder.started_at + args.warmup_seconds
    measured = [r for r in rows if r["landed"] >= warm]
    for r in measured:
        vals = [r[t] for t in GOLD]
        r["max_over_gold"] = None if any(v is None for v in vals) else max(vals)
    fed_seconds = feeder.finished_at - feeder.started_at
    latency = {"rate_events_per_s": rate, "seconds": seconds,
               "fed_events_per_s": round(feeder.events / max(fed_seconds, 1e-9)),
               "interval": intervals or "conf (streaming.<layer>_interval)",
               "files": len(rows), "warmup_s": args.warmup_seconds, "drained": drained,
               "zip_hourly_sightings": summarize(measured, GOLD[0], observed_until),
               "max_over_gold": summarize(measured, "max_over_gold", observed_until),
               "stages_p50_s": {k: summarize(measured, k)["p50_s"] for k in ("bronze", "silver", *GOLD)},
               "silver": summarize(measured, "silver", observed_until),
               "cores_busy_during_feed": busy, "others_cpu_share_during_feed": others,
               "own_cpu_share_during_feed": own}
    (run_dir / f"latency-files{tag}.json").write_text(json.dumps(rows, indent=1))
    return latency, {"span_s": span, "multiple": args.watermark_multiple}, cfg


def plain_stream(args, run_dir: Path, span_s: float, rate: int | None = None, seconds: float | None = None,
                 intervals: str | None = None, tag: str = "") -> dict:
    """(d) bench/baseline_stream.py on its own fresh lakehouse, after the pipeline's streaming
    run, with the same feed and intervals: plain Structured Streaming's landing -> silver and
    landing -> fresh gold latency."""
    rate = args.rate if rate is None else rate
    seconds = args.stream_seconds if seconds is None else seconds
    intervals = args.interval if intervals is None else intervals
    env = base_env(run_dir / f"lakehouse-baseline-stream{tag}", **interval_env(intervals))
    log(f"(d) plain Structured Streaming over the same feed ({rate:,} events/s for {seconds:g} s)")
    cmd = [sys.executable, "-m", "bench.baseline_stream", "--seconds", f"{seconds:g}",
           "--rate", str(rate), "--seed", str(args.seed), "--span-seconds", f"{span_s:g}",
           "--warmup-seconds", f"{args.warmup_seconds:g}", "--drain-seconds", f"{args.drain_seconds:g}"]
    log_path = run_dir / f"baseline-stream{tag}.log"
    run_logged(cmd, env, log_path)
    out = result_line(log_path, "BASELINE_STREAM")
    if out.get("cores_busy_during_feed") is not None:
        log(f"(d) plain feed done; the cores were {out['cores_busy_during_feed']:.0%} busy"
            + (f" (others {out['others_cpu_share_during_feed']:.0%})"
               if out.get("others_cpu_share_during_feed") is not None else "")
            + (f"; this run {out['own_cpu_share_during_feed']:.0%}"
               if out.get("own_cpu_share_during_feed") is not None else ""))
    return out


# --- i: sustained throughput ---------------------------------------------------------------

def sustained(args, run_dir: Path) -> dict:
    """(i) the feed stepped up (bench/steady.py) into the pipeline, then into the plain layers
    (bench/baseline_stream.py --steps), each on a lakehouse of its own with the same intervals."""
    from bench.steady import parse_steps, ratio

    rates = parse_steps(args.throughput_rates)
    seconds, intervals = args.throughput_seconds, args.throughput_interval or args.interval
    out = {"rates": rates, "seconds": seconds, "speedup": args.throughput_speedup,
           "drain_s": args.throughput_drain_seconds, "interval": intervals or "conf (streaming.<layer>_interval)"}
    out["pipeline"] = sustained_pipeline(args, run_dir, rates, seconds, intervals)
    env = base_env(run_dir / "lakehouse-baseline-sustained", **interval_env(intervals))
    log("(i) plain Structured Streaming, the same steps")
    cmd = [sys.executable, "-m", "bench.baseline_stream", "--seconds", f"{seconds:g}", "--steps",
           ",".join(map(str, rates)), "--seed", str(args.seed), "--speedup", f"{args.throughput_speedup:g}",
           "--drain-seconds", f"{args.throughput_drain_seconds:g}"]
    try:
        run_logged(cmd, env, run_dir / "baseline-sustained.log")
        out["plain"] = result_line(run_dir / "baseline-sustained.log", "BASELINE_STREAM")
    except BenchError as e:   # the pipeline's steps stand without the plain ones
        out["plain_error"] = str(e)
        print(f"error in i (plain): {e}", file=sys.stderr, flush=True)
    out.update(ratio(out.get("pipeline"), out.get("plain"), rates))
    # Each file's landing and visibility times, per run and step, beside the results (not in them).
    files = {who: [step.pop("rows", None) for step in (out.get(who) or {}).get("steps", [])]
             for who in ("pipeline", "plain")}
    (run_dir / "sustained-files.json").write_text(json.dumps(files, indent=1))
    return out


def sustained_pipeline(args, run_dir: Path, rates: list[int], seconds: float, intervals: str | None) -> dict:
    """(i) the pipeline's steps: run-all --trigger processing-time on a fresh lakehouse."""
    from bench.steady import run_steps
    from tools.generator.events import Params, write_locations

    env, cfg = pipeline_env(run_dir / "lakehouse-sustained", intervals)
    params = Params.from_config(cfg.generator)
    write_locations(cfg.locations_csv, params.devices, cfg.silver.min_event_time)
    cfg.landing.mkdir(parents=True, exist_ok=True)
    proc, log_file = start_pipeline(env, run_dir / "run-all-sustained.log")
    try:
        log(f"(i) run-all --trigger processing-time, steps {', '.join(f'{r:,}' for r in rates)} events/s, "
            f"{seconds:g} s or more each, intervals {intervals or 'conf'}")
        wait_for_gold(proc, cfg, args.startup_timeout, log_file)

        def check():
            if proc.poll() is not None:
                raise BenchError(f"run-all exited ({proc.returncode}) during the throughput steps")

        return run_steps(cfg.landing, params, args.seed, rates, seconds, args.throughput_speedup,
                         lambda landed: file_latencies(cfg, landed, [GOLD[0]]),
                         ["silver", GOLD[0]], args.throughput_drain_seconds, check, log)
    finally:
        stop_pipeline(proc, log_file)


def state(session, cfg, span: dict) -> dict:
    """Gold state rows over the streaming run: after each gold batch, the sum over the gold
    queries (one, `gold`; a lakehouse of an older version had one per table) of each one's
    latest state_rows. Flat: the second half's peak is within 25% of the first half's
    (unbounded state keeps growing with event time)."""
    path = cfg.table_path("ops", "query_progress")
    rows = session.sql(
        f"SELECT query_name, unix_millis(timestamp) AS t, state_rows, unix_millis(watermark) AS wm "
        f"FROM delta.`{path}` WHERE event = 'progress' AND query_name LIKE 'gold%' "
        f"AND state_rows IS NOT NULL ORDER BY t")
    queries = {r["query_name"] for r in rows}
    latest: dict[str, int] = {}
    series = []
    for r in rows:
        latest[r["query_name"]] = r["state_rows"]
        if len(latest) == len(queries):
            series.append((r["t"], sum(latest.values())))
    if not series:
        return {}
    values = [v for _, v in series]
    half = len(values) // 2
    first_half, second_half = max(values[:half] or values), max(values[half:])
    picks = [values[round(i * (len(values) - 1) / 7)] for i in range(8)]
    wms = [r["wm"] for r in rows if r["wm"] and r["wm"] > 0]
    advanced_h = round((max(wms) - min(wms)) / 3_600_000, 2) if wms else 0.0
    # State is bounded by about one or two watermarks of event time; a run whose gold got
    # through less than three cannot tell flat from growing.
    enough = advanced_h * 3600 >= 3 * cfg.gold.watermark.seconds
    by_query = {}
    for q in sorted(latest):
        v = [r["state_rows"] for r in rows if r["query_name"] == q]
        by_query[q] = {"first": v[0], "peak": max(v), "last": v[-1]}
    return {"first": values[0], "peak": max(values), "last": values[-1], "samples": picks,
            "batches": len(values), "second_half_peak_over_first": round(second_half / max(first_half, 1), 2),
            "flat": (second_half <= 1.25 * first_half) if enough else None,
            "watermark_advanced_h": advanced_h,
            "event_time_span_h": round(span["span_s"] / 3600, 2), "watermark_multiple": span["multiple"],
            "by_query": by_query}


def quiet_phase(args, run_dir: Path, extra_env: dict | None = None, before_stop=None):
    """(h) a quiet feed: run-all --trigger processing-time (conf's intervals) on a fresh lakehouse
    gets one small file every --quiet-gap seconds, its event time moving (d)'s span over the
    feed. After each file's batches every stateful query has caught up, its watermark has moved,
    and Spark runs the batch that closes what the watermark passed (sessions, windows), with
    nothing else on the cores. In (d)'s heavy run those batches queue behind the next files'
    tasks, so the two figures answer different questions: the batch's own cost, and what it
    costs on saturated cores. `extra_env` and `before_stop` (called while the pipeline still
    runs) are bench/batch_profile.py's. Returns the run's config, for empty_batches."""
    from tools.generator.events import Params, write_locations
    from bench.feeder import Feeder, stream_params

    root = run_dir / "lakehouse-quiet"
    shutil.rmtree(root, ignore_errors=True)    # a run before this one would mix into its progress rows
    env, cfg = pipeline_env(root, None)
    env.update(extra_env or {})
    params = stream_params(Params.from_config(cfg.generator), args.watermark_multiple * cfg.gold.watermark.seconds)
    seconds = args.quiet_files * args.quiet_gap
    feeder = Feeder(cfg.landing, params, args.seed, max(1, round(QUIET_EVENTS / args.quiet_gap)), seconds,
                    tick=args.quiet_gap, prefix="part-quiet-")
    write_locations(cfg.locations_csv, params.devices, cfg.silver.min_event_time)
    cfg.landing.mkdir(parents=True, exist_ok=True)
    log(f"(h) quiet feed: run-all --trigger processing-time, {len(feeder.chunks)} files of ~{QUIET_EVENTS} "
        f"events, {args.quiet_gap:g} s apart")
    proc, log_file = start_pipeline(env, run_dir / "run-all-quiet.log")
    try:
        wait_for_gold(proc, cfg, args.startup_timeout, log_file)
        feeder.start()
        feeder.join()
        _watch(proc, args.quiet_gap, "the last file's batches")
        if before_stop is not None:
            before_stop()
    finally:
        stop_pipeline(proc, log_file)
    return cfg


def empty_batches(session, cfg) -> dict:
    """Per query, the median duration of its batches that read no row (they only move the
    watermark, or close what it passed: session timeouts), from ops.query_progress. The first
    batch of each run of a query is left out: it pays for the query's start, rows or not."""
    path = cfg.table_path("ops", "query_progress")
    rows = session.sql(
        f"SELECT query_name, count(*) AS n, percentile(batch_duration_ms, 0.5) AS p50 FROM ("
        f"SELECT *, batch_id = min(batch_id) OVER (PARTITION BY run_id) AS first FROM delta.`{path}` "
        f"WHERE event = 'progress' AND batch_id IS NOT NULL) "
        f"WHERE input_rows = 0 AND NOT first GROUP BY query_name ORDER BY query_name")
    return {r["query_name"]: {"batches": r["n"], "median_s": round(r["p50"] / 1000, 2)} for r in rows}


# --- driver --------------------------------------------------------------------------------

def parse_args(argv, prog: str = "python -m bench.run"):
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--events", type=int, default=1_000_000, help="events for a, b, c, f, g (default 1M)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--only", default=",".join(SECTIONS), help="sections to run, e.g. a,b,g (default: all nine; h runs b's run-all and the d, e stream)")
    p.add_argument("--rate", type=int, default=5000, help="(d, e) feed rate, events/s (default 5000)")
    # Issue 16 judges latency and state over at least five minutes of feed.
    p.add_argument("--stream-seconds", type=float, default=300, help="(d, e) how long to feed (default 300)")
    p.add_argument("--warmup-seconds", type=float, default=15,
                   help="(d) files landed in the feed's first seconds are not counted (default 15)")
    p.add_argument("--drain-seconds", type=float, default=300,
                   help="(d, e) after the feed, at most this long for gold to catch up (default 300)")
    p.add_argument("--startup-timeout", type=float, default=300,
                   help="(d, e) at most this long for the three jobs to start (default 300)")
    p.add_argument("--interval", help="(d, e) TRIGGER_INTERVAL for every layer, e.g. '1 second' "
                                      "(default: the per-layer intervals in conf)")
    p.add_argument("--light-rate", type=int, default=LIGHT_RATE,
                   help=f"(d) the light rate, events/s, at which neither run saturates the cores (default "
                        f"{LIGHT_RATE}; 0: no light run)")
    p.add_argument("--light-interval", default=LIGHT_INTERVAL,
                   help=f"(d) the light run's intervals, for the pipeline and the plain run alike: one "
                        f"duration for every layer, or 'bronze=...,silver=...,gold=...' (default "
                        f"{LIGHT_INTERVAL!r})")
    p.add_argument("--light-seconds", type=float, help="(d) how long to feed the light rate (default: --stream-seconds)")
    p.add_argument("--throughput-rates", default=THROUGHPUT_RATES,
                   help=f"(i) the feed's steps, events/s, ascending (default {THROUGHPUT_RATES})")
    p.add_argument("--throughput-seconds", type=float, default=180,
                   help="(i) how long each step feeds at least (default 180: issue 60's 3 minutes; a step "
                        "lasts up to 3x longer when the step before predicts commits too far apart to judge it)")
    p.add_argument("--throughput-drain-seconds", type=float, default=120,
                   help="(i) after each step, at most this long for gold to show every file (default 120)")
    p.add_argument("--throughput-speedup", type=float, default=120,
                   help="(i) event-time seconds per second of feed (default 120: (d)'s 10 gold watermarks "
                        "in 300 s)")
    p.add_argument("--throughput-interval", help="(i) intervals of both runs, as --light-interval (default: --interval)")
    p.add_argument("--quiet-files", type=int, default=5, help="(h) files in the quiet feed (default 5)")
    # 20 s was not quiet: after a fresh start one file's batches take 25-30 s end to end.
    p.add_argument("--quiet-gap", type=float, default=40,
                   help="(h) seconds between the quiet feed's files (default 40)")
    p.add_argument("--watermark-multiple", type=float, default=10,
                   help="(e) event-time span of the feed, in gold watermarks (default 10)")
    p.add_argument("--keep", action="store_true", help="keep the benchmark lakehouses")
    args = p.parse_args(argv)
    args.sections = {s.strip() for s in args.only.split(",") if s.strip()}
    if not args.sections or args.sections - set(SECTIONS):
        p.error(f"--only takes letters from {','.join(SECTIONS)}, got {args.only!r}")
    if args.events < 100:
        p.error("-n must be at least 100 (the incremental phase appends 1%)")
    try:
        from bench.steady import parse_steps

        parse_steps(args.throughput_rates)
        for spec in (args.interval, args.light_interval, args.throughput_interval):
            interval_env(spec)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None, prog: str = "python -m bench.run") -> int:
    from common.config import load_config

    args = parse_args(argv, prog)
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    run_dir = OUT / f"run-{stamp}-{args.events}"
    run_dir.mkdir(parents=True)
    result = {"events": args.events, "seed": args.seed, "cores": os.cpu_count(), "sections": sorted(args.sections),
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "load_at_start": [round(x, 1) for x in os.getloadavg()], **provenance()}
    env = base_env(run_dir / "lakehouse")
    cfg = load_config(env=env)
    # (h) has nothing to time when Spark runs no watermark-only batch: the summary says so.
    result["no_data_batches"] = cfg.streaming.no_data_batches
    session = Session(cfg)
    errors = result.setdefault("errors", {})

    def phase(name, fn, *a):
        """A failed phase is reported and the others still run (and are still written)."""
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001 - one broken figure must not lose the other six
            errors[name] = f"{type(e).__name__}: {e}"
            print(f"error in {name}: {errors[name]}", file=sys.stderr, flush=True)
            return None

    try:
        measure_figures(args, run_dir, env, cfg, session, result, phase)
    finally:
        session.stop()
    save(result, stamp, args, run_dir)
    return 1 if errors else 0


def measure_figures(args, run_dir: Path, env: dict, cfg, session, result: dict, phase) -> None:
    """The selected figures, in the order that lets each reuse the one before (b needs the data
    a generated, c appends to what b ran, e reads what d streamed)."""
    if args.sections & (set("ag") | RUN_ALL_FIGURES):
        log(f"generating {args.events:,} events")
        manifest = phase("generate", generate, env, run_dir, args.events, args.seed, ("--span", SPAN))
        if manifest:
            result["records"] = manifest["records"]
            if "a" in args.sections:
                log("(a) engine ceiling: landing files -> explode -> noop, by spark.read.text and by binaryFile")
                from bench.ceiling import measure
                result["ceiling"] = phase("a", lambda: measure(session(), str(cfg.landing), args.events,
                                                                    cfg.profile))
            if args.sections & RUN_ALL_FIGURES:
                result["throughput"] = phase("b", throughput, session, cfg, env, run_dir, args.events,
                                             result.get("ceiling"))
                result["quality"] = phase("f", quality, session, cfg)
                result.setdefault("empty_batches", {})["run_all"] = phase("b", empty_batches, session, cfg)
            if "g" in args.sections:
                result["baseline"] = phase("g", baseline, session, cfg, run_dir, args.events,
                                           result.get("throughput"))
            if "c" in args.sections and result.get("throughput"):
                result["incremental"] = phase("c", incremental, session, cfg, env, run_dir, manifest, args.seed)
    if args.sections & STREAM_FIGURES:
        streamed = phase("d,e", stream_phase, args, run_dir)
        if streamed:
            latency, span, scfg = streamed
            if "d" in args.sections:
                result["latency"] = latency
                latency["plain"] = phase("d", plain_stream, args, run_dir, span["span_s"])
            if "e" in args.sections:
                result["state"] = phase("e", state, session, scfg, span)
            result.setdefault("empty_batches", {})["stream"] = phase("d,e", empty_batches, session, scfg)
    if "h" in args.sections:
        qcfg = phase("h", quiet_phase, args, run_dir)
        if qcfg:
            result.setdefault("empty_batches", {})["quiet"] = phase("h", empty_batches, session, qcfg)
    if "d" in args.sections and args.light_rate:
        # The light rate: same feed, seconds and event-time span, the light intervals for both runs.
        seconds = args.light_seconds or args.stream_seconds
        light = phase("d light", stream_phase, args, run_dir, args.light_rate, seconds, args.light_interval, "-light")
        if light:
            result["latency_light"], span, _ = light
            result["latency_light"]["plain"] = phase("d light", plain_stream, args, run_dir, span["span_s"],
                                                     args.light_rate, seconds, args.light_interval, "-light")
    if "i" in args.sections:
        result["sustained"] = phase("i", sustained, args, run_dir)
        if (result["sustained"] or {}).get("plain_error"):
            errors = result.setdefault("errors", {})
            errors["i"] = result["sustained"]["plain_error"]


def save(result: dict, stamp: str, args, run_dir: Path) -> None:
    """The results as JSON and markdown in bench-results/, the table on stdout, and
    docs/benchmark.md rewritten from them."""
    for key in [k for k, v in result.items() if v is None or v == {}]:
        del result[key]
    result["load_at_end"] = [round(x, 1) for x in os.getloadavg()]
    result["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    base = OUT / f"bench-{stamp}-{args.events}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    base.with_suffix(".md").write_text(summary.markdown(result))
    if not args.keep:
        for d in run_dir.glob("lakehouse*"):
            shutil.rmtree(d, ignore_errors=True)
    print()
    print(summary.text_table(result))
    print(f"\nresults: {base}.json, {base}.md (logs in {run_dir})")
    try:
        page, _ = docs_page.write(base.with_suffix(".json"))
        print(f"docs: {page} rewritten from this run")
    except OSError as e:   # the results are saved; a read-only checkout must not fail the run
        print(f"warning: could not rewrite the benchmark docs page: {e}", file=sys.stderr)
    print(summary.summary_line(result))


if __name__ == "__main__":
    sys.exit(main())
