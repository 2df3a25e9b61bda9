"""Kinds of gold table. A kind owns everything that differs between tables: its declaration in
a profile, its output schema, which silver columns it reads, how a micro-batch changes it (the
rows it hands to the MERGE and the MERGE's clauses), the count of rows it changed, and its
rebuild from silver in batch (the audit's recompute, a refresh). gold/job.py runs every kind
the same way and knows none of them.

A new kind is one module in this package: a `GoldTable` subclass decorated with `@register`,
whose `declare` reads its entry of the profile's `tables:` list. It is found by name
(`kind: <name>`); nothing else in the tree lists the kinds.

The gold query's stream hands each batch to the tables as rows of two shapes: the batch's
on-time events (struct column EVENT) and the rows of the one stateful kind (struct column
SESSION, see `GoldTable.stateful`)."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from common.profile import ProfileError
from common.spec import load
from gold.transform import CLOSING   # noqa: F401 - a row an update carries only because the watermark closed it

EVENT, SESSION = "event", "session"   # the two kinds of row a gold micro-batch hands over
# Timestamps handed from one plan to the next as SQL literals, in the session's time zone: a
# literal is what Delta's data skipping and Parquet's filter pushdown compare with file stats.
LITERAL_TS = "yyyy-MM-dd HH:mm:ss.SSSSSS"

KINDS: dict[str, type["GoldTable"]] = {}


def register(cls):
    """Class decorator: the kind answers to `kind: <cls.kind>` in a profile's `tables:`."""
    KINDS[cls.kind] = cls
    return cls


def kind(name: str) -> type["GoldTable"]:
    """The kind's class (KeyError if no module of this package registers it)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")     # cached after the first call
    if name not in KINDS:
        raise KeyError(name)
    return KINDS[name]


def known_kinds() -> list[str]:
    kind("windowed")            # loads every module
    return sorted(KINDS)


@dataclass(frozen=True)
class Declaring:
    """What a kind's `declare` gets beside its profile entry."""
    where: str                     # the entry, for errors: "<profile file>: tables.0"
    duration: Callable             # text -> Duration: a duration or a `$section.key` of the config
    columns: frozenset             # columns of silver's events (fields, derived, dimension)

    def entry(self, spec_class, entry: Any):
        """A `tables:` entry (a mapping) validated by the kind's spec class, or a spec already
        validated by the profile (its `aggregations:` and `sessions:`)."""
        if not isinstance(entry, dict):
            return entry
        return load(spec_class, {k: v for k, v in entry.items() if k != "kind"}, self.where, ProfileError)

    def column(self, key: str, name: str) -> str:
        if name not in self.columns:
            raise ProfileError(f"{self.where}: key '{key}': '{name}' is neither a field, a derived "
                               "column nor a dimension column")
        return name


class GoldTable:
    """One gold table of a profile, with every setting resolved (durations in seconds, Spark
    interval strings): no kind reads the configuration."""

    kind: ClassVar[str] = ""
    # Fed by a stateful operator in the stream (SESSION rows) rather than by the batch's events.
    stateful: ClassVar[bool] = False

    key: str                       # short name for --only
    table: str                     # gold.<table>
    keys: tuple[str, ...]          # MERGE keys
    publish: tuple | None = None   # (key columns, value column) for gold.stats_to_kafka

    # --- declaration ---------------------------------------------------------------------
    @classmethod
    def declare(cls, entry, at: Declaring) -> "GoldTable":   # pragma: no cover - interface
        """The table from its profile entry (see Declaring.entry)."""
        raise NotImplementedError

    def reads(self) -> set[str]:   # pragma: no cover - interface
        """Silver columns the table reads (names and identifiers of its expressions)."""
        raise NotImplementedError

    def output_schema(self, spark, silver_schema):   # pragma: no cover - interface
        raise NotImplementedError

    # --- the stream ----------------------------------------------------------------------
    def stream(self, events: DataFrame, *carried: str) -> DataFrame:   # pragma: no cover
        """Stateful kinds: the streaming operator over the on-time events."""
        raise NotImplementedError

    # --- a micro-batch -------------------------------------------------------------------
    def updates(self, batch: DataFrame, current: DataFrame | None, watermark_ms: int,
                earliest: str | None) -> DataFrame:   # pragma: no cover - interface
        """The rows a batch changes (their values after it), plus the rows `watermark_ms` (the
        batch's closing watermark, GoldBatch) closed that it did not touch, flagged CLOSING. `current()`: the table, None while it holds no
        file; `earliest`: the batch's earliest event time (a literal)."""
        raise NotImplementedError

    def sizes(self, rows: DataFrame) -> tuple[int, int, str | None]:   # pragma: no cover
        """(rows the batch's events changed, the live ones of those, a hint for `merge`), in
        one Spark job, which also fills the cache of `rows`."""
        raise NotImplementedError

    def live(self, rows: DataFrame) -> DataFrame:
        """The rows of an update the table holds (the gate checks these; a first write appends them)."""
        return rows

    def merge(self, target, rows: DataFrame, watermark_ms: int, hint: str | None) -> None:   # pragma: no cover
        """MERGE `rows` into `target` (a DeltaTable), closing what `watermark_ms` passed, also
        the table's rows that no update carries."""
        raise NotImplementedError

    def close(self, target, watermark_ms: int) -> None:   # pragma: no cover - interface
        """Mark closed, in place (an UPDATE of `target`, a DeltaTable), the rows `watermark_ms`
        passed that are still open: a batch without events changes nothing else."""
        raise NotImplementedError

    def checks(self) -> tuple:
        """The Delta CHECK constraints of the table (gold.constraints)."""
        return ()

    def condition(self) -> str:
        return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.keys)

    # --- batch ---------------------------------------------------------------------------
    def expected(self, events: DataFrame, arrival: str, watermark_ms: int) -> DataFrame:  # pragma: no cover
        """The table after the batch with `watermark_ms`, rebuilt in batch from the on-time
        events it consumed (`arrival`: the column numbering the micro-batch each came in)."""
        raise NotImplementedError


def touched(rows: DataFrame) -> DataFrame:
    """The rows of an update the batch's events changed: not the rows it only closes, which the
    gate has checked and the stats topic has had already (same values)."""
    return rows.where(~F.col(CLOSING)).drop(CLOSING) if CLOSING in rows.columns else rows


def identifiers(expressions) -> set[str]:
    """Column-like names in SQL expressions (over-approximate: function names too)."""
    import re

    return {w for e in expressions for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", e)}
