"""Bronze on Kafka rides out a broker outage: stop the broker under a running processing-time
bronze job, start it again on the same port and data dir, and every message lands exactly once.

Spark's Kafka source fails the query once its offset fetch has timed out (3 attempts of
kafka.source.api_timeout); the bronze job then waits for the broker with a bounded backoff and
restarts the query from its checkpoint. The test uses its own broker (not the session one), so
stopping it cannot disturb other tests.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tools.processes import kill_tree
from common.config import load_config
from common.kafka import ensure_topic
from tools.kafka_broker import Broker
from tools.processes import free_port

REPO = Path(__file__).resolve().parent.parent
TOPIC = "outage-events"

pytestmark = pytest.mark.kafka


class Job:
    """bronze.job as a process, its output collected line by line."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "bronze.job"], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        from common.log import message_of

        for line in self.proc.stdout:              # each line as printed, without its timestamp
            self.lines.append(message_of(line.rstrip("\n")))

    def text(self, last: int = 60) -> str:
        return "\n".join([l for l in self.lines if not l.startswith(("\tat ", "  at "))][-last:])

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> int:
        """Index of the first line from `after` on matching pattern."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(list(self.lines)[after:], after):
                if re.search(pattern, line):
                    return i
            assert self.proc.poll() is None, f"bronze exited ({self.proc.returncode}):\n{self.text()}"
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text()}")


def produce(bootstrap: str, first: int, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        p.produce(TOPIC, value=f'{{"msg":{i}}}'.encode(), key=f"k{i % 7}".encode())
    assert p.flush(60) == 0


def end_offsets(bootstrap: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "outage-test-check"})
    try:
        meta = c.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions
        return {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in meta}
    finally:
        c.close()


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "outage-kafka", free_port(), free_port(), heap="384m")
    b.start(timeout=90)
    yield b
    b.stop()


def test_bronze_restarts_its_kafka_query_after_a_broker_outage_and_loses_nothing(spark, env, broker):
    ensure_topic(broker.bootstrap, TOPIC, 2)
    produce(broker.bootstrap, 0, 300)
    env = dict(env, KAFKA_BOOTSTRAP=broker.bootstrap, SOURCE="kafka", TRIGGER="processing-time",
               TRIGGER_INTERVAL="2 seconds", LAKEHOUSE__KAFKA__TOPICS__EVENTS=TOPIC,
               LAKEHOUSE__KAFKA__SOURCE__MAX_OFFSETS_PER_TRIGGER="60",
               # detect the outage in ~3 x 3 s instead of 3 minutes; retry quickly
               LAKEHOUSE__KAFKA__SOURCE__API_TIMEOUT="3 seconds",
               LAKEHOUSE__KAFKA__SOURCE__RECONNECT_BACKOFF="1 second",
               LAKEHOUSE__KAFKA__SOURCE__RECONNECT_BACKOFF_MAX="4 seconds",
               LAKEHOUSE__KAFKA__SOURCE__MAX_OUTAGE="3 minutes",
               LAKEHOUSE__SPARK__DRIVER_MEMORY="1g")
    cfg = load_config(env=env)
    job = Job(env)
    try:
        job.wait_for(r"^bronze_kafka\s+batch \d+\s+[1-9][\d,]* rows", 240)
        broker.stop()
        failed = job.wait_for(r"bronze: Kafka query failed, broker at .* unreachable", 120)
        job.wait_for(r"still unreachable; next try in", 60, failed)
        assert job.proc.poll() is None
        broker.start(timeout=90)   # same port, same data dir: the topic and its offsets are back
        produce(broker.bootstrap, 300, 200)
        restarted = job.wait_for(r"bronze: Kafka query restarted from its checkpoint", 120, failed)
        job.wait_for(r"^bronze_kafka\s+batch \d+\s+[1-9][\d,]* rows", 120, restarted)

        ends = end_offsets(broker.bootstrap)
        assert sum(ends.values()) == 500, ends
        bronze_path = cfg.table_path("bronze", "events")
        deadline = time.monotonic() + 120
        while spark.read.format("delta").load(bronze_path).count() < 500 and time.monotonic() < deadline:
            time.sleep(2)
        job.proc.send_signal(signal.SIGTERM)
        assert job.proc.wait(120) == 0, job.text()
    finally:
        if job.proc.poll() is None:
            kill_tree(job.proc)

    rows = spark.read.format("delta").load(bronze_path).select(
        "kafka_topic", "kafka_partition", "kafka_offset", "raw").collect()
    keys = [(r.kafka_topic, r.kafka_partition, r.kafka_offset) for r in rows]
    assert len(keys) == len(set(keys)), "a message landed twice"
    assert set(keys) == {(TOPIC, p, o) for p, end in ends.items() for o in range(end)}
    assert sorted(int(re.search(r"\d+", r.raw).group()) for r in rows) == list(range(500))


def test_bronze_gives_up_with_a_clear_error_when_the_broker_stays_away(env):
    from bronze.job import _wait_for_broker
    from common.errors import JobError

    dead = f"127.0.0.1:{free_port()}"   # nothing listens there
    cfg = load_config(env=dict(env, KAFKA_BOOTSTRAP=dead, LAKEHOUSE__KAFKA__CONNECT_TIMEOUT="1 second",
                               LAKEHOUSE__KAFKA__SOURCE__RECONNECT_BACKOFF="1 second"))
    with pytest.raises(JobError, match=rf"Kafka broker at {dead} unreachable for kafka.source.max_outage"):
        _wait_for_broker(cfg, threading.Event(), time.monotonic() + 4)
