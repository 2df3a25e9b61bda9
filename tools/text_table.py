"""Rows of text as a table for a terminal, the two shapes the commands print: boxed (SQL
results, whose cells may hold anything) and aligned columns (reports and status lines)."""
from __future__ import annotations


def boxed(columns: list[str], rows: list[tuple], max_width: int = 60) -> str:
    """A table in +---+ borders, NULL for None, cells cut to max_width."""
    def cell(v) -> str:
        s = "NULL" if v is None else str(v)
        return s if len(s) <= max_width else s[: max_width - 1] + "…"

    body = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line, fmt(columns), line, *map(fmt, body), line])


def aligned(headers: list[str], rows: list[list[str]], indent: str = "", rule: bool = False) -> list[str]:
    """The lines of a table of left-aligned columns two spaces apart, the headers first (then a
    rule of dashes under each, if asked)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = lambda cells: indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(headers), *([line(["-" * w for w in widths])] if rule else []), *map(line, rows)]
