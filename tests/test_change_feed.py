"""Delta's change data feed on silver and gold: `lakehouse changes` prints it, and the streaming
consumer docs/change-feed.md shows, run as written, rebuilds every gold table exactly from
version 0 through appends and MERGEs."""
from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """Two available-now runs of the whole pipeline, the second over more events of the same
    devices and hours: gold's first write is an append, the second run's a MERGE."""
    from pipeline.cli import main

    root = tmp_path_factory.mktemp("change-feed")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER", "PROFILE")
           and not k.startswith("LAKEHOUSE__")}
    env.update(LAKEHOUSE_ROOT=str(root / "lakehouse"), TRIGGER="available-now")
    for seed in (3, 4):
        gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "600", "--seed", str(seed),
                              "--files", "2"], cwd=REPO, env=env, capture_output=True, text=True)
        assert gen.returncode == 0, gen.stderr
        assert main([], spark=spark, env=env) == 0
    cfg = load_config(env=env)
    yield cfg, env, root
    for layer, tables in cfg.tables.items():
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{table}")


def changes(env, *argv) -> tuple[int, str, str]:
    from audit.changes import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _environ(env):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _environ(env):
    import os

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_silver_and_gold_tables_record_the_change_feed(spark, lake):
    from common.delta import table_properties

    cfg, _, _ = lake
    for layer in ("silver", "gold"):
        for table in cfg.tables[layer]:
            if table == "device_locations":
                continue
            props = table_properties(spark, cfg.table_path(layer, table))
            assert props.get("delta.enableChangeDataFeed") == "true", f"{layer}.{table}"


def test_lakehouse_changes_prints_inserts_updates_and_deletes(lake):
    cfg, env, _ = lake
    code, out, err = changes(env, "gold.zip_hourly_sightings", "--from", "0", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    kinds = {r["_change_type"] for r in rows}
    assert {"insert", "update_preimage", "update_postimage"} <= kinds, kinds
    assert [r["_commit_version"] for r in rows] == sorted(r["_commit_version"] for r in rows)
    # Commit times carry their zone like the table's own timestamps (delta-rs gives them none).
    assert all(r["_commit_timestamp"].endswith("+00:00") and r["window_start"].endswith("+00:00") for r in rows)
    code, out, _ = changes(env, "gold.zip_hourly_sightings", "--from", "1", "--to", "1")
    assert code == 0 and re.search(r"\d+ insert, \d+ update_preimage, \d+ update_postimage, \d+ delete", out)
    code, _, err = changes(env, "gold.zip_hourly_sightings", "--from", "999")
    assert code == 2 and "has versions 0 to" in err
    code, _, err = changes(env, "gold.nope", "--from", "0")
    assert code == 2 and "unknown table" in err


def test_the_documented_consumer_rebuilds_every_gold_table_exactly(spark, lake):
    from audit.changes import mirror_differences

    cfg, _, root = lake
    for table in cfg.tables["gold"]:
        assert spark.read.format("delta").load(cfg.table_path("gold", table)).count() > 0, table
    assert mirror_differences(spark, cfg, str(root / "mirror")) == {t: 0 for t in cfg.tables["gold"]}
