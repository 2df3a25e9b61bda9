"""make dq-docs: the quality gate's recorded results (ops.dq_results) as Great Expectations Data
Docs, under paths.reports (default ./reports/dq-docs/index.html).

    python -m tools.dq_docs [--last N] [--layer silver|gold] [--suite NAME] [--out DIR]

Off the batch path: the gate only appends each expectation's GX result (result_json) to the
row it already writes; this command rebuilds one GX validation result per gated micro-batch
from those rows, adds the suites (from conf, or as recorded when conf no longer has them) to an
ephemeral GX context and lets GX's site builder render them. A validation page lists the
batch's expectations with their outcome; its "Show more info" names each rule's policy (warn /
quarantine / fail), as the suite page's notes do. The pages load their CSS and scripts from public CDNs when opened, as GX's
own Data Docs do; building them touches no network.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from common.config import load_config
from common.errors import JobError, LakehouseError, command
from common.storage import is_delta_table, parse, walk_files, write_atomic

# Imported for its side effect first: it turns GX's usage statistics off before GX loads.
import common.quality  # noqa: E402,F401

SITE = "dq_docs"
DEFAULT_LAST = 20
NO_RESULTS = "no recorded quality results in {path}: run the pipeline first (make run-all)"


class NoResults(JobError):
    """ops.dq_results is missing, empty, or holds nothing the filters select."""


class RenderError(LakehouseError, RuntimeError):
    """Great Expectations could not render a page (it prints why and carries on)."""


@dataclass(frozen=True)
class Run:
    """One gated micro-batch as recorded: the rows one write_results call appended."""
    query: str
    batch_id: int
    table: str
    suite: str
    evaluated_us: int
    rows: tuple

    @property
    def gx_suite(self) -> str:
        return gx_suite_name(self.suite, self.table)

    @property
    def run_time(self) -> datetime:
        return datetime.fromtimestamp(self.evaluated_us / 1e6, tz=timezone.utc)


def gx_suite_name(suite: str, table: str) -> str:
    # A suite file may gate several tables: one GX suite per (suite, table), as the gate runs it.
    return f"{suite}.{table}"


def recorded_runs(spark, cfg, last: int | None = DEFAULT_LAST, layer: str | None = None,
                  suite: str | None = None) -> list[Run]:
    """The recorded gate runs, oldest first: the last `last` batches of each query (None: all)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    path = cfg.table_path("ops", "dq_results")
    if not is_delta_table(path):
        raise NoResults(NO_RESULTS.format(path=path))
    df = spark.read.format("delta").load(path)
    if "result_json" not in df.columns:     # a table no job has started on since the column came
        df = df.withColumn("result_json", F.lit(None).cast("string"))
    if layer:
        df = df.where(F.col("table_name").startswith(f"{layer}."))
    if suite:
        df = df.where(F.col("suite") == suite)
    if last:
        batches = (df.select("query", "batch_id").distinct()
                   .withColumn("rank", F.dense_rank().over(Window.partitionBy("query").orderBy(F.desc("batch_id"))))
                   .where(F.col("rank") <= last).drop("rank"))
        df = df.join(batches, ["query", "batch_id"])
    rows = (df.select("query", "batch_id", "table_name", "suite", "expectation", "expectation_type", "policy",
                      "success", "element_count", "unexpected_count", "observed_value", "result_json",
                      F.unix_micros("evaluated_at").alias("evaluated_us"))
            .orderBy("evaluated_us", "query", "batch_id").collect())
    if not rows:
        if layer or suite:
            raise NoResults(f"no recorded quality results in {path} match "
                            + " and ".join(f"--{k} {v}" for k, v in (("layer", layer), ("suite", suite)) if v))
        raise NoResults(NO_RESULTS.format(path=path))
    runs: dict[tuple, list] = {}
    for r in rows:
        runs.setdefault((r.query, r.batch_id, r.table_name, r.suite, r.evaluated_us), []).append(r)
    return [Run(*key, rows=tuple(rs)) for key, rs in runs.items()]


def conf_suites(cfg) -> dict[tuple[str, str], object]:
    """The suites conf declares now, by (suite name, table): common.quality.Suite."""
    from common.quality import SuiteError, load_suites

    out = {}
    for path in {str(cfg.silver.expectations), str(cfg.gold.expectations)}:
        try:
            out.update({(s.name, s.table): s for s in load_suites(path).values()})
        except SuiteError as e:   # the recorded configurations still render
            print(f"warning: {e}; using the recorded expectations", file=sys.stderr)
    return out


def expectation_result(row, rule):
    """The GX ExpectationValidationResult of one dq_results row: its result_json, or for a row
    recorded before that column existed, one made from its columns and the conf rule of that
    name (None if conf no longer has it). Counts the gate implied from a pass (it skips GX's
    counting pass for those) are filled in so the page shows them."""
    from great_expectations.core import ExpectationValidationResult
    from great_expectations.core.expectation_validation_result import expectationValidationResultSchema

    if row.result_json:
        evr = expectationValidationResultSchema.load(json.loads(row.result_json))
    elif rule is not None and rule.expectation == row.expectation_type:
        evr = ExpectationValidationResult(success=row.success, expectation_config=rule.gx().configuration,
                                          result={})
    else:
        return None
    result = dict(evr.result or {})
    if "element_count" not in result and row.element_count is not None and row.unexpected_count is not None:
        result.update(element_count=row.element_count, unexpected_count=row.unexpected_count,
                      unexpected_percent=100.0 * row.unexpected_count / row.element_count
                      if row.element_count else 0.0)
    if "observed_value" not in result and row.observed_value is not None:
        result["observed_value"] = json.loads(row.observed_value)
    evr.result = result
    return evr


def validation_result(run: Run, evrs: list):
    """The GX ExpectationSuiteValidationResult of one run, as GX's validator would have made it."""
    import great_expectations as gx
    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier

    run_id = RunIdentifier(run_name=f"{run.query}-batch-{run.batch_id}", run_time=run.run_time)
    passed = sum(1 for e in evrs if e.success)
    return ExpectationSuiteValidationResult(
        success=passed == len(evrs), results=evrs, suite_name=run.gx_suite,
        statistics={"evaluated_expectations": len(evrs), "successful_expectations": passed,
                    "unsuccessful_expectations": len(evrs) - passed,
                    "success_percent": 100.0 * passed / len(evrs) if evrs else None},
        meta={"great_expectations_version": gx.__version__, "run_id": run_id,
              "validation_time": run.run_time.isoformat(),
              # The page's "Data asset" and its info table come from the batch spec. (GX's own
              # per-expectation columns, "meta properties", fail to render in 1.24.)
              "batch_spec": {"data_asset_name": run.table, "query": run.query, "batch_id": run.batch_id,
                             "policy": {row.expectation: row.policy for row in run.rows}}})


def gx_suite(name: str, declared, recorded: list, derived: dict | None = None):
    """The GX ExpectationSuite page: conf's rules when conf still declares the suite, plus the
    rules its gate ran that the file does not hold (a gold table's constraints no rule of the
    suite covers: the gate derives a rule from each, gold/constraints.py), as last recorded;
    else the expectations as last recorded. `recorded`: (dq_results row, GX result) pairs;
    `derived`: the constraints by their derived rule's name (pipeline/dq_docs.py), which the note
    of such a rule names, with the column of the gate's view it checks, if it checks one."""
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=name)
    declared_rules = declared.rules if declared is not None else ()
    for rule in declared_rules:
        config = rule.gx().configuration
        config.notes = f"rule `{rule.name}`, policy **{rule.policy}**"     # the page's note icon
        suite.add_expectation_configuration(config)
    known = {rule.name for rule in declared_rules}
    for row, evr in recorded:
        if declared is None or row.expectation not in known:
            config = evr.expectation_config
            if declared is not None:
                config.notes = (f"rule `{row.expectation}`, policy **{row.policy}**, not in the suite file (as run)"
                                + _derived_note((derived or {}).get(row.expectation), config))
            suite.add_expectation_configuration(config)
    return suite


def _derived_note(check, config) -> str:
    """What a suite page notes of a rule derived from a table constraint (`check`, None: not
    one): the constraint, and the gate's view column the rule as recorded (`config`) checks."""
    if check is None:
        return ""
    note = f": derived from the table constraint `{check.name}`, {check.sql}"
    if config.kwargs.get("column") == check.name:
        note += f"; column `{check.name}` of the gate's view is its value (NULL: false)"
    return note


def build_docs(runs: list[Run], suites: dict, site_dir: Path, derived: dict | None = None) -> dict:
    """Render the runs as a GX Data Docs site in site_dir; returns counts of what it holds.
    `derived`: what the notes of gold's derived constraint rules name (pipeline/dq_docs.py)."""
    import great_expectations as gx
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier, ValidationResultIdentifier)

    context = gx.get_context(mode="ephemeral")
    context.config.analytics_enabled = False
    context.variables.data_docs_sites = {SITE: {
        "class_name": "SiteBuilder", "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site_dir)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}}
    latest: dict[str, tuple] = {}     # GX suite name -> (suite, table, its last run's results)
    skipped = 0
    results = []
    for run in runs:
        declared = suites.get((run.suite, run.table))
        rules = {rule.name: rule for rule in declared.rules} if declared else {}
        pairs = [(row, evr) for row, evr in ((row, expectation_result(row, rules.get(row.expectation)))
                                             for row in run.rows) if evr]
        skipped += len(run.rows) - len(pairs)
        if pairs:
            latest[run.gx_suite] = (run.suite, run.table, pairs)
            results.append((run, validation_result(run, [evr for _, evr in pairs])))
    for name, (suite, table, pairs) in latest.items():
        context.suites.add(gx_suite(name, suites.get((suite, table)), pairs, derived))
    store = context.validation_results_store
    for run, result in results:
        store.set(ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(run.gx_suite),
                                             run_id=result.meta["run_id"],
                                             batch_identifier=f"{run.query}-batch-{run.batch_id}"), result)
    context.build_data_docs(site_names=[SITE])
    # GX prints a page's rendering error and carries on: a page missing is an error here.
    pages = sum(1 for _ in (site_dir / "validations").rglob("*.html")) if (site_dir / "validations").is_dir() else 0
    if pages < len(results):
        raise RenderError(f"Great Expectations rendered {pages} of {len(results)} validation pages; "
                           f"its messages above say why")
    return {"validations": len(results), "suites": len(latest), "skipped_rows": skipped}


def publish(site: Path, target) -> None:
    """Put the built site at target, replacing the previous one whole (no stale pages)."""
    if isinstance(target, Path):
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        site.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        return
    fresh = set()
    for rel, _ in walk_files(site):
        fresh.add(rel)
        write_atomic(target / rel, (site / rel).read_bytes())
    for rel, _ in list(walk_files(target)):
        if rel not in fresh:
            (target / rel).unlink(missing_ok=True)


@command
def main(argv=None, prog: str = "python -m tools.dq_docs", *, spark=None, cfg=None, derived=None) -> int:
    """`derived`: the gold constraints by their derived rule's name (pipeline/dq_docs.py), which
    the suite pages note; without it those rules are listed as run, unexplained."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--last", type=int, default=DEFAULT_LAST, metavar="N",
                        help=f"the last N batches of each query (default {DEFAULT_LAST}; 0: all)")
    parser.add_argument("--layer", choices=("silver", "gold"), help="only the gates in front of this layer")
    parser.add_argument("--suite", help="only this suite (its name in conf/expectations, e.g. gold)")
    parser.add_argument("--out", help="output folder (default: <paths.reports>/dq-docs)")
    args = parser.parse_args(argv)
    if args.last < 0:
        parser.error("--last must be 0 (all) or more")
    cfg = cfg or load_config()
    target = parse(args.out or str(cfg.paths.reports), store=cfg.store)
    target = target if args.out else target / "dq-docs"
    from common.spark import session

    try:
        with session(cfg, "dq-docs", spark) as spark:     # stopped before GX: the rest is GX alone
            runs = recorded_runs(spark, cfg, args.last or None, args.layer, args.suite)
    except NoResults as e:
        print(str(e), file=sys.stderr)
        return 1
    # Built beside the target (same file system: the swap is a rename), or locally for s3a://.
    staging_root = target.parent if isinstance(target, Path) else None
    if staging_root is not None:
        staging_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".dq-docs-", dir=staging_root) as tmp:
        site = Path(tmp) / "site"
        try:
            counts = build_docs(runs, conf_suites(cfg), site, derived)
        except RenderError as e:     # the previous site stays as it was
            print(f"error: {e}", file=sys.stderr)
            return 1
        publish(site, target)
    if counts["skipped_rows"]:
        print(f"note: {counts['skipped_rows']} result(s) recorded before result_json existed name a rule "
              f"conf no longer declares; left out", file=sys.stderr)
    print(f"{counts['validations']} validation result(s) of {counts['suites']} suite(s)")
    print(f"wrote {target / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
