"""One of several processes writing one Delta table at once (tests/test_local_fs.py).

Each process builds the project's session, waits for a start file, then either

- `commits`: does what Delta does to commit: writes version N through the table's log store
  without overwrite and, on FileAlreadyExistsException, tries the version after the newest in
  the log, until it has won WINS versions; it prints the versions it won as JSON. Two processes
  that both believe they won a version means a lost commit;
- `setup`: sets the ops table dq_results up as every layer's start does (common.delta.ensure_table)
  and prints its version.

    python tests/support/commit_race.py {commits,setup} ROOT WRITER START_FILE [--wins N] [--log-store CLASS]

ROOT is the table's folder for `commits`, the lakehouse root for `setup`. --log-store replaces
the session's store for file: paths (to show the race with Delta's own).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path


def commits(spark, table: Path, writer: str, wins: int) -> list[int]:
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    log_dir = table / "_delta_log"
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table)).store()
    conf = spark._jsc.hadoopConfiguration()
    to_scala = jvm.scala.jdk.javaapi.CollectionConverters.asScala
    won, version = [], 0
    while len(won) < wins:
        lines = jvm.java.util.ArrayList()
        lines.add(json.dumps({"commitInfo": {"writer": writer, "version": version}}))
        path = jvm.org.apache.hadoop.fs.Path(f"file://{log_dir}/{version:020d}.json")
        try:
            store.write(path, to_scala(lines.iterator()), False, conf)
            won.append(version)
            version += 1
            # A writer does work between its commits (Delta writes the data first); without it
            # the one that wins first keeps winning, its tries cheaper than the other's failures.
            time.sleep(random.uniform(0, 0.004))
        except Py4JJavaError as e:
            if e.java_exception.getClass().getName() != "java.nio.file.FileAlreadyExistsException":
                raise
            # As Delta does after a conflict: try again after the newest version in the log.
            version = 1 + max(int(f.name[:20]) for f in log_dir.glob("*.json"))
    return won


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("commits", "setup"))
    ap.add_argument("root", type=Path)
    ap.add_argument("writer")
    ap.add_argument("start_file", type=Path)
    ap.add_argument("--wins", type=int, default=100)
    ap.add_argument("--log-store")
    args = ap.parse_args(argv)

    from common.config import load_config
    from common.spark import build_spark, stop

    env = dict(os.environ, LAKEHOUSE_ROOT=str(args.root)) if args.action == "setup" else os.environ
    cfg = load_config(env=env)
    extra = {"spark.delta.logStore.file.impl": args.log_store} if args.log_store else {}
    spark = build_spark(cfg, f"commit-race-{args.writer}", extra)

    if args.action == "commits":
        # Warm: a first write costs far more than the next ones, long enough for the other
        # process to win every version before this one wins any.
        warm = args.root.parent / f"warm-{args.root.name}-{args.writer}"
        (warm / "_delta_log").mkdir(parents=True)
        commits(spark, warm, args.writer, 50)
    Path(f"{args.start_file}.{args.writer}.ready").touch()
    while not args.start_file.exists():
        time.sleep(0.005)
    if args.action == "commits":
        print(json.dumps(commits(spark, args.root, args.writer, args.wins)))
    else:
        from delta.tables import DeltaTable

        from common.delta import ensure_table
        from common.schemas import DQ_RESULTS

        path = ensure_table(spark, cfg, "ops", "dq_results", DQ_RESULTS)
        print(json.dumps(DeltaTable.forPath(spark, path).history(1).first().version))
    stop(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
