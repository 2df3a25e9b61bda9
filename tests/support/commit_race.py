"""One of several processes committing to one Delta log at once (tests/test_local_fs.py).

Each process builds the project's session, waits for a start file, then does what Delta does
to commit: write version N through the table's log store without overwrite, and on
FileAlreadyExistsException try the version after the newest in the log, until it has won `wins` versions. It prints the versions it
won as JSON. Two processes that both believe they won a version means a lost commit.

    python tests/support/commit_race.py LOG_DIR WRITER WINS START_FILE [--log-store CLASS]

--log-store replaces the session's store for file: paths (to show the race with Delta's own).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir", type=Path)
    ap.add_argument("writer")
    ap.add_argument("wins", type=int)
    ap.add_argument("start_file", type=Path)
    ap.add_argument("--log-store")
    args = ap.parse_args(argv)

    from py4j.protocol import Py4JJavaError

    from common.config import load_config
    from common.spark import build_spark, stop

    extra = {"spark.delta.logStore.file.impl": args.log_store} if args.log_store else {}
    spark = build_spark(load_config(env=os.environ), f"commit-race-{args.writer}", extra)
    jvm = spark._jvm
    table = args.log_dir.parent
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table)).store()
    conf = spark._jsc.hadoopConfiguration()
    to_scala = jvm.scala.jdk.javaapi.CollectionConverters.asScala

    Path(f"{args.start_file}.{args.writer}.ready").touch()
    while not args.start_file.exists():
        time.sleep(0.01)
    won, version = [], 0
    while len(won) < args.wins:
        lines = jvm.java.util.ArrayList()
        lines.add(json.dumps({"commitInfo": {"writer": args.writer, "version": version}}))
        path = jvm.org.apache.hadoop.fs.Path(f"file://{args.log_dir}/{version:020d}.json")
        try:
            store.write(path, to_scala(lines.iterator()), False, conf)
            won.append(version)
            version += 1
        except Py4JJavaError as e:
            if e.java_exception.getClass().getName() != "java.nio.file.FileAlreadyExistsException":
                raise
            # As Delta does after a conflict: try again after the newest version in the log.
            version = 1 + max(int(f.name[:20]) for f in args.log_dir.glob("*.json"))
    print(json.dumps(won))
    stop(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
