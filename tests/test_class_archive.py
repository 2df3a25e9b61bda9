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


def test_the_code_generator_is_loaded_unsigned_so_the_archive_holds_it(spark):
    """CDS skips every class of a signed jar, and pyspark's janino and commons-compiler are
    signed: each JVM loaded and verified their ~370 classes from the jars. The driver's
    classpath starts with unsigned copies, so their classes are defined from those."""
    from common.jars import UNSIGNED

    for name in ("org.codehaus.janino.SimpleCompiler", "org.codehaus.commons.compiler.CompileException"):
        cls = spark._jvm.java.lang.Class.forName(name)
        assert cls.getSigners() is None, name
        jar = cls.getProtectionDomain().getCodeSource().getLocation().getPath()
        assert jar.startswith(str(UNSIGNED) + "/"), (name, jar)


def test_unsigned_copies_hold_every_entry_of_the_signed_jar_but_its_signature():
    import zipfile
    from pathlib import Path

    import pyspark

    from common.jars import make_unsigned_copies, unsigned_jars

    shipped = Path(pyspark.__file__).parent / "jars"
    made = make_unsigned_copies()          # idempotent: setup made them already
    assert {p.name for p in made} >= {j.name for j in shipped.glob("janino-*.jar")}
    assert unsigned_jars() == [str(p) for p in sorted(made)]
    for copy in made:
        with zipfile.ZipFile(shipped / copy.name) as signed, zipfile.ZipFile(copy) as plain:
            signature = {n for n in signed.namelist()
                         if n.startswith("META-INF/") and n.rsplit(".", 1)[-1] in ("SF", "RSA", "DSA", "EC")}
            assert signature, f"{copy.name} was not signed"
            assert set(plain.namelist()) == set(signed.namelist()) - signature
            assert all(plain.read(n) == signed.read(n) for n in plain.namelist())


def test_an_archive_built_for_other_jars_is_reported_once_and_not_mapped(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", tmp_path)
    monkeypatch.setattr(class_archive, "archive_path", lambda: tmp_path / "driver-0123456789abcdef.jsa")
    monkeypatch.setattr(class_archive, "_warned", set())
    assert class_archive.driver_options() == ""
    assert not caplog.records                      # none built at all: a fresh clone before setup
    (tmp_path / "driver-fedcba9876543210.jsa").write_bytes(b"")
    assert class_archive.driver_options() == class_archive.driver_options() == ""
    assert [r.getMessage() for r in caplog.records if "class archive" in r.getMessage()] == [
        f"the class archive in {tmp_path} was built for another JDK or other jars: the JVM starts "
        "without it, several seconds slower (`make setup` rebuilds it)"]
    assert class_archive.driver_options(enabled=False) == ""
