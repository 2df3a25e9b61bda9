"""make soak: the growth judgement on synthetic series, and a real 3-minute soak end to end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak.judge import KINDS, MB, PACED, checkpoint_settled_s, judge, settle_s, verdicts

REPO = Path(__file__).resolve().parent.parent


def test_judge_flat_passes_growing_fails_tiny_noise_passes():
    flat = [1000 * MB + (7 if i % 2 else -7) * MB for i in range(20)]
    assert judge(flat, 64 * MB, 0.25)["verdict"] == "pass"

    growing = [1000 * MB + i * 60 * MB for i in range(20)]       # +60 MB a sample: a leak
    r = judge(growing, 64 * MB, 0.25)
    assert r["verdict"] == "GROWS" and r["ratio"] > 1.25

    # 3 files doubling to 12 is +300%, but below the floor of 50: not a finding.
    tiny = [3, 4, 3, 5, 8, 12, 10, 12]
    assert judge(tiny, 50, 0.25)["verdict"] == "pass"
    # Above the floor the same relative growth fails.
    assert judge([v * 100 for v in tiny], 50, 0.25)["verdict"] == "GROWS"

    assert judge([1, 2, 3], 0, 0.25)["verdict"] == "short"


def test_odd_counts_leave_the_middle_out_and_settle_times_follow_retention():
    # 1, 1, [100], 1, 1: the middle sample belongs to neither half.
    assert judge([1, 1, 100, 1, 1], 0, 0.25)["verdict"] == "pass"
    ctx = {"warmup_s": 180, "retention_s": 600, "maintenance_interval_s": 120,
           "min_batches_to_retain": 20, "slowest_interval_s": 30, "run_s": 1800}
    assert settle_s("heap_used", ctx) == 180
    assert settle_s("disk_files", ctx) == 720
    assert settle_s("checkpoint_bytes", ctx) == 900        # (20 retained + 10 to a snapshot) x 30 s
    # State fills until the watermark lets its oldest entries go: judged from then on, and in
    # a soak shorter than that (make soak MINUTES=2) not judged at all, instead of "grows".
    from bench.soak.run import state_horizon_s
    from common.config import load_config

    assert state_horizon_s(load_config()) == 7200 / 60     # silver's 2-hour dedup at 60x
    assert settle_s("state_rows", dict(ctx, state_horizon_s=120)) == 180
    short = dict(ctx, warmup_s=40, run_s=120, state_horizon_s=120)
    assert settle_s("state_bytes", short) == 120
    filling = [{"t": t, "queries": {"silver": {"state_rows": t * 100}}} for t in range(10, 121, 10)]
    assert {r["series"]: r for r in verdicts(filling, short, 0.25)}["state_rows[silver]"]["verdict"] == "short"


def test_checkpoints_are_judged_once_every_stateful_query_made_enough_batches():
    # silver is stateful and slower than its trigger (one batch a minute); bronze has no state.
    samples = [{"t": t, "queries": {"silver": {"batches": 1, "state_rows": 5},
                                    "bronze": {"batches": 6, "state_rows": None}}} for t in range(60, 1801, 60)]
    assert checkpoint_settled_s(samples, 30, never=1801) == 1800
    assert checkpoint_settled_s(samples, 31, never=1801) == 1801
    ctx = {"warmup_s": 180, "retention_s": 600, "maintenance_interval_s": 120,
           "min_batches_to_retain": 20, "slowest_interval_s": 30, "run_s": 1800, "checkpoint_settled_s": 1200}
    assert settle_s("checkpoint_bytes", ctx) == 1200


def test_verdicts_judge_only_after_settling_and_chart_the_rest():
    # A table whose files climb during warm-up, then hold: judged flat from the warm-up on.
    samples = [{"t": t, "process": {}, "queries": {},
                "tables": {"bronze.events": {"live_files": min(t, 180), "live_bytes": t * 1000}},
                "checkpoints": {}} for t in range(60, 1801, 60)]
    ctx = {"warmup_s": 180, "retention_s": 600, "maintenance_interval_s": 120,
           "min_batches_to_retain": 20, "slowest_interval_s": 30, "run_s": 1800}
    rows = {r["series"]: r for r in verdicts(samples, ctx, 0.25)}
    assert rows["live_files[bronze.events]"]["verdict"] == "pass"
    assert rows["live_files[bronze.events]"]["first_window"] == pytest.approx(144)   # 60, 120, 180, 180, 180
    assert rows["live_bytes[bronze.events]"]["verdict"] == "info"


def test_batch_times_are_judged_only_while_the_soak_had_the_machine():
    """A batch that takes twice as long while other processes hold the cores is contention, not
    a pipeline that degrades: such samples are left out of the batch-time judgement."""
    ctx = {"warmup_s": 0, "retention_s": 600, "maintenance_interval_s": 120,
           "min_batches_to_retain": 20, "slowest_interval_s": 30, "run_s": 480}

    def samples(others):
        return [{"t": t, "others_cpu_share": share, "process": {}, "tables": {}, "checkpoints": {},
                 "queries": {"silver": {"batch_ms_mean": 20_000 if t <= 240 else 46_000}}}
                for t, share in zip(range(60, 481, 60), others)]

    def verdict(others):
        return {r["series"]: r for r in verdicts(samples(others), ctx, 1.0)}["batch_ms_mean[silver]"]

    # The slow second half ran while others took 60% of the machine: not judged.
    row = verdict([0.05] * 4 + [0.6] * 4)
    assert row["verdict"] == "contended" and row["contended_samples"] == 4
    # The same slowdown on a quiet machine is a finding.
    assert verdict([0.05] * 8)["verdict"] == "GROWS"
    # Contention in a few samples leaves the rest judged.
    row = verdict([0.05, 0.6, 0.05, 0.05, 0.05, 0.6, 0.05, 0.05])
    assert row["verdict"] == "GROWS" and row["contended_samples"] == 2


def test_state_rows_that_follow_starved_batches_are_contention_but_a_quiet_leak_is_found():
    """A stateful query holds a batch's rows until the next batch's watermark passes them: when
    others hold the cores and batches take minutes, state holds minutes of the feed."""
    ctx = {"warmup_s": 0, "retention_s": 600, "maintenance_interval_s": 120,
           "min_batches_to_retain": 20, "slowest_interval_s": 30, "run_s": 480}

    def verdict(others):
        samples = [{"t": t, "others_cpu_share": share, "process": {}, "tables": {}, "checkpoints": {},
                    "queries": {"silver": {"state_rows": 900 if t <= 240 else 3400}}}
                   for t, share in zip(range(60, 481, 60), others)]
        return {r["series"]: r for r in verdicts(samples, ctx, 1.0)}["state_rows[silver]"]

    assert verdict([0.05] * 4 + [0.71] * 4)["verdict"] == "contended"
    assert verdict([0.05] * 8)["verdict"] == "GROWS"


def test_a_short_soak_samples_a_twelfth_of_its_run_unless_told_and_a_sparse_interval_is_refused(tmp_path):
    """`make soak MINUTES=2` runs: the conf's 1-minute samples would be two, so a run that short
    is sampled SAMPLES times; an interval given that leaves fewer than four is a usage error."""
    from bench.soak.settings import SAMPLES, UsageError, settings

    args, _, _ = settings(["--minutes", "2", "--out", str(tmp_path)], "soak", "")
    assert args.interval.seconds == 120 / SAMPLES and args.warmup_s == 40
    args, _, _ = settings(["--minutes", "30", "--out", str(tmp_path)], "soak", "")
    assert args.interval.seconds == 60 and args.warmup_s == 180     # conf soak.sample_interval, warmup
    with pytest.raises(UsageError, match="leaves fewer than 4 samples in 2 min: give a shorter one"):
        settings(["--minutes", "2", "--sample-interval", "1 minute", "--out", str(tmp_path)], "soak", "")


@pytest.mark.slow
def test_short_soak_end_to_end(tmp_path, env):
    out = tmp_path / "soak"
    # Three minutes on 2 cores judge halves of four samples each, taken while the JIT and the
    # first maintenance round still compete with the batches: only gross growth (2x) fails here;
    # the 30-minute soak judges the conf's 25%. Event time 4x faster still, so the dedup and
    # gold watermarks close within a batch or two and state settles inside the short run.
    env = dict(env, LAKEHOUSE__SOAK__GROWTH_LIMIT="1.0", LAKEHOUSE__SOAK__EVENT_TIME_SPEEDUP="240")
    proc = subprocess.run([sys.executable, "-m", "bench.soak", "--minutes", "3", "--rate", "20",
                           "--sample-interval", "15 seconds", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    runs = list(out.iterdir())
    assert len(runs) == 1, proc.stdout
    run = runs[0]
    detail = f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}\n{(run / 'pipeline.log').read_text()[-3000:]}"
    assert proc.returncode == 0, detail
    doc = json.loads((run / "samples.json").read_text())
    assert doc["ok"] and not doc["problems"], detail
    assert len(doc["samples"]) == 12
    # Every kind has a series with samples; every kind judged from the warm-up on was judged.
    kinds = {r["kind"] for r in doc["verdicts"]}
    assert kinds == set(KINDS), set(KINDS) - kinds
    early = {k for k, (_, _, floor) in KINDS.items() if floor is not None and settle_s(k, doc["judge"]) < 180}
    # Beside the rest of the suite, batch times and state rows may have too few quiet samples to
    # be judged ("contended"): growth is still judged from the other kinds, and a paced kind
    # that grew while the soak had the machine fails.
    by_kind = {r["kind"]: r for r in doc["verdicts"]}
    judged = {k for k in early if by_kind[k]["verdict"] == "pass"
              or (k in PACED and by_kind[k]["verdict"] == "contended" and by_kind[k]["contended_samples"] > 0)}
    assert early <= judged, {k: by_kind[k] for k in early - judged}
    assert doc["audit"]["ok"], doc["audit"]
    assert doc["audit"]["prefix"] and doc["audit"]["accounting"]
    assert doc["end"]["tables"]["bronze.events"]["live_files"] > 0
    assert (run / "index.html").is_file() and (run / "process.png").is_file()
    assert {p.stem for p in run.glob("*.png")} >= {"live_files", "state_rows", "batch_ms_mean", "checkpoint_bytes"}
    assert "soak PASS" in proc.stdout
    # A passing soak leaves only its report behind.
    assert not (run / "lakehouse").exists()
