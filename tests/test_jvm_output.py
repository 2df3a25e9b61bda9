"""What a driver JVM prints in normal output: its stderr reaches ours, less the one line the
JDK prints because Spark's launcher adds the incubating vector module to every driver."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import os, sys
from common.config import load_config
from common.spark import build_spark, stop
# As bench/soak does: stderr at a file while the JVM starts, back at ours after. The JVM's
# output stays where it was pointed at its launch, as a child process's would.
saved, log = os.dup(2), os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 2)
spark = build_spark(load_config(), "jvm-output")
os.dup2(saved, 2)
# The module is still added (the launcher's flag is untouched), only its warning is dropped.
assert spark._jvm.java.lang.ModuleLayer.boot().findModule("jdk.incubator.vector").isPresent()
spark._jvm.java.lang.System.err.println("written by the JVM on its stderr")
# An auto compaction that lost to the maintenance's OPTIMIZE is dropped, a real error is not.
logger = spark._jvm.org.apache.logging.log4j.LogManager.getLogger("org.apache.spark.sql.delta.hooks.AutoCompact")
logger.error("Auto Compaction failed with: [DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT] Transaction conflict")
logger.warn("Error when executing post-commit hook Auto Compact for commit 51")
logger.error("a real error of the same logger")
assert spark.range(3).count() == 3
# A SQL error the caller handles prints nothing (PySpark logs each with its stack trace).
from pyspark.errors import AnalysisException
try:
    spark.sql("SELECT no_such_column_here")
except AnalysisException:
    pass
# Delta's VACUUM prints its count with Scala's println: not inside quiet_console, and only there.
import tempfile
from common.internals import quiet_console
table = tempfile.mkdtemp() + "/t"
spark.range(3).write.format("delta").save(table)
with quiet_console(spark):
    spark.sql(f"VACUUM delta.`{table}`")
spark._jvm.scala.Console.println("printed by Scala after the block")
spark._jvm.scala.Console.flush()
stop(spark)
"""


def test_a_session_prints_no_incubator_warning_nor_handled_sql_errors_and_passes_the_jvms_output(env, tmp_path):
    launched = tmp_path / "stderr-at-launch.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(launched)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    jvm = launched.read_text()
    assert done.returncode == 0, done.stderr[-3000:] + jvm[-3000:]
    assert "Using incubator modules" not in jvm + done.stderr
    assert "written by the JVM on its stderr" in jvm and "written by the JVM" not in done.stderr
    assert "ERROR AutoCompact: a real error of the same logger" in jvm
    assert "Auto Compaction failed" not in jvm and "post-commit hook" not in jvm
    assert "no_such_column_here" not in done.stderr and "QueryContextLogger" not in done.stderr
    assert "Deleted" not in done.stdout and "printed by Scala after the block" in done.stdout, done.stdout
