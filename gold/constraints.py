"""The invariants of the gold tables, declared once by each table's kind (`GoldTable.checks`):
keys not NULL, counts not negative, windows and sessions that end after they start. Each is
enforced twice, from this one declaration:

- by the GX gate, before the write: a table's gate checks every constraint of the table, by a
  rule of its suite that covers it (`covered_by`) or else by a rule derived from it
  (`constraint:<name>`, policy `fail`) that rides in the same validation as the suite's rules
  (`gate_suite`). A batch breaking one stops there, named, with its result in ops.dq_results.
  A derived rule adds no Spark job of its own: each is a single-column expectation, which GX
  counts in the jobs the suite's rules run anyway (an `after` constraint is checked on a
  boolean column the gate's view adds, `viewed`, not by GX's column-pair expectation, which
  counts its rows in jobs of its own);
- by Delta, in the commit itself, as a CHECK constraint of the table: the table's own last
  line, for any other writer too (a write that breaks one fails with the constraint's name and
  commits nothing).

A rule of the suite that contradicts a constraint is left alone: it is the suite's to fix."""
from __future__ import annotations

from dataclasses import dataclass

DERIVED = "constraint:"    # a derived rule's name: DERIVED + the constraint's name
IN_SET = "expect_column_values_to_be_in_set"    # a derived rule's form on a column of the view
# An expectation's kwargs that only shape its result, not what it accepts.
RESULT_ONLY = frozenset({"result_format", "catch_exceptions", "meta", "include_config"})


@dataclass(frozen=True)
class Check:
    name: str              # the constraint's name (Delta folds it to lower case)
    sql: str               # its CHECK expression
    expectation: str       # its Great Expectations form (what a suite rule covering it is): the expectation ...
    kwargs: tuple          # ... and its kwargs, as (key, value) pairs
    # Whether its derived rule checks, instead of that form, a boolean column the gate's view
    # adds, named after it: the CHECK expression's value, NULL as false (`viewed`,
    # gold.transform.quality_view), with `value_set: [true]`. For a form GX runs Spark jobs of
    # its own for (a column pair).
    in_view: bool = False

    def rule(self):
        """The gate's rule derived from the constraint: policy `fail`, named after it."""
        from common.quality import Rule

        if self.in_view:
            return Rule(DERIVED + self.name, IN_SET, {"column": self.name, "value_set": [True]}, "fail")
        return Rule(DERIVED + self.name, self.expectation, dict(self.kwargs), "fail")

    def covered_by(self, rule) -> bool:
        """Whether a suite rule stops every batch the constraint would refuse: a `fail` rule of
        the same expectation on the same column(s), on every row (no `mostly`, no row
        condition), with a bound at least as strict."""
        if rule.policy != "fail" or rule.expectation != self.expectation:
            return False
        mine, theirs = dict(self.kwargs), {k: v for k, v in rule.kwargs.items() if k not in RESULT_ONLY}
        for key in ("column", "column_A", "column_B"):
            if (key in mine or key in theirs) and str(theirs.get(key, "")).lower() != str(mine.get(key, "")).lower():
                return False      # Spark's column names ignore case
        if theirs.pop("mostly", 1) != 1:
            return False
        return _COVERS[self.expectation](mine, {k: v for k, v in theirs.items()
                                                if k not in ("column", "column_A", "column_B")})


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _covers_not_null(mine: dict, theirs: dict) -> bool:
    return not theirs


def _covers_at_least(mine: dict, theirs: dict) -> bool:
    """expect_column_values_to_be_between: a lower bound at or above the constraint's (an upper
    bound only narrows it further)."""
    low = _number(theirs.pop("min_value", None))
    for narrower in ("max_value", "strict_min", "strict_max"):
        theirs.pop(narrower, None)
    return not theirs and low is not None and low >= mine["min_value"]


def _covers_greater(mine: dict, theirs: dict) -> bool:
    """expect_column_pair_values_a_to_be_greater_than_b: strictly greater covers both forms,
    greater or equal only the constraint that allows equal; rows with a NULL in the pair are
    the constraint's too (GX's default skips only rows where both are NULL)."""
    or_equal = theirs.pop("or_equal", False)
    if theirs.pop("ignore_row_if", "both_values_are_missing") not in ("both_values_are_missing", "neither"):
        return False
    return not theirs and (not or_equal or mine["or_equal"])


_COVERS = {"expect_column_values_to_not_be_null": _covers_not_null,
           "expect_column_values_to_be_between": _covers_at_least,
           "expect_column_pair_values_a_to_be_greater_than_b": _covers_greater}


def not_null(column: str) -> Check:
    return Check(f"{column}_not_null", f"`{column}` IS NOT NULL",
                 "expect_column_values_to_not_be_null", (("column", column),))


def not_negative(column: str) -> Check:
    # Delta refuses a NULL here as it does a negative value (a CHECK must be true, not unknown),
    # while GX's between skips NULLs: a NULL would pass the gate and be stopped by Delta alone.
    # The columns constrained are counts (count(), a set's size), never NULL.
    return Check(f"{column}_not_negative", f"`{column}` >= 0",
                 "expect_column_values_to_be_between", (("column", column), ("min_value", 0)))


def after(later: str, earlier: str, or_equal: bool) -> Check:
    # GX's column-pair expectation (what a suite rule covering it is) counts its rows in Spark
    # jobs of its own, about four per gate on a small batch: the derived rule checks the CHECK
    # on the gate's view instead, in the jobs the suite's rules run anyway. As Delta's CHECK, it
    # fails a row with either side NULL.
    word, op = ("at_or_after", ">=") if or_equal else ("after", ">")
    return Check(f"{later}_{word}_{earlier}", f"`{later}` {op} `{earlier}`",
                 "expect_column_pair_values_a_to_be_greater_than_b",
                 (("column_A", later), ("column_B", earlier), ("or_equal", or_equal)), in_view=True)


def by_name(checks) -> dict[str, str]:
    """name -> CHECK expression, as common.delta.ensure_table takes them."""
    return {c.name: c.sql for c in checks}


@dataclass(frozen=True)
class Coverage:
    """How a table's gate checks one of its constraints: by `rule`, a rule of its suite, or
    the rule derived from it (`derived`)."""
    check: Check
    rule: str
    derived: bool

    def __str__(self) -> str:
        return f"{self.check.name}: {self.how}"

    @property
    def how(self) -> str:
        """How the gate checks the constraint, as `lakehouse check` and `graph` list it (for a
        derived rule on a column of the gate's view, what the column holds)."""
        if not self.derived:
            return f"covered by {self.rule}"
        c = self.check
        return f"derived rule {self.rule}" + (f": view column {c.name} = {c.sql} (NULL: false) in [true]"
                                              if c.in_view else "")


def coverage(checks, suite) -> tuple[Coverage, ...]:
    """Each constraint with the first `fail` rule of `suite` (None: no suite) covering it, or
    its derived rule."""
    rules = suite.rules if suite is not None else ()
    out = []
    for check in checks:
        by = next((r.name for r in rules if check.covered_by(r)), None)
        out.append(Coverage(check, by or DERIVED + check.name, by is None))
    return tuple(out)


def gate_suite(table: str, checks, suite, name: str):
    """The suite the gate of gold.<table> runs: `suite`'s rules (None: the table has none in the
    file) plus the rules derived from the constraints no rule of it covers, all in one GX
    validation. `name`: the suite's name for a table the file has no entry for (its results are
    recorded under it)."""
    from common.quality import Suite, SuiteError

    derived = [c.check.rule() for c in coverage(checks, suite) if c.derived]
    own = suite.rules if suite is not None else ()
    taken = sorted({r.name for r in own} & {r.name for r in derived})
    if taken:
        raise SuiteError(f"{suite.source}: gold.{table}: rule name {taken[0]!r} is taken by the rule derived "
                         f"from the table's constraint (names starting {DERIVED!r} are kept for them)")
    if suite is None:
        return Suite(name, f"gold.{table}", tuple(derived), None, "gold/constraints.py")
    return Suite(suite.name, suite.table, (*own, *derived), suite.row_id, suite.source)


def gate_suites(tables, suites: dict) -> dict[str, object]:
    """gold.<table> -> the suite its gate runs (gate_suite), for each of `tables` (GoldTable):
    `suites` is the gold suite file's, by table."""
    name = next((s.name for s in suites.values()), "constraints")
    return {f"gold.{t.table}": gate_suite(t.table, t.checks(), suites.get(f"gold.{t.table}"), name)
            for t in tables}


def viewed(checks, gate) -> tuple[Check, ...]:
    """The constraints among `checks` whose derived rule `gate` (a gate_suite) runs on a column
    of the gate's view: gold.transform.quality_view adds one for each (none for a constraint a
    suite rule covers)."""
    return tuple(c for c in checks if c.in_view and c.rule() in gate.rules)


def listing(tables, suites: dict) -> list[str]:
    """One line per constraint of each of `tables`: the rule of the table's gate that checks it
    (`lakehouse check`, `lakehouse graph`). SuiteError as gate_suites."""
    gate_suites(tables, suites)
    width = max((len(f"gold.{t.table} {c.name}") for t in tables for c in t.checks()), default=0)
    return [f"{f'gold.{t.table} {c.check.name}':<{width}}  {c.how}"
            for t in tables for c in coverage(t.checks(), suites.get(f"gold.{t.table}"))]
