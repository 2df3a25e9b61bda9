"""Exact distinct counts per group per window (a `tables:` entry of `kind: distinct`), e.g. the
distinct devices seen per zip code per day.

A distinct count cannot be folded batch by batch from counts alone, so the row keeps the set
of values it has seen (`<value>_set`, sorted, bounded by the distinct values of one group in
one window) beside its size: a batch's set is unioned into the row's, which is exact whatever
order and batches the events came in. Otherwise a windowed table (finalizing, closing by the
watermark, the MERGE) like any other."""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F

from common.spec import Name, Names, Spec, Text, spec
from gold.kinds import Declaring, register
from gold.kinds.windowed import WindowedTable


@spec
class Distinct(Spec):
    table: Name
    value: Name                    # the column whose distinct values are counted
    window: Text                   # a duration, or $section.key of the lakehouse config
    key: Name = ""                 # gold.job --only name; default: the table
    group: Names = ()
    count: Name = "distinct_count"  # the count's column


@dataclass(frozen=True)
class DistinctCount:
    """The measure: a set column and its size (gold.transform.Measure's interface)."""
    name: str
    value: str

    counts = True              # a set's size: never negative (a table constraint)

    @property
    def expression(self) -> str:
        return self.value

    @property
    def members(self) -> str:
        return f"{self.value}_set"

    @property
    def parts(self) -> list[tuple[str, str]]:
        return [(self.members, f"array_sort(collect_set({self.value}))"),
                (self.name, f"CAST(size(collect_set({self.value})) AS BIGINT)")]

    def combined(self, t: str, s: str):
        old, new = F.col(f"{t}.`{self.members}`"), F.col(f"{s}.`{self.members}`")
        union = F.array_sort(F.coalesce(F.array_union(old, new), old, new))
        return [union.alias(self.members), F.size(union).cast("long").alias(self.name)]


@register
@dataclass(frozen=True)
class DistinctTable(WindowedTable):
    kind = "distinct"

    @classmethod
    def declare(cls, entry, at: Declaring) -> "DistinctTable":
        d = at.entry(Distinct, entry)
        return cls(d.key or d.table, d.table, tuple(at.column("group", c) for c in d.group),
                   at.duration(d.window).spark(), None,
                   (DistinctCount(d.count, at.column("value", d.value)),))
