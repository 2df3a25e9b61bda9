"""The benchmark's targets, its table (text and Markdown) and the one-line summary."""
from __future__ import annotations

# Issue 60 retired two targets: end-to-end >= 0.25x the parse-only ceiling ((a) is information,
# (b) is reported against (g)) and (d)'s absolute p95 <= 10 s (replaced by ratios against plain
# Structured Streaming measured in the same run, at a heavy and a light rate).
TARGETS = {
    "incremental": "incremental <= 0.25x batch recompute",
    "latency_silver": "landing -> silver p95 <= 1.3x plain Structured Streaming's, at both rates",
    "latency_gold": "landing -> gold p95 <= 1.3x plain fresh gold's, at both rates",
    "state": "gold state rows flat",
    "quality": "quality <= 10% of silver batch time",
    "baseline": "run-all <= 1.3x plain Structured Streaming",
    "empty": "empty batch <= 1 s per query (median)",
    "sustained": "sustained throughput >= 0.8x plain Structured Streaming's",
}
LATENCY_LIMIT, SUSTAINED_LIMIT = 1.3, 0.8
# (d)'s two rates, in the results: the heavy one (--rate) and the light one (--light-rate).
RATES = (("latency", "heavy"), ("latency_light", "light"))


def plain_layer(lat: dict, layer: str) -> dict | None:
    """The plain run's figures for `layer` (silver, zip_hourly_sightings) of one (d) rate. Results
    from before issue 60 held the plain silver's figures at the top and had no fresh gold."""
    plain = (lat or {}).get("plain")
    if not isinstance(plain, dict):
        return None
    if layer == "silver":
        return plain.get("silver") or (plain if "p95_s" in plain else None)
    return plain.get(layer)


def latency_ratios(lat: dict) -> dict:
    """(d) at one rate: pipeline / plain, p50 and p95, for silver and the fresh gold table
    (None where either side is missing)."""
    out = {}
    for key, layer in (("silver", "silver"), ("gold", "zip_hourly_sightings")):
        ours, plain = (lat or {}).get(layer), plain_layer(lat, layer)
        for p in ("p50_s", "p95_s"):
            a, b = (ours or {}).get(p), (plain or {}).get(p)
            out[f"{key}_{p[:3]}"] = round(a / b, 2) if a is not None and b else None
    return out


def _all_met(values: list[bool | None]) -> bool | None:
    measured = [v for v in values if v is not None]
    return None if not measured else all(measured)


def sustained_verdict(s: dict | None) -> bool | None:
    """(i): met when the pipeline's sustained rate is at least 0.8x the plain run's; None when
    the steps cannot tell (both kept up with every step, the plain run with none, or the plain
    run kept up with every step and the ratio it bounds from above is not below the target)."""
    ratio = (s or {}).get("ratio")
    if ratio is None:
        return None
    if s.get("bound") == "at least":
        return True if ratio >= SUSTAINED_LIMIT else None
    if s.get("bound") == "at most":
        return False if ratio < SUSTAINED_LIMIT else None
    return ratio >= SUSTAINED_LIMIT


def verdicts(r: dict) -> dict[str, bool | None]:
    """met (True), missed (False) or not measured (None) for each target."""
    def get(*keys):
        v = r
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    inc = get("incremental", "ratio_wall")
    flat = get("state", "flat")
    share = get("quality", "silver_share")
    over = get("baseline", "run_all_over_baseline")
    medians = [q["median_s"] for run in (r.get("empty_batches") or {}).values() for q in (run or {}).values()]
    # Without watermark-only batches (conf streaming.no_data_batches: false) a measured run has
    # none, and nothing closes until new data comes: the figure is missed, not met for free.
    measured = any(v is not None for v in (r.get("empty_batches") or {}).values())
    empty = (max(medians) <= 1.0 if medians
             else False if measured and r.get("no_data_batches") is False else None)
    ratios = [latency_ratios(r[key]) for key, _ in RATES if r.get(key)]
    met = lambda x: None if x is None else x <= LATENCY_LIMIT  # noqa: E731
    return {"empty": empty,
            "incremental": None if inc is None else inc <= 0.25,
            "latency_silver": _all_met([met(x["silver_p95"]) for x in ratios]),
            "latency_gold": _all_met([met(x["gold_p95"]) for x in ratios]),
            "state": flat,
            "quality": None if share is None else share <= 0.10,
            "baseline": None if over is None else over <= 1.3,
            "sustained": sustained_verdict(r.get("sustained"))}


def _mark(v: bool | None) -> str:
    return "not measured" if v is None else ("met" if v else "MISSED")


def _n(x, digits=0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _busy(fig: dict) -> str:
    """How busy the cores were during a feed, and how much of it other processes took."""
    others, own = fig.get("others_cpu_share_during_feed"), fig.get("own_cpu_share_during_feed")
    split = ", ".join(x for x in (f"this run {_pct(own)}" if own is not None else "",
                                  f"others {_pct(others)}" if others else "") if x)
    return f"cores {_pct(fig.get('cores_busy_during_feed'))} busy during the feed" + (f" ({split})" if split else "")


def _side(fig: dict | None) -> str:
    """p50 / p95 of one layer of one run, with how many files were visible."""
    if not fig:
        return "not measured"
    return (f"p50 {fig['p50_s']} s, p95 {fig['p95_s']} s"
            + (f" ({fig['visible']}/{fig['files']} files visible, so lower bounds)" if fig.get("censored") else ""))


def _ratio_mark(x) -> str:
    return "-" if x is None else f"{x}x ({'met' if x <= LATENCY_LIMIT else 'MISSED'})"


def latency_row(lat: dict, which: str) -> tuple[str, str, str]:
    """(d) at one rate: the pipeline's and the plain run's landing -> silver and -> gold, the
    ratios and the cores' busy share during each feed."""
    z, m = lat["zip_hourly_sightings"], lat.get("max_over_gold")
    x = latency_ratios(lat)
    plain = lat.get("plain") if isinstance(lat.get("plain"), dict) else None
    interval = lat.get("interval")
    value = (f"pipeline: landing -> silver {_side(lat.get('silver'))}; landing -> gold.zip_hourly_sightings {_side(z)}"
             + (f" (max over gold tables p50 {m['p50_s']} s, p95 {m['p95_s']} s)" if m else "")
             + f"; {_busy(lat)}. ")
    if plain:
        gold = plain_layer(lat, "zip_hourly_sightings")
        value += (f"Plain Structured Streaming on the same feed: landing -> silver "
                  f"{_side(plain_layer(lat, 'silver'))}; landing -> fresh gold "
                  + (_side(gold) if gold else "not timed (a run from before the fresh gold)")
                  + f"; {_busy(plain)}. "
                  f"Pipeline / plain p95: silver {x['silver_p95'] or '-'}x, gold {x['gold_p95'] or '-'}x"
                  f" (p50: {x['silver_p50'] or '-'}x, {x['gold_p50'] or '-'}x)")
    else:
        value += "Plain run: not measured"
    if interval:
        value += f"; intervals: {interval}"
    label = f"(d) latency at {_n(lat['rate_events_per_s'])} events/s ({which})"
    met = lambda r: _mark(None if r is None else r <= LATENCY_LIMIT)  # noqa: E731
    return label, value, (f"p95 <= {LATENCY_LIMIT}x plain: silver {met(x['silver_p95'])}, "
                          f"gold {met(x['gold_p95'])}")


def _steps(run: dict | None, base: float | None = None) -> str:
    """(i) one run: its sustained rate and each step's verdict with the figures behind it (a step
    longer than `base`, the steps' length, says how long it lasted: bench.steady.step_seconds)."""
    if not run:
        return "not measured"
    best = run.get("max_rate")
    steps = run.get("steps") or []
    first = steps[0] if steps else {}
    head = (f">= {_n(best)} events/s (kept up with every step)" if run.get("kept_up_with_all") and best
            else f"{_n(best)} events/s" if best else "no step ran" if not steps else
            f"below {_n(first['rate'])} events/s (fell behind at the first step)" if first.get("keeps_up") is False
            else f"not judged at the first step ({_n(first['rate'])} events/s)")
    parts = []
    for st in steps:
        layers = st.get("layers") or {}
        g = layers.get("zip_hourly_sightings") or {}
        rate = _n(st["rate"]) + (f" for {st['seconds']:g} s" if base and st.get("seconds", base) != base else "")
        if st.get("keeps_up") is None:
            short = [f"{'silver' if name == 'silver' else 'gold'} {x.get('commits')}"
                     for name, x in layers.items() if x.get("keeps_up") is None]
            parts.append(f"{rate} not judged (commits in the judged part: {', '.join(short)}; "
                         f"the step is too short for latencies of p95 {g.get('p95_s')} s; {_busy(st)})")
            continue
        verdict = "kept up" if st["keeps_up"] else "fell behind"
        parts.append(f"{rate} {verdict} (gold backlog {g.get('backlog_early')} -> "
                     f"{g.get('backlog_late')} files, latency {g.get('latency_early_s')} -> "
                     f"{g.get('latency_late_s')} s, p95 {g.get('p95_s')} s, {_busy(st)}"
                     + ("" if st.get("drained") else ", not drained") + ")")
    return head + ("; steps: " + ", ".join(parts) if parts else "")


def sustained_row(s: dict, verdict) -> tuple[str, str, str]:
    ratio = s.get("ratio")
    bound = {"at least": ">= ", "at most": "<= "}.get(s.get("bound"), "")
    base = s.get("seconds")
    value = (f"pipeline {_steps(s.get('pipeline'), base)}. Plain Structured Streaming {_steps(s.get('plain'), base)}. "
             + (f"Pipeline / plain: {bound}{ratio}x" if ratio is not None else f"Pipeline / plain: - ({s.get('why', 'not measured')})"))
    return (f"(i) sustained throughput, steps of {s.get('seconds', 0):g} s or more", value,
            f"{TARGETS['sustained']}: {_mark(verdict)}")


def cpu_parts(ours: dict | None, plain: dict | None) -> str | None:
    """Both runs' CPU seconds side by side, part by part (bench.contention.part_of), the parts
    where run-all spends the most beyond plain Spark first."""
    if not ours or not plain:
        return None
    total = f"total {sum(ours.values()):.1f} / {sum(plain.values()):.1f}"
    order = sorted(set(ours) | set(plain), key=lambda k: plain.get(k, 0) - ours.get(k, 0))
    return "; ".join([total] + [f"{k} {ours.get(k, 0):.1f} / {plain.get(k, 0):.1f}" for k in order])


def rows(r: dict) -> list[tuple[str, str, str]]:
    """(figure, value, target verdict) rows for the table."""
    v = verdicts(r)
    out = []
    c = r.get("ceiling")
    if c:
        m = c.get("methods") or {"binary_file": c}   # results from before both methods were measured
        each = "; ".join(f"{name} {_n(x['events_per_s'])} events/s ({x['seconds']} s)" for name, x in m.items())
        out.append(("(a) engine ceiling: raw files -> explode -> noop", each,
                    f"information: the faster, {c.get('method', 'binary_file')}"))
    t = r.get("throughput")
    if t:
        for layer in ("bronze", "silver", "gold"):
            L = t["layers"][layer]
            out.append((f"(b) {layer}", f"{_n(L['events_per_s_wall'])} events/s wall ({L['wall_s']} s), "
                        f"{_n(L['events_per_s_processing'])} events/s processing ({L['processing_s']} s)", ""))
        g = r.get("baseline") or {}
        # Issue 60: (b) against (g)'s plain rate, the ceiling (a) only as information.
        against = (f" = {round(g['wall_s'] / t['end_to_end_s'], 2)}x plain Structured Streaming's rate (g)"
                   if g.get("wall_s") and t.get("end_to_end_s") and g.get("run_all_wall_s") else "")
        ceiling = (f"; {t['end_to_end_vs_ceiling']}x the ceiling (a)" if t.get("end_to_end_vs_ceiling") is not None
                   else "")
        out.append(("(b) end-to-end `make run-all`",
                    f"{_n(t['end_to_end_events_per_s'])} events/s ({t['end_to_end_s']} s){against}{ceiling}",
                    f"against (g): {TARGETS['baseline']}: {_mark(v['baseline'])}" if against
                    else "information (reported against (g))"))
    i = r.get("incremental")
    if i:
        out.append(("(c) incremental run after +1% data vs batch recompute",
                    f"{i['incremental_wall_s']} s vs {i['recompute_wall_s']} s = {i['ratio_wall']}x "
                    f"(processing only: {i['incremental_processing_s']} s vs {i['recompute_processing_s']} s "
                    f"= {i['ratio_processing']}x)",
                    f"{TARGETS['incremental']}: {_mark(v['incremental'])}"))
    for key, which in RATES:
        if r.get(key):
            out.append(latency_row(r[key], which))
    s = r.get("state")
    if s:
        out.append((f"(e) gold state rows over {s['event_time_span_h']} h of event time "
                    f"({s['watermark_multiple']}x the gold watermark)",
                    f"first {_n(s['first'])}, peak {_n(s['peak'])}, last {_n(s['last'])}; "
                    f"samples {', '.join(_n(x) for x in s['samples'])}; gold's watermark advanced "
                    f"{s['watermark_advanced_h']} h",
                    f"{TARGETS['state']}: {_mark(v['state'])}"))
    q = r.get("quality")
    if q:
        out.append(("(f) quality gate share of silver batch time",
                    f"{q['silver_share']:.1%} ({q['silver_quality_s']} s of {q['silver_batch_s']} s)",
                    f"{TARGETS['quality']}: {_mark(v['quality'])}"))
    g = r.get("baseline")
    if g:
        rows_note = (f"; silver rows {_n(g['silver_rows'])} vs run-all's {_n(g['run_all_silver_rows'])}"
                     if g.get("run_all_silver_rows") is not None else "")
        value = f"{_n(g['events_per_s'])} events/s ({g['wall_s']} s wall{rows_note})"
        if g.get("run_all_over_baseline") is not None:
            value = f"run-all {g['run_all_wall_s']} s / baseline {g['wall_s']} s = {g['run_all_over_baseline']}x; " + value
        if g.get("others_cpu_share") is not None:
            pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
            value += (f"; other processes took {pct(g.get('run_all_others_cpu_share'))} of the CPU "
                      f"during run-all, {pct(g['others_cpu_share'])} during the baseline")
        out.append((f"(g) plain Structured Streaming baseline, N = {_n(r['events'])}", value,
                    f"{TARGETS['baseline']}: {_mark(v['baseline'])}"))
        parts = cpu_parts(g.get("run_all_cpu_parts_s"), g.get("cpu_parts_s"))
        if parts:
            out.append(("(g) CPU seconds by part, run-all / baseline", parts, "information"))
    e = {k: v for k, v in (r.get("empty_batches") or {}).items() if v}
    if not e and v["empty"] is False:
        out.append(("(h) median duration of batches that read no row, per query (how many)",
                    "none ran: streaming.no_data_batches is false, so what the watermark passed "
                    "stays open until new data comes",
                    f"{TARGETS['empty']}: {_mark(v['empty'])}"))
    if e:
        names = {"run_all": "available-now run-all", "stream": "streaming at (d)'s heavy rate",
                 "quiet": "quiet feed"}
        value = "; ".join(f"{names.get(run, run)}: " + ", ".join(
            f"{q} {x['median_s']} s ({x['batches']})" for q, x in qs.items()) for run, qs in e.items())
        out.append(("(h) median duration of batches that read no row, per query (how many)", value,
                    f"{TARGETS['empty']}: {_mark(v['empty'])}"))
    if r.get("sustained"):
        out.append(sustained_row(r["sustained"], v["sustained"]))
    return out


def text_table(r: dict) -> str:
    body = rows(r)
    w = max((len(a) for a, _, _ in body), default=10)
    return "\n".join(f"{a:<{w}}  {b}" + (f"  [{c}]" if c else "") for a, b, c in body)


def markdown(r: dict) -> str:
    head = (f"# Benchmark, N = {r['events']:,} events\n\n"
            f"Started {r['started']}, {r['cores']} cores, load average at start {r.get('load_at_start')}.\n\n"
            "| figure | value | target |\n|---|---|---|\n")
    errors = "".join(f"\n- {k} failed: {v}" for k, v in (r.get("errors") or {}).items())
    return (head + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows(r))
            + (f"\n\nErrors:{errors}" if errors else "") + "\n\n" + summary_line(r) + "\n")


def summary_line(r: dict) -> str:
    v = verdicts(r)
    parts = []
    c, t, g = r.get("ceiling"), r.get("throughput"), r.get("baseline")
    parts.append(f"ceiling {_n(c['events_per_s'])} ev/s ({c.get('method', 'binary_file')})" if c else "ceiling -")
    if t:
        # Against (g)'s plain rate when both ran; without (a) there is no ceiling to divide by.
        against = (f" = {round(g['wall_s'] / t['end_to_end_s'], 2)}x plain (g)"
                   if g and g.get("wall_s") and t.get("end_to_end_s") and g.get("run_all_wall_s") else "")
        ceiling = (f", {t['end_to_end_vs_ceiling']}x ceiling" if t.get("end_to_end_vs_ceiling") is not None else "")
        parts.append(f"end-to-end {_n(t['end_to_end_events_per_s'])} ev/s{against}{ceiling}")
    else:
        parts.append("end-to-end -")
    i = r.get("incremental")
    parts.append(f"incremental {i['ratio_wall']}x recompute ({_mark(v['incremental'])})" if i else "incremental -")
    for key, _ in RATES:
        lat = r.get(key)
        if not lat:
            if key == "latency":
                parts.append("latency -")
            continue
        x = latency_ratios(lat)
        plain_s, plain_g = plain_layer(lat, "silver") or {}, plain_layer(lat, "zip_hourly_sightings") or {}
        busy = (f", cores {_pct(lat.get('cores_busy_during_feed'))}/"
                f"{_pct((lat.get('plain') or {}).get('cores_busy_during_feed'))}")
        parts.append(f"latency at {_n(lat['rate_events_per_s'])} ev/s p95 pipeline/plain: "
                     f"silver {(lat.get('silver') or {}).get('p95_s', '-')}/{plain_s.get('p95_s', '-')} s = {_ratio_mark(x['silver_p95'])}, "
                     f"gold {lat['zip_hourly_sightings']['p95_s']}/{plain_g.get('p95_s', '-')} s = "
                     f"{_ratio_mark(x['gold_p95'])}{busy}")
    s = r.get("state")
    shape = {True: "flat", False: "growing", None: "too little event time processed"}[s["flat"]] if s else ""
    parts.append(f"gold state {_n(s['first'])}/{_n(s['peak'])}/{_n(s['last'])} first/peak/last "
                 f"{shape} ({_mark(v['state'])})" if s else "state -")
    q = r.get("quality")
    parts.append(f"quality {q['silver_share']:.1%} of silver ({_mark(v['quality'])})" if q else "quality -")
    if g and g.get("run_all_over_baseline") is not None:
        parts.append(f"run-all {g['run_all_over_baseline']}x baseline ({_mark(v['baseline'])})")
    else:
        parts.append(f"baseline {g['wall_s']} s, run-all not measured" if g else "baseline -")
    su = r.get("sustained")
    if su:
        def rate(run):
            if not run:
                return "-"
            if run.get("max_rate"):
                return f">={_n(run['max_rate'])}" if run.get("kept_up_with_all") else _n(run["max_rate"])
            first = (run.get("steps") or [{}])[0].get("keeps_up")
            return "<first step" if first is False else "not judged"

        bound = {"at least": ">=", "at most": "<="}.get(su.get("bound"), "")
        parts.append(f"sustained {rate(su.get('pipeline'))}/{rate(su.get('plain'))} ev/s pipeline/plain = "
                     + (f"{bound}{su['ratio']}x" if su.get("ratio") is not None else "-")
                     + f" ({_mark(v['sustained'])})")
    return f"SUMMARY N={r['events']:,}: " + " | ".join(parts)
