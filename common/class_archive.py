"""The driver JVM's class-data sharing archive (AppCDS), built once by `make setup`.

A pipeline's JVM loads about 27,000 classes (Spark, Delta, Scala, Jackson...). Read from jars,
verified and parsed one by one, they are most of the 8-10 s a session takes to start and most
of why the first Delta write, MERGE and streaming batch of a fresh JVM are slow. A dynamic CDS
archive holds those classes already parsed and verified, mapped from one file: measured on this
machine, session start + first write + MERGE + one streaming batch took 35 s without it and
18 s with it (C1 JIT; 25 s with the tiered JIT). Every driver JVM (jobs, tests, tools) gains.

The archive is valid only for the JVM and classpath it was dumped with, so its name carries a
hash of both; a JDK or jar change just means no archive (the JVM then loads classes as usual)
until the next `make setup`. The Delta and Kafka jars go on the driver's application classpath
(spark.driver.extraClassPath) rather than only spark.jars, because CDS archives only classes of
the JDK's own class loaders.

    python -m common.class_archive [--force]      # build it (make setup does)
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.errors import LakehouseError
from common.config import REPO_ROOT
from common.log import configure

logger = logging.getLogger(__spec__.name)   # `log` is the build log's path below

ARCHIVE_DIR = REPO_ROOT / ".cache" / "cds"
TRAINING_EVENTS = 500         # which classes load does not depend on how many events
# A JDK replaced in place (same path, other build) makes the JVM refuse the archive: it then
# runs without it, and this keeps its one-line warning out of the job's output.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def driver_class_path() -> str:
    from common.jars import spark_extra_jars

    return ":".join(spark_extra_jars())


def _java() -> Path:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(java).resolve() if java else Path("java")


def archive_path() -> Path:
    """Where the archive for this JVM and classpath lives (it may not exist)."""
    import pyspark

    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    ident = "\n".join([str(_java()), str(_java().stat().st_mtime_ns) if _java().exists() else "",
                       pyspark.__version__, *jars, driver_class_path()])
    return ARCHIVE_DIR / f"driver-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.jsa"


def driver_options(enabled: bool = True) -> str:
    """JVM flags that map the archive, or "" when it is off or not built."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if enabled and path.is_file() else ""


def _train(target: Path) -> None:
    """Run the real pipeline on a small sample in a scratch lakehouse, in a JVM that dumps every
    class it loaded when it exits."""
    from common.config import load_config
    from common.spark import build_spark, jvm_options

    scratch = Path(tempfile.mkdtemp(prefix="lakehouse-cds-"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")}
    env.update(LAKEHOUSE_ROOT=str(scratch / "lakehouse"), KAFKA_DATA_DIR=str(scratch / "kafka"),
               TRIGGER="available-now", SOURCE="files", LAKEHOUSE__GOLD__STATS_TO_KAFKA="false")
    try:
        subprocess.run([sys.executable, "-m", "bronze.generator", "-n", str(TRAINING_EVENTS),
                        "--seed", "7"], env=env, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL)
        cfg = load_config(env=env)
        dump = f"{jvm_options(cfg, archive=False)} -XX:ArchiveClassesAtExit={target} {QUIET}"
        spark = build_spark(cfg, "class-archive", {"spark.driver.extraJavaOptions": dump})
        from pipeline.cli import main as pipeline

        code = pipeline(["--layer", "all"], spark=spark, env=env)
        if code != 0:
            raise SystemExit(f"error: the training run of the pipeline failed (exit {code})")
        jvm = spark.sparkContext._gateway.proc
        spark.stop()
        # The JVM writes the archive as it exits, which it does when its stdin closes.
        jvm.stdin.close()
        jvm.wait(timeout=300)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class ArchiveError(LakehouseError, RuntimeError):
    pass


def build(force: bool = False) -> Path:
    path = archive_path()
    if path.is_file() and not force:
        return path
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    started = time.monotonic()
    log = ARCHIVE_DIR / "build.log"
    logger.info(f"class archive: a short pipeline run records the classes it loads (log: {log.relative_to(REPO_ROOT)})")
    # A child process, so the JVM that dumps is not this process's; its output goes to the log.
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-c", "import sys; from common.class_archive import _train; "
                               "from pathlib import Path; _train(Path(sys.argv[1]))", str(partial)],
                              cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-30:])
        raise ArchiveError(f"{tail}\nwarning: building the class archive failed (exit {done.returncode}); "
                           f"whole log: {log}. Jobs run without it, only slower to start.")
    partial.replace(path)          # atomic: a JVM starting now sees the whole archive or none
    for old in ARCHIVE_DIR.glob("driver-*"):
        if old != path:
            old.unlink(missing_ok=True)
    logger.info(f"class archive: {path.relative_to(REPO_ROOT)} "
                f"({path.stat().st_size >> 20} MB, {time.monotonic() - started:.0f} s)")
    return path


def main(argv=None, prog: str = "common.class_archive") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--force", action="store_true", help="rebuild even if an archive for this JVM exists")
    p.add_argument("--path", action="store_true", help="print where the archive is (or would be) and exit")
    args = p.parse_args(argv)
    if args.path:
        print(archive_path())
        return 0
    configure()
    try:
        build(args.force)
    except ArchiveError as e:      # an optimisation: setup goes on without it
        print(e, file=sys.stderr)      # the build log's tail, then the warning: not one log line
    return 0


if __name__ == "__main__":
    sys.exit(main())
