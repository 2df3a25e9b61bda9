"""Errors by type: Spark's failures read through their conditions and JVM exception classes, a
batch's typed error handed to the runner across Spark's foreachBatch boundary, and tools that end
on one of our errors with its message and exit code."""
from __future__ import annotations

import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import functions as F

from common.errors import (BatchInterrupted, JobError, LakehouseError, QueryFailed, caused_by, command,
                           describe, KeptFailure, exit_code, interrupted, spark_condition)


def test_a_spark_error_is_known_by_its_condition(spark, tmp_path):
    with pytest.raises(PySparkException) as caught:
        spark.sql(f"SELECT * FROM delta.`{tmp_path / 'nothing-here'}`").collect()
    condition = spark_condition(caught.value)
    assert condition and condition.isupper()
    text = describe(caught.value)
    assert condition in text and "\tat " not in text and "JVM stacktrace" not in text
    assert spark_condition(ValueError("not Spark's")) is None


def test_the_jvm_classes_behind_a_failure_are_found_without_reading_its_text(spark, tmp_path):
    """As with a Kafka fetch that fails on an executor: the query's error wraps the job's abort,
    which wraps the task's own exception."""
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .select(F.raise_error(F.lit("an executor gave up")).alias("x"))
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(60)
    error = caught.value
    assert caused_by(error, "org.apache.spark.SparkRuntimeException")       # the task's, two causes down
    assert caused_by(error, "java.lang.RuntimeException")                   # subclasses count
    assert caused_by(error, "org.apache.spark.SparkRuntimeException", raised_in="org.apache.spark")
    assert not caused_by(error, "java.lang.NullPointerException")
    assert not caused_by(error, "org.apache.spark.SparkRuntimeException", raised_in="org.example")
    assert not caused_by(ValueError("no JVM behind it"), "java.lang.Throwable")


def test_a_batch_hands_its_typed_error_to_the_runner(spark, tmp_path):
    """The body keeps its batch's typed error on itself: each start of a query has its own."""
    class Broken(JobError):
        pass

    class Body:
        def __init__(self):
            self.failure = KeptFailure()

        def __call__(self, df, batch_id):
            with self.failure.keep():
                raise Broken(f"batch {batch_id} cannot go on")

    body, other = Body(), Body()
    query = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
             .writeStream.queryName("typed_errors_probe").foreachBatch(body)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(60)
    typed = body.failure.error
    assert isinstance(typed, Broken) and str(typed) == "batch 0 cannot go on"
    assert other.failure.error is None                     # another run's body knows nothing of it
    failed = QueryFailed("typed_errors_probe", caught.value)
    assert failed.condition and str(failed).startswith("query typed_errors_probe failed: ")
    assert exit_code(typed) == 2 and exit_code(caught.value) == 1


def test_a_batch_stopped_mid_job_ends_as_a_stop_not_a_stack_overflow(spark, tmp_path):
    """Stopped while its batch's job runs, a query ends the way Spark ends a stop ("Stopped", no
    error), where Spark's reading of the long interrupted-call error overflowed its stream
    thread's stack; the body raises a short BatchInterrupted, which is no failure to keep."""
    import threading
    import time

    running, raised = threading.Event(), []

    class Body:
        def __init__(self):
            self.failure = KeptFailure()

        def __call__(self, df, batch_id):
            running.set()
            try:
                with self.failure.keep():
                    (df.sparkSession.range(1).repartition(1)
                     .selectExpr("java_method('java.lang.Thread', 'sleep', 120000L)").collect())
            except BaseException as e:
                raised.append(e)
                raise

    body = Body()
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
             .writeStream.queryName("stopped_mid_job_probe").foreachBatch(body)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    assert running.wait(60)
    time.sleep(1)                                   # the sleeping task has started
    query.stop()
    assert query.exception() is None
    assert query.status["message"] == "Stopped"     # Spark's own end of a stop
    (error,) = raised
    assert isinstance(error, BatchInterrupted) and len(str(error)) < 300, error
    assert body.failure.error is None
    assert interrupted(error) is False and not interrupted(ValueError("no JVM behind it"))


def test_a_tool_ends_on_our_error_with_its_message_and_code(capsys):
    @command
    def tool(argv):
        if argv == ["bad"]:
            raise JobError("the input names no table")
        if argv == ["broken"]:
            raise LakehouseError("an invariant broke")
        if argv == ["bug"]:
            raise KeyError("a bug keeps its traceback")
        return 0

    assert tool([]) == 0
    assert tool(["bad"]) == 2
    assert capsys.readouterr().err == "error: the input names no table\n"
    assert tool(["broken"]) == 1
    with pytest.raises(KeyError):
        tool(["bug"])
