"""What a run would trip on, found before any query starts: every problem, not the first.

Each function returns problems as text naming the file and key, the table or the checkpoint.
`lakehouse check` (pipeline/check.py) runs them all; a run runs the ones that would otherwise
fail later in it (its preflight, in pipeline/runner.py, and the checkpoints' state here).
"""
from __future__ import annotations

from pathlib import Path

from common.errors import JobError
from common.flow import Layer

# A stateful flow's operators, by Spark's name for them (state-metadata's operatorName).
DEDUP_OPERATOR = "dedupeWithinWatermark"
SESSIONS_OPERATOR = "applyInPandasWithState"


def raise_any(problems: list[str]) -> None:
    """The problems as one JobError (exit 2), one line each."""
    if len(problems) == 1:
        raise JobError(problems[0])
    if problems:
        raise JobError(f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))


def validate_problems(layers: list[Layer]) -> list[str]:
    """Each layer's validate (its GX suites, with Great Expectations)."""
    problems = []
    for layer in layers:
        try:
            layer.validate()
        except JobError as e:
            problems.append(str(e))
    return problems


def storage_problems(cfg) -> list[str]:
    """The object store, when a root is on one: reachable, with credentials it accepts."""
    from common.storage import ObjectPath

    problems = []
    for name, root in (("paths.lakehouse_root", cfg.root), ("paths.checkpoint_root", cfg.checkpoint_root)):
        if name != "paths.lakehouse_root" and str(root).startswith(f"{cfg.root}/"):
            continue                 # under the lakehouse root: the same store, asked already
        if isinstance(root, ObjectPath):
            try:
                root.exists()
            except JobError as e:
                problems.append(f"{cfg.source}: key '{name}': {e}")
    return problems


def lock_problems(cfg, layers: list[Layer]) -> list[str]:
    """Checkpoints another process holds (taken and released at once: the run takes its own)."""
    from common.checkpoint_lock import CheckpointBusy, CheckpointLocks

    problems = []
    for flow in (f for layer in layers for f in layer.flows):
        try:
            with CheckpointLocks(cfg, [flow.name]):
                pass
        except CheckpointBusy as e:
            problems.append(str(e))
    return problems


def expected_tables(spark, cfg, layers: list[Layer]) -> dict[str, object]:
    """layer.table -> the schema the selected layers write it with."""
    from common.schemas import BRONZE_EVENTS
    from gold.tables import for_config
    from silver.job import output_schemas

    silver, quarantine = output_schemas(spark, cfg.profile)
    names = {layer.name for layer in layers}
    tables = {}
    if "bronze" in names:
        tables["bronze.events"] = BRONZE_EVENTS
    if "silver" in names:
        tables.update({f"silver.{cfg.silver_table}": silver, "silver.quarantine": quarantine})
    if "gold" in names:
        tables.update({f"gold.{t.table}": t.output_schema(spark, silver) for t in for_config(cfg)})
    return tables


def _types(schema) -> dict[str, str]:
    return {f.name.lower(): f.dataType.simpleString() for f in schema.fields}


def table_problems(spark, cfg, expected: dict) -> list[str]:
    """Existing tables against the schema the run writes: a column of another type, or a
    non-nullable column the table lacks, fails the run's first write (a missing nullable one is
    added at start)."""
    from common.storage import is_delta_table

    problems = []
    for name, schema in expected.items():
        path = cfg.table_path(*name.split("."))
        if not is_delta_table(path):
            continue
        have = _types(spark.read.format("delta").load(path).schema)
        for f in schema.fields:
            now = have.get(f.name.lower())
            if now is not None and now != f.dataType.simpleString():
                problems.append(f"table {name} ({path}): column {f.name} is {now}, the pipeline writes "
                                f"{f.dataType.simpleString()}")
            elif now is None and not f.nullable:
                problems.append(f"table {name} ({path}): lacks the non-nullable column {f.name}")
    return problems


def _columns_named(kwargs: dict) -> list[tuple[str, str]]:
    """(kwargs key, column) of each column an expectation names."""
    named = [(k, kwargs[k]) for k in ("column", "column_A", "column_B") if isinstance(kwargs.get(k), str)]
    return named + [(f"column_list[{i}]", c) for i, c in enumerate(kwargs.get("column_list") or ())
                    if isinstance(c, str)]


def gated(spark, cfg, expected: dict) -> dict:
    """layer.table -> the columns its suite sees: silver's the table's, gold's the table's and
    the derived ones its gate adds (gold.transform.quality_view)."""
    from gold.transform import quality_view

    return {name: quality_view(spark.createDataFrame([], schema), cfg.profile.dimension).schema
            if name.startswith("gold.") else schema for name, schema in expected.items()}


def suite_problems(cfg, layers: list[Layer], expected: dict) -> list[str]:
    """Every column a suite's expectation names exists in what the suite gates (`gated`)."""
    from common.quality import load_suites
    from common.spec import read_yaml

    files = {"silver": cfg.silver.expectations, "gold": cfg.gold.expectations}
    problems = []
    for layer in layers:
        path = files.get(layer.name)
        if path is None:
            continue
        try:
            suites = load_suites(path, gx=False)
            multi = "tables" in (read_yaml(Path(path), JobError) or {})
        except JobError:
            continue                 # validate_problems reports the file itself
        for table, suite in suites.items():
            if table not in expected:
                continue
            have = _types(expected[table])
            for i, rule in enumerate(suite.rules):
                key = f"tables.{table}[{i}]" if multi else f"expectations[{i}]"
                for arg, column in _columns_named(rule.kwargs):
                    if column.lower() not in have:
                        problems.append(f"{path}: key '{key}.kwargs.{arg}': {rule.name} names column "
                                        f"{column!r}, which {table} does not have")
    return problems


def gold_tables(cfg, flow) -> list:
    """The gold tables a gold flow writes: the profile's all for `gold`, a selection's for
    `gold_<key>_<key>` (gold.tables.query_name)."""
    from gold.tables import for_config

    if flow.layer != "gold":
        return []
    keys = set(flow.name.split("_")[1:])
    return [t for t in for_config(cfg) if not keys or t.key in keys]


def constraint_lines(cfg, flow) -> list[str]:
    """A gold flow's tables' constraints, each with the rule of its gate that checks it: a rule
    of the suite that covers it, or the one derived from it (gold.constraints.listing)."""
    from common.quality import load_suites
    from gold.constraints import listing

    tables = gold_tables(cfg, flow)
    if not tables:
        return []
    try:
        return listing(tables, load_suites(cfg.gold.expectations, gx=False))
    except JobError as e:           # the suite file's own problem, which validate reports
        return [f"(not listed: {e})"]


def stateful_table(cfg, flow):
    """The stateful gold table the flow writes, if any."""
    return next((t for t in gold_tables(cfg, flow) if t.stateful), None)


def operators(cfg, flow) -> list[str]:
    """The stateful operators the flow's query runs, by Spark's name for them."""
    if flow.layer == "silver" and cfg.profile.dedup:
        return [DEDUP_OPERATOR]
    return [SESSIONS_OPERATOR] if stateful_table(cfg, flow) is not None else []


def expected_state(spark, cfg, flow) -> dict[str, tuple[str, str]]:
    """Operator name -> (key, value) schema of the state the flow's query keeps."""
    from gold.sessions import state_schema
    from silver.job import output_schemas
    from silver.transform import DEDUP_STATE

    shapes = {}
    for name in operators(cfg, flow):
        shapes[name] = (DEDUP_STATE if name == DEDUP_OPERATOR else
                        state_schema(stateful_table(cfg, flow).spec, output_schemas(spark, cfg.profile)[0]))
    return shapes


def _shape(ddl_or_struct) -> list[tuple[str, str]]:
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = ddl_or_struct if isinstance(ddl_or_struct, StructType) else _parse_datatype_string(ddl_or_struct)
    return [(f.name.lower(), f.dataType.simpleString()) for f in struct.fields]


def state_problems(spark, cfg, layers: list[Layer]) -> list[str]:
    """Each flow's checkpoint against the flow: the stateful operators it holds state for and
    the shape of that state. Spark refuses a changed state schema only once the query runs
    (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE and its kin, or a wrong answer for a new operator):
    this names the checkpoint and what changed before anything starts."""
    from common import state

    problems = []
    for flow in (f for layer in layers for f in layer.flows):
        checkpoint = cfg.checkpoint(flow.name)
        held = {op.name: op for op in state.operators(spark, checkpoint)}
        if not held:
            continue
        wanted = expected_state(spark, cfg, flow)
        fix = f"start it from a new checkpoint (move {checkpoint} away) and rebuild what it writes"
        for name in sorted(set(held) - set(wanted)):
            problems.append(f"checkpoint {checkpoint}: holds the state of a {name} operator that query "
                            f"{flow.name} no longer has: {fix}")
        for name in sorted(set(wanted) - set(held)):
            problems.append(f"checkpoint {checkpoint}: query {flow.name} now has a {name} operator that "
                            f"its checkpoint holds no state for: {fix}")
        for name in sorted(set(wanted) & set(held)):
            schema = state.rows(spark, checkpoint, held[name]).schema
            for part, want in zip(("key", "value"), wanted[name]):
                have = _shape(schema[part].dataType)
                if have != _shape(want):
                    problems.append(
                        f"checkpoint {checkpoint}: the {name} state's {part} is "
                        f"({', '.join(f'{n} {t}' for n, t in have)}), query {flow.name} now keeps "
                        f"({', '.join(f'{n} {t}' for n, t in _shape(want))}): {fix}")
    return problems
