"""The quality gate asks GX for no more than each rule's outcome needs, in one validation for a
clean batch, and still gives GX's own verdicts, counts and row ids."""
from datetime import datetime, timedelta

import pytest
import yaml

import common.quality as Q

T0 = datetime(2026, 11, 1, 10, 0, 0)
RULES = [
    {"name": "id_present", "expectation": "expect_column_values_to_not_be_null",
     "kwargs": {"column": "event_id"}, "policy": "fail"},
    {"name": "device_well_formed", "expectation": "expect_column_values_to_match_regex",
     "kwargs": {"column": "device_id", "regex": "^cam-[0-9]{4}$"}, "policy": "quarantine"},
    {"name": "ends_after_start", "expectation": "expect_column_pair_values_a_to_be_greater_than_b",
     "kwargs": {"column_A": "end_time", "column_B": "start_time", "or_equal": True}, "policy": "quarantine"},
    {"name": "zip_mostly_known", "expectation": "expect_column_values_to_not_be_null",
     "kwargs": {"column": "zip_code", "mostly": 0.5}, "policy": "warn"},
    {"name": "duration_max_plausible", "expectation": "expect_column_max_to_be_between",
     "kwargs": {"column": "duration_seconds", "max_value": 86400}, "policy": "warn"},
]
SCHEMA = "event_id string, device_id string, start_time timestamp, end_time timestamp, " \
         "duration_seconds double, zip_code string"


def rows(bad_device: bool = False) -> list[tuple]:
    out = [(f"e{i}", f"cam-{i:04d}", T0, T0 + timedelta(seconds=30), 30.0, None if i % 4 == 0 else "02108")
           for i in range(12)]
    if bad_device:
        out[3] = ("e3", "cam 3!", T0, T0 - timedelta(seconds=5), -5.0, "02108")
    return out


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "suite.yaml"
    path.write_text(yaml.safe_dump({"suite": "gate_test", "table": "silver.t", "row_id": "event_id",
                                    "expectations": RULES}))
    return Q.load_suites(path)["silver.t"]


@pytest.fixture
def validations(monkeypatch):
    """How many GX validations the gate runs."""
    runs = []
    real = Q._validator

    def counted(*args):
        validator = real(*args)
        run = validator.run
        validator.run = lambda configs, *rest: runs.append([c.kwargs["result_format"]["result_format"]
                                                            for c in configs]) or run(configs, *rest)
        return validator
    monkeypatch.setattr(Q, "_validator", counted)
    return runs


def gx_complete(suite, df) -> dict:
    """GX's own validation of the whole suite, every result in full."""
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    batch = (context.data_sources.add_spark(name="oracle", persist=False).add_dataframe_asset(name="a")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": df}))
    gx_suite = gx.ExpectationSuite(name="oracle")
    for rule in suite.rules:
        gx_suite.add_expectation(rule.gx())
    results = batch.validate(gx_suite, result_format={"result_format": "COMPLETE",
                                                      "unexpected_index_column_names": ["event_id"]}).results
    return {rule.name: Q._match([r for r in results if r.expectation_config.type == rule.expectation], rule)
            for rule in suite.rules}


def same_as_gx(outcomes, oracle, n: int) -> None:
    for o in outcomes:
        full = oracle[o.rule.name]
        assert o.success == full.success, o.rule.name
        res = full.result or {}
        if "unexpected_count" in res:
            assert (o.element_count, o.unexpected_count) == (res["element_count"], res["unexpected_count"]), o.rule.name
            assert sorted(o.unexpected_ids) == sorted(d["event_id"] for d in res.get("unexpected_index_list") or [])\
                or o.rule.policy not in ("quarantine", "fail"), o.rule.name
        else:                                   # an aggregate expectation: its observed value
            assert o.observed_value == str(res["observed_value"]) or \
                float(o.observed_value) == float(res["observed_value"]), o.rule.name
    assert {o.element_count for o in outcomes if o.unexpected_count is not None} == {n}


def test_a_clean_batch_is_one_validation_that_gives_gx_s_own_counts(spark, suite, validations):
    df = spark.createDataFrame(rows(), SCHEMA).cache()
    outcomes = Q.QualityGate(suite).validate(df, 12)
    assert len(validations) == 1
    # Pass/fail alone where success implies the counts; the `mostly` rule and the aggregate
    # expectation get their counts and observed value in the same validation.
    assert validations[0] == ["BOOLEAN_ONLY", "BOOLEAN_ONLY", "BOOLEAN_ONLY", "BASIC", "BASIC"]
    assert all(o.success for o in outcomes)
    same_as_gx(outcomes, gx_complete(suite, df), 12)
    zip_rule = next(o for o in outcomes if o.rule.name == "zip_mostly_known")
    assert (zip_rule.unexpected_count, zip_rule.sample) == (3, [None, None, None])


def test_a_failed_row_wise_rule_costs_a_second_validation_for_its_row_ids(spark, suite, validations):
    df = spark.createDataFrame(rows(bad_device=True), SCHEMA).cache()
    outcomes = Q.QualityGate(suite).validate(df, 12)
    assert [len(formats) for formats in validations] == [5, 2]
    assert validations[1] == ["COMPLETE", "COMPLETE"]     # the two quarantine rules that flagged a row
    failed = {o.rule.name: o.unexpected_ids for o in outcomes if not o.success}
    assert failed == {"device_well_formed": ["e3"], "ends_after_start": ["e3"]}
    same_as_gx(outcomes, gx_complete(suite, df), 12)


def gate_jobs(spark, gate, df, n):
    """A gate's outcomes on df, and the Spark jobs its validation ran."""
    import uuid

    sc, group = spark.sparkContext, f"gate-{uuid.uuid4()}"
    sc.setJobGroup(group, "a quality gate")
    try:
        outcomes = gate.validate(df, n)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    sc._jsc.sc().listenerBus().waitUntilEmpty()    # the tracker hears of a job after it ran
    return outcomes, len(sc.statusTracker().getJobIdsForGroup(group))


@pytest.mark.parametrize("bad", [False, True])
def test_a_small_batch_of_known_size_is_validated_in_fewer_spark_jobs(spark, suite, bad, tmp_path):
    """Below gate_one_task_below_rows, a batch of several partitions is read as one: GX's
    whole-batch aggregates run without an exchange, one job each instead of two. Its row count,
    given, is not counted again in a job of its own. The outcomes are GX's own all the same.
    Single-column row-wise rules without `mostly` (all a gold gate has) share one aggregate: a
    clean batch's gate is one job in all."""
    df = spark.createDataFrame(rows(bad_device=bad), SCHEMA).repartition(3).cache()
    df.count()
    oracle = gx_complete(suite, df)
    one, jobs_one = gate_jobs(spark, Q.QualityGate(suite, one_task_below_rows=13), df, 12)
    partitioned, jobs_partitioned = gate_jobs(spark, Q.QualityGate(suite), df, 12)
    counted, jobs_counted = gate_jobs(spark, Q.QualityGate(suite, one_task_below_rows=13), df, None)
    for outcomes in (one, partitioned, counted):
        same_as_gx(outcomes, oracle, 12)
    assert jobs_one < jobs_partitioned and jobs_one < jobs_counted

    single = [r for r in RULES if "column" in r["kwargs"] and "mostly" not in r["kwargs"]
              and not r["expectation"].startswith("expect_column_max")]
    path = tmp_path / "single.yaml"
    path.write_text(yaml.safe_dump({"suite": "single", "table": "silver.t", "row_id": "event_id",
                                    "expectations": single}))
    single_suite = Q.load_suites(path)["silver.t"]
    outcomes, jobs = gate_jobs(spark, Q.QualityGate(single_suite, one_task_below_rows=13), df, 12)
    assert [o.success for o in outcomes] == [True, not bad]
    if not bad:
        assert jobs == 1


@pytest.mark.parametrize("given, bad", [(12, False), (None, True)])
def test_a_column_pair_rule_counts_its_rows_and_unexpected_ones_in_one_job(spark, bad, given, tmp_path, monkeypatch):
    """GX counts a column-pair rule's rows (less those its `ignore_row_if` drops) and its
    unexpected rows in a job each; the gate asks one aggregate for both, by GX's own condition
    and domain records, whether or not the batch's row count is known. GX's own outcomes all
    the same, rows with missing values included."""
    pair = [r for r in RULES if r["name"] == "ends_after_start"]
    # the same columns, another condition: counted apart
    pair.append({**pair[0], "name": "ends_strictly_after_start", "kwargs": {**pair[0]["kwargs"], "or_equal": False}})
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump({"suite": "pair", "table": "silver.t", "row_id": "event_id",
                                    "expectations": pair}))
    pair_suite = Q.load_suites(path)["silver.t"]
    data = rows(bad_device=bad)
    data[5] = ("e5", "cam-0005", None, None, None, "02108")          # ignored: both values missing
    data[6] = ("e6", "cam-0006", T0, None, None, "02108")            # kept: not unexpected
    if bad:
        data[7] = ("e7", "cam-0007", T0, T0, 0.0, "02108")            # unexpected only if strictly
    df = spark.createDataFrame(data, SCHEMA).repartition(3).cache()
    df.count()
    oracle = gx_complete(pair_suite, df)
    outcomes = Q.QualityGate(pair_suite, one_task_below_rows=13).validate(df, given)
    for o in outcomes:
        full = oracle[o.rule.name].result
        assert (o.success, o.element_count, o.unexpected_count) == \
            (oracle[o.rule.name].success, full["element_count"], full["unexpected_count"]), o.rule.name
    outcome, res = outcomes[0], oracle["ends_after_start"].result
    assert res["element_count"] == 12 and res["unexpected_count"] == (1 if bad else 0)
    assert oracle["ends_strictly_after_start"].result["unexpected_count"] == (2 if bad else 0)
    if bad:     # its second validation's percentages divide by the rows GX kept (11 of 12)
        mine = outcome.gx_result.result
        for key in ("missing_count", "unexpected_percent", "unexpected_percent_nonmissing"):
            assert mine[key] == res[key], key
        assert res["missing_count"] == 1
    # Both counts in one aggregate: GX's two, by the jobs of the same gate without that. A
    # clean batch of known size is then one job per rule.
    _, jobs = gate_jobs(spark, Q.QualityGate(pair_suite, one_task_below_rows=13), df, given)
    monkeypatch.setattr(Q, "_pair_counts", lambda *args: Q.PairCounts({}))
    _, gx_jobs = gate_jobs(spark, Q.QualityGate(pair_suite, one_task_below_rows=13), df, given)
    assert jobs < gx_jobs, (jobs, gx_jobs)
    if given and not bad:
        assert jobs == 1          # both rules' counts in one aggregate


@pytest.mark.parametrize("bad", [False, True])
def test_the_single_column_rules_are_counted_in_the_column_pair_s_scan(spark, suite, bad, monkeypatch):
    """The level of GX's metric graph that asks for a column pair's counts also asks for the
    aggregate functions of the single-column rules, whose bundle GX would scan the batch for
    one level later: one aggregate computes both, and GX's bundled metrics take its values.
    GX's own outcomes all the same, clean or not; one job fewer than with the bundle left to
    GX."""
    df = spark.createDataFrame(rows(bad_device=bad), SCHEMA).repartition(3).cache()
    df.count()
    oracle = gx_complete(suite, df)
    outcomes, jobs = gate_jobs(spark, Q.QualityGate(suite, one_task_below_rows=13), df, 12)
    same_as_gx(outcomes, oracle, 12)
    monkeypatch.setattr(Q, "_whole_batch", lambda domain: False)      # GX bundles them itself
    left, gx_jobs = gate_jobs(spark, Q.QualityGate(suite, one_task_below_rows=13), df, 12)
    same_as_gx(left, oracle, 12)
    assert jobs < gx_jobs, (jobs, gx_jobs)


@pytest.mark.parametrize("bad", [False, True])
def test_a_not_null_rule_s_sample_of_unexpected_values_comes_from_its_count(spark, bad, tmp_path, monkeypatch):
    """A not-null rule's unexpected values are all NULL: a `mostly` rule's sample (or a failed
    rule's list) is that many NULLs, up to GX's limit, and needs no job that filters the batch
    for them. Its count is then computed a level early, in one aggregate with the other
    single-column rules' (no column pair needed): a clean batch of known size gates in one job
    where GX takes two, GX's own results all the same."""
    nulls = [{"name": "zip_mostly_known", "expectation": "expect_column_values_to_not_be_null",
              "kwargs": {"column": "zip_code", "mostly": 0.5}, "policy": "warn"},
             {"name": "zip_present", "expectation": "expect_column_values_to_not_be_null",
              "kwargs": {"column": "zip_code"}, "policy": "fail"},
             {"name": "device_well_formed", "expectation": "expect_column_values_to_match_regex",
              "kwargs": {"column": "device_id", "regex": "^cam-[0-9]{4}$"}, "policy": "quarantine"}]
    if not bad:
        nulls = [r for r in nulls if r["name"] != "zip_present"]
    path = tmp_path / "nulls.yaml"
    path.write_text(yaml.safe_dump({"suite": "nulls", "table": "silver.t", "row_id": "event_id",
                                    "expectations": nulls}))
    null_suite = Q.load_suites(path)["silver.t"]
    data = rows() * 2 if bad else rows()        # 6 NULLs of 24: more than a sample holds
    n = len(data)
    df = spark.createDataFrame(data, SCHEMA).repartition(3).cache()
    df.count()
    oracle = gx_complete(null_suite, df)
    outcomes, jobs = gate_jobs(spark, Q.QualityGate(null_suite, one_task_below_rows=n + 1), df, n)
    same_as_gx(outcomes, oracle, n)
    for o in outcomes:
        mine, full = o.gx_result.result or {}, oracle[o.rule.name].result
        for key in ("partial_unexpected_list", "unexpected_list"):
            if key in mine:
                assert mine[key] == full[key][:len(mine[key])], (o.rule.name, key)
    sample = next(o for o in outcomes if o.rule.name == "zip_mostly_known").sample
    assert sample == [None] * (Q.SAMPLE_ROWS if bad else 3)
    if bad:
        zip_present = next(o for o in outcomes if o.rule.name == "zip_present").gx_result.result
        assert zip_present["unexpected_list"] == [None] * 6 and zip_present["unexpected_count"] == 6
    monkeypatch.setattr(Q, "_null_samples", lambda todo: {})           # GX samples them itself
    left, gx_jobs = gate_jobs(spark, Q.QualityGate(null_suite, one_task_below_rows=n + 1), df, n)
    same_as_gx(left, oracle, n)
    assert jobs < gx_jobs, (jobs, gx_jobs)
    if not bad:
        assert (jobs, gx_jobs) == (1, 2)
