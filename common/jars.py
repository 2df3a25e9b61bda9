"""The JVM jars Maven fetched at setup (.cache/jars), as Spark and the Kafka broker need them."""
from __future__ import annotations

import re
from pathlib import Path

from common.errors import JobError
from common.config import REPO_ROOT

JAR_CACHE = REPO_ROOT / ".cache" / "jars"
_VERSIONED = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


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


def spark_extra_jars() -> list[str]:
    """Delta + Kafka connector jars, minus artifacts pyspark already ships.

    Maven's runtime closure also brings older copies of jackson, hadoop, parquet, scala...;
    two versions of one artifact on the classpath break Spark, so pyspark's copy wins.
    """
    import pyspark

    shipped = {_artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in _require(JAR_CACHE / "spark", "Spark (Delta/Kafka)")
            if _artifact(j) not in shipped]


def s3a_jars() -> list[str]:
    """hadoop-aws and the AWS SDK bundle, for sessions whose paths are s3a:// only."""
    import pyspark

    shipped = {_artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in _require(JAR_CACHE / "s3a", "s3a (hadoop-aws)") if _artifact(j) not in shipped]


def s3proxy_jar() -> str:
    return str(_require(JAR_CACHE / "s3proxy", "S3Proxy")[0])


def kafka_broker_classpath() -> str:
    return ":".join(str(j) for j in _require(JAR_CACHE / "kafka", "Kafka broker"))
