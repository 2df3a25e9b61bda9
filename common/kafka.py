"""Kafka as a client sees it: wait for a broker to answer, create a topic. The layers use these;
the broker the tests and `make kafka-up` run is tools.kafka_broker."""
from __future__ import annotations

import time

from common.errors import JobError


class BrokerError(JobError):
    """No Kafka broker answered at the configured address."""


def wait_for_kafka(bootstrap: str, timeout: float) -> None:
    """Return once a broker at bootstrap answers a metadata request; raise after timeout."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # log_level 0: the error we raise names the address; librdkafka would log each retry too.
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 2000,
                         "log_level": 0})
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            return
        except KafkaException as e:
            last = e
            time.sleep(0.2)
    raise BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout:g}s ({last})")


def ensure_topic(bootstrap: str, topic: str, partitions: int, compacted: bool = False,
                 timeout: float = 30.0) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=timeout).topics:
        return
    config = {"cleanup.policy": "compact"} if compacted else {}
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config)])
    try:
        futures[topic].result(timeout)
    except KafkaException as e:  # a concurrent creator may have won the race
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
