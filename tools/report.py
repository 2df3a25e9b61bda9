"""make report: PNG charts and one HTML page from ops.query_progress, ops.dq_results and
silver.quarantine, written under paths.reports (default ./reports, git-ignored).

    python -m tools.report [--out DIR]

A stream falling behind shows as its processing rate under its input rate, and as batch
durations above its trigger interval (drawn as a dashed line).
"""
from __future__ import annotations

import argparse
import html
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI
import matplotlib.dates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from common.config import load_config  # noqa: E402
from common.errors import command  # noqa: E402
from common.storage import is_delta_table, parse, write_atomic  # noqa: E402


def _read(spark, cfg, layer: str, table: str):
    path = cfg.table_path(layer, table)
    return spark.read.format("delta").load(path) if is_delta_table(path) else None


def grid(n: int, title: str, max_cols: int = 2, panel: tuple[float, float] = (7, 3.2)):
    """A figure of n panels, max_cols a row; returns the figure and its n axes."""
    cols = min(n, max_cols)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False)
    fig.suptitle(title, fontsize=13)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _interval_s(cfg, query: str) -> float | None:
    from common.streaming import interval

    if cfg.streaming.trigger != "processing-time":
        return None
    layer = "gold" if query.startswith("gold") else query.split("_")[0]
    return interval(cfg, layer).seconds


def rate_charts(progress, cfg, out: Path) -> list[Path]:
    queries = sorted(progress["query_name"].dropna().unique())
    if not queries:
        return []
    fig, axes = grid(len(queries), "Input rate vs processing rate (rows/s)")
    for ax, q in zip(axes, queries):
        d = progress[progress["query_name"] == q]
        ax.plot(d["timestamp"], d["input_rows_per_second"], label="input", color="tab:red", marker="o", ms=3)
        ax.plot(d["timestamp"], d["processed_rows_per_second"], label="processed", color="tab:green",
                marker="o", ms=3)
        ax.xaxis.set_major_formatter(matplotlib.dates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
        behind = d["processed_rows_per_second"] < d["input_rows_per_second"]
        ax.fill_between(d["timestamp"], d["processed_rows_per_second"], d["input_rows_per_second"],
                        where=behind, color="tab:red", alpha=0.2, label="falling behind")
        ax.set_title(q, fontsize=10)
        ax.legend(fontsize=8)
    rates = _save(fig, out / "rates.png")

    fig, axes = grid(len(queries), "Batch duration (s); dashed: trigger interval")
    for ax, q in zip(axes, queries):
        d = progress[progress["query_name"] == q]
        ax.bar(d["batch_id"], d["batch_duration_ms"] / 1000, color="tab:blue")
        limit = _interval_s(cfg, q)
        if limit:
            ax.axhline(limit, color="tab:red", linestyle="--")
        ax.set_title(q, fontsize=10)
        ax.set_xlabel("batch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    durations = _save(fig, out / "batch_duration.png")

    stateful = [q for q in queries if progress[progress["query_name"] == q]["state_rows"].notna().any()]
    charts = [rates, durations]
    if stateful:
        fig, axes = grid(len(stateful), "State rows over time")
        for ax, q in zip(axes, stateful):
            d = progress[progress["query_name"] == q]
            ax.plot(d["timestamp"], d["state_rows"], marker="o", ms=3, color="tab:purple")
            ax.xaxis.set_major_formatter(matplotlib.dates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
            ax.set_title(q, fontsize=10)
        charts.append(_save(fig, out / "state_rows.png"))
    return charts


def quality_chart(dq, out: Path) -> Path | None:
    if dq is None or dq.empty:
        return None
    failed = (dq.assign(failed=~dq["success"]).groupby(["query", "batch_id"])["failed"].sum().reset_index())
    queries = sorted(failed["query"].unique())
    fig, axes = grid(len(queries), "Failed expectations per batch")
    for ax, q in zip(axes, queries):
        d = failed[failed["query"] == q]
        ax.bar(d["batch_id"], d["failed"], color="tab:orange")
        ax.set_title(q, fontsize=10)
        ax.set_xlabel("batch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return _save(fig, out / "quality_failures.png")


def quarantine_chart(reasons, out: Path) -> Path | None:
    if reasons is None or reasons.empty:
        return None
    reasons = reasons.sort_values("n")
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(reasons) + 1.5))
    ax.barh(reasons["reason"], reasons["n"], color="tab:gray")
    ax.set_title("Quarantined rows by reason")
    for y, n in enumerate(reasons["n"]):
        ax.text(n, y, f" {n:,}", va="center", fontsize=8)
    return _save(fig, out / "quarantine_reasons.png")


def build_report(spark, cfg, out: Path, pictures=()) -> list[Path]:
    """The charts and index.html; `pictures`: more drawings, each `draw(cfg, out) -> Path`, first
    (the flows' graph, drawn by pipeline.graph on a floor above: `python -m tools.report` and
    `lakehouse report` pass it)."""
    from tools.status import new_fields, query_status, render

    out.mkdir(parents=True, exist_ok=True)
    charts: list[Path] = [draw(cfg, out) for draw in pictures]
    progress = _read(spark, cfg, "ops", "query_progress")
    if progress is not None:
        pdf = (progress.where("event = 'progress'")
               .select("query_name", "batch_id", "timestamp", "input_rows_per_second",
                       "processed_rows_per_second", "batch_duration_ms", "state_rows")
               .orderBy("timestamp").toPandas())
        charts += rate_charts(pdf, cfg, out)
    dq = _read(spark, cfg, "ops", "dq_results")
    charts.append(quality_chart(None if dq is None else
                                dq.select("query", "batch_id", "success").toPandas(), out))
    quarantine = _read(spark, cfg, "silver", "quarantine")
    charts.append(quarantine_chart(None if quarantine is None else
                                   quarantine.selectExpr("explode(reasons) AS reason").groupBy("reason")
                                   .count().withColumnRenamed("count", "n").toPandas(), out))
    charts = [c for c in charts if c is not None]
    status = render(query_status(spark, cfg), new_fields(spark, cfg))   # new fields below the queries
    body = "\n".join(f'<h2>{html.escape(c.stem.replace("_", " "))}</h2><img src="{c.name}">' for c in charts)
    (out / "index.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>lakehouse report</title>"
        "<style>body{font-family:sans-serif;margin:2em}img{max-width:100%}</style>"
        f"<h1>Lakehouse report: {html.escape(str(cfg.root))}</h1>"
        f"<h2>status</h2><pre>{html.escape(status)}</pre>{body}\n")
    return charts + [out / "index.html"]


@command
def main(argv=None, *, spark=None, cfg=None, prog: str = "tools.report", pictures=()) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output folder (default: paths.reports)")
    args = parser.parse_args(argv)
    cfg = cfg or load_config()
    target = parse(args.out or cfg.paths.reports)
    from common.spark import session

    with session(cfg, "report", spark) as spark, tempfile.TemporaryDirectory(prefix="report-") as tmp:
        # matplotlib writes local files: on object storage, draw here and upload the page.
        local = target if isinstance(target, Path) else Path(tmp)
        written = build_report(spark, cfg, local, pictures)
        if not isinstance(target, Path):
            for path in written:
                write_atomic(target / path.name, path.read_bytes())
            written = [target / path.name for path in written]
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from pipeline.graph import picture

    sys.exit(main(pictures=[picture]))
