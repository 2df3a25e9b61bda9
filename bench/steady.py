"""Figure (i), sustained throughput: the feed stepped up rate by rate, and for each step whether a
run kept up with it. One definition for the pipeline (bench/run.py) and the plain run
(bench/baseline_stream.py); the judgement is a pure function of the files' landing and
visibility times, so tests/test_bench_docs.py checks it on synthetic numbers.

A step lands one file a second at its rate for its duration, its event time continuing where the
step before ended at a fixed speed (`speedup` seconds of event time per second). After the feed,
the run is given up to `drain_s` seconds to make every file of the step visible in the last layer
judged; only then does the next step start, so each step starts from an empty backlog and is
judged on its own files. The steps stop at the first one the run did not keep up with.

For each layer (silver, and the fresh gold table) and each file: visible = landing time +
latency (bench/latency.py for the pipeline, bench/baseline_stream.py for the plain run). A layer
is judged at its commits, so a batch's sawtooth (files wait, then a commit shows them all) does
not read as growth:

  judged part   the commits that made files of the step visible after the step's first third
                (`WARMUP_SHARE`: a run starting from an empty backlog needs about one latency
                to reach its steady one) and before its feed ended (once the feed stops, the run
                is less loaded and the last files go faster); the first half of those commits is
                the early half, the second half the late one (the middle one of an odd count in
                neither);
  backlog       right after a commit: files of the step landed by then minus files of the step
                visible by then (what the batch could not take);
  latency       of a commit: its time minus the landing time of the oldest file it made visible
                (the longest wait it ended);
  growing       a figure's mean over the late half exceeds its mean over the early half by more
                than `GROWTH` (25%) AND by more than its floor: one batch's worth, the median time
                between the judged commits (for the backlog: the files landed in that time), and
                at least `LATENCY_FLOOR` seconds (`BACKLOG_FLOOR` files). A batch more or less
                before a commit moves its figures by that much without anything growing;
  keeps up      every file of the step visible by the end of the drain, and neither the backlog
                nor the latency growing. Fewer than `MIN_COMMITS` commits in the judged part (a
                step too short for the run's latency and batch length): not judged, and the
                steps stop.

A step lasts `seconds`, or longer when the run's batches are long (`step_seconds`): near its limit
a run's commits come about twice as far apart at twice the rate, so after a judged step the next
one lasts long enough for MIN_COMMITS + 1 of the commits the step before predicts in its judged
part (at most `MAX_STRETCH` times `seconds`). With a fixed length the pipeline's 16,000 events/s
step (gold committing every 37 s) was not judged in one run and ended its steps at 8,000.

A run keeps up with a step when every judged layer does; its sustained throughput is the highest
step rate it kept up with, every lower step included (a lower bound when it kept up with them all).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

WARMUP_SHARE = 1 / 3
GROWTH = 0.25
BACKLOG_FLOOR = 2.0      # files (one lands a second)
LATENCY_FLOOR = 2.0      # seconds
MIN_COMMITS = 4          # two a half: one commit against one is a single batch's noise
MAX_STRETCH = 3.0        # a step lasts at most this many times --throughput-seconds


def parse_steps(text: str) -> list[int]:
    """'1000,2000,4000' -> [1000, 2000, 4000], ascending and positive."""
    rates = [int(x) for x in text.replace(" ", "").split(",") if x]
    if not rates or any(r <= 0 for r in rates) or rates != sorted(set(rates)):
        raise ValueError(f"steps must be ascending positive rates, got {text!r}")
    return rates


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def growing(early: float | None, late: float | None, floor: float) -> bool | None:
    """Whether `late` exceeds `early` by more than GROWTH (relative) and more than `floor`
    (absolute); None when either half had nothing to judge."""
    if early is None or late is None:
        return None
    return late > early * (1 + GROWTH) and late - early > floor


def judge_layer(rows: list[dict], layer: str, start: float, end: float, observed_until: float) -> dict:
    """One layer over one step: rows are the step's files ({"landed": epoch s, layer: latency s
    or None}), the feed ran from `start` to `end` (its last file's landing)."""
    landed = sorted(r["landed"] for r in rows)
    seen = [(round(r["landed"] + r[layer], 3), r["landed"]) for r in rows if r[layer] is not None]
    visible = sorted(v for v, _ in seen)
    w0 = start + WARMUP_SHARE * (end - start)
    oldest: dict[float, float] = {}
    for v, t in seen:
        if w0 <= v <= end:
            oldest[v] = min(oldest.get(v, t), t)
    commits = sorted(oldest)
    backlog = [_count_le(landed, c) - _count_le(visible, c) for c in commits]
    age = [c - oldest[c] for c in commits]
    half = len(commits) // 2
    early, late = slice(0, half), slice(len(commits) - half, len(commits))
    gaps = sorted(b - a for a, b in zip(commits, commits[1:]))
    batch_s = gaps[len(gaps) // 2] if gaps else 0.0
    per_s = len(rows) / max(end - start + 1, 1.0)          # files landed a second
    out = {"commits": len(commits), "commit_gap_s": _r(batch_s),
           "backlog_early": _r(_mean(backlog[early])), "backlog_late": _r(_mean(backlog[late])),
           "latency_early_s": _r(_mean(age[early])), "latency_late_s": _r(_mean(age[late])),
           "visible": len(visible), "files": len(rows)}
    judged = len(commits) >= MIN_COMMITS
    out["backlog_growing"] = (growing(_mean(backlog[early]), _mean(backlog[late]), max(BACKLOG_FLOOR, batch_s * per_s))
                              if judged else None)
    out["latency_growing"] = (growing(_mean(age[early]), _mean(age[late]), max(LATENCY_FLOOR, batch_s))
                              if judged else None)
    drained = len(visible) == len(rows)
    # Files still waiting at the end of the drain settle it whatever the commits showed.
    out["keeps_up"] = False if not drained else (not out["backlog_growing"] and not out["latency_growing"]
                                                 if judged else None)
    return out


def _count_le(sorted_xs: list[float], t: float) -> int:
    from bisect import bisect_right
    return bisect_right(sorted_xs, t)


def _r(x):
    return None if x is None else round(x, 2)


def judge_step(rows: list[dict], layers: list[str], start: float, end: float, observed_until: float) -> dict:
    """Every layer's judgement and whether the run kept up with the step (all layers did; None
    when a layer could not be judged: a step too short for two halves with files)."""
    from bench.latency import summarize

    per = {layer: {**judge_layer(rows, layer, start, end, observed_until),
                   **{k: v for k, v in summarize(rows, layer, observed_until).items() if k.endswith("_s")}}
           for layer in layers}
    verdicts = [p["keeps_up"] for p in per.values()]
    keeps_up = False if False in verdicts else None if None in verdicts else True
    return {"layers": per, "keeps_up": keeps_up}


def step_seconds(seconds: float, previous: dict | None, rate: int) -> float:
    """How long the step at `rate` lasts: `seconds`, or enough for MIN_COMMITS + 1 commits in its
    judged part when the step before (`previous`, judged) predicts longer gaps between commits:
    its slowest layer's median gap, scaled by the rates' ratio."""
    if not previous or previous.get("keeps_up") is None:
        return seconds
    gap = max((layer.get("commit_gap_s") or 0.0) for layer in previous["layers"].values())
    needed = (MIN_COMMITS + 1) * gap * rate / previous["rate"] / (1 - WARMUP_SHARE)
    return round(min(max(seconds, needed), seconds * MAX_STRETCH))


def sustained(steps: list[dict]) -> dict:
    """The highest step rate kept up with, every lower step included: `max_rate` (None: not even
    the first), `kept_up_with_all` (then it is a lower bound)."""
    best = None
    for s in steps:
        if not s.get("keeps_up"):
            break
        best = s["rate"]
    return {"max_rate": best, "kept_up_with_all": bool(steps) and all(s.get("keeps_up") for s in steps)}


def ratio(pipeline: dict | None, plain: dict | None, rates: list[int]) -> dict:
    """Pipeline's sustained rate over the plain run's, with what the steps allow to say: both kept
    up with every step (`undetermined`: raise the steps), or the plain run with none (no figure).
    A run that kept up with every step has a lower bound, which is what the ratio uses."""
    if not pipeline or not plain:
        return {"ratio": None}
    q, p = pipeline.get("max_rate"), plain.get("max_rate")
    both_all = pipeline.get("kept_up_with_all") and plain.get("kept_up_with_all")
    if both_all:
        return {"ratio": None, "why": f"both kept up with every step (up to {rates[-1]:,} events/s): raise the steps"}
    if not p:
        first = ((plain.get("steps") or [{}])[0]).get("keeps_up")
        return {"ratio": None, "why": f"the plain run {'fell behind at' if first is False else 'was not judged at'} "
                                      f"the first step ({rates[0]:,} events/s)"}
    return {"ratio": round((q or 0) / p, 2),
            "bound": "at least" if pipeline.get("kept_up_with_all") else
                     "at most" if plain.get("kept_up_with_all") else None}


def run_steps(landing, params, seed: int, rates: list[int], seconds: float, speedup: float,
              visibility: Callable[[dict], list[dict]], layers: list[str], drain_s: float,
              check: Callable[[], None] = lambda: None, log: Callable[[str], None] = print) -> dict:
    """Feed the steps one after another into `landing` (see the module's docstring) and judge
    each; `visibility(landed)` -> one row per landed file with each layer's latency (None: not
    visible yet); `check()` raises when the run under test died."""
    from bench.contention import feed_measured
    from bench.feeder import Feeder
    out, start_ms = [], params.start_ms
    for k, rate in enumerate(rates):
        length = step_seconds(seconds, out[-1] if out else None, rate)
        span = length * speedup
        feeder = Feeder(landing, replace(params, start_ms=start_ms, span_s=span), seed + k, rate, length,
                        prefix=f"part-bench-s{k}-")
        start_ms += round(span * 1000)
        check()
        log(f"(i) step {k + 1}/{len(rates)}: {rate:,} events/s for {length:g} s")
        busy, others, own = feed_measured(feeder)
        deadline = time.time() + drain_s
        while True:
            check()
            rows = visibility(dict(feeder.landed))
            observed_until = time.time()
            if all(r[layers[-1]] is not None for r in rows) or observed_until > deadline:
                break
            time.sleep(2)
        step = judge_step(rows, layers, feeder.started_at, feeder.finished_at, observed_until)
        last = [r["landed"] + r[layers[-1]] for r in rows if r[layers[-1]] is not None]
        drained = len(last) == len(rows)
        step.update({"rate": rate, "seconds": length, "files": len(rows),
                     "fed_events_per_s": round(feeder.events / max(feeder.finished_at - feeder.started_at, 1e-9)),
                     "cores_busy_during_feed": busy, "drained": drained,
                     "others_cpu_share_during_feed": others, "own_cpu_share_during_feed": own,
                     "drain_s": round(max(last) - feeder.finished_at, 1) if drained and last else None,
                     "rows": rows})   # each file's times: the caller keeps them beside the results
        out.append(step)
        log(f"(i) step {rate:,} events/s: " + ("kept up" if step["keeps_up"] else
                                              "not judged" if step["keeps_up"] is None else "fell behind"))
        if not step["keeps_up"]:
            break
    return {"steps": out, **sustained(out)}
