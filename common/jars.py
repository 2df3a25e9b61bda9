"""The JVM jars Maven fetched at setup (.cache/jars), as Spark and the Kafka broker need them."""
from __future__ import annotations

import functools
import re
from pathlib import Path

from common.errors import JobError
from common.config import REPO_ROOT

JAR_CACHE = REPO_ROOT / ".cache" / "jars"
UNSIGNED = JAR_CACHE / "unsigned"
_VERSIONED = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")
_SIGNATURE = re.compile(r"^META-INF/[^/]+\.(SF|RSA|DSA|EC)$", re.IGNORECASE)


class MissingJarsError(JobError):
    pass


def _artifact(jar: Path) -> str:
    m = _VERSIONED.match(jar.name)
    return m.group("artifact") if m else jar.stem


def _require(folder: Path, what: str) -> list[Path]:
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise MissingJarsError(f"no {what} jars in {folder}: run `make setup` (Maven fetches them once)")
    return jars


@functools.cache
def pyspark_jars() -> tuple[Path, ...]:
    """The jars pyspark ships (they do not change while a process runs)."""
    import pyspark

    return tuple(sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar")))


def _not_shipped(folder: Path, what: str) -> list[str]:
    """The folder's jars (at least one, or a clear error) whose artifact pyspark does not ship."""
    shipped = {_artifact(j) for j in pyspark_jars()}
    return [str(j) for j in _require(folder, what) if _artifact(j) not in shipped]


def spark_extra_jars() -> list[str]:
    """Delta + Kafka connector jars, minus artifacts pyspark already ships.

    Maven's runtime closure also brings older copies of jackson, hadoop, parquet, scala...;
    two versions of one artifact on the classpath break Spark, so pyspark's copy wins.
    """
    return _not_shipped(JAR_CACHE / "spark", "Spark (Delta/Kafka)")


def unsigned_jars() -> list[str]:
    """The unsigned copies of pyspark's signed jars (janino and commons-compiler, Spark's code
    generator), for the front of the driver's classpath. The class archive (common/class_archive.py)
    cannot hold a class from a signed jar: every driver JVM loaded and verified their ~370
    classes from the jars. A copy is used only while pyspark ships a jar of its exact name."""
    shipped = {j.name for j in pyspark_jars()}
    return [str(j) for j in sorted(UNSIGNED.glob("*.jar")) if j.name in shipped]


def make_unsigned_copies() -> list[Path]:
    """Copy each signed jar pyspark ships without its signature files (make setup, before the
    class archive is built); copies of jars pyspark no longer ships are removed. Idempotent."""
    import zipfile

    UNSIGNED.mkdir(parents=True, exist_ok=True)
    made = []
    for jar in pyspark_jars():
        target = UNSIGNED / jar.name
        with zipfile.ZipFile(jar) as signed:
            entries = signed.infolist()
            if not any(_SIGNATURE.match(e.filename) for e in entries):
                continue
            made.append(target)
            if target.is_file() and target.stat().st_mtime >= jar.stat().st_mtime:
                continue
            partial = target.with_name(target.name + ".partial")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as copy:
                for entry in entries:
                    if not _SIGNATURE.match(entry.filename):
                        copy.writestr(entry, signed.read(entry.filename))
            partial.replace(target)     # a JVM starting now sees the whole copy or none
    for old in UNSIGNED.glob("*.jar"):
        if old not in made:
            old.unlink()
    return made


def register_java_function(spark, name: str, class_name: str, return_type, what: str) -> None:
    """Register a Java function built at setup (jvm/<what>) in this session once (a temporary
    function, session-scoped); a clear error naming `make setup` when its jar is not there."""
    from pyspark.errors import AnalysisException

    if spark.catalog.functionExists(name):
        return
    try:
        spark.udf.registerJavaFunction(name, class_name, return_type)
    except AnalysisException as e:
        raise MissingJarsError(f"{class_name} is not on Spark's classpath (jvm/{what}): "
                               f"run `make setup`, which builds it ({e.getMessage()})") from None


def s3a_jars() -> list[str]:
    """hadoop-aws and the AWS SDK bundle, for sessions whose paths are s3a:// only."""
    return _not_shipped(JAR_CACHE / "s3a", "s3a (hadoop-aws)")


def s3proxy_jar() -> str:
    return str(_require(JAR_CACHE / "s3proxy", "S3Proxy")[0])


def kafka_broker_classpath() -> str:
    return ":".join(str(j) for j in _require(JAR_CACHE / "kafka", "Kafka broker"))
