"""docs/benchmark.md is written by the bench: bench.run.main saves its results, then
bench.docs_page turns them into the page.

No Spark and no subprocess: the bench's own code computes every figure (throughput, quality,
incremental, baseline, latency percentiles, state), and only what it reads from the outside is
stood in for: the processes' walls and log lines, the ops tables' rows, the ceiling's timings.
So a figure or mark the page loses, or a results field the summary no longer understands,
fails here."""
from __future__ import annotations

import difflib
import json
import os
import sys
import types
from pathlib import Path

import pytest

import bench.run as run
from bench import docs_page, summary
from bench.steady import judge_step, sustained

EVENTS = 20_000
T0 = 1_800_000_000_000        # ms, the fake runs' first trigger


class FakeSession:
    """Answers the bench's SQL over ops.query_progress and ops.batch_accounting, and the row
    counts (g) reads, with fixed rows."""

    def __init__(self, cfg):
        pass

    def __call__(self):
        count = types.SimpleNamespace(count=lambda: EVENTS - 120)
        loader = types.SimpleNamespace(load=lambda path: count)
        return types.SimpleNamespace(read=types.SimpleNamespace(format=lambda fmt: loader))

    def sql(self, query: str) -> list[dict]:
        if "batch_accounting" in query:          # (f): 2.2 s of gate in 20 s of silver batches: 11%
            return [{"layer": "silver", "batches": 4, "batch_ms": 20_000, "quality_ms": 2_200},
                    {"layer": "gold", "batches": 6, "batch_ms": 30_000, "quality_ms": 1_500}]
        if "LIKE 'gold%'" in query:               # (e): state rows of the gold query
            rows, wm = [], T0
            for i, total in enumerate([30, 60, 90, 100, 95, 100, 98, 102]):
                wm += 3_600_000                    # the watermark moves 1 h a batch: 8 h in all
                rows.append({"query_name": "gold", "t": T0 + i * 10_000, "state_rows": total, "wm": wm})
            return rows
        if "input_rows = 0" in query:             # (h): batches that read no row, per query
            return [{"query_name": "gold", "n": 2, "p50": 1_500},
                    {"query_name": "silver", "n": 1, "p50": 400}]
        if "query_progress" in query:             # (b), (c): processing spans per layer
            return [{"query_name": "bronze_files", "t0": T0, "t1": T0 + 8_000},
                    {"query_name": "silver", "t0": T0 + 10_000, "t1": T0 + 33_000},
                    {"query_name": "gold", "t0": T0 + 40_000, "t1": T0 + 64_000}]
        raise AssertionError(f"unexpected bench query: {query}")

    def stop(self):
        pass


def fake_run_logged(cmd, env, log_path: Path, marks=()):
    """The walls of the processes the bench starts, and the result lines they print."""
    module = cmd[2] if len(cmd) > 2 else ""
    if module == "bench.baseline":
        log_path.write_text('BASELINE {"bronze": 5.0, "silver": 20.0, "gold": 20.0}\n')
        return 50.0, {}
    if module == "bench.baseline_stream" and "--steps" in cmd:   # (i): the plain run's steps
        rates = [int(x) for x in cmd[cmd.index("--steps") + 1].split(",")]
        steps = [synthetic_step(rate, growth=0.0 if i < 3 else 0.5) for i, rate in enumerate(rates)]
        log_path.write_text("BASELINE_STREAM " + json.dumps({"steps": steps, **sustained(steps)}) + "\n")
        return 400.0, {}
    if module == "bench.baseline_stream":           # (d): plain landing -> silver and fresh gold
        light = "light" in log_path.name
        fig = lambda p50, p95: {"files": 30, "visible": 30, "censored": 0, "p50_s": p50,  # noqa: E731
                                "p95_s": p95, "max_s": p95 + 0.1}
        log_path.write_text("BASELINE_STREAM " + json.dumps(
            {"silver": fig(1.2, 1.6), "zip_hourly_sightings": fig(2.0, 2.6) if not light else fig(2.5, 4.0),
             "cores_busy_during_feed": 0.35 if light else 0.9,
             "others_cpu_share_during_feed": 0.05 if light else None,
             "own_cpu_share_during_feed": 0.3 if light else None}) + "\n")
        return 60.0, {}
    if module == "bench.recompute":
        log_path.write_text('RECOMPUTE {"bronze": 10.0, "silver": 20.0, "gold": 30.0}\n')
        return 80.0, {}
    if "incremental" in log_path.name:
        return 40.0, {}
    return 100.0, {"bronze: done": 25.0, "silver: done": 60.0}     # the first run-all


def fake_generate(env, run_dir, n, seed, extra=()):
    return {"records": n // 2, "events": n, "span_s": 6 * 3600.0}


def synthetic_step(rate: int, growth: float, start: float = 1000.0, files: int = 60,
                   length: float = 180.0) -> dict:
    """One throughput step of `files` files, one a second, judged by bench.steady: latency 3 s for
    silver and 5 s for gold, plus `growth` seconds per second of landing time (0: kept up with).
    It reports the bench's default step length (`length`), as a step not stretched by
    step_seconds does."""
    rows = [{"landed": start + i, "silver": 3.0 + growth * i, "zip_hourly_sightings": 5.0 + growth * i}
            for i in range(files)]
    step = judge_step(rows, ["silver", "zip_hourly_sightings"], start, start + files - 1,
                      start + files + 5 + growth * files * 2)
    step.update({"rate": rate, "seconds": length, "files": len(rows), "fed_events_per_s": rate,
                 "cores_busy_during_feed": min(1.0, rate / 5000), "drained": True, "drain_s": 5.0})
    return step


def fake_sustained_pipeline(args, run_dir, rates, seconds, intervals):
    """(i): the pipeline keeps up with the first two steps (by default 4,000 and 8,000 events/s),
    not with the third."""
    steps = [synthetic_step(rate, growth=0.0 if i < 2 else 0.5) for i, rate in enumerate(rates[:3])]
    return {"steps": steps, **sustained(steps)}


def fake_quiet_phase(args, run_dir):
    """(h)'s quiet feed: the run's config (FakeSession answers its batches)."""
    from common.config import load_config

    return load_config(env=run.base_env(run_dir / "q"))


def fake_stream_phase(args, run_dir, rate=None, seconds=None, intervals=None, tag=""):
    """(d): landing -> gold latencies of 30 files, through the bench's own percentiles; the light
    rate's are lower."""
    from bench.latency import summarize
    from common.config import load_config

    light = 0.5 if tag else 1.0
    rows = [{"landed": 100.0 + i, "bronze": 1.0, "silver": 2.0 * light, "zip_hourly_sightings": (3.0 + i / 10) * light,
             "device_activity": 3.5, "device_sessions": 4.0 + i / 10} for i in range(30)]
    for r in rows:
        r["max_over_gold"] = max(r[t] for t in run.GOLD)
    rate = rate or args.rate
    latency = {"rate_events_per_s": rate, "fed_events_per_s": rate, "interval": intervals or "conf",
               "files": len(rows), "warmup_s": 0, "drained": True,
               "zip_hourly_sightings": summarize(rows, "zip_hourly_sightings", 200.0),
               "max_over_gold": summarize(rows, "max_over_gold", 200.0),
               "silver": summarize(rows, "silver", 200.0),
               "stages_p50_s": {}, "cores_busy_during_feed": 0.4 if tag else 0.97}
    return latency, {"span_s": 8 * 3600, "multiple": 10}, load_config(env=run.base_env(run_dir / "s"))


def stand_in_for_the_outside(tmp_path, monkeypatch):
    ceiling = types.ModuleType("bench.ceiling")
    ceiling.measure = lambda spark, landing, events, profile: {
        "method": "text", "seconds": 0.92, "events_per_s": round(events / 0.92),
        "methods": {"text": {"seconds": 0.92, "events_per_s": round(events / 0.92)},
                    "binary_file": {"seconds": 1.37, "events_per_s": round(events / 1.37)}}}
    monkeypatch.setitem(sys.modules, "bench.ceiling", ceiling)
    monkeypatch.setattr(run, "Session", FakeSession)
    monkeypatch.setattr(run, "run_logged", fake_run_logged)
    monkeypatch.setattr(run, "generate", fake_generate)
    monkeypatch.setattr(run, "stream_phase", fake_stream_phase)
    monkeypatch.setattr(run, "quiet_phase", fake_quiet_phase)
    monkeypatch.setattr(run, "sustained_pipeline", fake_sustained_pipeline)
    monkeypatch.setattr(run, "OUT", tmp_path / "bench-results")
    monkeypatch.setattr(docs_page, "DOCS", tmp_path / "docs" / "benchmark.md")


@pytest.fixture
def bench_run(tmp_path, monkeypatch):
    """One whole `python -m bench.run -n 20000`, results and docs page under tmp_path."""
    stand_in_for_the_outside(tmp_path, monkeypatch)
    assert run.main(["-n", str(EVENTS)]) == 0
    [saved] = (tmp_path / "bench-results").glob("bench-*.json")
    return json.loads(saved.read_text()), saved, tmp_path / "docs" / "benchmark.md"


def test_bench_rewrites_the_docs_page_with_every_figure_and_mark(bench_run):
    record, saved, page_path = bench_run
    page = page_path.read_text()
    # The figures the bench computed, as the page shows them.
    assert record["throughput"]["end_to_end_events_per_s"] == 200                 # 20,000 / 100 s
    assert record["throughput"]["end_to_end_vs_ceiling"] == 0.009
    assert record["quality"]["silver_share"] == 0.11
    assert record["incremental"]["ratio_wall"] == 0.5                               # 40 s / 80 s
    assert record["baseline"]["run_all_over_baseline"] == 2.0                       # 100 s / 50 s
    # (b) against (g): run-all's rate over the plain baseline's; the ceiling only as information.
    assert "200 events/s (100.0 s) = 0.5x plain Structured Streaming's rate (g); 0.009x the ceiling (a)" in page
    assert "11.0% (2.2 s of 20.0 s)" in page
    assert "40.0 s vs 80.0 s = 0.5x" in page
    assert "run-all 100.0 s / baseline 50.0 s = 2.0x" in page
    # (d) at both rates, each beside plain Structured Streaming's silver and fresh gold on the same feed.
    heavy, light = record["latency"], record["latency_light"]
    assert heavy["rate_events_per_s"] == 5000 and light["rate_events_per_s"] == run.LIGHT_RATE
    assert light["interval"] == run.LIGHT_INTERVAL
    assert heavy["plain"]["zip_hourly_sightings"]["p95_s"] == 2.6 and light["plain"]["silver"]["p95_s"] == 1.6
    gold_p95 = heavy["zip_hourly_sightings"]["p95_s"]
    x = summary.latency_ratios(heavy)
    assert x == {"silver_p50": 1.67, "silver_p95": 1.25, "gold_p50": round(heavy["zip_hourly_sightings"]["p50_s"] / 2.0, 2),
                 "gold_p95": round(gold_p95 / 2.6, 2)} and x["gold_p95"] > 1.3
    assert summary.latency_ratios(light)["gold_p95"] == round(light["zip_hourly_sightings"]["p95_s"] / 4.0, 2)
    assert "(d) latency at 5,000 events/s (heavy)" in page and f"(d) latency at {run.LIGHT_RATE:,} events/s (light)" in page
    assert f"landing -> gold.zip_hourly_sightings p50 {heavy['zip_hourly_sightings']['p50_s']} s" in page
    assert "cores 97% busy during the feed" in page and "cores 40% busy during the feed" in page
    assert "landing -> fresh gold p50 2.0 s, p95 2.6 s; cores 90% busy during the feed" in page
    assert f"Pipeline / plain p95: silver 1.25x, gold {x['gold_p95']}x" in page
    assert "| p95 <= 1.3x plain: silver met, gold MISSED |" in page
    assert "cores 35% busy during the feed (this run 30%, others 5%)" in page    # a shared machine
    line = summary.summary_line(record)
    assert (f"latency at 5,000 ev/s p95 pipeline/plain: silver 2.0/1.6 s = 1.25x (met), gold {gold_p95}/2.6 s = "
            f"{x['gold_p95']}x (MISSED), cores 97%/90%") in line
    # (i), the default steps: the pipeline kept up with 4,000 and 8,000 events/s, the plain run up to 16,000.
    su = record["sustained"]
    assert su["rates"] == [4000, 8000, 16000, 32000]
    assert su["pipeline"]["max_rate"] == 8000 and su["plain"]["max_rate"] == 16000
    assert [st["keeps_up"] for st in su["pipeline"]["steps"]] == [True, True, False]
    assert su["ratio"] == 0.5 and su.get("bound") is None
    assert "pipeline 8,000 events/s; steps: 4,000 kept up" in page and "16,000 fell behind" in page
    assert "Plain Structured Streaming 16,000 events/s" in page and "Pipeline / plain: 0.5x" in page
    assert "sustained 8,000/16,000 ev/s pipeline/plain = 0.5x (MISSED)" in line
    # Each layer's processing span: first trigger to last batch end.
    assert "2,500 events/s processing (8.0 s)" in page           # bronze
    assert "870 events/s processing (23.0 s)" in page            # silver
    assert "833 events/s processing (24.0 s)" in page            # gold
    assert "None" not in page
    # Every row of the bench's own table, with its mark, is in the page's table.
    rows = summary.rows(record)
    assert {r[0][:3] for r in rows} == {f"({x})" for x in "abcdefghi"}
    assert "gold 1.5 s (2), silver 0.4 s (1)" in page
    for figure, value, target in rows:
        assert f"| {figure} | {value} | {target} |" in page
    # Each target's verdict: these numbers meet some and miss others.
    v = summary.verdicts(record)
    assert v == {"incremental": False, "latency_silver": True, "latency_gold": False, "state": True,
                 "quality": False, "baseline": False, "empty": False,   # 11% > 10%; 1.5 s > 1 s
                 "sustained": False}                                     # 0.5x < 0.8x
    for key, met in v.items():
        assert f"{summary.TARGETS[key]}: **{'met' if met else 'MISSED'}**" in page
    assert summary.summary_line(record) in page
    # The run's facts, and the fixed explanation of every figure.
    assert f"N** = {EVENTS:,} events" in page and record["started"] in page
    assert f"{record['cores']} cores" in page and "GB memory" in page
    if record.get("commit"):
        assert record["commit"] in page
    assert saved.name in page
    for letter, name, _, _ in docs_page.FIGURES:
        assert f"| ({letter}) | {name} |" in page
    assert "No run has been recorded" not in page


def test_page_from_saved_results_without_rerunning(bench_run, tmp_path, capsys):
    record, saved, page_path = bench_run
    out = tmp_path / "again.md"
    assert docs_page.main(["--results", str(saved.parent), "--out", str(out)]) == 0
    assert out.read_text() == page_path.read_text()
    assert saved.name in capsys.readouterr().out


def test_latest_run_wins(tmp_path):
    for stamp, n in (("20260101T000000Z", 1000), ("20260301T000000Z", 2000), ("20260201T000000Z", 3000)):
        (tmp_path / f"bench-{stamp}-{n}.json").write_text(json.dumps({"events": n, "started": stamp}))
    (tmp_path / "audit-20260401T000000Z.json").write_text("{}")     # make bench-audit's, not a bench run
    record, path = docs_page.load(tmp_path)
    assert record["events"] == 2000 and path.name == "bench-20260301T000000Z-2000.json"


def test_the_committed_page_explains_the_figures_as_the_bench_writes_them():
    """docs/benchmark.md above its latest run is what bench.docs_page writes: a finding added to
    the page by hand and not to the generator is lost by the next `make bench`, and a figure's
    explanation changed in the generator is not on the page until a run rewrites it."""
    fixed = docs_page.render(None).split(docs_page.LATEST)[0]
    page = docs_page.DOCS.read_text()
    assert docs_page.LATEST in page
    committed = page.split(docs_page.LATEST)[0]
    if committed != fixed:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), fixed.splitlines(True),
                                                 "docs/benchmark.md", "bench.docs_page"))[:60])
        pytest.fail(f"docs/benchmark.md and bench/docs_page.py differ above {docs_page.LATEST!r} "
                    "(edit docs_page.py, then `python -m bench.docs_page` or keep the latest run):\n" + diff)


def test_page_without_any_run(tmp_path):
    out = tmp_path / "benchmark.md"
    assert docs_page.main(["--results", str(tmp_path / "nothing-here"), "--out", str(out)]) == 0
    page = out.read_text()
    assert "No run has been recorded yet" in page and "make bench" in page
    for key in summary.TARGETS:
        assert summary.TARGETS[key] in page
    assert "| figure | value | target |" not in page


def test_a_run_without_the_ceiling_gives_its_rate_alone(bench_run):
    """bench.run --only b (no (a)): there is no ceiling to divide the end-to-end rate by."""
    record, _, _ = bench_run
    record = json.loads(json.dumps(record))
    record.pop("ceiling", None)
    record["throughput"]["end_to_end_vs_ceiling"] = None
    line = summary.summary_line(record)
    assert "ceiling -" in line and "None" not in line
    assert f"end-to-end {summary._n(record['throughput']['end_to_end_events_per_s'])} ev/s = 0.5x plain (g) |" in line


def test_no_watermark_only_batch_is_a_missed_figure_not_a_free_pass(bench_run):
    """With streaming.no_data_batches off a run has no batch without rows, and nothing closes
    until new data: (h) says so and the target is missed; with them on, a run without one is
    left unmeasured."""
    record, _, _ = bench_run
    record = json.loads(json.dumps(record))
    record["empty_batches"] = {"run_all": {}}
    record["no_data_batches"] = False
    assert summary.verdicts(record)["empty"] is False
    (h,) = [r for r in summary.rows(record) if r[0].startswith("(h)")]
    assert "none ran" in h[1] and "streaming.no_data_batches is false" in h[1]
    assert h[2].endswith("MISSED")
    record["no_data_batches"] = True
    assert summary.verdicts(record)["empty"] is None
    assert not [r for r in summary.rows(record) if r[0].startswith("(h)")]


def test_the_machine_busy_share_comes_from_proc_stat_with_idle_and_iowait_not_busy():
    from bench.contention import busy_share, cpu_ticks

    # user nice system idle iowait irq softirq steal guest guest_nice
    before = cpu_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    after = cpu_ticks("cpu  250 0 100 850 100 0 0 0 0 0\n")
    assert before == (150, 1000) and after == (350, 1300)
    assert busy_share(before, after) == round(200 / 300, 3)
    assert busy_share(None, after) is None and busy_share(after, after) is None
    busy, total = cpu_ticks()            # this machine's own
    assert 0 <= busy <= total


def test_a_run_s_own_cpu_is_counted_apart_from_others():
    """What the measured run used, apart from what other processes took of the cores."""
    import time

    from bench.contention import OtherCpu, cpu_share

    with OtherCpu(interval=0.2) as cpu:
        t = time.process_time()
        while time.process_time() - t < 0.4:       # this process is the run: 0.4 s of CPU
            pass
        time.sleep(0.3)
    assert 0.3 <= cpu.own_seconds() <= 1.5
    assert cpu_share(cpu.own_seconds(), 1.0) == round(cpu.own_seconds() / os.cpu_count(), 3)
    assert cpu_share(None, 1.0) is None and cpu_share(1.0, 0) is None


def test_a_run_s_cpu_is_split_by_the_part_that_spent_it():
    """(g)'s CPU by part: the run's own process (the Python driver) apart from the processes it
    starts (Python workers), read per thread from /proc; JVM threads by their names. What this
    process ran before the phase (the suite's JVM, its Kafka broker) is not the run's."""
    import subprocess

    from bench.contention import OtherCpu, part_of

    # Each process spins 0.5 s of CPU, then idles past a sample so its last ticks are read.
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(0.5)\n"
    driver = ("import subprocess, sys\n"
              f"w = subprocess.Popen([sys.executable, '-c', {spin!r}])\n" + spin + "w.wait()\n")
    idle = subprocess.Popen([sys.executable, "-c", spin])     # this process's own, started before
    try:
        with OtherCpu(interval=0.2, by_part=True) as cpu:
            subprocess.run([sys.executable, "-c", driver], check=True)
    finally:
        idle.wait()
    parts = cpu.own_parts()
    assert set(parts) == {"Python driver", "Python workers"}, parts
    assert 0.3 <= parts["Python driver"] <= 0.9 and 0.3 <= parts["Python workers"] <= 0.9, parts
    assert part_of("java", "Executor task l", True) == "tasks"
    assert part_of("java", "Thread-17", True) == "driver: calls from Python"
    assert part_of("java", "stream executio", True) == "driver: streaming engine"
    assert part_of("java", "C1 CompilerThre", True) == "JIT"
    assert part_of("java", "GC Thread#3", True) == "GC"
    assert part_of("java", "dag-scheduler-e", True) == "JVM other"
    assert part_of("bash", "bash", True) == "other"
    # Side by side, the parts where run-all spends the most beyond plain Spark first.
    row = summary.cpu_parts({"tasks": 17.0, "JIT": 8.0, "Python driver": 5.0},
                            {"tasks": 8.5, "JIT": 5.0, "GC": 1.0})
    assert row == ("total 30.0 / 14.5; tasks 17.0 / 8.5; Python driver 5.0 / 0.0; JIT 8.0 / 5.0; "
                   "GC 0.0 / 1.0")
    assert summary.cpu_parts({}, {"tasks": 1.0}) is None


def test_only_takes_every_figure_the_help_lists():
    letters = [line.split()[0] for line in run.__doc__.splitlines()
               if len(line) > 4 and line[:2] == "  " and line[2].isalpha() and line[3:5] == "  "]
    assert "".join(letters) == run.SECTIONS == "abcdefghi"
    assert run.parse_args(["--only", ",".join(letters)]).sections == set(letters)
    with pytest.raises(SystemExit):
        run.parse_args(["--only", "j"])


def test_only_h_runs_the_two_runs_it_times(tmp_path, monkeypatch):
    """(h) reads the batches of (b)'s run-all, of the streaming run and of a quiet feed: `--only h`
    runs all three."""
    stand_in_for_the_outside(tmp_path, monkeypatch)
    assert run.main(["-n", str(EVENTS), "--only", "h"]) == 0
    [saved] = (tmp_path / "bench-results").glob("bench-*.json")
    record = json.loads(saved.read_text())
    assert record["sections"] == ["h"]
    assert set(record["empty_batches"]) == {"run_all", "stream", "quiet"}
    assert "ceiling" not in record and "baseline" not in record and "incremental" not in record
    assert "latency" not in record and "state" not in record
    (h,) = [r for r in summary.rows(record) if r[0].startswith("(h)")]
    assert "gold 1.5 s (2), silver 0.4 s (1)" in h[1]
    assert "quiet feed: gold 1.5 s (2)" in h[1]


def test_a_record_from_before_issue_60_still_renders(bench_run):
    """Saved results keep their shape: the plain run's silver figures at the top of `plain`, no
    fresh gold, no light rate, no (i): the page shows what they hold and marks the rest."""
    record, _, _ = bench_run
    record = json.loads(json.dumps(record))
    record["latency"]["plain"] = {"files": 30, "visible": 30, "censored": 0, "p50_s": 1.2, "p95_s": 1.6,
                                  "max_s": 1.7, "cores_busy_during_feed": 0.9}
    for key in ("latency_light", "sustained"):
        record.pop(key)
    x = summary.latency_ratios(record["latency"])
    assert x["silver_p95"] == 1.25 and x["gold_p95"] is None
    v = summary.verdicts(record)
    assert v["latency_silver"] is True and v["latency_gold"] is None and v["sustained"] is None
    page = docs_page.render(record, "old.json")
    assert "not timed (a run from before the fresh gold)" in page and "None" not in page
    assert "gold -x" not in summary.summary_line(record)


def step_rows(latency, seconds: int = 90, start: float = 0.0, layer: str = "zip_hourly_sightings"):
    """One file a second; latency(i) seconds to the layer (None: not visible)."""
    return [{"landed": start + i, layer: latency(i)} for i in range(seconds)]


def test_steady_state_keeps_up_and_growth_falls_behind():
    """bench/steady.py's definition on synthetic steps: a flat latency (with a batch sawtooth) keeps
    up; a latency growing 0.2 s per second, or a file never visible, does not."""
    from bench import steady

    layer = "zip_hourly_sightings"
    flat = step_rows(lambda i: 8.0 + (10 - i % 10))         # batches every 10 s: 8-18 s of latency
    j = steady.judge_layer(flat, layer, 0.0, 89.0, 120.0)
    assert j["keeps_up"] is True and not j["backlog_growing"] and not j["latency_growing"]
    assert 8 <= j["backlog_early"] <= 18 and abs(j["latency_late_s"] - j["latency_early_s"]) < 2
    growing = step_rows(lambda i: 5.0 + 0.2 * i)
    g = steady.judge_layer(growing, layer, 0.0, 89.0, 200.0)
    assert g["latency_growing"] and g["backlog_growing"] and g["keeps_up"] is False
    # Small figures move by more than 25% with one batch: the floors keep that from failing a step.
    small = step_rows(lambda i: 1.0 + (i % 4 == 0) * 1.5)
    assert steady.judge_layer(small, layer, 0.0, 89.0, 120.0)["keeps_up"] is True
    # A file still waiting at the end of the drain counts with its wait: the step is not kept up with.
    stuck = step_rows(lambda i: None if i == 80 else 5.0)
    s = steady.judge_layer(stuck, layer, 0.0, 89.0, 150.0)
    assert s["visible"] == 89 and s["keeps_up"] is False
    # Too few commits after the warm-up to compare two against two: not judged, and the steps stop.
    assert steady.judge_layer(step_rows(lambda i: 1.0, seconds=2), layer, 0.0, 1.0, 5.0)["keeps_up"] is None
    slow = step_rows(lambda i: 60.0 + (30 - i % 30))        # a batch every 30 s, 60-90 s behind
    assert steady.judge_layer(slow, layer, 0.0, 89.0, 200.0)["keeps_up"] is None
    # Batches of uneven length move the oldest wait of a commit by up to a batch: not growth.
    commits = [10, 20, 30, 36, 42, 48, 54, 68, 82, 96]       # 6-s batches, then 14-s ones
    uneven = step_rows(lambda i: next(c for c in commits if c >= i + 4) - i)
    u = steady.judge_layer(uneven, layer, 0.0, 89.0, 120.0)
    assert u["latency_late_s"] > 1.25 * u["latency_early_s"] and u["keeps_up"] is True
    assert u["commit_gap_s"] == 6 and u["latency_late_s"] - u["latency_early_s"] < 6


def test_a_step_lasts_long_enough_for_the_commits_the_step_before_predicts():
    """The full run of 2026-12-04: gold committed every 19 s at 8,000 events/s, so the 16,000
    step (gaps about twice as long) needs 5 commits of 38 s in its judged two thirds, not 180 s;
    a fast run keeps the steps' length, and no step grows past MAX_STRETCH times it."""
    from bench import steady

    def judged(rate, silver_gap, gold_gap, keeps_up=True):
        return {"rate": rate, "keeps_up": keeps_up,
                "layers": {"silver": {"commit_gap_s": silver_gap}, "zip_hourly_sightings": {"commit_gap_s": gold_gap}}}

    assert steady.step_seconds(180, None, 4000) == 180                      # the first step
    assert steady.step_seconds(180, judged(8000, 17.0, 19.0), 16000) == 285
    assert steady.step_seconds(180, judged(16000, 5.0, 5.0), 32000) == 180  # the plain run's gaps
    assert steady.step_seconds(180, judged(16000, 30.0, 37.0), 32000) == 540
    assert steady.step_seconds(180, judged(8000, 17.0, 19.0, keeps_up=None), 16000) == 180
    # A stretched step names its length in the table.
    row = dict(judged(16000, 30.0, 37.0), seconds=285, files=285, drained=True,
               cores_busy_during_feed=0.99, others_cpu_share_during_feed=0.0, own_cpu_share_during_feed=0.99)
    row["layers"]["zip_hourly_sightings"].update(backlog_early=30, backlog_late=31, latency_early_s=60,
                                                 latency_late_s=62, p95_s=80)
    text = summary._steps({"max_rate": 16000, "kept_up_with_all": True, "steps": [row]}, 180)
    assert "16,000 for 285 s kept up" in text, text


def test_sustained_rate_and_ratio_from_the_steps():
    from bench import steady

    ok, behind = {"keeps_up": True}, {"keeps_up": False}
    assert steady.sustained([{**ok, "rate": 1000}, {**ok, "rate": 2000}, {**behind, "rate": 4000}]) == \
        {"max_rate": 2000, "kept_up_with_all": False}
    assert steady.sustained([{**behind, "rate": 1000}]) == {"max_rate": None, "kept_up_with_all": False}
    every = steady.sustained([{**ok, "rate": 1000}, {**ok, "rate": 2000}])
    assert every == {"max_rate": 2000, "kept_up_with_all": True}
    exact = {"max_rate": 2000, "kept_up_with_all": False}
    rates = [1000, 2000, 4000]
    assert steady.ratio(exact, {"max_rate": 4000, "kept_up_with_all": False}, rates) == {"ratio": 0.5, "bound": None}
    assert steady.ratio(every, every, rates)["ratio"] is None
    assert steady.ratio(exact, {"max_rate": None, "kept_up_with_all": False}, rates)["ratio"] is None
    assert steady.ratio({"max_rate": None}, exact, rates)["ratio"] == 0.0
    # Verdicts where the steps bound the ratio from one side only.
    assert summary.sustained_verdict({"ratio": 1.0, "bound": "at least"}) is True
    assert summary.sustained_verdict({"ratio": 0.5, "bound": "at most"}) is False
    assert summary.sustained_verdict({"ratio": 0.9, "bound": "at most"}) is None
    assert summary.sustained_verdict({"ratio": 0.8}) is True and summary.sustained_verdict({"ratio": None}) is None
    assert steady.parse_steps("1000, 2000,4000") == [1000, 2000, 4000]
    for bad in ("", "2000,1000", "0,1000", "1000,1000"):
        with pytest.raises(ValueError):
            steady.parse_steps(bad)


def test_the_same_intervals_reach_both_runs_through_the_environment():
    assert run.interval_env(None) == {}
    assert run.interval_env("10 seconds") == {"TRIGGER_INTERVAL": "10 seconds"}
    assert run.interval_env("bronze=10 seconds, gold=5 seconds") == {
        "LAKEHOUSE__STREAMING__BRONZE_INTERVAL": "10 seconds", "LAKEHOUSE__STREAMING__GOLD_INTERVAL": "5 seconds"}
    for bad in ("soon", "platinum=1 second", "gold=soon"):
        with pytest.raises(ValueError):
            run.interval_env(bad)
    with pytest.raises(SystemExit):
        run.parse_args(["--light-interval", "gold=soon"])
    args = run.parse_args(["--only", "d,i", "--light-rate", "300", "--throughput-rates", "500,1000",
                           "--throughput-seconds", "40"])
    assert args.sections == {"d", "i"} and args.light_rate == 300 and args.throughput_seconds == 40
