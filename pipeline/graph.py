"""lakehouse graph: the pipeline's flows, source -> transform -> sink, as declared.

    lakehouse graph [--source files|kafka] [--png FILE]

Derived from the layers' declarations (each layer's `layer(cfg)`, common/flow.py) and the config:
per flow (one streaming query), what it reads, its transform and stateful operators, the tables
it writes, its checkpoint, the suite gating it (for gold, with each table constraint and the
gate's rule that checks it) and its trigger. `make report` draws the same
graph (flows.png); --png draws it alone.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from common.config import load_config
from common.errors import command
from common.flow import ORDER
from common import late


@dataclass(frozen=True)
class FlowNode:
    name: str                      # the streaming query
    layer: str
    sources: tuple[str, ...]
    transform: str
    sinks: tuple[str, ...]
    checkpoint: str
    suite: str
    trigger: str
    constraints: tuple[str, ...] = ()    # gold: each table constraint and the gate's rule checking it


def _table_names(cfg) -> dict[str, str]:
    return {cfg.table_path(layer, t): f"{layer}.{t}" for layer, tables in cfg.tables.items() for t in tables}


def _source(cfg, layer) -> str:
    """What a layer reads from outside the lakehouse, from its description ("<source> -> ...")."""
    kind = layer.describe.split(" -> ")[0]
    return {"files": f"landing {cfg.landing}", "kafka": f"kafka topic {cfg.kafka.topics.events}"}.get(kind, kind)


def _suite(cfg, layer, sinks) -> str:
    from common.errors import JobError
    from common.quality import load_suites

    path = {"silver": cfg.silver.expectations, "gold": cfg.gold.expectations}.get(layer.name)
    if path is None:
        return "-"
    try:
        gated = sorted(set(load_suites(path, gx=False)) & set(sinks))
    except JobError as e:
        return f"{path}: {e}"
    # Gold's tables are gated without a suite too, by the rules derived from their constraints.
    none = "no rules for these tables" + (": derived rules only" if layer.name == "gold" else "")
    return f"{Path(path).name} ({', '.join(gated) or none})"


def flows(cfg, source: str | None = None) -> list[FlowNode]:
    from common.streaming import trigger
    from pipeline.checks import constraint_lines, operators
    from pipeline.runner import declare

    names = _table_names(cfg)
    dimension = cfg.profile.dimension
    nodes = []
    for layer in declare(cfg, ORDER, {"bronze": {"source": source}} if source else None):
        sources = [names.get(layer.reads_table, layer.reads_table) if layer.reads_table else _source(cfg, layer)]
        sinks = [f"{layer.name}.{t}" for t in cfg.tables[layer.name]]
        if dimension and f"{layer.name}.{dimension.table}" in sinks:
            sinks.remove(f"{layer.name}.{dimension.table}")        # joined, not written
            sources.append(f"{layer.name}.{dimension.table}")
        if layer.name == "silver" and not cfg.profile.dedup:
            sinks.remove(f"silver.{late.TABLE}")                   # nothing deduplicated is late for silver
        if layer.name == "gold" and cfg.gold.watermark is not None:
            sinks.append(f"silver.{late.TABLE}")                   # the late events it keeps
        if layer.name == "gold" and cfg.gold.stats_to_kafka:
            sinks.append(f"kafka topic {cfg.kafka.topics.stats}")
        for flow in layer.flows:
            ops = operators(cfg, flow)
            nodes.append(FlowNode(
                flow.name, layer.name, tuple(sources),
                f"{layer.name}/transform.py" + (f" + {', '.join(ops)}" if ops else ""), tuple(sinks),
                cfg.checkpoint(flow.name), _suite(cfg, layer, sinks),
                ", ".join(f"{k} {v}" if v is not True else k for k, v in trigger(cfg, layer.name).items()),
                tuple(constraint_lines(cfg, flow))))
    return nodes


def render(nodes: list[FlowNode]) -> str:
    lines = []
    for n in nodes:
        lines += [f"{n.name} ({n.layer}, {n.trigger})",
                  f"  {' + '.join(n.sources)}",
                  f"    -> {n.transform}",
                  f"    -> {', '.join(n.sinks)}",
                  f"  checkpoint {n.checkpoint}",
                  f"  suite      {n.suite}"]
        if n.constraints:
            lines += ["  constraints (each checked by the gate: a suite rule covering it, or one derived from it)",
                      *(f"    {c}" for c in n.constraints)]
        lines.append("")
    return "\n".join(lines).rstrip()


def draw(cfg, out: Path, source: str | None = None) -> Path:
    """The flows as a picture (PNG, matplotlib): tables and sources as boxes, each flow a box
    between what it reads and what it writes, ranked left to right by how far down the chain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    nodes = flows(cfg, source)
    rank: dict[str, int] = {}
    for n in nodes:                                   # declared in pipeline order: one pass ranks
        r = max((rank[s] for s in n.sources if s in rank), default=0) + 1
        for s in n.sources:
            rank.setdefault(s, r - 1)                 # read from outside: just before its reader
        rank[n.name] = r
        for s in n.sinks:
            rank[s] = max(rank.get(s, 0), r + 1)
    columns: dict[int, list[str]] = {}
    for name, r in rank.items():
        columns.setdefault(r, []).append(name)
    height = max(len(c) for c in columns.values())
    columns = dict(sorted(columns.items()))
    fig, ax = plt.subplots(figsize=(3.2 * len(columns), 1.1 * height + 1))
    at = {name: (r * 3.2, (len(col) - 1) / 2 - i) for r, col in columns.items() for i, name in enumerate(col)}
    by_flow = {n.name: n for n in nodes}
    for name, (x, y) in at.items():
        flow = by_flow.get(name)
        label = f"{name}\n{flow.trigger}\n{flow.transform}" if flow else name
        ax.add_patch(FancyBboxPatch((x - 1.4, y - 0.32), 2.8, 0.64, boxstyle="round,pad=0.05",
                                    fc="#dbe9f6" if flow else "#f4f4f4", ec="#336699" if flow else "#888"))
        ax.text(x, y, label, ha="center", va="center", fontsize=8)
    for n in nodes:
        for a, b in [(s, n.name) for s in n.sources] + [(n.name, s) for s in n.sinks]:
            (x0, y0), (x1, y1) = at[a], at[b]
            ax.annotate("", xy=(x1 - 1.35, y1), xytext=(x0 + 1.35, y0),
                        arrowprops=dict(arrowstyle="->", color="#555"))
    xs, ys = [x for x, _ in at.values()], [y for _, y in at.values()]
    ax.set_xlim(min(xs) - 1.5, max(xs) + 1.5)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.axis("off")
    ax.set_title("flows: source -> query (trigger) -> sink", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def picture(cfg, out_dir: Path) -> Path:
    """The report's page of it (tools.report's `pictures`)."""
    return draw(cfg, out_dir / "flows.png")


@command
def main(argv=None, *, cfg=None, prog: str = "pipeline.graph") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["files", "kafka"], help="bronze's source (default: conf bronze.source)")
    parser.add_argument("--png", metavar="FILE", help="draw the graph to FILE instead of printing it")
    args = parser.parse_args(argv)
    cfg = cfg or load_config()
    if args.png:
        print(f"wrote {draw(cfg, Path(args.png), args.source)}")
    else:
        print(render(flows(cfg, args.source)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
