"""docs/benchmark.md, written from the bench's saved results, so the figures in the docs are
always a run's own and never retyped by hand.

    python -m bench.docs_page [--results DIR_OR_JSON] [--out PATH]

`make bench` (bench/run.py) calls write() with the JSON it has just saved; run this to rebuild
the page from what is in bench-results/ without running the bench again. The page is a fixed
explanation of figures (a)-(i) and their targets, then the latest run's table (bench/summary.py's
rows, each with its target met, MISSED or not measured), its date, N, commit and machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import summary

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench-results"
DOCS = REPO / "docs" / "benchmark.md"
# Where the page's fixed text ends and the run's figures begin.
LATEST = "## Latest run"

# (letter, name, what is measured and how, key(s) in summary.TARGETS, another figure's letter
# the target is read against, or None for a figure given as information)
FIGURES = [
    ("a", "engine ceiling",
     "Spark alone: the landing files, silver's JSON schema and the cameras explode, into the `noop` "
     "sink, with the lines read two ways: `spark.read.text`, and bronze's binaryFile read and line "
     "split; each best of two runs in one session, the faster method is the ceiling "
     "(`bench/ceiling.py`). Information only: issue 60 retired (b)'s target against it.", None),
    ("b", "layer and end-to-end throughput",
     "`python -m pipeline` (available-now) on a fresh lakehouse; per layer its wall time (from the "
     "jobs' `done` lines, JVM start-up included) and its processing span (first trigger to last batch "
     "end, from `ops.query_progress`); end-to-end against (g): `run-all`'s rate as a multiple of "
     "the plain baseline's over the same files (so (g)'s target is (b)'s), and as information a "
     "multiple of (a).", "against (g)"),
    ("c", "incremental cost",
     "+1% events continuing in event time, then the incremental `run-all`, against "
     "`bench/recompute.py`: all layers recomputed from scratch in one batch process with the same "
     "transform functions (gold as the audit's prefix check rebuilds it; no quality gates, so the "
     "recompute is if anything flattered).", "incremental"),
    ("d", "latency, against plain Structured Streaming, at two rates",
     "`run-all --trigger processing-time` on a fresh lakehouse, a feeder landing one file per second "
     "at `--rate` events/s (heavy, default 5,000) for `--stream-seconds`; per file, landing time "
     "to the first silver commit whose lineage (Delta `userMetadata`) consumed the bronze commit "
     "of the batch that read the file, and to the first gold commit that consumed that silver "
     "commit (`bench/latency.py`, from the checkpoints and Delta logs, nothing added to the "
     "product); gold for `gold.zip_hourly_sightings` and as the max over the gold tables. Then "
     "the plain counterpart on a fresh lakehouse, same feed, same intervals "
     "(`bench/baseline_stream.py`, one session): (g)'s bronze and silver as processing-time "
     "appends, and fresh gold as a Spark user writes it: the hourly sightings per zip in update "
     "mode, upserted into Delta by `foreachBatch` + MERGE, idempotent by Delta's "
     "`txnAppId`/`txnVersion` (the batch id); (g)'s 10-minute activity and sessions run beside it "
     "in append mode so the cores carry what the pipeline's gold also computes. Its files are "
     "timed the same way: to the first silver commit holding the file's events, then to the first "
     "fresh-gold commit whose batch read silver through that commit (its end offset in the "
     "checkpoint). Both again at `--light-rate`, a rate at which neither run saturates the two "
     "cores, with `--light-interval`'s triggers for both. Files landed in the first 15 s are not "
     "counted; files still not visible at the end count with the time they had waited (lower "
     "bounds). Each run reports how busy the cores were during its feed (`/proc/stat`).",
     ("latency_silver", "latency_gold")),
    ("e", "bounded state",
     "The same streaming run, whose event time spans 10x the gold watermark; gold state rows (sum "
     "over the three queries, from `ops.query_progress`) first/peak/last and samples; flat if the "
     "second half's peak is within 25% of the first half's, judged only when gold's watermark moved "
     "at least 3 watermarks.", "state"),
    ("f", "quality share",
     "`sum(quality_ms) / sum(batch_ms)` of silver in `ops.batch_accounting`; `quality_ms` is what "
     "the gate adds to a batch: GX validation (its `ops.dq_results` commit runs beside the data "
     "writes).", "quality"),
    ("g", "against plain Structured Streaming",
     "`bench/baseline.py`, what a user following the Databricks examples would write instead: one "
     "process and SparkSession (same Spark conf), bronze (text -> Delta), silver (`from_json` + "
     "explode, watermark + `dropDuplicatesWithinWatermark`, stream-static join with "
     "`device_locations`) and gold (hourly sightings per zip, 10-minute activity sliding 5 minutes, "
     "`session_window` sessions) one layer after the other, available-now, append mode, no gates, "
     "accounting, lineage or MERGE; on its own fresh lakehouse over (b)'s landing files, after (b) "
     "and before (c). Reported as (b)'s `run-all` wall over the baseline's wall, both including "
     "Python and JVM start-up, with the share of the CPU other processes took during each run "
     "(`bench/contention.py`, from `/proc`: on a shared machine the ratio means little if only one "
     "of them ran under load). The same sampling splits each run's own CPU seconds by the part "
     "that spent them, from the threads' names (`part_of`): Spark's tasks, the driver JVM's calls "
     "from Python (plans, writes, Delta commits) and its streaming engine, JIT, GC, other JVM "
     "threads, the Python driver and Python workers; the parts where run-all spends the most "
     "beyond plain Spark come first.", "baseline"),
    ("h", "empty batches",
     "Per query, the median duration of its batches that read no row (they move the watermark, "
     "evict state, close sessions the watermark passed), from `ops.query_progress`: in (b)'s "
     "`run-all` (each query's last, watermark-only batch), in the streaming run of (d, e) (on "
     "saturated cores, behind the next files' tasks), and in a quiet feed: `run-all --trigger "
     "processing-time` given a file of 500 events every 40 s (`--quiet-files`, `--quiet-gap`), "
     "so each query runs the batch that closes what its watermark passed with the cores idle: "
     "the batch's own cost. A query's first batch of a run is left out (it pays for the query's "
     "start).",
     "empty"),
    ("i", "sustained throughput",
     "The feed stepped up (`--throughput-rates`, default 4,000, 8,000, 16,000 and 32,000 events/s, "
     "each for `--throughput-seconds`, default 180, or longer when the step before predicts "
     "commits too far apart to judge this one: `bench.steady.step_seconds`, at most 3x), into "
     "`run-all --trigger processing-time`, "
     "then into the plain run of (d) (fresh gold included), each on a lakehouse of its own with "
     "(d)'s heavy intervals. After each step's feed the run gets up to "
     "`--throughput-drain-seconds` (default 120) to show every file in gold, so each step starts "
     "from an empty backlog; the steps stop at the first one the run did not keep up with. Kept "
     "up with (`bench/steady.py`), for silver and for the hourly gold table, judged at the "
     "layer's commits between the end of the step's first third and the end of its feed: after "
     "each commit the backlog (files landed minus files visible) and the commit's latency (its "
     "time minus the landing of the oldest file it showed); the step is kept up with when every "
     "file was visible by the end of the drain and neither figure grew: the late half of the "
     "commits' mean at most 25% above the early half's, or above it by no more than one batch "
     "(the median time between the commits, at least 2 s; for the backlog the files landed in "
     "that time, at least 2). A step with fewer than four such commits is not judged, and ends "
     "the steps. The figure is the highest step rate "
     "kept up with (a lower bound when every step was), and pipeline / plain.", "sustained"),
]

HEAD = """\
# Benchmark

`make bench` measures nine figures of the pipeline on this machine in one run, (a) to (i)
below, and marks each target met or MISSED; this page is written by the bench itself
(`bench/docs_page.py`) from the results it saved in `bench-results/`, so do not edit it by hand:
`python -m bench.docs_page` rebuilds it from the latest saved results without running the bench.

## Running it

```bash
make bench                      # BENCH_N events, default 1,000,000
make bench BENCH_N=20000        # fewer events
make bench ONLY=a,b,f,g         # a subset of the figures
make bench ONLY=h               # (h) alone: runs (b)'s run-all, the (d, e) stream and the quiet feed it times
make bench BENCH_ARGS="--rate 5000 --stream-seconds 300 --interval '2 seconds'"
make bench ONLY=d BENCH_ARGS="--light-rate 200 --light-interval 'bronze=10 seconds,silver=10 seconds,gold=10 seconds'"
make bench ONLY=i BENCH_ARGS="--throughput-rates 1000,2000 --throughput-seconds 40"   # a smoke run of (i)
.venv/bin/python -m bench.run --help
.venv/bin/python -m bench.batch_profile   # a light-load silver and gold batch, job by job (issue 60)
```

The bench prints a table, then a summary line with each target marked. JSON and Markdown go to
`bench-results/bench-<time>-<N>.{json,md}` (git-ignored), each phase's logs to
`bench-results/run-<time>-<N>/`. (d) and (e) come from one streaming run on its own fresh
lakehouse (the heavy rate's; the light rate and each plain run get their own, and so do (i)'s
two runs); (a), (b), (c), (f) and (g) read the first lakehouse's landing files ((g) runs before
(c) appends to them). A failed phase is reported and the others still run. `make bench-audit`
(`bench/audit_versions.py`) times `make audit` on a gold table with `VERSIONS` versions (default
50), results in `bench-results/audit-<time>.json`.

## What each figure measures

| | figure | what is measured, and how | target |
|---|---|---|---|
"""

READING = """\
## Reading the figures

Where the time goes is fixed costs, not rows:

- A Delta commit has a fixed cost of its own however small it is (write job, commit, snapshot
  update, a few small jobs); silver makes up to four per batch, gold one per table the batch
  changed plus one `ops.dq_results` append for all its gates. They run at once per batch, so a
  batch costs its slowest commit rather than their sum.
- Gold is one query: each batch reads silver once and shuffles it once by device for every gold
  table. Windows keep no Spark state (the batch's partial aggregate is folded into the window's
  row in the table, so only measures that combine are accepted: count, sum, min, max, max_by,
  min_by); sessions keep theirs in `applyInPandasWithState`. Gold's state is open sessions.
- Available-now runs snapshot their state stores at every commit: with changelog checkpointing
  a run ended before the maintenance thread uploaded a snapshot, and each start replayed every
  changelog since the query began (silver's incremental run at 1M: about 30 s down to 21 s).
- Appends keyed by their batch are blind unless the batch is a replay after a crash: Delta
  4.4's own key (`txnAppId`) rebuilds the table's state to look up the last batch written, three
  Spark jobs, about 0.35 s of a one-row ops append's 0.5 s (a blind append takes 0.12 s).
- A gold batch reads and MERGEs only what it can change: its fold reads the windows not
  finalized and those ending after its earliest event, and its MERGE bounds `t.window_start` by
  the earliest window it changes, so Delta skips older windows' files. Before, both joined the
  table's whole history every batch. At the bench's sizes (gold 0.5 MB) that made no measurable
  difference; `python -m bench.gold_history` folds one 2,000-window batch into an hourly table
  of 2,000,000 finalized windows (83 days of 1,000 zip codes): fold 2.01 s and MERGE 1.79 s
  against 7.40 s and 3.37 s unbounded (medians of 3, alternated).
- Spark runs the watermark-only batch (`streaming.no_data_batches: true`, its default): at the
  end of an available-now run, and in a stream once when the feed goes quiet (at most one per
  batch with rows, and only when no row waits, so a stream with a backlog runs none). Gold flags
  closed in it, with one UPDATE per table, the sessions it timed out and the windows it made
  final (a MERGE of the same rows took 14.6 s at the end of a 20,000-event demo). Before,
  with them off, an available-now run ended after its last batch with rows and everything stayed
  open (after `make demo`, 0 of 2,505 sessions closed and 0 of 933 windows finalized). (h) times
  these batches. A fresh gold table's first batch is an append, not a MERGE.
- Spark also runs a batch that reads no row when the table a query reads gets a commit that
  changes no data (a compaction: auto-compaction, `make maintain`, the runner's maintenance).
  Gold closes in it only what a watermark newer than its last batch's passed; under the same
  watermark it writes nothing. Both layers count a batch in the job that fills its cache: an
  observed no-op write, one stage, where `agg(...).first()` added a one-task stage behind a
  shuffle (on a busy machine it waits for a core behind the other layers' tasks).
- The JIT is a large share of the CPU in a short-lived JVM. C1-only (`spark.jit: c1`) saves CPU
  but not wall time in a long process; `auto` keeps C1 for available-now runs.
- The garbage collector: `auto` (`spark.gc`) runs available-now runs on the throughput collector
  (ParallelGC), processing-time ones on G1. Alternated in one hour: a fresh 20,000-event
  `run-all` 25.24 s mean of four with G1, 24.50 s with ParallelGC; a 1M-event incremental one
  30.3 / 29.5 s against 29.2 / 29.0 s; a fresh 1M one 87.0 / 89.5 s against 86.3 / 86.2 s. The
  baseline (g) runs on the same settings.
- The class archive (`common/class_archive.py`) cannot hold a class of a signed jar, and pyspark
  ships Spark's code generator (janino, commons-compiler) signed: every JVM read and verified
  those ~370 classes from the jars. Setup puts unsigned copies first on the driver's classpath;
  alternated in one hour, a fresh 20,000-event `run-all` went from 27.4 / 28.5 s to 26.2 /
  26.6 s and a 1M-event incremental one from 31.1 / 30.9 s to 29.1 / 30.1 s. Training the
  archive on a second, incremental run as well (the ~250 classes MERGE and data skipping load)
  measured no gain and was dropped.
- The baseline (g) pays none of: MERGE, gates, accounting, lineage, quarantine, sessions' MERGE.
- The driver JVM does most of the work: a 20,000-event `run-all` used about 43 s of JVM CPU
  against the baseline's 24 s over the same files, and about 4 s of Python (foreachBatch code,
  GX). A JFR profile of it put ~20% of the JVM's CPU in generating and compiling code for the
  many small plans; whole-stage codegen is now off (`common/spark.py`), which helps below a
  million events and costs nothing at a million, except in silver's large batches (below,
  "Silver's parse fused").
- Spark caches the classes it compiles by their source, 100 by default: fewer than one round of
  the pipeline's plans needs, so in a long-running process every batch recompiled what the one
  before had. In `make bench-audit`'s loop (a silver commit and a gold batch a version, warm JVM)
  that was about 80 compiles a version; with a cache of 2,000, 6 (code that inlines a batch's
  literals). Four interleaved pairs: 7.8 / 9.0 / 9.5 / 8.2 s a version before, 8.0 / 8.4 / 5.7 /
  7.2 s after; driver JVM CPU (the last two pairs) 11.2 / 9.8 s against 7.0 / 8.8 s a version.
  An available-now run compiles each plan once and is unchanged.
- Every PySpark call that builds a plan (a `select`, an `F.col`, a `when`) went to the JVM about
  five times more than it needed: PySpark's DataFrame debugging (`spark.python.sql.
  dataFrameDebugging.enabled`, on by default) asks for the active session and a conf, captures
  the Python stack and sets then clears the call site, on every call. Silver's plan is about
  4,500 such calls (1.1 s warm, 0.55 s with it off), and each micro-batch builds its writes,
  gates and MERGEs anew, on threads that share one Python interpreter. Off: in the streaming run
  (d), alternated in one hour, landing -> gold p50 / p95 33.1 / 49.5 and 37.1 / 49.1 s against
  38.7 / 55.2 and 38.3 / 52.6 s; silver's batch median 9.2 / 9.8 s against 12.5 / 10.2 s, gold's
  11.9 / 12.6 s against 15.1 / 13.5 s. An analysis error no longer names the Python line that
  built the failing expression.
- Python's bytecode: uv installs packages without compiling them (pip compiles by default), and
  where Python may not write its cache (`PYTHONDONTWRITEBYTECODE`, set on this machine and in CI)
  every process compiled what it imported again: the pipeline's driver, each Python worker Spark
  starts for the sessions, each tool and test subprocess. Importing pyspark, pandas, pyarrow, GX
  and delta took 8.4 s, 3.3 s compiled. Setup compiles the venv (`uv pip install
  --compile-bytecode`: 14 s, 155 MB). A fresh `run-all`, alternated in one hour (2026-11-30),
  without / with: 20,000 events 56.5 and 46.0 s (1.67x and 1.33x the baseline) against 41.5 and
  43.3 s (1.35x and 1.30x); 200,000 events 74.7 s (1.60x) against 65.2 s (1.42x). The baseline
  imports pyspark too and gains a little. The test suite's time did not move (2,639 s, 2,619 s):
  its tests run in one process.
- Start-up at 20,000 events (the largest gap to the baseline there): the session is ready after
  about 9 s, bronze's table after 3.5 s more (the first Delta operation of a cold JVM), and silver
  waits about 3 s after bronze for its dimension's seed, which ran beside bronze's batch. The GX
  import that checks the suites (2-6 s of Python) runs beside the JVM's start and ends before the
  session is up. Leaving it to silver's first batch started bronze 2-3 s sooner but added as much
  to silver: whole runs 60.7 / 65.6 s against 57.4 / 66.4 s, so it stays where it is. That import
  took 5.5 s of CPU, 2.3 s of it in modules no gate here uses: charts (altair) and the
  distribution tests of a few expectations (scipy.stats). `common.quality.import_gx` loads those
  lazily (importlib's LazyLoader: on first use only), 3.3-3.8 s. A 20,000-event `run-all`, four
  pairs alternated: bronze started at 6.3-7.1 s instead of 7.1-7.8 s, gold was done at
  24.8-26.9 s instead of 25.5-27.3 s.
- Silver's parse is per-record CPU: JSON parsing, the two timestamps parsed and formatted (the
  event id hashes them), SHA-256, and the reason checks. The checks must stay in generated code:
  a reason list built with `filter(array(...))` (a higher-order function) made Spark evaluate
  every check under it row by row, `is_valid_utf8` through reflection; concatenated one-element
  arrays give the same codes generated (`silver/transform.py` `_reasons`), and the record regexes
  run only on lines whose first and last bytes cannot decide. Parsing 200,000 events took 30% less
  JVM CPU, and the cache of each batch is kept uncompressed (compressing it was 9% of a run-all's
  task CPU); at 200,000 events silver's layer went from 55.7 / 53.7 s to 43.5 / 47.3 s of
  run-all, in interleaved pairs in one hour.
- Local files go through `jvm/localfs` (Java's file API): Hadoop without its native library
  forked `chmod` for every file it created and `readlink` for every checkpoint or log rename,
  and a streaming run spent half its CPU in system time doing so. The baseline (g) uses it too.
- Bronze splits a landing file's bytes into lines in one pass (`jvm/bronze-lines`). Spark's own
  `split` works on decoded text, so the lossless way decoded each file as ISO-8859-1, split it
  and encoded every line back: on the 1,000,000-event landing (630,005 lines, 294 MB) into the
  `noop` sink that took 7.3-8.1 s (11-13 s of JVM CPU), the byte splitter 2.2-3.0 s (3.8-5.0 s),
  with the same rows and bytes.
- Silver looks for keys a profile does not declare with one streaming scan of each record
  (`jvm/silver-keys`) and parses again only the records that have one; the second parse of every
  record had cost 6-10 of the ~20 s of JVM CPU of silver's parse at 200,000 events. Interleaved
  in one process on the bench's 200,000 events: 16.3 core-s before, 12.0 with the scan (medians
  of six), with the same rows. The scan reads each record's UTF-8 bytes: given text, Spark decoded
  every record into a Java string for it, and the scan alone cost 0.90 core-s for 124,711 records
  against 0.52 on the bytes (medians of eight, the same records flagged).
- Gold's sessions and the Python workers (2026-12-02): the state function folded each event in
  as a Python dict (4.4 s of a core per 200,000 events); it now groups a batch's events with
  numpy and sweeps only the groups and the open sessions (0.14 s, the same sessions, ids and
  latest values). Spark puts its zip copies of pyspark and py4j ahead of site-packages on the
  workers' path, and a zip's modules are compiled from source in every process (1.0-1.2 s of a
  core per daemon start and for what each worker imports): the daemon (`common/python_daemon.py`)
  moves them behind the installed packages and imports pandas and pyarrow once before it forks.
  The locations seed no longer starts Python workers at all (a literal plan). (g)'s Python
  workers went from 8.6 to 2.6 core-s; `run-all` alternated with the previous commit on one
  200,000-event landing: 104.5 / 98.6 s before, 86.1 / 91.8 s after.
- The ops rows every batch writes (accounting, progress, quality results) were built from
  Column literals, four calls into the JVM per cell: 70-125 ms for one accounting or progress
  row, 290-410 ms for a gate's nine results. They are now one SQL expression parsed by one call
  (`common/literal_frame.py`): 23-29 ms and 44-62 ms. `run-all` alternated with the commit
  before, one 200,000-event landing (2026-12-02, a slower machine): 121.1 / 108.3 s before,
  107.6 / 99.5 s after.
- A gold batch costs Delta's work per table version more than its rows: the 13-row gold batches
  of `make bench-audit` took about 6 s each, 4.4 s of it in the MERGE. Before skipping files,
  Delta 4.4 rebuilds the state of the version a MERGE reads and computes its size (`filesForScan`
  asks for it): a scan of the log's JSON and an aggregation, 1.7 s of those 4.4 s, once per table
  per batch whatever the batch changed. Its checksum file lists every file of a small table, but
  open-source Delta does not read the files from it. That state is built in one task
  (`spark.databricks.delta.snapshotPartitions` 1): those batches went from 8.8-9.4 s to 8.0-9.2 s
  a version, silver commits included.
- In the streaming run (d), with the intervals of the time (bronze 5 s, silver 10 s, gold 30 s),
  an event waited for triggers more than for work: stage medians bronze 2.9 s, silver 15.1 s,
  gold 38.4 s, with silver's batches at 5.4 s and gold's at 9.8 s. Silver and gold now trigger
  every second (a batch as soon as the one before has committed something new); bronze keeps 5 s:
  at 1 s it ran a batch per landing file (215 of 0.65 s median in 5 minutes, against 62). Same
  hour, 5,000 events/s: p50 / p95 38.4 / 51.8, 38.7 / 52.0, 38.2 / 52.2 s with 5/10/30 s;
  31.7 / 43.9 s with 1/2/5 s; 25.6 / 35.5, 25.9 / 36.4 and 26.8 / 38.0 s with 5/1/1 s. The two
  cores are then 96-99% busy (/proc/stat over the feed), so what is left is work per event. Where
  it goes, per thread of the run-all process over a 5-minute feed at 5/10/30 s (443 CPU-s; a run
  at 5/1/1 s, with -XX:CompileThresholdScaling=3, used 608): executor tasks 151, the JIT's
  compiler threads 109 (C2 most, falling from 16 s to 4 s per 30 s as the run warms), stream
  execution 42, py4j threads 36, Python 36, GC 27. C1 alone (conf spark.jit c1) cut compiling to
  12 s but made the tasks 82% slower (275 s): p95 72.7 s. ParallelGC instead of G1: same p95 (52.2
  s). Gold's MERGEs (Delta's own metrics, median per table): 2.8-3.5 s each, of which 1.1-1.7 s
  materializing the source (the rows behind the watermark to close are read from the table
  there), about 1 s finding the touched files and 0.6-0.8 s rewriting them; the three run side
  by side. Gold's state stays at its open sessions (53 rows at 1.5M events; the three queries
  before it kept 2,500 and growing).
  The quality gates weigh more there than in (f), where one batch pays the gate once. A clean
  batch's gate is now one GX validation, each rule asking only for the detail its outcome
  needs: 9 Spark jobs on a batch cached in two partitions, where the two validations before
  ran 13 (5 and 7 in one partition), and 0.49-0.61 s alone on 20,000 silver rows instead of
  0.64-0.81 s. In two streaming runs (N = 20,000) ten minutes apart, before and after: silver's
  median gate 774 -> 477 ms, its share of silver's batch time 20.7% -> 15.0%; gold's gates
  (one validation each already) 1.28 s median, 21% and 19% of its batch time; p95 53.7 s and
  53.1 s, so the latency is unchanged.
  GX computes a validation's metrics level by level, each level one aggregate over the whole
  batch, and over several partitions each aggregate is two Spark jobs (the exchange's map stage
  is a job of its own). It also counted the rows, in a level of their own, although every
  caller knows the count. A batch below `spark.gate_one_task_below_rows` (100,000) is now
  validated as one partition, and its row count is given to GX (`common.quality`): a gold table
  whose rules are all single-column (sightings, daily devices) gates in one job instead of four,
  and one with a column-pair rule of its suite (activity, sessions) in three. The quiet feed
  (`bench.batch_profile`, two runs each, alternated, 2026-12-03, a slow spell): gold's gate jobs
  12 -> 8 per data batch, their summed time 1.27/1.95 s -> 0.41/0.36 s; silver's data batch
  (304 rows) 11 -> 10 jobs, median 4.11/3.71 s -> 2.78/2.61 s; gold's data batch median
  11.70/13.20 s -> 11.41/10.99 s.
- What plain Structured Streaming reaches at (d)'s rate on this machine: after the pipeline's
  5-minute feed of 5,000 events/s (1M-event bench, 15:38 on 2026-11-28), the same feed into
  (g)'s plain layers as processing-time queries of one session (`bench/baseline_stream.py`)
  brought a file into silver in p50 6.67 s, p95 10.92 s (cores 91% busy); the pipeline took
  12.08 / 19.55 s to silver and 23.37 / 34.76 s to gold (cores 99% busy). A 150-s feed earlier, in
  separate runs: plain 7.89 / 11.43 s, the pipeline 14.78 / 20.92 s to silver. So on two cores plain
  Spark alone does not reach silver within 10 s at p95, before any gold batch: (d)'s 10 s to gold
  is out of this machine's reach. The pipeline's silver costs about 1.8x the plain one's (the
  gate, quarantine, accounting, lineage and idempotent appends), and gold adds a batch of 10-12 s
  on the same cores.
- What plain Spark reaches against the ceiling (a) at 1,000,000 events: the baseline (g) took
  116.4 s against a ceiling of 15.02 s on 2026-11-26 (0.129x) and 69.4 s against 8.18 s on
  2026-11-28 (0.118x). Issue 60 retired (b)'s target for that reason: (a) stays as information
  and (b) is read against (g). (b)'s old 0.25x would have needed `run-all` at about twice plain Structured
  Streaming's speed while doing more (gates, quarantine, accounting, lineage, MERGE): out of
  reach on this machine. Where the pipeline's time goes past the baseline's at 1M (2026-11-28,
  103.3 s against 69.4 s): start-up to bronze's first batch about 9 s against 3.3 s (the GX import
  beside the JVM, table set-up, the ops tables); bronze 11.1 s against 3.5 s (whole files read
  and split into lines with their numbers, then written partitioned by ingest date: the plain
  text reader has neither line numbers nor a partition sort); silver 64.2 s against 48.6 s (per
  task at 200,000 events: the parse 7.1 s against 4.7 s, with reason codes, lineage and the raw
  line carried; the batch cached, then written, 3.6 + 3.0 s against 3.9 s for dedup and write in
  one pass); gold 18.8 s against 12.5 s (sessions through Python and Arrow, folds and gates).
- Measured and dropped: starting silver's and gold's queries beside bronze in available-now
  runs (processing-time triggers every 200 ms, each layer drained with `processAllAvailable`
  once the one before it ended). A fresh 20,000-event `run-all`: 23.6 / 26.4 / 24.8 / 25.3 /
  26.8 s against 26.3 / 26.2 / 25.2 / 28.2 / 27.2 s, alternated; the 1M incremental run 33.1 /
  29.9 / 29.5 s against 33.4 / 29.5 / 31.2 s. The gain at 20,000 came mostly from an extra gold
  batch over the still-empty silver table (4.7-4.9 s, warming gold up beside silver's batch),
  which (h) would count as a batch that read no row. On two busy cores the overlap moves CPU
  more than it saves. Also measured without a gain beyond noise: not registering the table names
  in the pipeline's own session (0.8 s of start-up at 1M; the 1M incremental run 35.0 / 33.3 s
  against 34.9 / 30.2 s) and `spark.sql.maxConcurrentOutputFileWriters` 4 (no sort before a
  partitioned write: bronze's 1M batch 7.4 / 7.1 / 7.1 s against 7.7 / 7.5 / 7.0 s).
- Issue 60 compares (d) with plain Structured Streaming's fresh gold, not only its silver. A
  plain append-mode window is written once the watermark has passed it (an hour of event time
  here), so it is no peer for gold's latency; what a Spark user writes for fresh gold is an
  update-mode aggregation upserted by `foreachBatch` + MERGE (`bench/baseline_stream.py`),
  made idempotent the way Delta documents for MERGE: `spark.databricks.delta.write.txnAppId` and
  `txnVersion` (the batch id) on the batch's session, which the query's own clone keeps from the
  other queries. It pays what the pipeline's gold pays per batch and a table: Delta's check of
  the transaction key (the table's state rebuilt for each new version) and the MERGE's scans. The
  plain 10-minute activity and sessions stay beside it in append mode and are not timed: the
  pipeline's gold query computes four tables in each batch, and a plain run with only the hourly
  one would have left its cores to silver. Its gold visibility comes from the fresh-gold query's
  offset log (which silver version each batch read through) and the batch id in each commit's
  transaction key; Spark keeps only the last 100 offset entries, so the bench reads them every
  second while the run goes. In the first smoke runs (2026-11-29, shared machine), at 500
  events/s for 40 s with 1-s triggers: pipeline landing -> silver p95 55.6-62.4 s against the
  plain 30.4-33.4 s (1.83-1.86x), landing -> gold 76.1-91.7 s against the plain fresh gold's
  46.5-46.7 s (1.64-1.96x).
- (d)'s light rate is 200 events/s (the soak's rate) with 30-s triggers for every layer, in both
  runs (`--light-rate`, `--light-interval`). The rate alone cannot unload the cores: a 1-s
  trigger starts the next batch as soon as the last one ends once new data has arrived, and at
  light load the pipeline's silver batch takes 4.1-7.5 s and gold's 8.7-12.4 s (`make soak`),
  so its queries run back to back at any rate (issue 60: 100% busy at 500 events/s in both). With
  30-s triggers each layer idles between batches: in a 120-s trial feed its bronze batches took
  2.5-3.1 s, silver's 9-17 s and gold's 11-26 s, on cores that other sessions' Spark tests were
  half using. The trials could not show an idle machine's busy share: other processes took
  39-75% of the two cores in each one, so every feed saw the cores 96-100% busy. The busy share
  less the others', at 200 events/s: 1-s triggers (120-s feed) pipeline 46%, plain 36%; 10-s
  (90 s) 40% and 26%; 30-s (120 s) 44% and 25%: what the others left them. Pipeline /
  plain p95 at 200 events/s were 1.79x (silver) and 1.91x (gold) with 1-s triggers, 0.99-1.01x
  and 0.98-1.07x with 10-s and 30-s ones: with longer triggers both runs wait for triggers more
  than for work. The bench reports the busy share of each light run (and what this run and
  other processes took of it); if the pipeline's is near 100% on an idle machine, lengthen
  `--light-interval`.
- (i) is judged at commits (`bench/steady.py`): a second-by-second backlog read the pipeline's
  filling up at a step's start as growth, and the drain's lighter load as a falling latency.
  Two commits against two is the least it compares, and growth within one batch's length (the
  median time between the commits) is batch jitter, not growth: a step too short for the run's
  latency and batch length to give four commits after its warm-up is not judged. The smoke runs'
  40-s steps (gold 80-116 s behind on the shared machine) were not; of the 150-s ones at 250
  events/s, the plain run's were (six gold commits 16 s apart: kept up with), the pipeline's not
  (silver and gold committed every 50-53 s on cores others half used). Doubling steps tell the
  ratio only to within a factor of two: finer steps around both runs' limits narrow it. Each
  step after the first starts from a drained run, so a step the run fell behind on does not
  load the next.
- (i)'s steps were 1,000 to 8,000 events/s until 2026-12-04, and both runs kept up with every
  one (the full run of 2026-11-29 too): no ratio. `make bench ONLY=i BENCH_N=20000
  BENCH_ARGS="--throughput-rates 8000,16000,32000"` that day, at `63d6c2b`: the pipeline kept
  up with 16,000 events/s and fell behind at 32,000 (silver showed 105 of the step's 180 files,
  gold 40, by the end of the drain); the plain run kept up with all three. Pipeline / plain
  <= 0.5x (target 0.8x: MISSED). At 16,000 the pipeline kept up at its edge: silver and gold
  committed every 30 s (four commits judged, the least), their latency 47 -> 60 s and 60 -> 84 s
  over the step, within one batch's length, so not growing; the plain run committed every 5 s
  (latency 13 -> 15 s and 19 -> 20 s), and at 32,000 every 11-14 s. Cores 95-99% busy in every
  step of both runs: at these rates the figure is CPU per event, where the pipeline pays for
  what plain Spark does not do (bronze's byte-exact lines, the event id, the schema contract
  and record checks, the late events kept, the gate, four gold tables by MERGE instead of one;
  see (d)'s heavy-run profile below). The default steps are now 4,000 to 32,000, so a full
  run measures the ratio. The full run of the same day (the latest run below, steps from
  8,000) gave the pipeline 8,000: at 16,000 its gold committed every 37 s, three commits
  fell in the judged part, and a step not judged ends the steps. Run to run the pipeline's
  figure is 8,000-16,000 events/s against the plain run's 32,000 or more. Since then a step
  lasts long enough for five commits in its judged part, by the gaps between the commits of
  the step before scaled by the rates' ratio (`bench.steady.step_seconds`: the full run's 19 s
  between gold commits at 8,000 would have made its 16,000 step 285 s), so a run's figure no
  longer depends on whether its commits happened to fall inside a fixed 180 s.
  `make bench ONLY=i BENCH_N=20000 BENCH_ARGS="--throughput-rates 8000,16000,32000"` with it
  (2026-12-04, 17:26-18:12, at `622ee82`): the pipeline kept up with 8,000 (180 s; silver and
  gold committing every 23 and 25 s) and with 16,000 (377 s; every 48 and 54 s: gold's latency
  95 -> 137 s over the judged commits, within one batch, and its last file in gold 120 s after
  the feed, at the drain's limit), and fell behind at 32,000 (540 s; two commits each after
  the warm-up, 258 and 132 of 540 files in silver and gold after the drain). The plain run
  kept up with all three in 180 s each (gold every 5, 6 and 20 s; p95 28, 27 and 63 s).
  Pipeline / plain <= 0.5x, as in the run at 13:34: the pipeline's limit is about 16,000
  events/s, at its edge, the plain run's above 32,000.
  The default steps on 2026-12-05 (`make bench ONLY=d,h,i BENCH_N=20000` at `986f20b`, after
  silver pinned its batch instead of caching it): the pipeline kept up with 4,000, 8,000 and
  16,000 in 180 s each (gold's latency 63.0 -> 62.7 s at 16,000, p95 99 s) and fell behind at
  32,000 (294 s; gold's backlog 78 -> 116 files); the plain run kept up with all four (p95 18,
  15, 19 and 52 s). Pipeline / plain <= 0.5x.
- (h) has a third run since 2026-11-30, a quiet feed, because the other two cannot time a
  watermark-only batch on its own: the available-now run has one per query, and at (d)'s heavy
  rate they wait for cores behind the next files' tasks (gold 4.27 s (5), silver 4.05 s (1) in
  `make bench ONLY=h BENCH_N=20000` that day). With 20 s between the quiet feed's files, gold
  took 2.12 s (5) and silver 0.9 s (4): after a fresh start a file's batches take 25-30 s end to
  end (bronze 1-4 s, silver 6-12 s, gold 10-15 s), so gold's closing batch still ran beside
  silver's next one. With 40 s (the default now): gold 1.08 s (5), silver 1.04 s (5) in the
  phase run alone, and gold 1.06 s (5), silver 1.41 s (5) in `make bench ONLY=h BENCH_N=20000`
  (its heavy stream that time: gold 1.11 s (7), silver 1.71 s (1)). Those runs had no class
  archive: it had gone stale (built for other jar stamps), and nothing said so; the JVM now
  warns (`common/class_archive.py`).
  In the run of 2026-12-05 above, every median was at most 0.48 s: available-now gold 0.42 s
  (1), silver 0.37 s (1); the heavy stream gold 0.48 s (9), silver 0.46 s (1); the quiet feed
  gold 0.39 s (5), silver 0.46 s (5).
- Where a batch's time goes at light load, job by job: `python -m bench.batch_profile` runs the
  quiet feed with Spark's UI on and reads its REST API before the pipeline stops. On 2026-11-30
  (four files, 40 s apart): silver's data batch (304 rows) took 2.01 s, 11 jobs covering 0.94 s
  and 1.07 s in no job (the driver: the batch function's Python, GX, Delta's commits); silver's
  watermark-only batch 0.49 s, one 88-ms job (the streaming plan) and 0.40 s in no job. Gold's
  data batch (439 rows) took 8.76 s: 54 jobs covering 6.06 s, 2.70 s in none. Summed (the four
  tables' jobs overlap): 22 scans of Delta tables, 3.51 s (12-13 tasks each: the folds' reads of
  the live rows they change, the MERGEs' joins, the gate's views); 13 of Delta's own jobs, 2.86 s
  (9 "Filtering files for query", 4 "Writing modified data - MERGE operation"); 9 rebuilds of a
  table's state for a snapshot, 2.13 s; 8 reads of the batch's cache, 1.71 s (the first, 0.92
  s, runs the streaming plan: the sessions through Python); 2 appends of local rows, 0.52 s.
  Delta 4.4's defaults already keep a small table's file list and transaction keys in each
  version's checksum (`allFilesInCrc`, `setTransactionsInCrc`); these state scans remain all the
  same. Gold's watermark-only batch: 1.24 s, one 0.99-s job (the streaming plan: four state-store tasks and the sessions' timeouts
  through Python) and 0.24 s in no job. The plain fresh gold pays, per batch, one table's
  MERGE: its state rebuilt for the transaction key, one scan, one write, and a streaming
  aggregation without Python. The pipeline pays that four times, plus a fold read per table;
  the leads are one file filtering per table per batch (shared by the fold and the MERGE, which
  filter the same window range) and one read of the live rows for both.
  Six of those nine file filterings came after the MERGEs: a commit re-plans every cached plan
  that reads the table, and each batch's update was a cache over its table (whose next read
  then folded the batch in twice). Pinned instead (a local checkpoint, `BatchContext.pin`),
  the same feed's gold data batch runs 55 jobs, not 61, with 3 file filterings: median over
  five data batches 9.07 s against 10.48 s in the run before (within this machine's noise).
- Most of gold's watermark-only batch was not the sessions' work but Python's imports: before
  every task a PySpark worker calls `importlib.invalidate_caches()`, and Python's finder for a
  zip archive answers by reading the archive's whole directory again, in pure Python. Spark
  puts three archives at the head of each worker's path (pyspark.zip, py4j's zip and the
  spark-core jar), so each sessions task re-read them: about 0.3 s of a core per task, two
  tasks per batch, with or without rows (py-spy on the workers; the job's tasks showed 600 ms
  of run time and 24 ms of JVM CPU). The workers now run under `common/python_daemon.py`
  (`spark.python.daemon.module`, PySpark's daemon with the archives' finders kept). An empty
  batch of a small pandas stateful query: 0.37-0.43 s, was 0.9-1.2 s (a JVM stateful
  operator's: 0.2 s). The quiet feed (`bench.batch_profile --files 5`) on 2026-12-01: gold's
  watermark-only batches median 0.73 s (was 1.09 s), its data batches 7.96 s (was 9.07 s).
  Silver's watermark-only batch runs beside gold's data batch of the same file: its one job
  took 0.19 s when the cores were free and 0.5-1.0 s beside gold's.
  `make bench ONLY=h BENCH_N=20000` that day, after the change: available-now gold 0.65 s,
  silver 0.49 s (one each); at (d)'s heavy rate gold 1.07 s (6), silver 1.69 s (1); quiet
  feed gold 0.8 s (5), silver 1.06 s (5). The run before it (2026-11-30, without the
  daemon): 1.0 / 0.74, 1.28 / 4.7, 1.25 / 1.04.
- py4j asked the driver JVM what a name means on every use (`jvm.functions`, `jvm.py4j`): each
  `F.col` or `F.lit` cost three round trips instead of one, and a package name was first
  searched as a class in every jar under each of the gateway's imports (2-7 ms). A 20,000-event
  `run-all` asked about 9,900 times, 5.2 s of its Python threads; PySpark's conversion of a JVM
  exception asks a dozen times, so even the end of iterating a Java set cost 25 ms. Now
  remembered (`common/internals.remember_jvm_names`): 140 lookups, 0.2 s; `F.lit` 154 us
  (was 417 us, 75 us of JVM CPU, was 180). The run-all's wall did not move beyond this
  machine's noise (eight interleaved pairs on 2026-12-02): most lookups waited beside other
  threads' work, off the batches' critical path. The plain baseline gets it too (build_spark).
- At (d)'s heavy rate every silver batch found 500-560 events behind its dedup watermark, and
  read its whole input again to keep them (`silver.late_events`): a second full parse of some
  140,000 records per batch. It now parses in full only the records whose event times, read
  alone, may be behind the watermark (`silver.transform.may_hold_late`): on a batch of 124,711
  records (204,000 events, 399 late) 10.8 -> 3.6 core-s and 5.9 -> 2.0 s (four rounds, medians,
  2026-12-02). (d) at 5,000 events/s that day, one run each: before 4.10x / 3.72x and
  3.74x / 3.64x (silver / gold), after 3.65x / 3.43x, within this rate's run-to-run spread.
  The py4j name cache above made no difference to (d) either: the two "before" runs are one
  without it and one with it.
- Where (d)'s heavy run spends its cores (event logs of a 180-s feed at 5,000 events/s,
  900,000 events, tasks' JVM CPU, 2026-12-02): the pipeline's silver 100 core-s (its main
  job, parse + dedup + dimension join + cache, 83), gold 58 (and its sessions' Python workers
  beside), bronze 18; the plain run's silver and fresh gold together 70 (Delta's log and
  snapshot jobs of its many 1-s commits 35 more), bronze 4. The pipeline needs about 1.4x the
  plain run's CPU for the same feed; plain runs at the cores' edge (99% busy), so the pipeline's
  backlog grows all through the feed and its p95 is that backlog, not a batch's cost.
- Where silver's parse spends its CPU (a JFR profile of the task threads while silver's parse of
  200,000 events ran four times into a no-op sink, 2026-12-03): Spark's `from_json` 25% (it
  reads each record through a `Reader`, char by char, in plain Spark too), the event id's
  SHA-256 12% (half of it formatting the timestamps, which plain Spark's cast to text also
  does), the ISO timestamps' `DateTimeFormatter` 13%, the schema contract's key scan 9% and its
  element zip 3%, the record checks' regexes 3%. The timestamps are now read by Spark's cast
  when their text has the usual shape (`silver.transform.ISO_SHAPE`; plain Spark casts too):
  that parse 7.85-8.10 -> 7.44-7.55 s wall (two alternated rounds of four). Tried and not kept:
  the event id's timestamps built from year/month/.../microsecond parts instead of
  `date_format` (1.3 s against 0.8 s on 500,000 timestamps), and the contract's elements
  exploded without the zip, the few records with an undeclared key exploded by a second
  generator (slower: the second generator copies every row once more).
- Each gold MERGE copied its source once more before it started: Delta's
  `spark.databricks.delta.merge.materializeSource` ("auto") checkpoints any source that is not a
  plain Delta scan, and a gold batch's update is a local checkpoint already (`BatchContext.pin`).
  The gold query's merges are now declared `pinned` (`common.outputs.Merge`), and their commit
  runs with the setting at "none" (`common.delta.sources_pinned`); the sessions table's source,
  which also reads the table for the sessions to close, checkpoints itself lazily, filled by the
  MERGE's first pass. The quiet feed (`bench.batch_profile`, 2026-12-03, two pairs alternated):
  gold's data batch 48 -> 44 jobs; the MERGEs' own `materializeSourceTimeMs` 140-665 ms per
  windowed table and 2.1-3.2 s for the sessions table -> 1 ms, and `executionTimeMs` 3.9-6.2 s
  -> 3.3-5.1 s (device_activity) and 4.8-6.7 s -> 2.5-3.6 s (sessions), over the three data
  batches each; gold's data batches median 11.53 / 10.70 s before, 8.03 / 9.04 s after.
  What is left of the "table state rebuilt" jobs (four per gold batch, "Compute snapshot for
  version: N", 0.2-0.5 s each) is Delta 4.4's MERGE asking for metrics: `findTouchedFiles` reads
  `snapshot.numOfFiles` (numTargetFilesBeforeSkipping), and a scan without a filter
  `sizeInBytesIfKnown`, and in 4.4 both aggregate the whole log state of every new version
  (jstack of a MERGE loop, 2026-12-03); the version's checksum holds both figures, and Delta's
  main branch answers from it. No setting skips them: a Delta release with that change would.
- Where `make audit`'s time goes (2026-12-04; the three-round lakehouse of tests/test_audit.py,
  four gold tables of three to five versions): 26 s in a fresh process (C1), 10-12 s warm in
  one, CPU-bound (about 24 core-s in 12 s on the two cores) and about 210 Spark jobs. A JFR
  profile of warm audits: 23% of the samples under Delta's scan preparation, of which half in
  `Snapshot.sizeInBytesIfKnown` (Delta 4.4 aggregates a version's whole log state for the size
  of every `versionAsOf` read without a data filter; 4.4.0 is the newest release on Maven
  Central), about a third in Catalyst's planning of the recompute plans, 6% in Spark's code
  formatter (a regex over every generated expression class, per task, before its cache
  lookup). Measured and dropped: an always-true data filter on each version read, which takes
  Delta's data-skipping path instead of the size (four warm audits each: 9.9-12.0 s with it,
  10.9-12.7 s without, within the noise); AQE off for the audit, alternated with on in one
  session (still warming): 11.9 / 11.5 and 9.7 / 9.5 s off, 13.9 and 10.5 / 10.5 s on, about
  1 s (the audit runs on its caller's session, which it would have to change or clone for that
  second); AQE off for `run-all` at 20,000 events, three pairs
  alternated: 23.7 / 23.4 / 23.2 s against 24.4 / 23.5 / 23.5 s, the same batch times.
- Start-up of a fresh 20,000-event `run-all` against the baseline (g), from a sampler of the
  driver's threads and Spark's REST API (2026-12-04): the session is up after 2.5-3.5 s (the
  baseline's 2.2 s), bronze's query starts 1.9 s later (its table, the ops tables and the
  checkpoint lock: the first Delta operation of a cold JVM, which the baseline pays inside its
  first write), then bronze 3.7 s against 1.8 s, silver 9.6 s against 7.9 s (1.8 s of it before
  its first batch starts: the batch's plan on a cold JVM, and the ops append of bronze's batch),
  gold 5.3 s against 5.7 s. Silver's and gold's table creations (ten, 0.3-0.7 s each) run beside
  bronze's batch on the two cores.
- Task slots (2026-12-04, `spark.local_slots_per_core`): with `local[*]` Spark runs one task per
  core, and a micro-batch's small jobs that run side by side (its writes and gates, gold's four
  folds and MERGEs), mostly waiting on the driver and the disk, queue behind each other's
  tasks. Two slots per core (`local[4]` here), alternated on the same landing: a fresh `run-all`
  at 20,000 events 24.1 s with one slot, 23.4 s with two (means of five), the baseline (g)
  17.5 / 17.0 s and 17.0 / 16.9 s; at 200,000 events 35.5 / 34.1 s -> 32.8 / 32.9 s, the
  baseline 23.4 / 21.7 s -> 21.7 / 21.1 s (the ratio unchanged, 1.52-1.57x); at 1,000,000 the
  same (78.5 / 79.3 s). The quiet feed (`bench.batch_profile`): gold's data batch median 5.67
  -> 4.96 s, silver's 1.48 -> 1.22 s. (d) at 5,000 events/s, 180-s feeds, one run each:
  landing -> silver / gold p95 43.5 / 57.9 s with two slots, 42.6 / 58.3 s with one: the cores
  are full either way, and time-sharing them moves no work. `make bench ONLY=g,h BENCH_N=20000`
  with two slots: (g) 23.1 / 17.1 s = 1.35x; (h) available-now gold 0.39 s, silver 0.3 s, at
  (d)'s heavy rate gold 0.47 s (15), silver 1.02 s (1), quiet feed gold 0.48 s, silver 0.28 s;
  but (f) 10.2% (0.7 s of 6.9 s): silver's gate, whose one-task jobs then share the cores,
  took 0.51-0.84 s of a 20,000-event batch against 0.44-0.51 s with one slot (five runs each,
  also with the progress log's appends held back), 7.5-11.6% of the batch against 6.3-7.4%. The
  default stays one slot; two is a setting for runs without that target. Also measured and
  dropped that day: starting bronze's query before its tables were created, its first batch
  waiting for them (24.9 / 25.6 / 24.8 s without, 24.7 / 25.7 / 25.1 s with: the set-up's 1.8 s
  is CPU of a cold JVM, and the query's start needs the same cores).
- Fresh starts (2026-12-05): three costs of a fresh `run-all` that plain Spark pays less or
  not at all. Delta's streaming source lists a new query's snapshot in Spark jobs before its
  first batch (latestOffset: silver 1.4 s, gold 0.6 s at 20,000 events); a fresh query over a
  table whose log still holds every commit, each an append, now reads those commits from
  version 0 (`common/delta_source.py`, `startingVersion`), any other history (compaction,
  delete, overwrite, a schema change, a log checkpoint) the snapshot as before: 22.7 -> 21.5 s
  (five pairs alternated). Silver's first batch read its dimension (a time-travel read and its
  scan, 0.8-1 s on a cold JVM); silver's set-up now reads it ahead on a thread while bronze
  runs (`silver.job.Dimension`): 20.6 -> 19.8 s (five pairs). `SparkContext.stop()` waited
  0.35-0.7 s for PySpark's accumulator server, whose handler reads its stop flag between 1-s
  polls; the server is now shut down after the session, unwaited
  (`common.internals.detach_accumulator_server`): the stop 0.46-0.77 -> 0.06-0.16 s.
  `make bench ONLY=b,g`, two runs of each after them: (g) 20,000 events 20.4 / 16.1 s = 1.27x
  and 21.0 / 15.8 s = 1.33x, 200,000 events 30.8 / 23.2 s = 1.33x and 30.5 / 21.5 s = 1.42x
  (were 1.45-1.57x that day): at the target at 20,000, not reliably under it; (f) 6.2-8.9%. Where the 200,000-event
  run still spends more: bronze 6.2 s from the session to silver's start against the
  baseline's 2.0 s (its tables 1.6 s on a cold JVM, its batch 3.3 s with the accounting row's
  commit, 0.6 s, after the append), silver 14.8 s against 12.4 s (the quarantine's fetch of
  its records' bytes from bronze, 3.6 s against silver's own append of 2.1 s), tasks 27.5
  against 18.9 core-s. Measured and dropped that day: a semi join that broadcasts only the
  quarantined records' keys in that fetch (1.55 s either way: it reads every bronze row of the
  batch's files all the same), the progress log's appends held to the end of an available-now
  run (19.38 / 19.34 s, four pairs), and the dimension's seed waiting for bronze's tables
  (20.46 / 20.79 s).
- (g) at 200,000 events, 2026-12-05 at `5dc65ae` (this machine about 1.6x slower than the day
  before: the baseline 37.3 s, was 21.5-23.2): `make bench ONLY=b,g BENCH_N=200000` 53.5 / 37.3 s
  = 1.43x; CPU 87.0 / 56.0 core-s, of which tasks 49.6 / 31.1. A JFR profile of run-all's task
  threads: Parquet writes 14% (Parquet's dictionary falling back to plain for event ids and
  the INT96 timestamps about half of it), the batch's cache 9%, `from_json` 9%, the sort before
  silver's partitioned write 8% (with what it pulls through), Janino and class loading 7% and
  5%, SHA-256 2%. Run-alls over the same landing, fresh lakehouse each, alternated:
  - the quarantine's fetch of its records' bytes from bronze, switched off to size it (not a
    valid pipeline): 46.9 and 44.7 s against 48.3-50.9 s (silver 21.4-22.8 against 24.5-25.8 s;
    about 5 core-s). Apart, warm: reading the batch's raw column from bronze 0.6-0.8 s, its keys
    alone 0.23 s; the fetch's left join (sort-merge: every record of the range shuffled with its
    bytes) 1.1-1.35 s for 801 records, a broadcast semi join of their keys 0.7 s. Since then a
    small record's bytes ride on its rejected events from the parse (`silver.carry_record_kb`,
    64 KB of size times elements: a nest record of a few hundred bytes is carried, a record of
    20,000 cameras still fetched), NULLed on its accepted ones before the deduplication, and the
    quarantine's rows are one pass over the batch's rejects (a union of two reads of the batch's
    cache before). Parsing 200,000 events with or without the bytes: 5.4 / 5.3 s. Run-all, three
    pairs alternated: silver 23.2, 24.5, 24.7 s against 25.0, 26.0, 25.5 s; the run 47.4, 48.6,
    49.8 s against 48.5, 50.3, 49.7 s. Less than switching the fetch off gave: the quarantine's
    window (a record's bytes on its first rejected element only) remains.
  - silver not partitioned by event date: 46.1 and 49.7 s against 50.9 and 49.3 s, inside the
    noise; kept (queries prune by `event_date`).
  - `spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS` instead of Spark's INT96: 51.0 and
    50.1 s against 49.8 and 48.3 s, no gain; kept (every reader the tests use reads INT96).
- (g) on a fresh machine, 2026-12-05 at `873989a` (`make bench ONLY=b,f,g BENCH_N=200000`): 30.3 /
  23.0 s = 1.32x. Where run-all's 7.3 s more go, layer by layer against the baseline's steps:
  bronze 4.7 s against 1.9 (its main job 2.6 s, 5.0 core-s in tasks, against plain's 0.84 s
  and 1.3 core-s: the byte splitter, the UTF-8 check, 14 columns partitioned by ingest date,
  on a cold JVM, beside silver's set-up jobs), silver 14.1 s against 12.0 (the parse's stage
  12.9 core-s against 7.5: the record checks, the schema contract's key scan, the typed
  timestamps' checks; warm, the parse alone into a no-op sink 4.7-5.1 s against plain's
  3.2-3.4 s), gold 5.9 s against 5.3, and about 2 s more before bronze starts (4.7 s from the
  process's start to bronze's first line; the baseline's session is up in 2.3 s: "Start-up"
  above). Silver now pins its parsed batch (a local
  checkpoint, the rows as computed) instead of caching it as columns: warm, 200,000 parsed
  events computed and kept in 5.2 s instead of 5.9 (94 MB instead of 62); run-all, six pairs
  alternated: silver 14.12 s against 14.63 (means), the run 29.5 s against 30.4. (f) at
  200,000 rose from 0.6 to 0.8 s of the batch (the gate reads whole rows now), 7.1-7.5%;
  the quiet feed's silver data batch 1.21 s against 1.17. After it, four runs of
  `make bench ONLY=b,f,g`: 200,000 events 31.8 / 25.6 s = 1.24x and 33.2 / 24.8 s = 1.34x,
  20,000 events 20.2 / 16.8 s = 1.2x and 20.6 / 16.2 s = 1.27x: at the target on average,
  not in every run. Measured and dropped that day: Spark's concurrent output writers
  (`spark.sql.maxConcurrentOutputFileWriters` 16: a partitioned write without its sort;
  silver the same, the run 30.0 against 30.8 s, three pairs) and `translate` for the
  timestamps' upper-casing (slower than `upper`, which costs 0.13 s per million texts).
- (g) at 200,000 events, 2026-12-05 evening (this machine faster again: the baseline 21.3-21.7
  s): `make bench ONLY=b,g` 31.7 / 21.7 s = 1.46x at `7b7dfbc`; after the change below 1.43x,
  1.33x and 1.39x (30.4 / 22.9 s, 30.1 / 21.7 s), and at 20,000 events 19.1 / 15.3 s = 1.25x and
  20.1 / 14.7 s = 1.37x: the pipeline's fixed costs do not shrink when the machine speeds up, so
  the ratio grows on a fast evening. Two hours later, the machine slower again (the baseline
  24.5 s): 31.6 / 24.5 s = 1.29x at 200,000 events and 22.1 / 17.9 s = 1.23x at 20,000. Layer by layer against the baseline (the 1.43x run):
  bronze 4.8 s against 1.9, silver 14.0 against 11.2, gold 6.1 against 4.8, and 4.5-4.9 s from
  the process's start to bronze's first line against a session up in 2.2 s. The CPU of every
  thread of a fresh run-all, sampled each 0.25 s from /proc: up to bronze's end (10 s) the two
  cores are 88-95% busy, but bronze's tasks use 0.3-1.1 of them; the rest is the JVM's threads
  serving Python (the session, the dozen table creations, the dimension's load, planning:
  0.6-1.1 cores), C1 compiling (0.25-0.5) and GC; from silver's parse on, tasks take nearly both
  cores. Over the run: tasks 27.5 core-s, the Python-serving threads 7.2, the JIT 5.0, the
  Python driver 2.9, GC 1.9, the streaming threads 1.8. A fresh table's creation costs 0.96 s
  for the first (a cold Delta) and 0.11-0.2 s for each after it, warm.
  Parquet started every column of a file with a dictionary and fell back to plain values once
  it outgrew 1 MB: bronze's record bytes, silver's event ids and event times are nearly all
  distinct, so every file held them as PLAIN_DICTIONARY then PLAIN, the dictionary's work spent.
  They are now written plain from the start (`common.spark.plain_encoded`: Parquet's
  per-column `parquet.enable.dictionary#<column>`; the profile's timestamps too): fresh
  run-all, four pairs alternated, 29.38 -> 29.05 s (every pair faster), silver 14.28 -> 13.88
  s, the timestamps' column chunks smaller (834 -> 674 KB in a 99,403-row file). Measured and
  dropped that day: the rest of Parquet's per-value work (page checksums, size statistics,
  min/max of the record bytes; a warm write of bronze's 124,711 rows is 0.30-0.31 s with or
  without each), the driver's heap at its full size from the start (`-Xms4g`: 27.9-28.2 s
  against 27.8-28.6), C1's compile thresholds scaled by 3 or 0.5 (29.3-29.4 and 28.8-29.1 s
  against 28.3-29.1), and a shorter interval for handing Python's GIL over (the GX import on a
  thread during start-up: 29.0-31.6 s against 29.0-30.8).
- (g) at 2026-12-05 23:20 (`9da8ba6`): `make bench ONLY=b,g` 36.7 / 23.9 s = 1.54x at 200,000
  events (CPU 57.7 / 34.8 core-s, tasks 33.2 / 20.2) and 23.5 / 17.6 s = 1.34x at 20,000. Where
  the driver's Python threads waited for the JVM in a fresh 200,000-event `run-all` (py-spy over
  every thread at 50 samples/s, waits in `awaitTermination` left out; thread-seconds, which
  overlap): Delta appends 17.7 s (the batches' writes and commits), the batches' counting passes
  16.0, table creations at start-up 10.5 (four threads beside bronze), the progress log's
  appends 5.9 (its own thread, every 5 s), silver's dimension read ahead 4.7 and its seed 3.0,
  the gate's metrics 2.1, catalog registrations 1.7, the session 1.6; the Python driver's own
  CPU: the GX import 2.3 s, the JVM's launch 1.3. The progress log's appends held to the end of
  the run (`LAKEHOUSE__MONITORING__PROGRESS_FLUSH="600 seconds"`), three pairs alternated at
  200,000 events: 31.0, 33.7, 35.6 s against 31.7, 33.5, 36.2 s, inside the noise (as at 20,000
  events before): it stays off the batches' path.
- (g) at 2026-12-06 00:46 (`736e9ef`): 32.4 / 22.4 s = 1.45x at 200,000 events, and ten minutes
  later 22.8 / 22.2 s = 1.03x at 20,000 (the baseline 5 s slower than in any run before, its
  streaming engine 7.4 core-s against 4.8: one pair's ratio is a draw). A fresh 200,000-event
  run-all with the driver's calls traced: from the process's start to bronze's first line 5.2 s
  (imports and the layers' declaration 0.7, the session 2.8, bronze's and the accounting's
  tables 1.7 on a cold Delta), bronze 4.9 s (its job 2.5 s, whose tasks ran 4.8 s for 1.9 s of
  CPU: the dimension's seed, 3.4 s, and the creations of silver's, gold's and the ops tables,
  0.7-1.2 s each, ran beside it), silver 13.6 s, gold 6.3 s; the baseline: its session 2.5 s,
  bronze 2.3, silver 13.0, gold 5.9. Start-up and bronze are 5-6 s of the 10 s between them.
  Tried that night: the tables' first commits written as files (the protocol, metadata and
  commit info Delta's CREATE writes), with neither Delta's CREATE nor the catalog's
  registration: bronze's first line 2 s sooner (3.3-3.5 s against 5.3-5.8), every run slower
  (33.6-36.4 s against 31.1-33.6, three pairs alternated): registering a new table reads its log
  into Delta's cache, and without it each layer's first write did that on its batch's path.
  Dropped. The schema contract's share of silver's parse, on bronze's 124,711 records in a warm
  session (the parse alone, task CPU, medians of six to nine alternated runs): 8.7-9.3 core-s
  with the contract, 6.9 without, 6.6 for the baseline's parse. Of those 2 core-s, the scan for
  undeclared keys about 0.65 (0.3 alone), the second read's expressions left in the plan 0.7,
  the zip of each element with its map and the drift columns 0.5. The scan in a projection of
  its own changed nothing (the generated code evaluates it once already); the drift columns
  skip their work for an event with neither a map nor extra record keys (9.05 against 9.28
  core-s, 7 of 8 pairs faster): kept. Whole-stage codegen (off since `be067bb`) saved CPU on the
  same parse and deduplication in a warm session, in every pair (medians 14.5 against 16.3
  core-s), and lost in fresh run-alls: on for every batch that reads rows, 37.5-40.4 s against
  33.2-37.2 (three pairs alternated), on for silver's pinned pass alone 30.8-38.3 against
  29.7-32.9: compiling the fused classes on a cold JVM costs more than one run of them saves.
- (g) at 2026-12-06 05:11 (`aad0e29`): 32.0 / 23.0 s = 1.39x at 200,000 events (CPU 50.6 /
  32.8 core-s: tasks 28.3 / 18.6, the driver's JVM serving Python's calls 7.4 / 2.2, Python 2.5 /
  0.7, JIT 5.6 / 4.2, GC 2.2 / 1.2, the streaming engine 1.7 / 4.3) and 20.8 / 16.9 s = 1.23x at
  20,000. A gold micro-batch at light load, job by job (the audit test's second round on a fresh
  test JVM: 5 events, 2 of them late for gold, one query writing the three windowed tables and
  the sessions; Spark's REST API): 6.6 s and 32 jobs. Its count and cache 0.4 s; then per
  windowed table, the three side by side: Delta's file filtering for the fold's read of the
  table's open rows 0.4-0.6 s, the fold (the batch's windows joined with those rows, two
  exchanges and a sort-merge join) 1.2-1.3 s, the MERGE 2.0-2.9 s: its own file filtering
  0.3-0.5, the join that finds the touched files 0.8, the state rebuild for its metrics
  ("Compute snapshot", Delta 4.4) 0.2-0.3, the rewrite of the touched files 0.7-1.0; the
  sessions' MERGE the same after them, 2.0 s; the late rows' append beside. Plain fresh gold
  pays one MERGE per batch (the same four parts) and a streaming aggregation; the pipeline
  pays a MERGE per table and a fold per windowed table. Warm, the same batch took 3.2-4.3 s
  (the three rounds rebuilt ten times in one JVM: the first build 43.5 s, from the fifth 16-19 s).
  Tried and not kept: shuffled hash joins instead of sort-merge joins
  (`spark.sql.join.preferSortMergeJoin=false`: the third round's gold batch 4.9 / 4.9 s against
  5.9 / 5.9 s in two fresh pairs, but within the noise in one warm JVM, three pairs alternated:
  3.0-5.0 s against 3.1-4.5; the conversion at run time, `maxShuffledHashJoinLocalMapThreshold`
  64 MB, the same), and Delta's data skipping off, so the filtering reads each version's file
  list from its checksum without a job (warm, four pairs: 3.1-4.2 s against 3.2-4.3).
- (g) at 2026-12-06 07:38 (`5d2baaa`): 32.4 / 23.6 s = 1.37x at 200,000 events (CPU 51.2 / 34.7
  core-s: tasks 28.8 / 19.3, the driver's JVM serving Python's calls 7.2 / 2.2) and 20.7 / 16.0 s
  = 1.29x at 20,000; (f) in the same runs 7.4% at 200,000 and 14.0% at 20,000 (0.7 s of a 4.8-s
  batch; 8.3-12.1% in the eleven 20,000-event runs since 2026-12-05): at 20,000 events silver's
  gate is at its target's edge. Where a fresh 200,000-event `run-all`'s silver goes, its calls
  timed in the driver: from bronze's end 1.5 s to the first call of its batch (the query's plan
  built in Python, 0.6 s, of which the parse's expressions 0.43; Spark's start of the query and
  the batch's planning 0.9), the batch's computation 10.3 s (its one pass over the rows 9.7-10,
  the gate 0.65-1.0), the writes and commits 2.1 s, the watermark-only batch 0.3 s; gold the same:
  its plan 0.23 s, then 0.2 s to its batch. Silver's gate alone, warm, on the 200,000 rows pinned
  (`QualityGate.validate`, seven rounds after a first): 0.60-0.79 s and five jobs in two levels of
  GX's metric graph (the column pair's counts and a `mostly` rule's sample of unexpected values,
  then the aggregates of the other rules, each level a scan of the pinned rows), against 0.27-0.30
  s for one aggregate of all five rules' counts: half the gate is its second scan, and folding the
  rules' counts into the batch's one pass (GX then given them, as it is given the row count) would
  take both off. Tried and not kept: the queries' plans built while the layer before runs
  (`Ahead`: silver's plan and body made once its tables were, gold's once its were, both during
  bronze's batch, and taken at the start if the source's read options and schema were unchanged):
  silver's first batch began 0.8 s after bronze's end instead of 1.5, gold's 0.2 s after its start
  instead of 0.45, but bronze's batch took as much longer (the plans' calls into the JVM need the
  cores bronze's tasks use; four pairs alternated: 30.9 / 31.4 / 35.1 / 32.9 s against 29.2 / 31.4
  / 33.2 / 33.2); bronze's per-file statistics on `ingest_time` alone instead of its nine lineage
  columns (warm appends of the 200,000-event batch after a first, seven each: 0.68-0.75 s against
  0.78-1.00; left as they are: they let a reader find a file's or a Kafka offset's rows without a
  full scan); the level's pair counts computed beside GX's own jobs (warm, seven rounds each after
  a first: 0.64-0.79 s against 0.60-0.79); `spark.sql.files.minPartitionNum` 4, bronze's files in
  more, shorter tasks so silver's set-up jobs get a slot sooner (three pairs alternated: 31.8 /
  29.4 / 29.9 s against 31.4 / 29.7 / 30.2); two task slots per core again (`make bench
  ONLY=b,f,g`: 30.1 / 22.9 s = 1.31x, the baseline faster too, as on 2026-12-04).
- The gate's second scan taken off (2026-12-06, `8bc0a35`): the level of GX's metric graph that
  asks for the column pairs' counts (which `common.quality` already counted in one aggregate of
  its own) also asks for the single-column rules' aggregate functions (GX resolves them without a
  job, as columns), whose bundle GX then ran as a scan of its own one level later. Both are now
  one aggregate, and GX's bundled metrics take its values (`_fewer_jobs`; the outcomes are GX's
  own, tested against GX's validation of the same rows, clean and not). Silver's clean
  200,000-event batch, warm: 3 jobs instead of 5, 0.47-0.59 s instead of 0.60-0.79 (the first
  round 0.63 s against 0.98); left: the aggregate and a `mostly` rule's sample of unexpected
  values, a small job of its own. `make bench ONLY=b,f,g` after it: (f) 6.3% at 200,000 events
  (0.7 s of 11.3 s; 7.4% before, tonight) and 7.5% at 20,000 (0.4 s of 5.4 s; 14.0% before,
  8.3-12.1% in the eleven runs before tonight); (g) 33.3 / 25.6 s = 1.30x and 22.6 / 20.7 s =
  1.09x, on a slower hour (a first 200,000-event run in which the machine stalled, its clock
  stepped and the baseline took 30.1 s is left out). (d) after it, one run at the heavy rate
  (08:27, the machine slower than at 05:55: plain's p95 to silver 18.57 s against 11.38): silver
  39.33 / 18.57 s = 2.12x (2.44x before), gold 60.47 / 27.55 s = 2.19x (2.57x); at the light rate
  1.08x / 1.06x (1.06x / 1.05x); (h) at the heavy rate gold 1.2 s (3 batches), silver 1.6 s (1),
  against 0.9 s (6) and 0.75 s (1) at 05:55: empty batches behind saturated cores, which the gate
  (run only on batches with rows) does not touch.
- A not-null rule's sample taken from its count (2026-12-06, `0e0c9e6`): what silver's gate still
  scanned the batch for besides its one aggregate was the `mostly` rule's sample of unexpected
  values (`device_location_known`), GX's filter of the batch for rows whose `zip_code` is NULL,
  limited to five: on a batch with none it reads every row, in two jobs (Spark's limit tries one
  partition, then the rest). A not-null rule's unexpected values are all NULL, so its count gives
  the sample; the count is computed in the gate's one aggregate, now also when a suite has no
  column pair (`_null_samples`; GX's own results, tested against GX's validation with NULLs and
  without, and a failed rule's full list). The gate alone on 200,000 pinned rows in two partitions
  (`QualityGate.validate`, silver's suite, seven warm rounds after a first, alternated twice):
  without a NULL 4 jobs, 0.49-0.68 s and 0.40-0.46 s before, 2 jobs, 0.27-0.34 s after; with 2%
  NULLs 3 jobs, 0.29-0.52 s before, 2 jobs, 0.27-0.33 s after. `make bench ONLY=b,f,g` after it
  (11:30-11:34): (f) 5.3% at 200,000 events (0.5 s of 9.3 s, twice) and 5.5% at 20,000 (0.3 s of
  4.7 s); (g) 27.8 / 21.2 s = 1.31x and 26.9 / 20.6 s = 1.31x at 200,000 (CPU 43.4 / 30.8 core-s:
  tasks 25.2 / 17.4, the driver's JVM serving Python's calls 5.0 / 1.9, Python 2.2 / 0.6, Python
  workers 1.0 / 0, JIT 4.6 / 3.6, GC 2.2 / 1.3, the streaming engine 1.5 / 4.5), 18.8 / 14.0 s =
  1.34x at 20,000 (25.0 / 17.6 core-s: calls from Python 5.2 / 1.7, tasks 8.6 / 5.5, JIT 4.4 /
  3.3). (d) after it (11:35-12:03, a faster hour than 08:27: plain's p95 to silver 10.19 s against
  18.57): heavy silver 19.74 / 10.19 s = 1.94x, gold 31.37 / 14.17 s = 2.21x; light 1.02x / 1.02x;
  (h) at the heavy rate gold 0.55 s (10 batches), silver 0.91 s (1). What the driver's JVM spends
  serving Python beyond plain Spark's at 20,000 events (3.5 core-s) is mostly the tables' creation
  on a fresh lakehouse: Delta's CREATE TABLE (`DeltaTableBuilder.execute`) takes 0.89 s and 1.29
  JVM core-s for the first table of a new JVM, then 0.10 s of wall and 0.12-0.18 core-s for each
  next one (24 warm creations: 2.48 s of 2.90, the catalog's registration 0.27, the existence
  check 0.02; Delta's checksum file off: the same), and a fresh `run-all` creates up to thirteen
  (the late events' table only when there are some). Left: writing a new table's first commit
  without Delta's command would take that off, but it would be this project's own Delta writer,
  its protocol choice (CDF and CHECK constraints move a table to writer version 7 with table
  features) to keep equal to Delta's for every reader.
- The throughput collector's heap at full size from the start (2026-12-06: `73c3434`, reverted in
  `9ecc100`, back in `5ebef58` once `5bf284e` found what filled the tests' JVM). With
  `-XX:+UseParallelGC` (available-now runs) a fresh 200,000-event `run-all` paid three full
  collections, each stopping every thread for 0.14-0.28 s (`-Xlog:gc`): one when class metadata
  first passed the JVM's 21 MB threshold, two as the heap, started at 1/64 of the machine's
  memory, grew under the batches. `-XX:MetaspaceSize=256m` with `-Xms` at `spark.driver.memory`
  removes all three (each flag alone one kind): pauses 1.21-1.47 s -> 0.83-0.84 s, `run-all` 27.84
  / 27.19 / 26.89 s -> 26.81 / 25.97 / 26.21 at 200,000 events and 17.94 / 17.69 / 17.69 -> 17.51
  / 17.31 / 16.88 at 20,000 (alternated), the plain baseline with the same flags unchanged; `make
  bench ONLY=b,f,g`: (g) 1.26x and 1.29x at 200,000, 1.17x and 1.24x at 20,000 (14:17-14:26); on a
  slower machine at 18:17-18:21 (the baseline 31.4 and 33.1 s at 200,000 instead of 20.5) 1.27x
  and 1.24x at 200,000, 1.08x and 1.33x at 20,000. The first try was reverted because the fresh-
  clone CI's test JVM (one for the whole suite, the same flags) ran out of old generation at 88%
  of the tests: 99.99% full, 358 full collections, 572 s in them. Without the flags it was at that
  edge too (2,713 of 2,731 MB at the refresh tests, 47 full collections, 69 s). A heap dump of the
  two refresh test files in one process (`jmap -dump:live`, read with NetBeans' profiler library
  from Maven Central: each object's nearest path to a GC root) showed 613 `QueryExecution`s live,
  nearly all held by py4j's table of objects handed to Python (1,317 entries while Python held 202
  proxies: DataFrames in reference cycles that Python's full collection, rare in a long pytest
  process, had not freed) and by Delta's log cache (an entry per table of every finished test,
  kept an hour). `tests/conftest.py` now runs a full Python collection and clears Delta's log
  cache after each module: after `test_refresh.py` 16 plans and 0.5 GB live instead of 613 and 1.7
  GB. The next fresh-clone CI, with the flags (`jstat` every 30 s): 34 full collections, 37 s in
  them, no stall. The pipeline itself does not keep plans: a processing-time `run-all` kept 89-92
  over 50 batches.
- Python's collector and Spark's memory page (2026-12-06, `075fcd4`, `5b19853`, `86f0037`). Every
  Py4J object whose method Python called once is in a reference cycle with that method (py4j's
  `JavaMember` keeps its container), so the JVM's side of every DataFrame and Column is freed only
  by Python's cyclic collection. The test process allocates little in Python while its jobs run,
  so its own collections came seldom: within `test_refresh_silver.py` 230-600 plans stayed live
  between module ends. A collection after each test (`tests/conftest.py`) keeps 24-31; it is cheap
  because GX's import (`common.quality.import_gx`) now runs without collections and freezes what
  the process then holds (`gc.freeze`): its 200,000-odd objects are out of every later scan. The
  same in a fresh 20,000-event `run-all`: the driver's collections 0.40 -> 0.08 s of a core (four
  full ones during GX's import had freed 80 objects), and the sessions' Python workers, which
  PySpark's daemon forks, 0.46 -> 0.09 s over nine full ones, since the daemon
  (`common/python_daemon.py`) freezes what they inherit. The plans were not what filled the tests'
  JVM, though: after that module's first test it held 2.8 GB live, 2.4 GB of it `long[]` arrays of
  64 MB (a heap dump: 17 in the block manager's memory store, broadcast hash tables of the
  locations dimension waiting for Spark's cleaner; 11 sorter pages in thread-locals of streaming
  threads). Spark's memory page (`spark.buffer.pageSize`), the least every sort, hash aggregation
  and broadcast hash table takes, follows the memory per core: 64 MB for this 4 GB driver on two
  cores, for five rows as for five million. Conf `spark.page_size` now sets it, 2m: the same point
  0.4 GB live, 96 MB of arrays. A fresh `run-all` is the same either way (alternated: 28.2 / 28.5
  / 27.6 s with 64 MB pages, 29.3 / 26.4 / 28.2 with 2 MB at 20,000 events; 34.6 / 35.8 against
  34.8 / 34.3 at 200,000): a short run's pages are pooled; `tests/test_gold.py` alone 161.7 /
  169.0 / 160.2 s against 154.4 / 160.2. `make bench ONLY=b,f,g` before these (20:10) 41.5 / 35.0
  s = 1.19x at 200,000 events, 28.6 / 23.4 s = 1.22x at 20,000; after (21:36) 39.6 / 31.4 s =
  1.26x and 28.0 / 20.9 s = 1.34x: `run-all` 1.9 and 0.6 s faster, the baseline 3.6 and 2.5 s (the
  machine's hour); the Python driver's CPU 3.6-3.8 -> 2.7-2.8 core-s, its workers' 1.2-1.3 ->
  0.9-1.2.
- Case mapping through ICU (2026-12-07, `1a7878d`). Silver read a boolean field as `lower(text) =
  'true'` and an ISO timestamp as `cast(upper(text) as timestamp)`. Spark 4 maps case through ICU
  (`spark.sql.icu.caseMappings.enabled`, on by default), and the first call in a JVM initialises
  ICU's case-mapping and break-iterator data (`CollationAwareUTF8String.<clinit>` in JFR samples of
  silver's task threads); one value in an odd case is enough, and the generated landing has some.
  Most of that time is spent outside sampled Java code (JFR counted 0.3-0.4 s); alternated fresh
  runs show all of it: silver's batch at 20,000 events 6.6 / 6.7 / 7.0 s -> 5.1 / 4.8 / 5.2 s,
  `run-all` 23.2 / 24.0 / 23.1 -> 21.1 / 21.9 / 22.8 s, and at 200,000 events 39.3 / 35.0 / 36.7
  -> 35.4 / 34.6 / 34.6 s. The usual spelling is now compared as it is, and other text folded by
  `translate()` of the compared letters, which reads every text the same (no other code point
  lower-cases to those letters; a test compares both readings on look-alikes and keeps case
  mapping out of the parse's plan). Plain Spark's casts never call it. `make bench ONLY=b,f,g`
  after (00:00-00:03): (g) 21.9 / 19.1 s = 1.15x and 23.4 / 21.3 s = 1.10x at 20,000 events, 34.2
  / 27.7 s = 1.23x and 38.6 / 29.8 s = 1.30x at 200,000; the same evening before, six runs at
  200,000: 1.08-1.45x, median 1.31x. (f) at 20,000 8.1-8.6% (0.3 s of a 3.9-4.1-s batch): the
  gate's share grows as the batch shrinks. Where silver's tasks still spend more than plain Spark's
  (JFR, 200,000 events, samples of the task threads by the innermost known frame): generated
  projections 28% against 9% (the reasons' CASE WHENs, lineage and the raw bytes carried per
  event), Janino compiling generated classes 12% against 7% (518 generated classes in a 20,000-
  event `run-all`, 270 in plain Spark's), the schema contract's key scan 4%, JSON parsing 14%
  against 29% (silver parses in full only what it keeps).
- The memory page's cost to a fresh `run-all`, alternated over three pairs of `make bench
  ONLY=b,f,g` at 200,000 events (23:16-23:23): 64 MB pages 38.2 / 36.6 / 30.9 s (tasks 36.1 /
  33.6 / 28.3 core-s), 2 MB pages 36.3 / 32.4 / 37.2 s (33.8 / 29.8 / 35.6): none beyond the noise.
- Silver's parse fused (2026-12-07, `099297f`). Whole-stage codegen is off for the session (the
  bullet on the driver JVM above), and unfused each operator of silver's parse (the scan, from_json,
  the explode, the reasons' CASE WHENs, lineage, the filter) copies every row into a new row for
  the next: generated projections were 28% of silver's task samples at 200,000 events against 9%
  in plain Spark's. Silver's query now fuses its stages in batches expected to read 20,000 rows
  or more (conf `spark.whole_stage_from_rows`; a first batch counts as large, so the query starts
  fused, and its body sets its own session's setting from the batch before, as for interpreted
  expressions); MERGEs, gates and gold stay unfused. A fresh 200,000-event `run-all`, three pairs
  alternated: silver 13.5 / 13.7 / 13.4 s against 16.1 / 15.2 / 16.3 s, the run 32.3 / 31.8 /
  31.2 s against 35.0 / 32.8 / 34.3 s; the whole session fused did as well for silver and
  nothing for the baseline (27.2 / 30.3 s unfused, 29.9 / 30.3 s fused), and gold's body fused
  nothing (6.4-7.2 s against 6.1-6.7 s). `make bench ONLY=b,f,g` after (02:58-03:00): (g) 37.0 /
  31.9 s = 1.16x at 200,000 events, 26.5 / 21.2 s = 1.25x at 20,000. Streaming (d) at 5,000
  events/s (silver's batches 31,000-50,000 rows, so fused), two runs in the hour: fused, silver
  p95 33.4 s against plain 13.8 s (2.43x), gold 54.1 against 21.2 s (2.56x), silver's batch median
  14.7 s (3.27 s per 10,000 rows); not fused, 37.4 against 16.4 s (2.28x), 60.6 against 25.1 s
  (2.41x), 13.9 s (3.22 s per 10,000 rows): on saturated cores the same within the noise. At 200
  events/s (fused only from a first batch): 65.6 / 61.7 s = 1.06x and 97.2 / 92.1 s = 1.05x.
- Compiled after a small batch (2026-12-07, `439fffb`, `ee72373`). A JFR profile of the heavy
  stream (5,000 events/s) had 40% of the JVM's samples in interpreted expressions and orderings
  (the sliding activity is a sort-based aggregation, its max_by keeping a string, and
  interpreted, its sort by the window struct builds a new ordering for every comparison), all
  inside the gold batches that followed a watermark-only one. Two faults. The
  batch after a watermark-only one was sized by its 0 rows, so interpreted: it is now sized by
  the last batch that read. And a body chose "compiled" by unsetting Spark's mode, but a body
  runs inside its streaming part's execution, which had put the session's setting of the batch
  before (interpreted) in the thread's properties, where a job finds a setting its session
  lacks: the batch after any small one ran interpreted whatever its size. Compiled is now set
  (`FALLBACK`); the tests read the mode from what the tasks did (a class compiled or not). The
  heavy stream for 180 s, one file a second, in one hour: landing -> silver p95 57.2 / 54.3 /
  55.8 s and gold 105.1 / 87.7 / 94.8 s before, 50.0 s and 70.9 s after. `make bench ONLY=d`
  (heavy) before and after, 50 minutes apart: silver 46.6 against plain 19.5 s (2.39x), gold 76.8
  against 30.5 s (2.52x); after, 29.0 against 10.5 s (2.77x), 51.4 against 15.8 s (3.26x): the
  machine faster in the second hour (plain's p95 halved), the plain run's cores 90% busy instead
  of 98%, the pipeline's 99% in both, so the ratio grew while both latencies fell. (g) at
  200,000 events after: 1.24x.
- Classes compiled again every batch (2026-12-07; tried, not kept). Spark writes a literal long or
  timestamp into the Java source it compiles, and caches classes by their source: a plan that
  differs from the last batch's only by the batch's id, watermark or frontier is a new class,
  compiled by Janino and then warmed by the JIT again. Codegen's debug log of run-all fed at 2,000
  events/s for 150 s: once warm, 415 classes in 106 s, 333 of them such variants (6.9 of Janino's
  9.2 s), silver's late filter the largest (168 KB of source, compiled in every batch that dropped
  late events). A Java function that takes the value as digits in a binary literal (which the class
  reads from its references, and which the optimizer does not fold into a literal) removed the
  pipeline's own from its batch plans: 277 classes, 6.2 s, the variants left mostly Delta's (its
  data-skipping filters hold a MERGE's or an UPDATE's literal bounds, which the pipeline keeps so
  that Delta skips files; its log replay), Spark's (a batch's timestamp) and the ops rows' literal
  plans. But the JIT's time on generated classes did not fall (JFR over the whole run: 22.6 s
  before, 27.7 s after), nor did latency: two alternated pairs at 2,000 events/s, landing ->
  silver p95 23.5 and 22.5 s before, 24.9 and 23.3 s after; gold 38.5 and 39.7 s against 40.1
  and 39.2 s. Janino's 3 s in 106 is about 1.4% of two cores: not worth a JVM module
  and a function in every batch's plan.
- Fewer C2 compilations (2026-12-07; tried, not kept). The JIT's threads stay busy for minutes of a
  processing-time run (29% of its CPU at 5,000 events/s). Raising C2's thresholds fourfold
  (`-XX:Tier4InvocationThreshold=20000 -XX:Tier4CompileThreshold=60000`, and the back-edge and
  minimum ones with them), so that only the hottest methods reach C2: two alternated pairs at
  2,000 events/s, landing -> gold p95 41.3 and 41.9 s at the defaults, 44.8 and 44.6 s raised;
  silver 27.7 and 24.4 s against 28.0 and 24.9 s.
- A windowed table's fold as one aggregation (2026-12-07; probed, not kept). A gold batch folds
  its part of each window into the table's open rows with a full join (`gold.transform.combine`):
  three exchanges (the batch's aggregation, its part again by the join keys, which `<=>` turns
  into `coalesce`/`isnull` pairs, and the table's rows), two sorts and a sort-merge join. The same
  fold as one aggregation over the batch's events, each as its contribution to a measure, unioned
  with the table's rows (sums add, extremes compare, `max_by` keeps its ordering's extreme): one
  exchange, no sort, the same rows. The hourly sightings of 50 events over 3 windows, in one
  process: warm, 0.058-0.073 s against 0.048-0.055 s (medians of 15, three rounds); the first fold
  of a fresh JVM, three alternated pairs, 1.35 / 1.76 / 1.59 s against 1.55 / 1.71 / 1.85 s. A
  real batch's fold took 1.2-1.3 s (above), and a fresh JVM's first fold takes as long with one
  exchange as with three: that time is not the exchanges' (each batch's literals compile anew,
  above). Not kept: 10 ms a table warm, and nothing cold, against a second way to fold (the
  distinct kind's sets, and `max_by`'s ties, which the join breaks toward the table).
- (d) again (2026-12-07 13:36, `c5f1288`: the code of the runs after `ee72373` above, a docstring
  apart): heavy, landing -> silver p95 24.94 s against plain 15.71 s (1.59x), gold 41.98 against
  23.67 s (1.77x), cores 99% and 98% busy; light, 66.15 / 61.77 s = 1.07x and 98.28 / 92.01 s =
  1.07x, cores 40% and 17%. The same code gave 2.77x and 3.26x at heavy load earlier in the day:
  on saturated cores the ratio measures the hour as much as the pipeline.
- Both runs' JVMs at the heavy rate, side by side (2026-12-07 15:34, `ff6d304`; JFR's profile
  settings on each driver, one 180-s feed at 5,000 events/s each, the same feed): landing -> silver
  p95 33.6 s against plain 13.3 s, gold 48.4 against 19.4 s. JFR's CPU load: the pipeline's JVM
  411.5 core-s in 218 s, the plain one's 393.7 in 216 s, the machine 99% and 95% busy: at this rate
  each run's JVM takes the two cores whole, so CPU totals cannot rank them (plain spends on many
  small batches, 1-s triggers, what the pipeline's larger ones need). Its Java samples by what they
  were doing (first match of: per-task source generation, Janino, Java serialization, Delta's file
  statistics, JSON, Parquet, state store, sort, aggregation, shuffle), pipeline / plain: tasks
  generating Java source 16.6% / 23.1%, Java serialization of tasks and closures 12.2 / 17.8, JSON
  parsing 7.4 / 7.2, shuffle 9.0 / 4.5, sort 4.0 / 1.7, Parquet writing 4.1 / 2.1, Delta's file
  statistics 1.7 / 1.3, state stores 1.1 / 2.5, Janino 2.6 / 0.6, the driver's planning 9.1 / 10.5
  and Delta log and snapshot work 5.3 / 6.7. The largest share is the same in both and is Spark's:
  each task builds its projections anew (`UnsafeProjection.create`, no cache by expression; the
  compiled class is cached, Janino ran in 123 of the pipeline's 1,453 such samples), 26.5% of the
  pipeline's task samples, and about half of that is text work on the source:
  `CodegenContext.buildCodeBlocks` runs a comment-stripping regex over each expression's code only
  to measure its length for method splitting, and `stripMargin` over every block. No setting skips
  either; a Spark that measured without the regex, or cached generated code by its expressions,
  would lighten both runs. No hot spot of the pipeline's own stands out: where its shares are
  larger (sort, shuffle, Parquet writing: the folds' joins, the MERGEs' rewrites, the tables plain
  Spark does not write), the samples are spread over many operators.
- Run to run, the same command varies by about 10% on this machine, and its speed drifts by up to
  3x over a day (the ceiling (a) at 20,000 events: 62,532 events/s at 16:42, 20,956 at 23:04;
  the baseline (g): 15.8 s, then 35.4 s): compare figures of one run, never across runs.
"""


def latest(results: Path) -> Path | None:
    """The newest bench-<time>-<N>.json in a results folder (the time sorts as text)."""
    runs = sorted(results.glob("bench-*.json"))
    return runs[-1] if runs else None


def load(results: Path) -> tuple[dict | None, Path | None]:
    """A results record and the file it came from: `results` is a JSON file or a folder, whose
    latest run is taken; (None, None) when there is none."""
    path = results if results.is_file() else latest(results)
    if path is None:
        return None, None
    return json.loads(path.read_text()), path


def _gb(x) -> str:
    return f"{x:g} GB" if isinstance(x, (int, float)) else "-"


def _run_facts(r: dict, source: str | None) -> str:
    sections = ", ".join(r.get("sections") or []) or "-"
    lines = [
        f"- **Date**: started {r.get('started', '-')}, finished {r.get('finished', '-')} (UTC)",
        f"- **N** = {r['events']:,} events (seed {r.get('seed', '-')}); figures measured: {sections}",
        f"- **Commit**: `{r['commit']}`" if r.get("commit") else "- **Commit**: not recorded by this run",
        f"- **Machine**: {r.get('cores', '-')} cores, {_gb(r.get('memory_gb'))} memory"
        + (f", {r['platform']}" if r.get("platform") else "")
        + f"; load average at start {r.get('load_at_start', '-')}, at end {r.get('load_at_end', '-')}",
    ]
    if source:
        lines.append(f"- **Results**: `{source}`")
    return "\n".join(lines) + "\n"


def render(record: dict | None, source: str | None = None) -> str:
    """The whole page: the fixed explanation, then the record's run (or a line saying no run has
    been recorded). `source` names the results file in the page."""
    out = [HEAD]
    for letter, name, how, key in FIGURES:
        keys = key if isinstance(key, tuple) else (key,)
        target = "; ".join(summary.TARGETS.get(k, k) for k in keys) if key else "information"
        out.append(f"| ({letter}) | {name} | {how} | {target} |\n")
    out.append("\n" + READING + "\n" + LATEST + "\n\n")
    if record is None:
        out.append("No run has been recorded yet. `make bench` (or `make bench BENCH_N=20000` for a quicker\n"
                   "one) measures the figures and writes them here; `python -m bench.docs_page`\n"
                   "rewrites this page from results already in `bench-results/`.\n")
        return "".join(out)
    out.append(_run_facts(record, source) + "\n")
    out.append("| figure | value | target |\n|---|---|---|\n")
    out.extend(f"| {a} | {b.replace('|', '/')} | {c} |\n" for a, b, c in summary.rows(record))
    verdicts = summary.verdicts(record)
    out.append("\nTargets: " + "; ".join(f"{summary.TARGETS[k]}: **{summary._mark(v)}**"
                                         for k, v in verdicts.items()) + ".\n")
    errors = record.get("errors") or {}
    if errors:
        out.append("\nPhases that failed:\n\n" + "".join(f"- {k}: {v}\n" for k, v in errors.items()))
    out.append(f"\n```\n{summary.summary_line(record)}\n```\n")
    return "".join(out)


def _shown(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def write(results: Path | None = None, out: Path | None = None) -> tuple[Path, Path | None]:
    """(Re)write the page from `results` (a JSON file, or a folder's latest run; default
    bench-results/); returns the page's path and the results file it was written from."""
    record, path = load(Path(results) if results is not None else RESULTS)
    target = Path(out) if out is not None else DOCS
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(record, _shown(path)))
    return target, path


def main(argv=None, prog: str = "python -m bench.docs_page") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="a bench results folder (its latest bench-*.json) or one JSON file "
                        "(default: bench-results/)")
    p.add_argument("--out", type=Path, default=DOCS, help="the page to write (default: docs/benchmark.md)")
    args = p.parse_args(argv)
    page, path = write(args.results, args.out)
    print(f"wrote {page} " + (f"from {path}" if path else f"(no bench results in {args.results} yet)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
