"""make dq-docs: the silver gate's recorded results (ops.dq_results, written by the real silver
query from corpus files) rendered as Great Expectations Data Docs, without network access."""
from __future__ import annotations

import re
import socket
import sys
from html import unescape
from pathlib import Path

import pytest

from tools import dq_docs
from common.delta import ensure_table
from common.quality import Outcome, dq_rows, load_suites
from common.schemas import DQ_RESULTS

sys.path.insert(0, str(Path(__file__).parent))
from test_silver_job import append_bronze, isolated_config, run_silver, write_locations  # noqa: E402

CORPUS = Path(__file__).parent / "corpus"
SUITE = "silver_camera_events.silver.camera_events"     # GX suite: conf suite name + table


def lines(*names: str) -> list[str]:
    return [line for n in names for line in (CORPUS / f"{n}.jsonl").read_text().splitlines()]


def text(page: Path) -> str:
    """A page's visible text, one space between words."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def stat(page_text: str, name: str) -> int:
    return int(re.search(rf"{name} (\d+)", page_text).group(1))


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """Two silver batches: corpus records that break three quarantine rules and the warn rule,
    then one clean record."""
    cfg = isolated_config(tmp_path_factory.mktemp("dq-docs"))
    write_locations(cfg.locations_csv)
    append_bronze(spark, cfg, lines("valid_record", "long_device_id", "end_before_start", "unknown_device"))
    first = run_silver(spark, cfg)
    append_bronze(spark, cfg, lines("timestamp_offset"))
    second = run_silver(spark, cfg)
    yield cfg, first, second
    for layer, tables in cfg.tables.items():
        for name in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{name}")


def build(spark, cfg, out: Path, *args: str) -> int:
    return dq_docs.main(["--out", str(out), *args], spark=spark, cfg=cfg)


def test_data_docs_name_the_suite_and_show_each_expectations_outcome(spark, lake, tmp_path, monkeypatch, capsys):
    cfg, _, _ = lake
    connect = socket.socket.connect

    def local_only(sock, address):            # GX must not phone home while it builds
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access during the docs build: {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    out = tmp_path / "dq-docs"
    assert build(spark, cfg, out) == 0
    assert f"wrote {out / 'index.html'}" in capsys.readouterr().out

    index = (out / "index.html").read_text()
    pages = sorted((out / "validations").rglob("*.html"))
    assert len(pages) == 2                                    # one per gated batch
    for page in pages:                                        # the index links every validation
        assert str(page.relative_to(out)) in index
    assert (out / "expectations" / "silver_camera_events" / "silver" / "camera_events.html").exists()

    bad, clean = sorted(pages, key=lambda p: "batch-0" not in str(p))
    bad_text, clean_text = text(bad), text(clean)
    for t in (bad_text, clean_text):
        assert f"Expectation Suite: {SUITE}" in t and "Data asset: silver.camera_events" in t
        assert stat(t, "Evaluated Expectations") == 5
    # Batch 0: three quarantine rules and the warn rule failed, each shown with its sample.
    assert "Status: Failed" in bad_text
    assert stat(bad_text, "Unsuccessful Expectations") == 4
    # GX's failed icon: once for the page's status, once for each failed expectation.
    assert bad.read_text().count("fa-times text-danger") == 1 + 4
    assert clean.read_text().count("fa-times text-danger") == 0
    assert "values must match this regular expression" in bad_text
    assert "cam-99999999" in bad_text                             # the long device id, as sampled
    assert "device_id_well_formed quarantine" in bad_text and "event_id_present fail" in bad_text
    # Batch 1: every expectation passed, with the counts the gate implied from the pass.
    assert "Status: Succeeded" in clean_text and stat(clean_text, "Unsuccessful Expectations") == 0
    assert "0% unexpected" in clean_text


def test_last_layer_and_suite_select_what_is_rendered(spark, lake, tmp_path, capsys):
    cfg, _, second = lake
    out = tmp_path / "docs"
    assert build(spark, cfg, out, "--last", "1") == 0
    pages = list((out / "validations").rglob("*.html"))
    assert len(pages) == 1 and "batch-0" not in str(pages[0])
    assert build(spark, cfg, out, "--layer", "silver", "--suite", "silver_camera_events") == 0
    assert len(list((out / "validations").rglob("*.html"))) == 2   # rebuilt whole: no stale page
    capsys.readouterr()
    assert build(spark, cfg, out, "--layer", "gold") == 1
    assert "match --layer gold" in capsys.readouterr().err


def test_no_recorded_results_says_to_run_the_pipeline_first(spark, cfg, tmp_path, capsys):
    assert build(spark, cfg, tmp_path / "docs") == 1
    assert "run the pipeline first" in capsys.readouterr().err
    assert not (tmp_path / "docs").exists()


def test_a_table_from_before_result_json_gains_it_at_start_and_its_rows_still_render(spark, cfg, tmp_path, capsys):
    from pyspark.sql.types import StructType

    old = StructType([f for f in DQ_RESULTS.fields if f.name != "result_json"])
    path = ensure_table(spark, cfg, "ops", "dq_results", old)
    suite = load_suites(cfg.silver.expectations)["silver.camera_events"]
    outcomes = [Outcome(rule, rule.name != "device_id_well_formed", 10, 0 if rule.name != "device_id_well_formed" else 2,
                        None) for rule in suite.rules]
    rows = [r[:-1] for r in dq_rows(outcomes, "silver", 3, suite.table, suite.name)]
    rows.append(rows[0][:4] + ("a_rule_conf_dropped",) + rows[0][5:])
    spark.createDataFrame(rows, old).write.format("delta").mode("append").save(path)

    ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS)          # what a job's start does
    table = spark.read.format("delta").load(path)
    assert table.columns == DQ_RESULTS.fieldNames()
    assert table.where("result_json IS NOT NULL").count() == 0

    out = tmp_path / "docs"
    assert build(spark, cfg, out) == 0
    assert "1 result(s) recorded before result_json existed" in capsys.readouterr().err
    [page] = (out / "validations").rglob("*.html")
    t = text(page)
    assert stat(t, "Evaluated Expectations") == 5 and stat(t, "Unsuccessful Expectations") == 1
    assert "20% unexpected" in t                      # 2 of 10, from the row's own counts

    # A page GX cannot render (it prints why and carries on) fails the build; the site stays.
    unrenderable = ('{"success":true,"expectation_config":{"type":"expect_column_values_to_not_be_null",'
                    '"kwargs":{"column":"event_id","no_such_kwarg":1}},"result":{}}')
    spark.createDataFrame([rows[0][:1] + (4,) + rows[0][2:] + (unrenderable,)], DQ_RESULTS) \
        .write.format("delta").mode("append").save(path)
    assert build(spark, cfg, out) == 1
    assert "rendered 1 of 2 validation pages" in capsys.readouterr().err
    assert list((out / "validations").rglob("*.html")) == [page]


def test_a_gold_suite_page_lists_the_rules_its_gate_derived_from_the_tables_constraints():
    """The suite page holds the file's rules and, as recorded, the rules the gate ran that the
    file does not hold (gold's `constraint:<name>` rules), each noted with its constraint; an
    `after` rule as it runs, on the column of the gate's view that holds the CHECK's value."""
    from great_expectations.core import ExpectationValidationResult
    from pyspark.sql import Row

    from common.config import load_config
    from gold.constraints import gate_suites
    from pipeline.dq_docs import constraint_checks
    from gold.tables import for_config

    cfg = load_config(env={})
    derived = constraint_checks(cfg)
    for table in ("gold.device_sessions", "gold.zip_hourly_sightings"):
        declared = load_suites(cfg.gold.expectations)[table]
        gate = gate_suites(for_config(cfg), {table: declared})[table]
        recorded = [(Row(expectation=rule.name, policy=rule.policy),
                     ExpectationValidationResult(success=True, expectation_config=rule.gx().configuration, result={}))
                    for rule in gate.rules]
        page = dq_docs.gx_suite(f"gold.{table}", declared, recorded, derived)
        assert len(page.expectations) == len(gate.rules) > len(declared.rules)
        notes = [e.notes for e in page.expectations]
        assert notes[:len(declared.rules)] == [f"rule `{r.name}`, policy **{r.policy}**" for r in declared.rules]
        assert all(note.startswith(f"rule `{r.name}`, policy **fail**, not in the suite file (as run): derived "
                                   f"from the table constraint `{r.name.removeprefix('constraint:')}`, ")
                   for r, note in zip(gate.rules[len(declared.rules):], notes[len(declared.rules):])), notes
    ends = next(e for e in page.expectations if "window_end_after_window_start" in e.notes)
    assert (ends.expectation_type, ends.column, ends.value_set) == (
        "expect_column_values_to_be_in_set", "window_end_after_window_start", [True])
    assert ends.notes.endswith(": derived from the table constraint `window_end_after_window_start`, "
                               "`window_end` > `window_start`; column `window_end_after_window_start` of the "
                               "gate's view is its value (NULL: false)")
    nulls = next(e for e in page.expectations if "constraint:window_start_not_null" in e.notes)
    assert nulls.notes.endswith("`window_start_not_null`, `window_start` IS NOT NULL")
