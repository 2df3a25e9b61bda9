"""The lakehouse on object storage: every path s3a://, against a real S3-compatible server
(S3Proxy from the Maven cache, on a free port) that Spark's s3a connector talks HTTP to.

One chaos run on s3a covers the pipeline end to end: landing files written to the bucket,
bronze, silver and gold as one application, kill -9 of that process mid-batch and restarts
(each restart takes over the dead process's checkpoint leases once they expire), an
available-now drain, `python -m audit` passing on s3a, byte-exact bronze, and `make report`
writing its page to the bucket. A second test
holds the checkpoint lease and checks that another instance is refused before Spark starts.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# A lease the next start cannot prove dead (its holder ran elsewhere) expires after this. Longer
# than a pipeline process takes to import its layers and reach the lock (about 10 s).
LEASE_TTL = "20 seconds"
SHORT_LEASE_TTL = "8 seconds"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    from tools.processes import free_port
    from tools.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3"), free_port(), "lakehouse")
    server.load_credentials(environ={})   # a fresh random key pair, as `make s3-up` draws one
    server.start(timeout=90)
    yield server
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture
def s3_env(env, s3_server, monkeypatch) -> dict[str, str]:
    """A test's lakehouse under its own prefix of the bucket; this process can reach it too."""
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return dict(env, **s3_server.env(), LAKEHOUSE_ROOT=s3_server.uri(f"{prefix}/lakehouse"),
                LAKEHOUSE__OBJECT_STORE__LEASE_TTL=LEASE_TTL)


def test_config_takes_s3a_paths_and_refuses_other_schemes(s3_env):
    from common.config import ConfigError, load_config
    from common.spark import spark_conf
    from common.storage import ObjectPath

    cfg = load_config(env=s3_env)
    assert isinstance(cfg.root, ObjectPath) and cfg.on_object_store
    assert cfg.table_path("gold", "device_sessions") == f"{s3_env['LAKEHOUSE_ROOT']}/gold/device_sessions"
    assert cfg.checkpoint("silver") == f"{s3_env['LAKEHOUSE_ROOT']}/_checkpoints/silver"
    conf = spark_conf(cfg)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == s3_env["S3_ENDPOINT"]
    # A local master's tasks run in the driver's JVM: the connector is on its class path and
    # not copied to every run's temp folder (its AWS SDK bundle is 641 MB); a cluster gets it sent.
    assert cfg.spark.master.startswith("local") and "spark.jars" not in conf
    assert "hadoop-aws" in conf["spark.driver.extraClassPath"]
    shipped = spark_conf(cfg, ship_jars=True)
    assert "hadoop-aws" in shipped["spark.jars"]
    assert not any("secret" in k.lower() or s3_env["AWS_SECRET_ACCESS_KEY"] in v for k, v in shipped.items())
    local = spark_conf(load_config(env=dict(s3_env, LAKEHOUSE_ROOT="/tmp/x")), ship_jars=True)
    assert "hadoop-aws" not in local["spark.jars"] and "fs.s3a" not in " ".join(local)
    with pytest.raises(ConfigError, match="paths.lakehouse_root.*s3:// paths are not supported"):
        load_config(env=dict(s3_env, LAKEHOUSE_ROOT="s3://bucket/x"))


@pytest.mark.slow
def test_pipeline_on_s3a_survives_kill_dash_nine_and_audits(s3_env, s3_server, tmp_path):
    report = tmp_path / "chaos.json"
    seed = int(os.environ.get("CHAOS_SEED") or 4242)
    proc = subprocess.run([sys.executable, "-m", "chaos", "--mode", "app", "--kills", "2", "--seed", str(seed),
                           "--root", s3_env["LAKEHOUSE_ROOT"], "--logs", str(tmp_path / "logs"),
                           "--report", str(report)],
                          cwd=REPO, env=s3_env, capture_output=True, text=True, timeout=1800)
    print(proc.stdout[-15000:])
    assert report.exists(), f"chaos wrote no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    summary = json.loads(report.read_text())
    assert len(summary["kills"]) == 2 and summary["unexpected_exits"] == [], summary
    assert summary["drain_exit"] == 0, f"drain failed; see {summary['drain_log']}"
    failed = [c for c in summary["checks"] if not c["ok"]]
    assert not failed, failed
    names = [c["name"] for c in summary["checks"]]
    assert "bronze: raw bytes unchanged" in names and "audit passes" in names, names
    assert summary["audit_exit"] == 0, summary["audit_failures"]
    # A start after a kill found the killed process's lease and took it over: at once, the process
    # and its JVM being gone, or, when the start reached the lock later than the lease's expiry
    # (a loaded machine), as expired. (The takeover at once is proven apart, below.)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "lease held by" in logs and ": taken over" in logs
    assert proc.returncode == 0, proc.stderr[-4000:]

    # The objects are in the server's bucket, not in some local folder named "s3a:".
    prefix = s3_env["LAKEHOUSE_ROOT"].removeprefix(f"s3a://{s3_server.bucket}/")
    stored = s3_server.data_dir / "objects" / s3_server.bucket / prefix
    for part in ("bronze/events/_delta_log", "gold/device_sessions/_delta_log", "_checkpoints/silver/commits",
                 "landing/nest"):
        assert (stored / part).is_dir(), part
    assert not (REPO / "s3a:").exists() and not (Path.cwd() / "s3a:").exists()

    # make report on the same lakehouse, its page written to the bucket too.
    reports = f"{s3_env['LAKEHOUSE_ROOT']}-reports"
    rep = subprocess.run([sys.executable, "-m", "tools.report"], cwd=REPO, env=dict(s3_env, REPORTS_DIR=reports),
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert "SLF4J" not in rep.stderr, rep.stderr[-3000:]     # the AWS SDK's shaded logging's notice
    assert f"wrote {reports}/index.html" in rep.stdout
    page = stored.parent / "lakehouse-reports" / "index.html"
    assert page.is_file() and "Lakehouse report: s3a://" in page.read_text()


def test_a_second_instance_on_an_s3a_checkpoint_is_refused(s3_env, logged, lock_holder):
    from common.checkpoint_lock import CheckpointBusy, CheckpointLocks, live_leases
    from common.config import load_config
    from common.storage import location

    # No restart has to meet a dead lease here before it expires (the chaos run's reason for
    # LEASE_TTL): a shorter one makes each refusal and the takeover below wait less.
    s3_env = dict(s3_env, LAKEHOUSE__OBJECT_STORE__LEASE_TTL=SHORT_LEASE_TTL)
    cfg = load_config(env=s3_env)
    lease = location(cfg.checkpoint("silver")).with_name("silver.lease")
    with CheckpointLocks(cfg, ["silver"]):
        assert json.loads(lease.read_text())["owner"].startswith(f"pid {os.getpid()} ")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pipeline", "--layer", "silver"], cwd=REPO, env=s3_env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "in use by pid" in proc.stderr and "renews its lease" in proc.stderr, proc.stderr
        assert "SparkSession" not in proc.stderr  # refused before Spark starts
        assert time.monotonic() - started < 60
        # Delta's S3 log store allows one writing driver: maintenance from another process waits.
        maint = subprocess.run([sys.executable, "-m", "pipeline.maintenance"], cwd=REPO, env=s3_env,
                               capture_output=True, text=True, timeout=120)
        assert maint.returncode == 2 and "holds checkpoints" in maint.stderr, maint.stderr
    assert not lease.exists(), "a clean stop deletes its lease"

    # A holder killed with -9 leaves its lease. It ran on this machine and nothing it started
    # runs: the next instance takes the lease over at once, without waiting for it to expire.
    with lock_holder(s3_env) as holder:
        assert [h for h in live_leases(cfg) if f"pid {holder.pid} " in h]
    assert lease.exists() and live_leases(cfg) == []     # maintenance need not wait for it either
    logged.clear()
    started = time.monotonic()
    with CheckpointLocks(cfg, ["silver"]):
        waited = time.monotonic() - started
        assert json.loads(lease.read_text())["owner"].startswith(f"pid {os.getpid()} ")
    assert any("no longer runs on this machine: taken over" in m for m in logged.messages), logged.messages
    assert waited < cfg.object_store.lease_settle.seconds + 3
    assert not any("waiting up to" in m for m in logged.messages)

    # A process the dead holder started still runs (a job's JVM, finishing what it wrote), started
    # after it took the lease (a pipeline's) or before (a refresh's): the lease is watched until
    # it expires, then taken over; or, when that process ends while it is watched (a JVM still
    # dying when a restart looked), as soon as it has.
    ttl = cfg.object_store.lease_ttl.seconds
    for child, dies_after in (("before", None), ("after", 2.0)):
        with lock_holder(s3_env, child=child) as holder:
            pass
        logged.clear()
        killer = dies_after and threading.Timer(dies_after, os.kill, (holder.child, signal.SIGKILL))
        try:
            assert [h for h in live_leases(cfg) if f"pid {holder.pid} " in h], child
            started = time.monotonic()
            if killer:
                killer.start()
            with CheckpointLocks(cfg, ["silver"]):
                waited = time.monotonic() - started
        finally:
            if killer:
                killer.join()
            with contextlib.suppress(ProcessLookupError):     # (the timer's kill ended it)
                os.kill(holder.child, signal.SIGKILL)
        assert any("waiting up to" in m for m in logged.messages), (child, logged.messages)
        if dies_after:
            assert any("which no longer runs on this machine: taken over" in m for m in logged.messages), logged.messages
            assert dies_after <= waited < ttl / 2, waited
        else:
            assert ttl / 2 < waited <= ttl + 5, child

    # A lease from another machine (another boot of a kernel) is watched until it expires too.
    with CheckpointLocks(cfg, ["silver"]):
        held = json.loads(lease.read_text())
    logged.clear()
    lease.write_text(json.dumps(dict(held, owner="pid 1 on elsewhere", expires=time.time() + 6,
                                     process=dict(held["process"], boot="another-boot"))))
    started = time.monotonic()
    with CheckpointLocks(cfg, ["silver"]):
        waited = time.monotonic() - started
    assert any("lease held by pid 1 on elsewhere; waiting up to" in m for m in logged.messages), logged.messages
    assert waited >= 5
    with pytest.raises(CheckpointBusy):   # the lease is ours while held: a rival is refused
        with CheckpointLocks(cfg, ["silver"]):
            CheckpointLocks(cfg, ["silver"]).__enter__()
