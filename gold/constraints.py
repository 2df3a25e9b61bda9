"""Delta CHECK constraints of the gold tables, declared by each table's kind (`GoldTable.checks`):
the invariants no batch may break whatever its input (keys not NULL, counts not negative,
windows and sessions that end after they start). The GX gate checks a batch's rows before the
write and records what it found; the constraints are the table's own last line, enforced by
Delta in the commit itself, so a write that breaks one fails with the constraint's name and
commits nothing, from the pipeline or from any other writer."""
from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Check:
    name: str          # the constraint's name (Delta folds it to lower case)
    sql: str           # its CHECK expression


def not_null(column: str) -> Check:
    return Check(f"{column}_not_null", f"`{column}` IS NOT NULL")


def not_negative(column: str) -> Check:
    # NULL passes a CHECK (as in SQL): a sum over no value is NULL until one comes.
    return Check(f"{column}_not_negative", f"`{column}` >= 0")


def after(later: str, earlier: str, or_equal: bool) -> Check:
    word, op = ("at_or_after", ">=") if or_equal else ("after", ">")
    return Check(f"{later}_{word}_{earlier}", f"`{later}` {op} `{earlier}`")


def by_name(checks) -> dict[str, str]:
    """name -> CHECK expression, as common.delta.ensure_table takes them."""
    return {c.name: c.sql for c in checks}
