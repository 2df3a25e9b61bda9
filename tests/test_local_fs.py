"""Local paths go through jvm/localfs (Java's file API), not Hadoop's shell-outs: the session
uses it for both Hadoop APIs, and it behaves as Hadoop's local file system does where Spark,
Delta and the checkpoints rely on it (permissions, checksums, renames, symbolic links). Delta
commits to local tables through its log store, which stays put-if-absent across processes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from common.spark import LOCAL_FS, LOCAL_FS_CONTEXT, LOCAL_LOG_STORE


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


def test_delta_commits_local_tables_through_the_link_log_store(spark, tmp_path):
    jvm = spark._jvm
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(tmp_path)).store()
    assert store.getDelegate(jpath(spark, tmp_path)).logStoreImpl().getClass().getName() == LOCAL_LOG_STORE


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


RACE = Path(__file__).resolve().parent / "support" / "commit_race.py"
WINS = 150     # commits each writer makes; at about 2 ms a try, both race through the same versions


def race(action: str, root: Path, env: dict[str, str], *extra: str) -> dict[str, object]:
    """Two processes doing `action` on one table at once (support/commit_race.py): what each printed."""
    start = root.parent / f"start-{root.name}"
    procs = {w: subprocess.Popen([sys.executable, str(RACE), action, str(root), w, str(start), *extra],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in ("a", "b")}
    try:
        deadline = time.monotonic() + 300
        while not all(Path(f"{start}.{w}.ready").exists() for w in procs):
            failed = {w: p.stderr.read()[-3000:] for w, p in procs.items() if p.poll() is not None}
            assert not failed, failed
            assert time.monotonic() < deadline, "the writers' sessions did not start"
            time.sleep(0.05)
        start.touch()
        out = {}
        for w, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr[-3000:]
            out[w] = json.loads(stdout.strip().splitlines()[-1])
        return out
    finally:
        for p in procs.values():
            p.kill()


def test_two_processes_committing_to_one_delta_log_never_both_win_a_version(spark, tmp_path, env):
    # run-bronze, run-silver and run-gold are separate applications that all commit to the ops
    # tables. Delta's default local log store checks and renames under a lock of its own JVM, and a
    # local rename replaces: a CI run lost a dq_results commit and was left with another writer's
    # .crc beside it, unreadable for good. With it, this test saw 23 to 78 of 300 commits lost.
    # A race can run its writers one after the other (one stalled for a moment): then it is
    # run again, its results checked all the same, until one where they ran at once.
    for attempt in range(3):
        table = tmp_path / f"table-{attempt}"
        log_dir = table / "_delta_log"
        log_dir.mkdir(parents=True)
        won = race("commits", table, env, "--wins", str(WINS))
        a, b = set(won["a"]), set(won["b"])
        assert len(a) == len(b) == WINS
        assert not a & b, f"both writers were told they committed versions {sorted(a & b)[:10]}"
        assert {int(f.stem) for f in log_dir.glob("*.json")} == a | b == set(range(2 * WINS))
        # Each commit is its winner's, checksum included (Hadoop's local file system verifies it).
        rows = (spark.read.text(f"file://{log_dir}/*.json")
                .selectExpr("regexp_extract(input_file_name(), '(\\\\d+)\\\\.json$', 1) AS v", "value").collect())
        commits = {int(r.v): json.loads(r.value)["commitInfo"] for r in rows}
        assert {v: c["writer"] for v, c in commits.items()} == {v: "a" if v in a else "b" for v in a | b}
        assert all(c["version"] == v for v, c in commits.items())
        assert not [f.name for f in log_dir.iterdir() if ".tmp" in f.name]
        if min(a) < max(b) and min(b) < max(a):
            break
    else:
        pytest.fail("in three races the writers never ran at once")


def test_two_applications_starting_at_once_both_set_up_the_shared_ops_table(tmp_path, env):
    # Both create ops.dq_results, as run-silver and run-gold do on a new lakehouse: one commit
    # wins, and the other application finds the table made and goes on (without the retry it
    # failed on Delta's ProtocolChangedException, every time this was tried).
    versions = race("setup", tmp_path / "lakehouse", env)
    assert versions == {"a": 0, "b": 0}
    log = tmp_path / "lakehouse" / "ops" / "dq_results" / "_delta_log"
    assert sorted(f.name for f in log.glob("*.json")) == [f"{0:020d}.json"]
