"""Local paths go through jvm/localfs (Java's file API), not Hadoop's shell-outs: the session
uses it for both Hadoop APIs, and it behaves as Hadoop's local file system does where Spark,
Delta and the checkpoints rely on it (permissions, checksums, renames, symbolic links)."""
from __future__ import annotations

import os
import stat

import pytest
from py4j.protocol import Py4JJavaError

from common.spark import LOCAL_FS, LOCAL_FS_CONTEXT


def jpath(spark, path) -> object:
    return spark._jvm.org.apache.hadoop.fs.Path(f"file://{path}")


def file_system(spark):
    jvm = spark._jvm
    return jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())


def file_context(spark):
    jvm = spark._jvm
    return jvm.org.apache.hadoop.fs.FileContext.getFileContext(jvm.java.net.URI("file:///"),
                                                              spark._jsc.hadoopConfiguration())


def test_the_session_reads_and_writes_local_paths_through_the_nio_file_system(spark):
    assert file_system(spark).getClass().getName() == LOCAL_FS
    assert file_context(spark).getDefaultFileSystem().getClass().getName() == LOCAL_FS_CONTEXT


def test_created_files_get_the_permission_asked_for_and_a_checksum(spark, tmp_path):
    fs = file_system(spark)
    perm = spark._jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o640)
    out = fs.create(jpath(spark, tmp_path / "a.txt"), perm, True, 4096, 1, 1 << 20, None)
    out.write(bytearray(b"hello"))
    out.close()
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640
    assert (tmp_path / ".a.txt.crc").is_file()      # Hadoop's checksum file, as before
    fs.setPermission(jpath(spark, tmp_path / "a.txt"),
                     spark._jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o604))
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o604
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        fs.setPermission(jpath(spark, tmp_path / "missing"),
                         spark._jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o644))


def test_file_context_renames_refuse_an_existing_target(spark, tmp_path):
    fc = file_context(spark)
    for name in ("src", "dst"):
        (tmp_path / name).write_text(name)
    no_options = spark.sparkContext._gateway.new_array(spark._jvm.org.apache.hadoop.fs.Options.Rename, 0)
    # Spark's checkpoint manager and Delta's log store rename without overwrite: an existing
    # target (another writer's commit) must be refused, not replaced.
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        fc.rename(jpath(spark, tmp_path / "src"), jpath(spark, tmp_path / "dst"),
                  no_options)
    assert (tmp_path / "dst").read_text() == "dst"
    fc.rename(jpath(spark, tmp_path / "src"), jpath(spark, tmp_path / "moved"),
              no_options)
    assert (tmp_path / "moved").read_text() == "src" and not (tmp_path / "src").exists()



def status_of(spark, impl: str, path) -> tuple | str:
    """FileContext's link status of path with the given AbstractFileSystem for file:."""
    jvm = spark._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    conf.set("fs.AbstractFileSystem.file.impl", impl)
    fc = jvm.org.apache.hadoop.fs.FileContext.getFileContext(jvm.java.net.URI("file:///"), conf)
    assert fc.getDefaultFileSystem().getClass().getName() == impl
    try:
        st = fc.getFileLinkStatus(jpath(spark, path))
    except Py4JJavaError as e:
        return e.java_exception.getClass().getName()
    return st.isSymlink(), st.isDirectory(), st.getLen(), st.getModificationTime()


def test_link_status_is_what_hadoops_own_local_fs_says(spark, tmp_path):
    (tmp_path / "file").write_text("12345")
    (tmp_path / "dir").mkdir()
    os.symlink(tmp_path / "file", tmp_path / "link")
    for name in ("file", "dir", "link", "missing"):
        ours = status_of(spark, LOCAL_FS_CONTEXT, tmp_path / name)
        assert ours == status_of(spark, "org.apache.hadoop.fs.local.LocalFs", tmp_path / name), name
    assert status_of(spark, LOCAL_FS_CONTEXT, tmp_path / "missing") == "java.io.FileNotFoundException"
