"""Drop the gold tables and the gold queries' checkpoints, so the next gold run rebuilds every
gold table from silver.

    python -m audit.reset_gold            # lists what it deletes, asks y/N
    python -m audit.reset_gold --yes      # (make reset-gold YES=1)

Gold folds each micro-batch into the rows of its tables, so a table is only ever written by
the checkpoint that wrote it first; a gold run refuses anything else (a new checkpoint, another
`--only` selection, a table restored by hand) and names this command. Silver and bronze are not
touched: gold is derived from silver alone. Refused while a gold query runs (its checkpoint
lock is held).
"""
from __future__ import annotations

import argparse
import shutil
import sys

from common.checkpoint_lock import CheckpointLocks
from common.config import load_config
from common.errors import JobError, command
from common.storage import ObjectPath, location


def gold_checkpoints(cfg) -> list[str]:
    """Checkpoint folders of gold queries: `gold`, `--only` subsets (`gold_<keys>`) and the
    per-table queries of earlier versions (`gold_<table>`)."""
    root = location(str(cfg.checkpoint_root))
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if (p.name == "gold" or p.name.startswith("gold_")) and p.suffix not in (".lock", ".lease"))


def remove(path) -> None:
    where = location(path)
    if isinstance(where, ObjectPath):
        where._fs.delete_dir(where._at)
    elif where.exists():
        shutil.rmtree(where)


@command
def main(argv=None, *, cfg=None, stdin=None) -> int:
    """Exit code: 0 reset (or nothing to reset), 1 not confirmed, 2 a gold query runs."""
    parser = argparse.ArgumentParser(prog="audit.reset_gold", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    args = parser.parse_args(argv)
    from audit.restore import confirm

    stdin = stdin or sys.stdin
    cfg = cfg or load_config()
    queries = gold_checkpoints(cfg)
    tables = [cfg.table_path("gold", t) for t in cfg.tables["gold"] if location(cfg.table_path("gold", t)).exists()]
    if not queries and not tables:
        print("no gold table or checkpoint: nothing to reset")
        return 0
    with CheckpointLocks(cfg, queries):
        print("deletes (silver and bronze are kept; the next gold run rebuilds these from silver):")
        for q in queries:
            print(f"  checkpoint {cfg.checkpoint(q)}")
        for t in tables:
            print(f"  table      {t}")
        if not args.yes:
            if not stdin.isatty():
                raise JobError("stdin is not a terminal, so the reset cannot be confirmed; rerun with "
                               "--yes (make reset-gold YES=1) to reset without asking")
            if not confirm("Delete them? [y/N] ", stdin):
                print("aborted: nothing changed")
                return 1
        for path in [*(cfg.checkpoint(q) for q in queries), *tables]:
            remove(path)
    print(f"reset: {len(tables)} gold table(s) and {len(queries)} checkpoint(s) deleted; run gold to rebuild")
    return 0


if __name__ == "__main__":
    sys.exit(main())
