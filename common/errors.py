"""The lakehouse's errors, raised and caught by type, and what Spark's own failures are.

Every error this project raises on purpose is a `LakehouseError`; its `exit_code` is what a
command exits with when it ends on it (2: the user can fix it, 1: a run failed). The errors of a
micro-batch cross Spark's foreachBatch boundary as text only (Spark rebuilds them as a
StreamingQueryException), so the batch's body keeps the typed one (`KeptFailure`) for the
runner that started its query.

Spark's own failures are read through their error conditions (`getCondition()`) and the JVM
exception classes behind them, never by searching the text of a stack trace.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import traceback


class LakehouseError(Exception):
    """Base of every error this project raises on purpose."""
    exit_code = 1


class JobError(LakehouseError, RuntimeError):
    """A problem the user can fix (missing input, unreachable broker, a checkpoint in use):
    reported as its message alone, exit code 2."""
    exit_code = 2


class DataQualityError(LakehouseError, RuntimeError):
    """An expectation with policy `fail` did not pass in a batch. The batch was not committed."""

    def __init__(self, message: str, query: str, batch_id: int, table: str,
                 expectations: tuple[str, ...], samples: dict[str, list] | None = None):
        super().__init__(message)
        self.query, self.batch_id, self.table = query, batch_id, table
        self.expectations = expectations
        self.samples = samples or {}           # expectation -> a few unexpected values

    def summary(self) -> str:
        names = ", ".join(f"'{e}'" for e in self.expectations)
        return f"expectation {names} failed in batch {self.batch_id} (policy fail)"


class GateError(LakehouseError, RuntimeError):
    """The quality gate could not evaluate an expectation (not a failed one: a broken one)."""


class QueryFailed(LakehouseError):
    """A streaming query ended on an error that is not one of ours: Spark's condition (error
    class) when it has one, and the first lines of its message."""

    def __init__(self, query: str, error: BaseException):
        self.query, self.cause = query, error
        self.condition = spark_condition(error)
        super().__init__(f"query {query} failed: {describe(error)}")


# --- a batch's typed error, kept for the runner ---------------------------------------------

class KeptFailure:
    """The typed error a foreachBatch body raised, kept on the body itself (one per start of a
    query) for the runner that started it: Spark fails the query with only the error's text.
    Thread-safe: the batch's thread sets it, the runner's thread reads it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._error: LakehouseError | None = None

    @contextlib.contextmanager
    def keep(self):
        """Around a batch's work: a typed error it raises is kept, then raised on to Spark. Work
        the query's stop interrupted is raised on as a short BatchInterrupted (see there)."""
        try:
            yield
        except LakehouseError as e:
            with self._lock:
                self._error = e             # the last one wins
            raise
        except Exception as e:
            if interrupted(e):
                raise BatchInterrupted(e) from None
            raise

    @property
    def error(self) -> LakehouseError | None:
        with self._lock:
            return self._error


class BatchInterrupted(LakehouseError):
    """A batch's Spark work interrupted by its query's stop (its job cancelled, its call's thread
    interrupted), raised in place of Spark's error.

    Spark 4.1 reads the error of a Python foreachBatch to tell a stop from a failure: it matches
    the Python traceback's text with `StreamExecution.PROXY_ERROR`, whose `(.|\\r\\n|\\r|\\n)*`
    recurses once per character, and the JVM stack trace inside a Py4JJavaError (7-8 KB) is enough
    to overflow the stream thread's stack: a StackOverflowError and its thousand frames in the log
    of every query stopped mid-batch (a failure elsewhere stops the others), the thread dying on
    it instead of finishing the stop Spark's way. Raised `from None`, so that the traceback Spark
    reads is a few frames long, and worded so that its pattern recognises it (the call's name,
    then the interruption's class)."""

    def __init__(self, cause: BaseException):
        first = str(cause).split("\n", 1)[0].strip()
        call = first if first.startswith(_PY4J_CALL) else f"{_PY4J_CALL} the batch's Spark work."
        super().__init__(f"this batch's Spark work was interrupted (its query stopped or its job "
                         f"cancelled): py4j.protocol.Py4JJavaError: {call}\n: {_INTERRUPTIONS[0]}")


_PY4J_CALL = "An error occurred while calling"
# What a stop leaves behind a batch's error: the thread of its call interrupted (as Spark's own
# pattern lists them), or its job cancelled.
_INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                  "java.nio.channels.ClosedByInterruptException")
_CANCELLED = "SPARK_JOB_CANCELLED"


def interrupted(error: BaseException) -> bool:
    """Whether a JVM interruption or a cancelled Spark job is behind `error`."""
    from common.internals import is_jvm_instance

    try:
        for t in jvm_chain(error):
            if any(is_jvm_instance(t, c) for c in _INTERRUPTIONS):
                return True
            if is_jvm_instance(t, "org.apache.spark.SparkThrowable") and t.getCondition() == _CANCELLED:
                return True
    except Exception:   # noqa: BLE001 - a JVM going away: the batch's own error is raised as it is
        return False
    return False


# --- Spark's failures ------------------------------------------------------------------------

def spark_condition(error: BaseException) -> str | None:
    """Spark's error condition (e.g. DELTA_CANNOT_VACUUM_LITE), or None for an unclassified one."""
    from pyspark.errors import PySparkException

    if not isinstance(error, PySparkException):
        return None
    try:
        return error.getCondition()
    except Exception:   # noqa: BLE001 - a failure without a live JVM behind it has no condition
        return None


def jvm_chain(error: BaseException, limit: int = 32) -> list:
    """The JVM throwables behind a Spark error, outermost first, causes and suppressed ones."""
    from common.internals import jvm_throwable

    origin = jvm_throwable(error)
    if origin is None:
        return []
    chain, todo, seen = [], [origin], set()
    while todo and len(chain) < limit:
        t = todo.pop(0)
        key = t.hashCode()
        if key in seen:
            continue
        seen.add(key)
        chain.append(t)
        todo.extend(t.getSuppressed())
        if t.getCause() is not None:
            todo.append(t.getCause())
    return chain


def caused_by(error: BaseException, java_class: str, raised_in: str | None = None) -> bool:
    """Whether a JVM exception of `java_class` (or a subclass) is behind `error`; with
    `raised_in`, only one thrown by code of that package or class."""
    from common.internals import is_jvm_instance

    for t in jvm_chain(error):
        if not is_jvm_instance(t, java_class):
            continue
        if raised_in is None or any(f.getClassName().startswith(raised_in) for f in t.getStackTrace()):
            return True
    return False


def describe(error: BaseException) -> str:
    """What a user needs from an error: ours as its message; Spark's as its condition and the
    message without the JVM frames (a foreachBatch error keeps its Python traceback)."""
    if isinstance(error, LakehouseError):
        return str(error)
    if os.environ.get("LAKEHOUSE_DEBUG"):
        return "".join(traceback.format_exception(error))
    from pyspark.errors import PySparkException

    if isinstance(error, PySparkException):
        from common.internals import spark_error_message

        text = spark_error_message(error)
        text = text.split("\n\tat ")[0].split("\n\nJVM stacktrace:")[0].rstrip()
        condition = spark_condition(error)
        return text if not condition or condition in text else f"[{condition}] {text}"
    return str(error) or type(error).__name__


def exit_code(error: BaseException) -> int:
    return error.exit_code if isinstance(error, LakehouseError) else 1


def command(main):
    """A tool's main(argv, ...) -> exit code. The errors it raises on purpose end it with their
    message on stderr and their exit code, without a traceback; anything else is a bug and
    keeps its traceback."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except LakehouseError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return e.exit_code
    return run
