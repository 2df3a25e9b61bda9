"""Issue 58's target: a full refresh of gold at N events takes <= 1.5x a from-scratch build of
gold at the same N, with zero seconds of an empty or partial table for readers.

    python -m bench.refresh [-n 200000] [--seed 7] [--every 0.5] [--keep]
    (make bench-refresh N=200000)

One run, on a fresh lakehouse in a temporary folder:

  1. N generated events in its landing (as bench/run.py's (b), same event-time span).
  2. `run-all` available-now, a child process. Gold's share of it is read two ways: the layer's
     `gold: done in X s` line (gold's queries from start to end; the JVM is already up and gold's
     tables were created beside bronze) and the sum of batch_ms of gold's batches in
     ops.batch_accounting (the batches alone, without the commits).
  3. `python -m pipeline.refresh gold`, a child process, timed start to exit, while a reader
     thread here samples every gold table's version and row count every --every seconds. No
     pipeline runs meanwhile (2 cores): the refresh's build and switch are timed alone, not
     beside a live gold query, which would make it wait for that query's lock.
  4. `python -m audit.reset_gold --yes`, then `python -m pipeline --layer gold` (make reset-gold,
     make run-gold): gold built from scratch again, timed start to exit, the same reader running.

Which from-scratch time the target is judged against: (4), the from-scratch run-gold process.
Like the refresh it is one process that starts Python and a JVM, creates gold's tables and
builds all of them from all of silver, then stops; and it is what an operator would otherwise
run to rebuild gold. Gold's share of run-all (2) has no JVM start to pay and its tables were
made ahead, which the refresh cannot avoid: the ratio against it is printed too, as is the
refresh's own build + switch seconds (its log line; no JVM start) against it, both information.

The reader reads only the Delta logs, with delta-rs (`deltalake`, no JVM: a Spark session here
would take a core from the runs it watches): a table's rows are the sum of its add actions'
stats.numRecords. A sample with no table, 0 rows or fewer rows than the table had before the
phase is a violation; so is a version with fewer rows than the version before it. Samples can
miss a version committed between two of them, so after the refresh every version it committed
is counted too. The from-scratch run (4) is sampled the same way, to show what readers get
without the refresh (its violations are expected and are not the target's).

Results: bench-results/refresh-<time>-<N>.json and .md; logs in bench-results/refresh-<time>-<N>/.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.contention import OtherCpu
from bench.run import OUT, RUN_ALL, SPAN, base_env, generate, log, provenance, run_logged
from common.log import message_of

TARGET = 1.5
REFRESH = [sys.executable, "-m", "pipeline.refresh", "gold"]
RUN_GOLD = [*RUN_ALL, "--layer", "gold"]
RESET_GOLD = [sys.executable, "-m", "audit.reset_gold", "--yes"]


# --- reading a table's row count from its Delta log -----------------------------------------

def table_rows(path: str, version: int | None = None) -> tuple[int, int] | None:
    """(version, rows) of the Delta table at `path` (its latest version, or `version`), from the
    log alone: the sum of the add actions' stats.numRecords. None if there is no table."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder
    from deltalake.exceptions import TableNotFoundError

    try:
        dt = DeltaTable(path, version=version)
    except TableNotFoundError:
        return None
    counts = pa.table(dt.get_add_actions()).column("num_records").to_pylist()
    if None in counts or "deletionVectors" in (dt.protocol().reader_features or []):
        # A file written without stats, or rows hidden by deletion vectors: the stats cannot
        # tell, so count by scanning (slower, never taken by the pipeline's tables so far).
        n = QueryBuilder().register("t", dt).execute("SELECT count(*) AS n FROM t").read_all()
        return dt.version(), pa.table(n).column("n")[0].as_py()
    return dt.version(), sum(counts)


def snapshot(paths: dict[str, str]) -> dict[str, tuple[int, int] | None]:
    return {name: table_rows(path) for name, path in paths.items()}


class Reader(threading.Thread):
    """Samples every table's (version, rows) every `every` seconds until stopped; a sample is
    (seconds since start, version or None, rows or None, error or None)."""

    def __init__(self, paths: dict[str, str], every: float):
        super().__init__(daemon=True, name="bench-reader")
        self.paths, self.every = paths, every
        self.samples: dict[str, list[tuple]] = {name: [] for name in paths}
        self._halt, self.started = threading.Event(), time.monotonic()

    def run(self) -> None:
        while True:
            for name, path in self.paths.items():
                t = round(time.monotonic() - self.started, 2)
                try:
                    got = table_rows(path)
                    self.samples[name].append((t, *(got or (None, None)), None))
                except Exception as e:  # noqa: BLE001 - a reader that fails is what we measure
                    self.samples[name].append((t, None, None, f"{type(e).__name__}: {e}"[:300]))
            if self._halt.wait(self.every):
                return

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self.join()
        self.ended = round(time.monotonic() - self.started, 2)


def judge(samples: list[tuple], before: int | None, ended: float) -> dict:
    """What one table's reader saw: samples, the fewest rows, and every violation: no table (or
    a read error), 0 rows, fewer rows than `before`, or a version with fewer rows than the
    version seen before it. `bad_s`: seconds covered by bad samples (each until the next one)."""
    violations, bad_s, last = [], 0.0, None
    for i, (t, version, rows, error) in enumerate(samples):
        reason = ((error or "no table") if rows is None else "0 rows" if rows == 0
                  else f"fewer rows than before ({before})" if before is not None and rows < before else None)
        if last is not None and rows is not None and version > last[0] and rows < last[1]:
            reason = reason or f"fewer rows than version {last[0]} ({last[1]})"
        if reason:
            violations.append({"t_s": t, "version": version, "rows": rows, "why": reason})
            bad_s += (samples[i + 1][0] if i + 1 < len(samples) else ended) - t
        if version is not None:
            last = (version, rows)
    seen = [s[2] for s in samples if s[2] is not None]
    versions = [s[1] for s in samples if s[1] is not None]
    return {"samples": len(samples), "before": before, "min_rows": min(seen) if seen else None,
            "last_rows": seen[-1] if seen else None,
            "versions": [min(versions), max(versions)] if versions else None,
            "bad_s": round(bad_s, 2), "violations": violations[:20], "violation_count": len(violations)}


def walk(path: str, before: tuple[int, int]) -> list[dict]:
    """Every version committed after `before` (version, rows), each counted: none may hold 0
    rows, fewer than before, or fewer than the version before it."""
    latest = table_rows(path)
    out, prev = [], before[1]
    for v in range(before[0] + 1, (latest[0] if latest else before[0]) + 1):
        _, rows = table_rows(path, v)
        ok = rows > 0 and rows >= before[1] and rows >= prev
        out.append({"version": v, "rows": rows, "ok": ok})
        prev = rows
    return out


# --- timings --------------------------------------------------------------------------------

def layer_seconds(log_path: Path, layer: str) -> float | None:
    """The `<layer>: done in X s` the runner logs when an available-now layer ends."""
    for line in log_path.read_text(errors="replace").splitlines():
        m = re.match(rf"{layer}: done in ([\d.]+) s", message_of(line))
        if m:
            return float(m.group(1))
    return None


def gold_batches(cfg) -> dict[str, tuple[int, float]]:
    """Per gold checkpoint (query_id): its batches and the sum of their batch_ms, in seconds,
    from ops.batch_accounting. Each phase runs a new checkpoint, so a phase's are the new ids."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(cfg.table_path("ops", "batch_accounting"))
    rows = pa.table(QueryBuilder().register("b", dt).execute(
        "SELECT query_id, count(*) AS n, sum(batch_ms) AS ms FROM b WHERE layer = 'gold' GROUP BY query_id"
    ).read_all()).to_pylist()
    return {r["query_id"]: (r["n"], (r["ms"] or 0) / 1000) for r in rows}


def new_batches(cfg, seen: set) -> dict:
    new = {k: v for k, v in gold_batches(cfg).items() if k not in seen}
    return {"batches": sum(n for n, _ in new.values()), "batch_s": round(sum(s for _, s in new.values()), 2)}


def timed(cmd: list[str], env: dict, log_path: Path) -> tuple[float, float | None]:
    """Run cmd to its end (run_logged); wall seconds and the share of the machine other
    processes took meanwhile (the machine may be shared)."""
    with OtherCpu() as other:
        wall, _ = run_logged(cmd, env, log_path)
    return round(wall, 1), other.share(wall)


def watched(cmd, env, log_path: Path, paths: dict, before: dict, every: float,
            first: list[str] | None = None) -> tuple[dict, dict]:
    """Run cmd timed while a Reader samples the gold tables, from before `first` (run untimed)
    if given; (timing, per-table reader verdict)."""
    cpu = os.times()
    with Reader(paths, every) as reader:
        if first:
            run_logged(first, env, log_path)          # the same log, ahead of cmd's
        wall, others = timed(cmd, env, log_path)
    cpu = os.times().user + os.times().system - cpu.user - cpu.system
    seen = {name: judge(reader.samples[name], (before.get(name) or (None, None))[1], reader.ended)
            for name in paths}
    (log_path.parent / f"samples-{log_path.stem}.json").write_text(json.dumps(reader.samples))
    # The bench process does nothing else meanwhile: its CPU is the reader's cost (upper bound).
    return {"wall_s": wall, "others_cpu_share": others, "reader_cpu_s": round(cpu, 1)}, seen


# --- the run --------------------------------------------------------------------------------

def measure(args, run_dir: Path, root: Path, result: dict) -> None:
    from common.config import load_config
    from gold.tables import for_config

    env = base_env(root)
    cfg = load_config(env=env)
    # The tables the refresh rebuilds: every table of the profile's gold query.
    paths = {s.table: cfg.table_path("gold", s.table) for s in for_config(cfg)}

    log(f"generating {args.events:,} events into {cfg.landing}")
    result["records"] = generate(env, run_dir, args.events, args.seed, ("--span", SPAN))["records"]

    log(f"run-all available-now over {args.events:,} events")
    wall, others = timed(RUN_ALL, env, run_dir / "run-all.log")
    result["run_all"] = {"wall_s": wall, "others_cpu_share": others,
                         "gold_layer_s": layer_seconds(run_dir / "run-all.log", "gold"),
                         **new_batches(cfg, set())}
    log(f"run-all {wall} s; gold {result['run_all']['gold_layer_s']} s ({result['run_all']['batch_s']} s in batches)")

    before = snapshot(paths)
    result["rows_before_refresh"] = {k: v and v[1] for k, v in before.items()}
    seen_ids = set(gold_batches(cfg))
    log(f"refresh gold, reading {', '.join(paths)} every {args.every:g} s")
    timing, seen = watched(REFRESH, env, run_dir / "refresh.log", paths, before, args.every)
    line = next((message_of(s) for s in (run_dir / "refresh.log").read_text().splitlines()
                 if message_of(s).startswith("refreshed ")), "")
    m = re.search(r"built in ([\d.]+) s, switched in ([\d.]+) s", line)
    timing.update(build_s=float(m.group(1)) if m else None, switch_s=float(m.group(2)) if m else None,
                  **new_batches(cfg, seen_ids))
    versions = {name: walk(path, before[name]) for name, path in paths.items() if before[name]}
    result["refresh"] = {**timing, "reader": seen, "versions": versions,
                         "zero_bad_seconds": all(r["violation_count"] == 0 for r in seen.values())
                         and all(v["ok"] for vs in versions.values() for v in vs)}
    log(f"refresh {timing['wall_s']} s (build {timing['build_s']} s, switch {timing['switch_s']} s); "
        f"reader: {sum(r['samples'] for r in seen.values())} samples, "
        f"{sum(r['violation_count'] for r in seen.values())} violations")

    before = snapshot(paths)
    seen_ids = set(gold_batches(cfg))
    log("reset-gold, then run-gold from scratch (the same reader from before the reset, for contrast)")
    timing, seen = watched(RUN_GOLD, env, run_dir / "run-gold.log", paths, before, args.every, first=RESET_GOLD)
    result["run_gold"] = {**timing, "gold_layer_s": layer_seconds(run_dir / "run-gold.log", "gold"),
                          **new_batches(cfg, seen_ids), "reader": seen}
    log(f"run-gold from scratch {timing['wall_s']} s")


def ratios(result: dict) -> dict:
    refresh, gold, run_all = result.get("refresh", {}), result.get("run_gold", {}), result.get("run_all", {})
    div = lambda a, b: round(a / b, 2) if a is not None and b else None  # noqa: E731
    # The refresh's own log line: its build and switch, after its JVM started.
    parts = (refresh.get("build_s"), refresh.get("switch_s"))
    in_jvm = None if None in parts else sum(parts)
    out = {"target": TARGET,
           "refresh_over_run_gold": div(refresh.get("wall_s"), gold.get("wall_s")),
           "refresh_over_run_all_gold": div(refresh.get("wall_s"), run_all.get("gold_layer_s")),
           "refresh_in_jvm_over_run_all_gold": div(in_jvm, run_all.get("gold_layer_s")),
           "refresh_batches_over_run_all_batches": div(refresh.get("batch_s"), run_all.get("batch_s"))}
    r = out["refresh_over_run_gold"]
    out["time_met"] = None if r is None else r <= TARGET
    out["readers_met"] = refresh.get("zero_bad_seconds")
    return out


def markdown(result: dict) -> str:
    ra, rf, rg, q = (result.get(k) or {} for k in ("run_all", "refresh", "run_gold", "ratios"))
    verdict = lambda ok: "not measured" if ok is None else "met" if ok else "MISSED"  # noqa: E731
    f = lambda v, unit="": "-" if v is None else f"{v}{unit}"  # noqa: E731
    lines = [f"# Full refresh of gold, N = {result['events']:,} events", "",
             f"Started {result['started']}, {result['cores']} cores, commit {result.get('commit', '?')}.", "",
             "| measure | seconds |", "|---|---|",
             f"| run-all, whole | {f(ra.get('wall_s'))} |",
             f"| gold in run-all (`gold: done in`; sum of batch_ms) | {f(ra.get('gold_layer_s'))}; {f(ra.get('batch_s'))} |",
             f"| run-gold from scratch after reset-gold (process start to exit) | {f(rg.get('wall_s'))} |",
             f"| refresh gold (process start to exit; build, switch) | {f(rf.get('wall_s'))} "
             f"({f(rf.get('build_s'))}, {f(rf.get('switch_s'))}) |", "",
             "| target | value | verdict |", "|---|---|---|",
             f"| refresh <= {TARGET}x from-scratch gold (run-gold) | {f(q.get('refresh_over_run_gold'), 'x')} | "
             f"{verdict(q.get('time_met'))} |",
             f"| zero seconds of an empty or partial gold table during the refresh | "
             f"{sum((r.get('violation_count') or 0) for r in (rf.get('reader') or {}).values())} violations | "
             f"{verdict(q.get('readers_met'))} |", "",
             f"Information: refresh / gold in run-all {f(q.get('refresh_over_run_all_gold'), 'x')}; the refresh's "
             f"build + switch / gold in run-all {f(q.get('refresh_in_jvm_over_run_all_gold'), 'x')}; its batches / "
             f"run-all's gold batches {f(q.get('refresh_batches_over_run_all_batches'), 'x')}.", "",
             "| table | rows before | reader samples | min rows seen (refresh) | violations (refresh) "
             "| versions the refresh committed: rows | seconds without a full table (run-gold from scratch) |",
             "|---|---|---|---|---|---|---|"]
    for name, r in (rf.get("reader") or {}).items():
        g = (rg.get("reader") or {}).get(name, {})
        committed = ", ".join(f"v{v['version']}: {v['rows']}{'' if v['ok'] else ' (BAD)'}"
                              for v in (rf.get("versions") or {}).get(name, [])) or "-"
        lines.append(f"| {name} | {r['before']} | {r['samples']} | {r['min_rows']} | {r['violation_count']} "
                     f"| {committed} | {f(g.get('bad_s'))} |")
    for name, r in (rf.get("reader") or {}).items():
        lines += [f"- refresh, {name} at {v['t_s']} s: version {v['version']}, {v['rows']} rows: {v['why']}"
                  for v in r["violations"][:5]]
    if result.get("error"):
        lines += ["", f"Error: {result['error']}"]
    return "\n".join(lines) + "\n"


def main(argv=None, prog: str = "python -m bench.refresh") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--events", type=int, default=200_000, help="events generated (default 200000)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--every", type=float, default=0.5, help="seconds between the reader's samples (default 0.5)")
    p.add_argument("--keep", action="store_true", help="keep the temporary lakehouse")
    args = p.parse_args(argv)
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    run_dir = OUT / f"refresh-{stamp}-{args.events}"
    run_dir.mkdir(parents=True)
    root = Path(tempfile.mkdtemp(prefix="bench-refresh-"))
    result = {"events": args.events, "seed": args.seed, "cores": os.cpu_count(), "every_s": args.every,
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "load_at_start": [round(x, 1) for x in os.getloadavg()], **provenance()}
    try:
        measure(args, run_dir, root, result)
    except Exception as e:  # noqa: BLE001 - what was measured before it is still saved
        result["error"] = f"{type(e).__name__}: {e}"
        args.keep = True           # for the logs and tables that explain it
    result["ratios"] = ratios(result)
    result["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    base = OUT / f"refresh-{stamp}-{args.events}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    base.with_suffix(".md").write_text(markdown(result))
    if args.keep:
        print(f"lakehouse kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    print(markdown(result))
    print(f"results: {base}.json, {base}.md (logs in {run_dir})")
    # A missed target is a figure, as in bench.run: only a run that could not measure fails.
    return 1 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
