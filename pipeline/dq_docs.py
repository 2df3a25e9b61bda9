"""`make dq-docs`: tools/dq_docs.py with what only the layers know, the gold tables' constraints,
so a suite page can say which constraint each of the gate's derived rules checks (tools sit
below the layers and do not import them).

    python -m pipeline.dq_docs [--last N] [--layer silver|gold] [--suite NAME] [--out DIR]
"""
from __future__ import annotations

import sys

from common.config import load_config
from common.errors import JobError


def constraint_checks(cfg) -> dict[str, object]:
    """The rule name each gold table constraint's derived rule takes -> the constraint
    (gold.constraints.Check). A name says its CHECK (`window_end_after_window_start`:
    `window_end` > `window_start`), whatever the table."""
    from gold.constraints import DERIVED
    from gold.tables import for_config

    try:
        tables = for_config(cfg)
    except JobError as e:      # the recorded configurations still render, without the notes
        print(f"warning: {e}; the gold constraints' rules are not described", file=sys.stderr)
        return {}
    return {DERIVED + c.name: c for t in tables for c in t.checks()}


def main(argv=None) -> int:
    from tools import dq_docs

    cfg = load_config()
    return dq_docs.main(argv, "make dq-docs", cfg=cfg, derived=constraint_checks(cfg))


if __name__ == "__main__":
    sys.exit(main())
