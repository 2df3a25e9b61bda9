"""The driver JVM's class-data sharing archive (AppCDS), built once by `make setup`.

A pipeline's JVM loads about 27,000 classes (Spark, Delta, Scala, Jackson...). Read from jars,
verified and parsed one by one, they are most of the 8-10 s a session takes to start and most
of why the first Delta write, MERGE and streaming batch of a fresh JVM are slow. A dynamic CDS
archive holds those classes already parsed and verified, mapped from one file: measured on this
machine, session start + first write + MERGE + one streaming batch took 35 s without it and
18 s with it (C1 JIT; 25 s with the tiered JIT). Every driver JVM (jobs, tests, tools) gains.

CDS skips every class of a signed jar, and pyspark ships two: janino and commons-compiler, Spark's
code generator, which every run uses. Setup copies them without their signature files
(common.jars.make_unsigned_copies) to the front of the driver's classpath, so the archive holds
their ~370 classes too: a fresh 20,000-event run-all and a 1M-event incremental one each took
1.2-2 s less.

The archive is valid only for the JVM and classpath it was dumped with, so its name carries a
hash of both; a JDK or jar change just means no archive (the JVM then loads classes as usual)
until the next `make setup`. The Delta and Kafka jars go on the driver's application classpath
(spark.driver.extraClassPath) rather than only spark.jars, because CDS archives only classes of
the JDK's own class loaders.
Built by pipeline/class_archive.py, which runs the pipeline to record what it loads.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from common.config import REPO_ROOT

ARCHIVE_DIR = REPO_ROOT / ".cache" / "cds"
# A JDK replaced in place (same path, other build) makes the JVM refuse the archive: it then
# runs without it, and this keeps its one-line warning out of the job's output.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def driver_class_path() -> str:
    from common.jars import spark_extra_jars, unsigned_jars

    # The unsigned copies first: their classes are found there, not in pyspark's signed jars.
    return ":".join(unsigned_jars() + spark_extra_jars())


def _java() -> Path:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(java).resolve() if java else Path("java")


def archive_path() -> Path:
    """Where the archive for this JVM and classpath lives (it may not exist)."""
    import pyspark

    from common.jars import pyspark_jars

    jars = [p.name for p in pyspark_jars()]
    # The JVM refuses an archive once a jar on its classpath is rewritten (setup re-fetches or
    # rebuilds them under the same names), so the name carries each jar's size and time too.
    stamps = [_stamp(j) for j in driver_class_path().split(":") if j]
    ident = "\n".join([str(_java()), str(_java().stat().st_mtime_ns) if _java().exists() else "",
                       pyspark.__version__, *jars, *stamps])
    return ARCHIVE_DIR / f"driver-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.jsa"


def _stamp(jar: str) -> str:
    try:
        st = os.stat(jar)
    except OSError:
        return jar
    return f"{jar}:{st.st_size}:{st.st_mtime_ns}"


_warned: set[Path] = set()


def driver_options(enabled: bool = True) -> str:
    """JVM flags that map the archive, or "" when it is off or not built. An archive built for
    another JDK or classpath says the jars changed since setup: every JVM then starts slower
    (unnoticed for hours here: a 20,000-event plain baseline took 32.6 s without it, 22.7 and
    24.5 s once rebuilt), so say so, once per process."""
    path = archive_path()
    if enabled and path.is_file():
        return f"-XX:SharedArchiveFile={path} {QUIET}"
    if enabled and path not in _warned and any(ARCHIVE_DIR.glob("driver-*.jsa")):
        import logging

        _warned.add(path)
        logging.getLogger(__name__).warning(
            "the class archive in %s was built for another JDK or other jars: the JVM starts without "
            "it, several seconds slower (`make setup` rebuilds it)", ARCHIVE_DIR)
    return ""
