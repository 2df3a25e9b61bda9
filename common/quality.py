"""Quality gate between layers: Great Expectations 1.x suites declared in conf/expectations.

Each expectation has a policy:
  warn       -> the result is recorded in ops.dq_results, rows pass;
  quarantine -> failing rows are returned so the caller can quarantine them (reason dq:<name>);
  fail       -> DataQualityError: the micro-batch is not committed, the query stops, and the
                same batch is replayed from the checkpoint once the data or the rule is fixed.
"""
from __future__ import annotations

import functools
import gc
import importlib.abc
import importlib.util
import itertools
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import model_validator

from common.errors import DataQualityError, GateError, JobError
from common.spec import Spec, Text, invalid, load, one_of, read_yaml, spec

# GX would otherwise try to send usage analytics: jobs must not touch the network.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

# What importing GX loads for features no gate of this project uses: charts (altair) and the
# distribution tests of a few expectations (scipy.stats). About 2.3 s of the 5.5 s of CPU GX's
# import takes, on the core the JVM starts on. Made lazy, each loads on first use only.
GX_LAZY_IMPORTS = ("altair", "scipy")

POLICIES = ("warn", "quarantine", "fail")
SAMPLE_ROWS = 5
SAMPLE_CHARS = 200      # of one sampled value in result_json: a bad value may be a whole line


class SuiteError(JobError, ValueError):
    """A suite file is malformed; the message names the file and the entry."""


@spec
class Rule(Spec):
    name: Text
    expectation: Text      # snake_case GX expectation type
    kwargs: dict           # none in the file: {}
    policy: one_of(*POLICIES)

    @model_validator(mode="before")
    @classmethod
    def _kwargs_optional(cls, raw):
        return {**raw, "kwargs": raw.get("kwargs") or {}} if isinstance(raw, dict) else raw

    def gx(self):
        gx = import_gx()
        cls = getattr(gx.expectations, _camel(self.expectation))
        return cls(**self.kwargs)


@spec
class Suite(Spec):
    name: str
    table: str
    rules: tuple[Rule, ...]
    row_id: str | None = None
    source: str = ""


@dataclass
class Outcome:
    rule: Rule
    success: bool
    element_count: int | None
    unexpected_count: int | None
    observed_value: str | None
    unexpected_ids: list = field(default_factory=list)
    sample: list = field(default_factory=list)
    gx_result: object = None       # GX's ExpectationValidationResult; recorded as JSON (result_json_of)


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


@spec
class SuiteFile(Spec):
    """A suite file: either one table (`table:` + `expectations:`) or several (`tables:`)."""
    suite: Text
    row_id: Text | None = None
    table: Text | None = None
    expectations: tuple[Rule, ...] | None = None
    tables: dict[str, tuple[Rule, ...]] | None = None

    @property
    def by_table(self) -> dict[str, tuple[tuple, tuple[Rule, ...]]]:
        """table -> (its key in the file, its rules)."""
        if self.tables is not None:
            return {t: (("tables", t), rules) for t, rules in self.tables.items()}
        return {self.table: (("expectations",), self.expectations or ())} if self.table else {}

    @model_validator(mode="after")
    def _runnable(self, info):
        # {"gx": False}: the checks that need Great Expectations (an import of 2-3 s) are left
        # to a later load with them, which the runner makes while the Spark session starts.
        with_gx = (info.context or {}).get("gx", True)
        if not self.by_table:
            invalid("table", "needs 'table' + 'expectations' or 'tables'")
        for key, rules in self.by_table.values():
            if not rules:
                invalid(*key, "expected a non-empty list of expectations")
            names = [r.name for r in rules]
            for i, rule in enumerate(rules):
                if rule.name in names[:i]:
                    invalid(*key, i, "name", f"duplicate name '{rule.name}'")
                if rule.policy == "quarantine" and not self.row_id:
                    invalid(*key, i, "policy", "policy 'quarantine' needs the suite's 'row_id'")
                if with_gx:
                    _check_gx(key, i, rule)
        return self


def _check_gx(key: tuple, i: int, rule: Rule) -> None:
    gx = import_gx()
    if not hasattr(gx.expectations, _camel(rule.expectation)):
        invalid(*key, i, "expectation", f"unknown Great Expectations expectation '{rule.expectation}'")
    try:
        rule.gx()
    except Exception as err:  # pydantic validation of the kwargs
        invalid(*key, i, "kwargs", f"bad kwargs for {rule.expectation}: {err}")


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Hands out the modules named (and their submodules) through importlib's LazyLoader: the
    module object exists at once, its code runs when an attribute of it is first read."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if not any(name == n or name.startswith(n + ".") for n in self.names):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            found = finder.find_spec(name, path, target)
            if found is not None:
                if found.loader is not None and hasattr(found.loader, "exec_module"):
                    found.loader = importlib.util.LazyLoader(found.loader)
                return found
        return None


_gx_lock = threading.Lock()


def import_gx():
    """great_expectations, imported with GX_LAZY_IMPORTS lazy (the validate thread imports it
    while the session starts; a gate builds on it later)."""
    with _gx_lock:
        if "great_expectations" not in sys.modules:
            finder = _LazyFinder(GX_LAZY_IMPORTS)
            sys.meta_path.insert(0, finder)
            # The import leaves the process some 200,000 objects (with pandas' and pyspark's)
            # that live as long as it does. The collections Python ran while they piled up freed
            # next to nothing (0.3 s of a core in 600 collections, beside the JVM's start, 80
            # objects freed), and each full one after it scanned them all again (0.1-0.4 s,
            # holding the GIL). Frozen once imported, with what else the process holds then,
            # they are out of every later collection; the full collection after it makes Python
            # space its next ones by what is left, not by them.
            collecting = gc.isenabled()
            gc.disable()
            try:
                import great_expectations    # noqa: F401
            finally:
                sys.meta_path.remove(finder)
                gc.freeze()
                gc.collect()
                if collecting:
                    gc.enable()
    # The import statement, not sys.modules: it waits for an import of GX another thread began
    # on its own (a test, a tool) instead of handing out a half-initialised module.
    import great_expectations
    return great_expectations


def load_suites(path: str | Path, gx: bool = True) -> dict[str, Suite]:
    """Read a suite file (SuiteFile) into its suites, by table. gx=False leaves out the checks
    that need Great Expectations (the expectation exists, its kwargs fit): a second load with
    them must follow before any suite is used."""
    path = Path(path)
    f = load(SuiteFile, read_yaml(path, SuiteError), path, SuiteError, context={"gx": gx})
    return {t: Suite(f.suite, t, rules, f.row_id, str(path)) for t, (_, rules) in f.by_table.items()}


class QualityGate:
    """Validates DataFrames against a suite with one ephemeral GX context per job."""

    def __init__(self, suite: Suite, one_task_below_rows: int = 0):
        gx = import_gx()
        self.suite = suite
        self.one_task_below_rows = one_task_below_rows
        self._context = gx.get_context(mode="ephemeral")
        try:
            self._context.variables.progress_bars = {"globally": False, "metric_calculations": False}
        except Exception:  # cosmetic only
            pass
        # persist=False: GX would cache every batch DataFrame and never unpersist it; the
        # caller caches the batch once and releases it after all checks.
        source = self._context.data_sources.add_spark(name=f"lakehouse_{suite.table}", persist=False)
        self._batches = source.add_dataframe_asset(name="batch").add_batch_definition_whole_dataframe("all")
        self._rules = {rule.name: rule for rule in suite.rules}
        self._expectations: dict[tuple, list] = {}     # (rule name, result format) pairs -> GX expectations
        # A row-wise (map) expectation without `mostly` succeeds only with no unexpected row, so
        # its success alone gives its counts: unexpected 0 of the batch's rows.
        from great_expectations.expectations.expectation import (
            ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)

        row_wise = (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)
        self._implied = {rule.name for rule in suite.rules
                         if isinstance(rule.gx(), row_wise) and "mostly" not in rule.kwargs}

    def _detail_format(self, rule: Rule) -> str:
        """The result format a rule needs when its success does not say everything: row ids
        (COMPLETE) for quarantine and fail rules, counts and a sample (BASIC) for the others."""
        return "COMPLETE" if self.suite.row_id and rule.policy in ("quarantine", "fail") else "BASIC"

    def _result_format(self, fmt: str) -> dict:
        if fmt == "BOOLEAN_ONLY":
            return {"result_format": fmt}
        extra = {"unexpected_index_column_names": [self.suite.row_id]} if fmt == "COMPLETE" else {}
        return {"result_format": fmt, "partial_unexpected_count": SAMPLE_ROWS, **extra}

    def _run(self, df, formats: dict[str, str], rows: int | None) -> dict:
        """One GX graph for the rules, each with its own result format: GX computes the metrics
        they share (row count, null counts) once and bundles the aggregates on one domain into
        one Spark job. A validation-wide result format would make a rule needing more detail
        cost a second validation, and with it a second round of the same metrics."""
        key = tuple(formats.items())
        if key not in self._expectations:
            self._expectations[key] = [self._rules[name].gx().copy(update={"result_format": self._result_format(fmt)})
                                       for name, fmt in key]
        by_type = {}
        for r in _validator(self._batches, df).run([e.configuration for e in self._expectations[key]], rows):
            by_type.setdefault(r.expectation_config.type, []).append(r)
        return {name: _match(by_type.get(self._rules[name].expectation, []), self._rules[name]) for name in formats}

    def validate(self, df, rows: int | None = None) -> list[Outcome]:
        """Evaluate the suite on df (cached by the caller; `rows`: its row count, if known).

        GX runs Spark jobs per metric it returns, so each rule asks for no more than its outcome
        needs, all in one validation: pass/fail (BOOLEAN_ONLY) for the row-wise rules whose
        success implies their counts, counts (BASIC) or row ids (COMPLETE) for the others (a
        `mostly`, an aggregate expectation's observed value). Only a row-wise rule that failed
        needs a second validation, for its counts or ids. A clean batch pays for one.

        GX's metrics are whole-batch aggregates, each level of its metric graph one Spark query,
        and an aggregate over several partitions is two jobs (Spark runs the exchange's map
        stage as a job of its own). A batch smaller than `one_task_below_rows` is read as one
        partition, with no exchange: one job per level. And a known row count is given to GX,
        which would otherwise count the rows in a level of their own: a clean gold table whose
        rules are all single-column gated in four jobs, and now in one. A column-pair rule is
        computed outside GX's bundles: its two counts, a job each in GX, are one aggregate
        here, which also computes the single-column rules' aggregates GX would scan the batch
        for again one level later (_fewer_jobs): silver's clean batch of 200,000 events gated
        in three jobs instead of five, 0.47-0.59 s instead of 0.60-0.79 warm. A not-null rule's
        sample of unexpected values (all NULL) is taken from its count, not a filter of the
        batch: two jobs."""
        if rows is not None and rows < self.one_task_below_rows:
            df = df.coalesce(1)
        first = {rule.name: "BOOLEAN_ONLY" if rule.name in self._implied else self._detail_format(rule)
                 for rule in self.suite.rules}
        found = self._run(df, first, rows)
        failed = {name: self._detail_format(self._rules[name]) for name, fmt in first.items()
                  if fmt == "BOOLEAN_ONLY" and not found[name].success}
        if failed:
            found.update(self._run(df, failed, rows))
        implied = {name for name, fmt in first.items() if fmt == "BOOLEAN_ONLY" and name not in failed}
        if rows is None and implied:
            rows = df.count()
        outcomes = []
        for rule in self.suite.rules:
            r = found[rule.name]
            if r.exception_info and r.exception_info.get("raised_exception"):
                raise GateError(f"expectation '{rule.name}' ({rule.expectation}) could not be "
                                f"evaluated: {r.exception_info.get('exception_message')}")
            if rule.name in implied:
                outcomes.append(Outcome(rule=rule, success=True, element_count=rows, unexpected_count=0,
                                        observed_value=None, gx_result=r))
                continue
            res = r.result or {}
            with_ids = self._detail_format(rule) == "COMPLETE"
            ids = [d.get(self.suite.row_id) for d in res.get("unexpected_index_list") or []
                   if isinstance(d, dict)] if with_ids else []
            outcomes.append(Outcome(
                rule=rule, success=bool(r.success),
                element_count=res.get("element_count"),
                unexpected_count=res.get("unexpected_count"),
                observed_value=None if res.get("observed_value") is None
                else json.dumps(res.get("observed_value"), default=str),
                unexpected_ids=ids,
                sample=(res.get("unexpected_index_list") or res.get("partial_unexpected_list") or [])[:SAMPLE_ROWS],
                gx_result=r,
            ))
        return outcomes


def _validator(batch_definition, df):
    """A GX validator of df that applies each expectation's own result format."""
    return _per_rule_format_validator()(batch_definition=batch_definition, batch_parameters={"dataframe": df})


@functools.cache
def _per_rule_format_validator():
    from great_expectations.validator.v1_validator import Validator   # built on first use: GX's import is slow

    class PerRuleFormat(Validator):
        """GX's V1 validator with no validation-wide result format, which GX 1.x would give
        precedence over each expectation's own `result_format`. The rest is GX's own path:
        the wrapped validator's graph_validate, as Validator._validate_expectation_configs
        runs it."""

        def run(self, configs: list, rows: int | None = None) -> list:
            """`rows`: the batch's row count, if known: GX's table.row_count metric, given."""
            validator = self._wrapped_validator
            engine = validator.execution_engine
            engine.resolve_metrics = _fewer_jobs(engine, engine.resolve_metrics, rows)
            try:
                return validator.graph_validate(
                    configurations=validator.process_expectations_for_validation(configs, None),
                    runtime_configuration={})
            finally:
                del engine.resolve_metrics      # the engine's own method again

    return PerRuleFormat


def _fewer_jobs(engine, resolve, rows: int | None):
    """An execution engine's `resolve_metrics` (the one entry point GX's metric graph calls it
    by) that answers the whole batch's row count (table.row_count without a row condition)
    with `rows` when known, and scans the batch once where GX scans it twice: the level of the
    graph that asks for the column-pair rules' counts (GX: two jobs per rule, outside its
    bundles) also asks for the aggregate functions of the single-column rules, whose bundle GX
    then runs as a job of its own one level later. Here one aggregate computes both, by GX's
    own conditions and aggregate functions (_one_pass), and the next level's bundled metrics
    get their values from it. A not-null rule's sample of unexpected values is that many
    NULLs: its count, computed in the same aggregate, stands for GX's filter of the batch
    (_null_samples). Every other metric is resolved as the engine does."""
    early: dict = {}        # an aggregate function's metric id -> its value, computed a level early

    def resolve_metrics(metrics_to_resolve, metrics=None, runtime_configuration=None):
        todo, metrics = list(metrics_to_resolve), metrics or {}
        given = {} if rows is None else {m.id: rows for m in todo if m.metric_name == "table.row_count"
                                         and not (m.metric_domain_kwargs or {}).get("row_condition")}
        for m in todo:
            partial = (m.metric_dependencies or {}).get("metric_partial_fn")
            if partial is not None and partial.id in early and _bundled(engine, m):
                given[m.id] = early[partial.id]
        pairs, nulls = _pair_counts(todo, metrics), _null_samples(todo)
        rest = [m for m in todo if m.id not in given and m.id not in pairs.counted and m.id not in nulls]
        found = resolve(metrics_to_resolve=rest, metrics=metrics,
                        runtime_configuration=runtime_configuration) if rest else {}
        if pairs.by_condition or nulls:
            aggregates = {m.id: found[m.id] for m in rest if m.metric_name.endswith(".aggregate_fn")
                          and m.id in found and _whole_batch(found[m.id][1])
                          and not (rows is not None and m.metric_name == "table.row_count.aggregate_fn")}
            counts, values = _one_pass(engine, pairs.by_condition, metrics, aggregates)
            given.update(counts)
            early.update(values)
            given.update({m.id: _nulls(m, values[nulls[m.id]]) for m in todo
                          if m.id in nulls and nulls[m.id] in values})
            left = [m for m in todo if m.id in nulls and m.id not in given]
            if left:                      # a count not folded after all: GX samples the rows
                found.update(resolve(metrics_to_resolve=left, metrics=metrics,
                                     runtime_configuration=runtime_configuration))
        return {**found, **given}

    return resolve_metrics


NULL_SAMPLE = "column_values.nonnull.unexpected_values"
NULL_COUNT = "column_values.nonnull.unexpected_count.aggregate_fn"


def _null_samples(todo) -> dict:
    """A not-null rule's sample of unexpected values (a `mostly` rule's, or a failed one's) ->
    the id of its unexpected count's aggregate function in the same level. Its values are all
    NULL, so the count alone gives the sample: GX would filter the batch for them in a job of
    their own, which on a batch without one scans every row."""
    counts = {m.metric_domain_kwargs_id: m.id for m in todo
              if m.metric_name == NULL_COUNT and _whole_batch(m.metric_domain_kwargs)}
    return {m.id: counts[m.metric_domain_kwargs_id] for m in todo
            if m.metric_name == NULL_SAMPLE and m.metric_domain_kwargs_id in counts}


def _nulls(sample, count: int) -> list:
    """GX's sample of a not-null rule's unexpected values (_spark_column_map_condition_values):
    as many as its result format takes of the `count` NULLs."""
    from great_expectations.constants import MAX_RESULT_RECORDS

    fmt = (sample.metric_value_kwargs or {})["result_format"]
    limit = MAX_RESULT_RECORDS if fmt["result_format"] == "COMPLETE" else \
        min(fmt["partial_unexpected_count"], MAX_RESULT_RECORDS)
    return [None] * min(count or 0, limit)


def _bundled(engine, metric) -> bool:
    """Whether GX computes `metric` as the value of its aggregate function's bundle (a metric
    provider with no function of its own), which a value computed earlier can then stand for."""
    from great_expectations.expectations.registry import get_metric_provider

    return get_metric_provider(metric_name=metric.metric_name, execution_engine=engine)[1] is None


def _unfiltered(domain_kwargs: dict, *also: str) -> bool:
    """A domain with no row condition and no filter (nor any of the keys `also` names)."""
    return not any((domain_kwargs or {}).get(k) for k in ("row_condition", "filter_conditions", *also))


def _whole_batch(domain_kwargs: dict) -> bool:
    """A compute domain that is the whole batch: unfiltered, and no column pair or list."""
    return _unfiltered(domain_kwargs, "column_A", "column_list", "ignore_row_if")


PAIR_COUNTS = ("unexpected_count", "filtered_row_count")
# GX's column-pair domain drops the rows its `ignore_row_if` names (SparkDFExecutionEngine.get_domain_records).
PAIR_IGNORED = {"both_values_are_missing": lambda a, b: a.isNull() & b.isNull(),
                "either_value_is_missing": lambda a, b: a.isNull() | b.isNull(),
                "neither": None}


@dataclass
class PairCounts:
    by_condition: dict          # the rule's condition (a metric id) -> {PAIR_COUNTS suffix: metric}

    @property
    def counted(self) -> set:
        """The ids of those metrics."""
        return {m.id for pair in self.by_condition.values() for m in pair.values()}


def _pair_counts(todo, metrics: dict) -> PairCounts:
    """The column-pair rules' unexpected_count and filtered_row_count among `todo`, which GX
    computes as two counts of the same rows (its domain records, less those `ignore_row_if`
    drops), each a Spark job of its own: _one_pass counts both, by GX's own condition. A pair
    whose condition is not at hand, or whose domain holds a row condition or filter, is left
    to GX."""
    pairs: dict[str, dict] = {}
    for m in todo:
        suffix = m.metric_name.rpartition(".")[2]
        condition = (m.metric_dependencies or {}).get("unexpected_condition")
        domain = m.metric_domain_kwargs or {}
        if suffix in PAIR_COUNTS and condition is not None and condition.id in metrics \
                and {"column_A", "column_B"} <= set(domain) and domain.get("ignore_row_if") in PAIR_IGNORED \
                and _unfiltered(domain):
            pairs.setdefault(condition.id, {})[suffix] = m
    pairs = {c: pair for c, pair in pairs.items() if len(pair) == len(PAIR_COUNTS)}
    return PairCounts(pairs)


def _one_pass(engine, pairs: dict, metrics: dict, aggregates: dict) -> tuple[dict, dict]:
    """One aggregate over the batch: each column pair's row and unexpected counts (`pairs`:
    PairCounts.by_condition), and GX's aggregate functions (`aggregates`: metric id -> (its
    aggregate column, domain, accessor), all on the whole batch). Returns the pairs' counts by
    metric id, and the aggregate functions' values by metric id, as GX's bundle gives them."""
    from great_expectations.util import convert_to_json_serializable
    from pyspark.sql import functions as F

    # Every metric of one validation is on the same batch: any compute domain names it.
    named = next(itertools.chain((metrics[c][1] for c in pairs), (d for _, d, _ in aggregates.values())), None)
    if named is None:
        return {}, {}
    batch = engine.get_domain_records(domain_kwargs={"batch_id": named.get("batch_id")})
    columns, slots = [], []
    for i, (condition_id, pair) in enumerate(pairs.items()):
        condition, compute_kwargs, accessor_kwargs = metrics[condition_id]
        domain = {**compute_kwargs, **accessor_kwargs}
        # As GX: the condition as a column first, true counts. Every column-pair condition GX
        # has is row-wise (no window function), so the pair's rows are those its own
        # `ignore_row_if` keeps, counted over the whole batch beside the other aggregates.
        flag = f"__unexpected_{i}"
        batch = batch.withColumn(flag, condition)
        ignored = PAIR_IGNORED[domain["ignore_row_if"]]
        kept = F.lit(True) if ignored is None else ~ignored(F.col(domain["column_A"]), F.col(domain["column_B"]))
        columns += [F.count_if(kept), F.count_if(kept & (F.col(flag) == True))]  # noqa: E712
        slots += [pair["filtered_row_count"].id, pair["unexpected_count"].id]
    row = batch.agg(*columns, *[fn for fn, _, _ in aggregates.values()]).first()
    counts = dict(zip(slots, row[:len(slots)]))
    return counts, {mid: convert_to_json_serializable(data=v) for mid, v in zip(aggregates, row[len(slots):])}


def result_json_of(r) -> str:
    """One expectation's GX result (ExpectationValidationResult) as JSON, for ops.dq_results'
    result_json: `make dq-docs` rebuilds the suite's validation result from these. Its lists are
    cut to SAMPLE_ROWS and its texts to SAMPLE_CHARS first: a COMPLETE result lists every
    unexpected row, and GX's serializer walks each in Python, which on a bad batch would cost
    more than the validation (and the row's size would have no bound)."""
    from great_expectations.core import ExpectationValidationResult

    result = {k: v if k == "unexpected_index_column_names" else _sample(v) for k, v in (r.result or {}).items()}
    cut = ExpectationValidationResult(success=r.success, expectation_config=r.expectation_config,
                                      result=result, meta=r.meta, exception_info=r.exception_info)
    return json.dumps(cut.to_json_dict(), separators=(",", ":"))


def _sample(value):
    if isinstance(value, str):
        return value if len(value) <= SAMPLE_CHARS else value[:SAMPLE_CHARS] + "..."
    if isinstance(value, list):
        return [_sample(v) for v in value[:SAMPLE_ROWS]]
    if isinstance(value, tuple):        # one row's values (a column pair): all of them
        return tuple(_sample(v) for v in value)
    if isinstance(value, dict):
        return {k: _sample(v) for k, v in value.items()}
    return value


def _match(results, rule: Rule):
    """The result of `rule` among its expectation type's: the one whose kwargs hold the rule's
    with the fewest others (GX adds its own, batch_id, result_format), so a rule whose kwargs
    are part of another's (a derived constraint rule beside a suite rule with `mostly`) gets
    its own result, not the other's."""
    own = set(rule.kwargs) | {"batch_id", "result_format"}
    found = [r for r in results if all(r.expectation_config.kwargs.get(k) == v for k, v in rule.kwargs.items())]
    if not found:
        raise GateError(f"no GX result for expectation '{rule.name}'")
    return min(found, key=lambda r: len(set(r.expectation_config.kwargs) - own))


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.rule.policy == "fail" and not o.success]


def raise_on_failures(outcomes: list[Outcome], query: str, batch_id: int, table: str) -> None:
    failed = failures(outcomes)
    if failed:
        lines = [f"quality gate failed: query '{query}', batch {batch_id}, table {table}"]
        for o in failed:
            lines.append(f"  expectation '{o.rule.name}' ({o.rule.expectation} {o.rule.kwargs}): "
                         f"{o.unexpected_count} of {o.element_count} rows unexpected; "
                         f"sample: {json.dumps(o.sample, default=str)}")
        lines.append("  the batch was not committed; fix the data or the rule in the suite, then "
                     "restart the job: it resumes from this batch.")
        raise DataQualityError("\n".join(lines), query, batch_id, table,
                               tuple(o.rule.name for o in failed), {o.rule.name: o.sample for o in failed})


def dq_rows(outcomes: list[Outcome], query: str, batch_id: int, table: str, suite: str):
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return [(query, batch_id, table, suite, o.rule.name, o.rule.expectation, o.rule.policy,
             o.success, o.element_count, o.unexpected_count, o.observed_value, now,
             # Serialized here, in the write's thread beside the layer's own writes, not in validate().
             None if o.gx_result is None else result_json_of(o.gx_result))
            for o in outcomes]


def write_results(spark, path: str, checked: list[tuple[list[Outcome], Suite]], query: str, batch_id: int,
                  app_id: str, metadata: dict | None = None, replay: bool = True) -> None:
    """One row per expectation per table per batch into ops.dq_results, in one append (gold
    gates every table it writes in a batch: one commit, not one per table). A batch stopped by
    a `fail` rule is recorded under its own app id, so after the fix its replay adds the passing
    results next to the failed attempt (an audit trail), while a replay of the same outcome is
    skipped."""
    from common.delta import idempotent_append
    from common.literal_frame import local_frame
    from common.schemas import DQ_RESULTS

    rows = [row for outcomes, suite in checked for row in dq_rows(outcomes, query, batch_id, suite.table, suite.name)]
    kind = "dq-failed" if any(failures(outcomes) for outcomes, _ in checked) else "dq"
    idempotent_append(local_frame(spark, rows, DQ_RESULTS), path, f"{app_id}-{kind}", batch_id, metadata, replay)


class GateRun:
    """A validated batch: its outcomes, and the ops.dq_results write still to make. The layer
    runs `record` beside its own writes (MicroBatch.commit): the results are an idempotent
    append keyed by the batch, so they need not wait for the data, nor the data for them.
    `ms` is what the gate adds to the batch's path: validating (the write runs beside others)."""

    def __init__(self, outcomes: list[Outcome], validate_ms: int, record):
        self.outcomes, self.ms, self.record = outcomes, validate_ms, record


def check(gate: "QualityGate", df, spark, path: str, query: str, batch_id: int,
          app_id: str, metadata: dict | None = None, rows: int | None = None,
          replay: bool = True) -> GateRun:
    """Validate a batch; on a `fail` rule record the results and raise. Otherwise the caller
    records them (GateRun.record), beside its writes. Callers gate only batches with rows: an
    empty batch has nothing to validate and records nothing."""
    return check_tables([(gate, df, rows)], spark, path, query, batch_id, app_id, metadata, replay)


def check_tables(gated: list[tuple["QualityGate", object, int | None]], spark, path: str, query: str,
                 batch_id: int, app_id: str, metadata: dict | None = None, replay: bool = True) -> GateRun:
    """`check` for several tables of one batch, (gate, df, rows) each: validated side by side
    (GX's Python and Spark's jobs overlap), recorded in one append. `outcomes` holds them all."""
    import time

    from common.batch import together

    started = time.monotonic()
    found = together(*[(lambda g=g: g[0].validate(g[1], g[2])) for g in gated])
    checked = [(outcomes, gate.suite) for outcomes, (gate, _, _) in zip(found, gated)]
    run = GateRun([o for outcomes, _ in checked for o in outcomes], int((time.monotonic() - started) * 1000),
                  lambda: write_results(spark, path, checked, query, batch_id, app_id, metadata, replay))
    for outcomes, suite in checked:
        if failures(outcomes):
            run.record()
            raise_on_failures(outcomes, query, batch_id, suite.table)
    return run
