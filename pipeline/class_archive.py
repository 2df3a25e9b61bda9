"""Build the driver JVM's class-data sharing archive (make setup does): a short run of the real
pipeline in a scratch lakehouse, in a JVM that dumps every class it loaded when it exits. What the
archive is and how every driver maps it: common/class_archive.py.

    python -m pipeline.class_archive [--force] [--path]
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.class_archive import ARCHIVE_DIR, QUIET, archive_path
from common.config import REPO_ROOT
from common.errors import LakehouseError
from common.log import configure

logger = logging.getLogger(__spec__.name)   # `log` is the build log's path below

TRAINING_EVENTS = 500         # which classes load does not depend on how many events


def _train(target: Path) -> None:
    """Run the real pipeline on a small sample in a scratch lakehouse, in a JVM that dumps every
    class it loaded when it exits."""
    from common.config import load_config
    from common.internals import driver_jvm_process
    from common.spark import build_spark, jvm_options, stop

    scratch = Path(tempfile.mkdtemp(prefix="lakehouse-cds-"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("LANDING", "CHECKPOINT_ROOT", "REFERENCE_DIR", "SOURCE", "TRIGGER")}
    env.update(LAKEHOUSE_ROOT=str(scratch / "lakehouse"), KAFKA_DATA_DIR=str(scratch / "kafka"),
               TRIGGER="available-now", SOURCE="files", LAKEHOUSE__GOLD__STATS_TO_KAFKA="false")
    try:
        subprocess.run([sys.executable, "-m", "tools.generator", "-n", str(TRAINING_EVENTS),
                        "--seed", "7"], env=env, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL)
        cfg = load_config(env=env)
        dump = f"{jvm_options(cfg, archive=False)} -XX:ArchiveClassesAtExit={target} {QUIET}"
        spark = build_spark(cfg, "class-archive", {"spark.driver.extraJavaOptions": dump})
        from pipeline.cli import main as pipeline

        code = pipeline(["--layer", "all"], spark=spark, env=env)
        if code != 0:
            raise SystemExit(f"error: the training run of the pipeline failed (exit {code})")
        jvm = driver_jvm_process(spark)
        stop(spark)
        # The JVM writes the archive as it exits, which it does when its stdin closes.
        jvm.stdin.close()
        jvm.wait(timeout=300)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class ArchiveError(LakehouseError, RuntimeError):
    pass


def build(force: bool = False) -> Path:
    import zipfile

    from common.jars import make_unsigned_copies

    try:
        make_unsigned_copies()        # they are on the classpath the archive is valid for
    except (OSError, zipfile.BadZipFile) as e:   # an optimisation too: the signed jars still work
        logger.warning(f"class archive: no unsigned copies of pyspark's signed jars ({e}); "
                       "the archive will not hold their classes")
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
        done = subprocess.run([sys.executable, "-c", "import sys; from pipeline.class_archive import _train; "
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


def main(argv=None, prog: str = "pipeline.class_archive") -> int:
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
