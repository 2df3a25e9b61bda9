"""lakehouse check: a dry run. Everything a run would touch, checked without starting a query.

    lakehouse check [all|bronze|silver|gold] [--source files|kafka] [--only KEYS] [--trigger ...]

The config and its profile, each layer's GX suites (and the columns their expectations name,
against the tables they gate; gold's with the rules derived from its tables' constraints), the sources (landing folder, Kafka broker), the object store,
the tables that exist against the schemas the run writes, each checkpoint against the flow that
owns it (its stateful operators and the shape of their state; which query wrote each gold
table) and the checkpoint locks. Every problem is listed, each naming the file and key, the
table or the checkpoint; the exit code is 2 if there is any. A run makes the same checks before
its queries start (`lakehouse run`). When all is well it lists each gold table's constraints
with the rule of its gate that checks each.
"""
from __future__ import annotations

import argparse
import sys

from common.errors import JobError, command
from common.flow import ORDER

LAYER_CHOICES = ("all", *ORDER)


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("layer", nargs="?", choices=LAYER_CHOICES, default="all",
                   help="the layers a run would run (default: all)")
    p.add_argument("--source", choices=["files", "kafka"], help="bronze's source (default: conf bronze.source)")
    p.add_argument("--only", help="comma-separated subset of the profile's gold tables, by key")
    p.add_argument("--trigger", choices=["available-now", "processing-time"], help="as `lakehouse run`")
    p.add_argument("--interval", help="as `lakehouse run`")
    return p


def declared(cfg, names, only) -> tuple[list, list[str]]:
    """The layers that declare without error, and the errors of the others."""
    from pipeline.runner import declare

    layers, problems = [], []
    for name in names:
        try:
            layers += declare(cfg, [name], {"gold": {"only": only}})
        except JobError as e:
            problems.append(str(e))
    return layers, problems


def find_problems(cfg, layers, spark=None, names=None) -> list[str]:
    """Every check, in the order a run meets them; Spark is started only for the checks needing
    it (schemas, checkpoints), and only once the config has loaded. `names`: the layers the run
    would run, also those that failed to declare (their problem is said already: a layer reading
    one of them needs no "run it first")."""
    from common.spark import session
    from pipeline import checks
    from pipeline.runner import preflight_problems

    unreachable = checks.storage_problems(cfg)
    if unreachable:
        return unreachable + checks.validate_problems(layers)    # no table, checkpoint or lock can be read
    from pipeline import root_owner

    wrong_root = root_owner.problem(cfg)
    if wrong_root:        # every table and checkpoint there is another feed's: nothing else to say
        return [wrong_root]
    problems = (preflight_problems(layers, names) + checks.validate_problems(layers)
                + checks.lock_problems(cfg, layers))
    with session(cfg, "check", spark) as spark:
        expected = checks.expected_tables(spark, cfg, layers)
        problems += checks.suite_problems(cfg, layers, checks.gated(spark, cfg, expected))
        problems += checks.table_problems(spark, cfg, expected)
        problems += checks.state_problems(spark, cfg, layers)
        problems += owner_problems(spark, cfg, layers)
    return problems


def owner_problems(spark, cfg, layers) -> list[str]:
    """Each gold table written by the checkpoint of the query that would write it now. Tables
    last written with other logic than today's profile are warned of, as a run's start does."""
    from gold.owner import check_owner
    from pipeline.checks import gold_tables
    from silver.logic import other_logic

    if any(layer.name == "silver" for layer in layers):
        other_logic(spark, cfg)
    problems = []
    for flow in (f for layer in layers if layer.name == "gold" for f in layer.flows):
        try:
            check_owner(spark, cfg, flow.name, gold_tables(cfg, flow))
        except JobError as e:
            problems.append(str(e))
    return problems


@command
def main(argv=None, *, spark=None, env=None, prog: str = "pipeline.check") -> int:
    from common.config import load_config
    from common.log import configure
    from pipeline.cli import only_keys, overrides

    args = parser(prog).parse_args(argv)
    configure()          # the warnings a run's start gives (other logic) read as a run's do
    names = ORDER if args.layer == "all" else (args.layer,)
    only = only_keys(args)
    try:
        cfg = load_config(env=env, overrides=overrides(args))
    except JobError as e:               # nothing else can be checked without the config
        problems = [str(e)]
    else:
        layers, problems = declared(cfg, names, only)
        problems += find_problems(cfg, layers, spark, names)
    if problems:
        print(f"check: {len(problems)} problem{'s' if len(problems) > 1 else ''}")
        for p in problems:
            print(f"  - {p}")
        return 2
    flows = [f.name for layer in layers for f in layer.flows]
    print(f"check: OK ({', '.join(layer.name for layer in layers)}: queries {', '.join(flows)})")
    from pipeline.checks import constraint_lines

    for flow in (f for layer in layers if layer.name == "gold" for f in layer.flows):
        print(f"{flow.name}: table constraints, each checked by the gate (a suite rule covering it, "
              "or one derived from it), then by Delta")
        for line in constraint_lines(cfg, flow):
            print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
