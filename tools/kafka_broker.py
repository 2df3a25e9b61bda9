"""A single-node KRaft Apache Kafka broker, run from the jars Maven fetched at setup.

`python -m tools.kafka_broker up|down|status` backs `make kafka-up/-down/-status`; tests use
`Broker` directly on free ports. The broker listens on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import base64
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from common.config import load_config
from common.errors import command
from common.jars import kafka_broker_classpath
from common.kafka import BrokerError, ensure_topic, wait_for_kafka
from tools.processes import live_pid, port_open, terminate

LOG4J2 = """\
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = INFO
"""


@dataclass
class Broker:
    data_dir: Path
    port: int
    controller_port: int
    heap: str = "512m"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = self.data_dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.data_dir / 'data'}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            # A local broker: keep the log cleaner snappy so compaction is observable.
            "log.cleaner.backoff.ms=1000",
            "",
        ]))
        (self.data_dir / "log4j2.properties").write_text(LOG4J2.format(log=self.data_dir / "server.log"))
        return props

    def _java(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return ["java", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.data_dir}",
                "-cp", kafka_broker_classpath(), main, *args]

    def pid(self) -> int | None:
        return live_pid(self.pid_file)

    def start(self, timeout: float = 60.0) -> None:
        if self.pid():
            wait_for_kafka(self.bootstrap, timeout)
            return
        for p in (self.port, self.controller_port):
            if port_open(p):
                raise BrokerError(f"port {p} on 127.0.0.1 is already in use by another process; "
                                  "set kafka.port / KAFKA_PORT to a free one")
        props = self._write_config()
        if not (self.data_dir / "data" / "meta.properties").exists():
            cluster_id = "-"
            while cluster_id.startswith("-"):  # the tool's argument parser reads "-x..." as an option
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                            "-c", str(props), "--ignore-formatted"),
                                 capture_output=True, text=True)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting the KRaft log dir failed:\n{fmt.stdout}{fmt.stderr}")
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(self._java("kafka.Kafka", str(props), heap=self.heap),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if proc.poll() is not None:
                raise BrokerError(f"the broker exited with code {proc.returncode}; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the broker did not listen on {self.bootstrap} within {timeout:g}s; "
                                  f"see {self.log_file}")
            time.sleep(0.2)
        wait_for_kafka(self.bootstrap, max(1.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 30.0) -> bool:
        pid = self.pid()
        if pid is not None:
            terminate(pid, timeout)  # controlled shutdown: flushes logs, closes segments
        self.pid_file.unlink(missing_ok=True)
        return pid is not None


def broker_from_config(cfg) -> Broker:
    return Broker(data_dir=cfg.kafka_data_dir, port=cfg.kafka.port,
                  controller_port=cfg.kafka.controller_port, heap=cfg.kafka.broker_heap)


@command
def main(argv: list[str] | None = None, prog: str = "kafka_broker") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Run the local single-node KRaft Kafka broker (127.0.0.1).")
    parser.add_argument("action", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    cfg = load_config()
    broker = broker_from_config(cfg)
    if args.action == "up":
        broker.start(cfg.kafka.start_timeout.seconds)
        for topic, compacted in ((cfg.kafka.topics.events, False), (cfg.kafka.topics.stats, True)):
            ensure_topic(broker.bootstrap, topic, cfg.kafka.topic_partitions, compacted)
        print(f"kafka up at {broker.bootstrap} (pid {broker.pid()}, data in {broker.data_dir})")
    elif args.action == "down":
        print("kafka stopped" if broker.stop() else "kafka was not running")
    else:
        pid = broker.pid()
        if pid is None:
            print(f"kafka down (no broker process for {broker.data_dir})")
            return 1
        wait_for_kafka(broker.bootstrap, 5)
        print(f"kafka up at {broker.bootstrap} (pid {pid})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
