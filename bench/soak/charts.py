"""The soak's charts (one PNG per kind of series, a panel per query or table) and its page.

Each panel marks where judging starts (dashed) and the two judged halves' means (dotted), so
a failing verdict can be read off the chart; a growing series has its title in red.
"""
from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402

from bench.soak.judge import KINDS, MB, fmt, series, summary_table  # noqa: E402
from tools.report import grid  # noqa: E402

SCALE = {"bytes": (MB, "MB"), "ms": (1000, "s")}


def _panel(ax, points, unit: str, label: str, verdict: dict | None) -> None:
    div, shown = SCALE.get(unit, (1, unit))
    ax.plot([t / 60 for t, _ in points], [v / div for _, v in points], marker="o", ms=3, color="tab:blue")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("minutes")
    ax.set_ylabel(shown, fontsize=8)
    grows = verdict is not None and verdict.get("verdict") == "GROWS"
    ax.set_title(label + (f"  {verdict['verdict']}" if verdict and verdict["verdict"] != "info" else ""),
                 fontsize=9, color="tab:red" if grows else "black")
    if verdict and "first_half" in verdict:
        judged = [t for t, _ in points if t >= verdict["judged_from_s"]]
        ax.axvline(verdict["judged_from_s"] / 60, color="gray", linestyle="--", lw=1)
        half = len(judged) // 2
        for span, mean in (((judged[0], judged[half - 1]), verdict["first_half"]),
                           ((judged[-half], judged[-1]), verdict["second_half"])):
            ax.hlines(mean / div, span[0] / 60, span[1] / 60, color="tab:red" if grows else "tab:green",
                      linestyle=":", lw=2)


def write_charts(samples: list[dict], rows: list[dict], ctx: dict, out: Path) -> list[Path]:
    by_series = {(r["kind"], r["subject"]): r for r in rows}
    data = series(samples)
    charts = []
    process = [k for k, (scope, _, _) in KINDS.items() if scope == "process" and (k, "") in data]
    groups = [("process", "Driver: RSS, heap and non-heap after a full GC", [(k, "") for k in process])]
    for kind, (scope, unit, _) in KINDS.items():
        if scope != "process":
            keys = sorted((k, s) for k, s in data if k == kind)
            groups.append((kind, f"{kind} per {scope} ({SCALE.get(unit, (1, unit))[1]})", keys))
    for name, title, keys in groups:
        if not keys:
            continue
        fig, axes = grid(len(keys), title + "; dashed: judged from, dotted: half means", max_cols=3, panel=(5.2, 2.8))
        for ax, (kind, subject) in zip(axes, keys):
            _panel(ax, data[(kind, subject)], KINDS[kind][1], subject or kind, by_series.get((kind, subject)))
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        charts.append(path)
    return charts


def _files_table(end: dict) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(t)}</td><td>{f['live_files']}</td><td>{f['disk_files']}</td>"
        f"<td>{fmt(f['live_bytes'], 'bytes')}</td><td>{fmt(f['log_bytes'], 'bytes')}</td>"
        f"<td>{html.escape(', '.join(f'{op} {n}' for op, n in end.get('operations', {}).get(t, {}).items()))}</td></tr>"
        for t, f in end.get("tables", {}).items())
    return ("<table><tr><th>table</th><th>live files</th><th>data files on disk</th><th>live bytes</th>"
            f"<th>Delta log</th><th>operations</th></tr>{rows}</table>")


def write_page(doc: dict, charts: list[Path], out: Path) -> Path:
    meta, audit = doc["meta"], doc.get("audit") or {}
    verdict = "PASS" if doc["ok"] else "FAIL"
    facts = (f"{meta['minutes']:g} min at {meta['rate']} events/s, maintenance "
             f"{'on every ' + meta['maintenance_interval'] if meta['maintenance'] else 'off'}, retention "
             f"{meta['retention']}, event time x{meta['event_time_speedup']:g} ({meta['event_time_span_h']:g} h), "
             f"{len(doc['samples'])} samples every {meta['sample_interval_s']:g} s from {meta.get('warm_after_s', '-')} s "
             f"after the feed's start, {meta['cores']} cores, other processes took "
             f"{meta['others_cpu_share'] if meta.get('others_cpu_share') is not None else '-'} of the CPU")
    problems = "".join(f"<li>{html.escape(p)}</li>" for p in doc["problems"]) or "<li>none</li>"
    audit_text = (f"{'PASS' if audit.get('ok') else 'FAIL'} in {audit.get('seconds', '-')} s; prefix checks "
                  + html.escape(", ".join(f"{t} {s}" for t, s in (audit.get("prefix") or {}).items()))
                  + "; accounting " + html.escape(", ".join(f"{a} {s}" for a, s in (audit.get("accounting") or {}).items()))
                  ) if audit else "not run"
    body = "\n".join(f'<h2>{html.escape(c.stem.replace("_", " "))}</h2><img src="{c.name}">' for c in charts)
    page = out / "index.html"
    page.write_text(
        "<!doctype html><meta charset='utf-8'><title>soak</title>"
        "<style>body{font-family:sans-serif;margin:2em}img{max-width:100%}"
        "td,th{padding:2px 8px;text-align:right}td:first-child{text-align:left}</style>"
        f"<h1>Soak {verdict}: {html.escape(meta['started'])}</h1><p>{html.escape(facts)}</p>"
        f"<h2>problems</h2><ul>{problems}</ul><h2>audit</h2><p>{audit_text}</p>"
        f"<h2>series</h2><pre>{html.escape(summary_table(doc['verdicts']))}</pre>"
        f"<h2>tables at the end</h2>{_files_table(doc.get('end') or {})}\n{body}\n")
    return page
