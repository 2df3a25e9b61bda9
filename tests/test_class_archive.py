"""The driver JVM maps the class archive `make setup` built, and only when conf says so."""
from __future__ import annotations

import psutil

from common import class_archive
from common.config import load_config
from common.spark import jvm_options, spark_conf


def test_the_driver_jvm_maps_the_class_archive(spark):
    archive = class_archive.archive_path()
    assert archive.is_file(), f"{archive} missing: `make setup` builds it"
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    # A JVM that refuses an archive (other JDK, other classpath) unmaps it and loads from jars.
    assert str(archive) in {m.path for m in psutil.Process(pid).memory_maps()}
    # Delta is on the driver's own classpath, where the archive can hold its classes.
    loader = spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable").getClassLoader()
    assert loader.equals(spark._jvm.java.lang.ClassLoader.getSystemClassLoader())


def test_the_archive_is_named_for_its_jvm_and_classpath_and_can_be_turned_off(env):
    on = jvm_options(load_config(env=env))
    assert f"-XX:SharedArchiveFile={class_archive.archive_path()}" in on
    off = jvm_options(load_config(env={**env, "LAKEHOUSE__SPARK__CLASS_ARCHIVE": "false"}))
    assert "SharedArchiveFile" not in off and off.startswith("-Duser.timezone=UTC")
    assert spark_conf(load_config(env=env))["spark.driver.extraClassPath"] == class_archive.driver_class_path()
    assert class_archive.archive_path().name.startswith("driver-")
