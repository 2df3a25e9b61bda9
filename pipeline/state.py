"""lakehouse state: what the stateful queries hold now, read from their checkpoints.

    lakehouse state [QUERY] [--json] [--limit N]

Gold's open sessions (key, session id, start, last event, events so far) and silver's dedup keys
(how many, oldest and newest by event time), read with Spark's state data sources
(`state-metadata`, `statestore`) as of each query's latest committed batch. Read-only: it takes
no lock and works while the pipeline runs. QUERY: one query by name (silver, gold, or a gold
subset's gold_<keys>); default: every stateful query the layers declare.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field

from common.config import load_config
from common.errors import JobError, command
from common.flow import ORDER
from tools.text_table import aligned

DEDUP = ("dedupeWithinWatermark", "dedupe")
SESSIONS = ("applyInPandasWithState", "transformWithStateInPandas")


@dataclass
class Held:
    query: str
    operator: str
    batch: int
    keys: int
    summary: dict = field(default_factory=dict)     # dedup: oldest/newest event; sessions: open
    rows: list[dict] = field(default_factory=list)  # sessions: one per open session


def declared_queries(cfg) -> list[str]:
    from pipeline.runner import declare

    return [f.name for layer in declare(cfg, ORDER) for f in layer.flows]


def _sessions_table(cfg):
    from gold.tables import for_config

    return next((t for t in for_config(cfg) if t.stateful), None)


def read_held(spark, cfg, query: str, limit: int | None = None) -> list[Held]:
    """What each stateful operator of `query`'s checkpoint holds now ([] for a stateless one)."""
    from common import state
    from silver.transform import dedup_keys

    checkpoint = cfg.checkpoint(query)
    out = []
    for op in state.operators(spark, checkpoint):
        rows = state.rows(spark, checkpoint, op).cache()
        try:
            held = Held(query, op.name, op.batch, rows.count())
            sessions = _sessions_table(cfg) if op.name in SESSIONS else None
            if op.name in DEDUP:
                r = dedup_keys(rows, cfg.silver.dedup_watermark.seconds).first()
                held.summary = {"reject_keys": r.reject_keys, "oldest_event": r.oldest_event,
                                "newest_event": r.newest_event}
            elif sessions is not None:
                open_ = sessions.held(rows).orderBy("session_start", sessions.keys[0])
                held.summary = {"open_sessions": open_.count(), "key": sessions.keys[0]}
                held.rows = [r.asDict() for r in (open_.limit(limit) if limit else open_).collect()]
            out.append(held)
        finally:
            rows.unpersist()
    return out


def _when(v) -> str:
    return "" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")


def render(held: list[Held]) -> str:
    if not held:
        return "no stateful query has committed a batch under this lakehouse yet"
    lines = []
    for h in held:
        head = f"{h.query}: {h.operator} (batch {h.batch}): "
        if h.operator in DEDUP:
            lines.append(head + f"{h.keys:,} dedup keys ({h.summary['reject_keys']:,} of rejected rows), "
                         f"events from {_when(h.summary['oldest_event'])} to {_when(h.summary['newest_event'])}")
        elif "open_sessions" in h.summary:
            lines.append(head + f"{h.summary['open_sessions']:,} open sessions of {h.keys:,} "
                         f"{h.summary['key']} values")
            lines += aligned([h.summary["key"], "session_id", "start", "last event", "events"],
                             [[str(r[h.summary["key"]]), r["session_id"], _when(r["session_start"]),
                               _when(r["last_event"]), f"{r['events']:,}"] for r in h.rows], indent="  ")
            if len(h.rows) < h.summary["open_sessions"]:
                lines.append(f"  ... {h.summary['open_sessions'] - len(h.rows):,} more (--limit)")
        else:
            lines.append(head + f"{h.keys:,} keys")
    return "\n".join(lines)


@command
def main(argv=None, *, spark=None, cfg=None, prog: str = "pipeline.state") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("query", nargs="?", help="one query by name (default: every stateful one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--limit", type=int, default=50, metavar="N",
                        help="open sessions listed per query (default 50; 0: all)")
    args = parser.parse_args(argv)
    cfg = cfg or load_config()
    queries = [args.query] if args.query else declared_queries(cfg)
    from common.spark import session

    with session(cfg, "state", spark) as spark:
        held = [h for q in queries for h in read_held(spark, cfg, q, args.limit or None)]
    if args.query and not held:
        raise JobError(f"query {args.query}: no state at {cfg.checkpoint(args.query)} "
                       f"(declared queries: {', '.join(declared_queries(cfg))})")
    print(json.dumps([asdict(h) for h in held], indent=2, default=str) if args.json else render(held))
    return 0


if __name__ == "__main__":
    sys.exit(main())
