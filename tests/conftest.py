"""Shared fixtures: one real SparkSession with Delta for the run, per-test lakehouse roots,
and a real single-node Kafka broker on free ports for tests marked `kafka`."""
from __future__ import annotations

import gc
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from common.config import load_config

TABLES = load_config(env={}).tables    # the default (nest) profile's tables, by layer

REPO = Path(__file__).resolve().parent.parent

# The whole suite took at most 620 MB of disk beyond what setup left (`df` every 20 s beside a
# fresh-clone CI, the soak included); 1,000 leaves room. Below it the suite fails late and
# everywhere at once (a CI run died 21 minutes in with 87 errors from ENOSPC): stop first.
NEED_FREE_MB = int(os.environ.get("TEST_NEED_FREE_MB", 1000))


def _free_mb(config) -> dict[str, int]:
    places = {"temp": Path(config.option.basetemp or tempfile.gettempdir()), "repo": REPO}
    return {k: shutil.disk_usage(p if p.exists() else p.parent).free >> 20 for k, p in places.items()}


def pytest_report_header(config):
    return "disk free: " + ", ".join(f"{k} {mb:,} MB" for k, mb in _free_mb(config).items())


def pytest_sessionstart(session):
    short = {k: mb for k, mb in _free_mb(session.config).items() if mb < NEED_FREE_MB}
    if short:
        pytest.exit(f"not enough disk for the suite: {', '.join(f'{k} has {mb:,} MB free' for k, mb in short.items())}; "
                    f"it needs about {NEED_FREE_MB:,} MB (TEST_NEED_FREE_MB overrides)", returncode=4)


@pytest.fixture(scope="session")
def session_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lakehouse-session")


@pytest.fixture(scope="session")
def spark(session_root):
    from common.spark import build_spark, stop

    # The test process's JVM lives for the whole run: the JVM's default JIT (C2 too) pays off.
    cfg = load_config(env=dict(os.environ, LAKEHOUSE_ROOT=str(session_root), LAKEHOUSE__SPARK__JIT="tiered"))
    # Tests run small batches: two shuffle partitions keep stateful queries quick on 2 cores.
    session = build_spark(cfg, "lakehouse-tests", {"spark.sql.shuffle.partitions": "2"})
    # GX's import freezes what the process holds (common.quality.import_gx): here, before any
    # test's objects exist, rather than within whichever test first builds a gate.
    from common.quality import import_gx

    import_gx()
    yield session
    stop(session)


@pytest.fixture(autouse=True)
def release_cycles():
    """After each test, a collection of Python's reference cycles, which frees the JVM's side of
    the Py4J objects among them (each DataFrame's, each Column's: a Py4J object whose method
    was called once holds that method, which holds it). The test process allocates little in
    Python while its jobs run, so Python's own collections came seldom: the suite's one JVM
    kept 230-600 unused plans within a module (test_refresh_silver.py). Cheap since GX's import
    froze the process's long-lived objects (common.quality.import_gx): it scans what the tests
    made since."""
    yield
    gc.collect()


@pytest.fixture(autouse=True, scope="module")
def release_plans():
    """After each module, Delta's log cache, which keeps every table a finished test read for an
    hour (spark.databricks.delta.delta.log.cacheRetentionMinutes). With release_cycles and
    Spark's smaller memory pages (conf spark.page_size), what kept the suite's one JVM near its
    old generation's limit (2.7 of 2.7 GB, 47 full collections by the end of a CI run)."""
    yield
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is not None:
        sc._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """Environment for a test's own lakehouse under tmp_path (also for subprocess jobs)."""
    from common.log import parseable_env

    e = parseable_env(os.environ)      # tests read job output as plain lines
    e.update(LAKEHOUSE_ROOT=str(tmp_path / "lakehouse"), KAFKA_DATA_DIR=str(tmp_path / "kafka"),
             # Job processes in tests live for minutes, whatever their trigger: C1 warms up fastest.
             LAKEHOUSE__SPARK__JIT="c1")
    for var in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER"):
        e.pop(var, None)
    return e


@pytest.fixture
def logged(caplog):
    """What the project's code logs at INFO and above, whatever LOG_LEVEL says (caplog.messages)."""
    from common.log import PACKAGES

    for name in PACKAGES:
        caplog.set_level(logging.INFO, logger=name)
    return caplog


@pytest.fixture
def lock_holder():
    """hold(env): a block during which another process holds the silver checkpoint's lock (a
    lease on object storage); the block's end kills that process with -9, so what a dead
    holder leaves behind is the test's to check."""
    @contextmanager
    def hold(env: dict, query: str = "silver", child: str | None = None):
        """`child`: "after" the holder took the lock, or "before", it starts a process of its own
        (a job's JVM, started after the lock in a pipeline, before it in a refresh), which
        outlives the holder's kill; its pid is the block's value's `child`."""
        start_child = "import subprocess; c = subprocess.Popen(['sleep', '600']); "
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import time; from common.config import load_config; "
                                 "from common.checkpoint_lock import CheckpointLocks; "
                                 + (start_child if child == "before" else "c = None; ") +
                                 # held in a name: a collected lock object closes its flock
                                 f"held = CheckpointLocks(load_config(), [{query!r}]).__enter__(); "
                                 + (start_child if child == "after" else "") +
                                 "print('locked', c and c.pid, flush=True); time.sleep(600)"],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        try:
            word, pid = proc.stdout.readline().split()
            assert word == "locked"
            proc.child = None if pid == "None" else int(pid)
            yield proc
        finally:
            proc.kill()
            proc.wait()
    return hold


@pytest.fixture
def cfg(env, spark):
    config = load_config(env=env)
    yield config
    # Names are per process; forget this test's tables so the next test's root is used.
    for layer, tables in TABLES.items():
        for table in tables:
            spark.sql(f"DROP TABLE IF EXISTS {layer}.{table}")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real KRaft broker from the Maven jars, on free ports, for this test session."""
    from tools.kafka_broker import Broker
    from tools.processes import free_port

    broker = Broker(tmp_path_factory.mktemp("kafka"), free_port(), free_port())
    broker.start(timeout=90)
    yield broker
    broker.stop()
    shutil.rmtree(broker.data_dir, ignore_errors=True)
