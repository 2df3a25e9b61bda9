"""The unchanged jobs on a real Spark standalone cluster give the same gold tables as local mode.

A master and two workers (1 core each) run on 127.0.0.1 from the launcher pyspark ships. The same
generated landing data goes into two lakehouse roots; `python -m pipeline` (available-now, one application)
runs once through `spark-submit --master spark://127.0.0.1:<port> --properties-file` (the
docs/cluster.md's line: the submit's master wins over conf) and once with SPARK_MASTER=local[2], side by side, and
the three gold tables must hold the same rows. The daemons, the executors they fork and the job
drivers must all be gone afterwards.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cluster import StandaloneCluster
from tools.processes import kill_tree, processes_using, with_jvm_options
from common.spark import C1_ONLY

REPO = Path(__file__).resolve().parent.parent
GOLD = ("zip_hourly_sightings", "device_activity", "device_sessions")
APPS = ("nest-lakehouse:bronze+silver+gold",)   # the one pipeline application
RUN_TIMEOUT = 600
@pytest.fixture
def cluster(tmp_path):
    c = StandaloneCluster(tmp_path / "spark-cluster", workers=2, worker_cores=1, worker_memory="1536m",
                          java_options=C1_ONLY)
    try:
        yield c.start(timeout=120)
    finally:
        c.stop()


def _start_pipeline(env: dict, root: Path, master: str, submit: bool = False) -> subprocess.Popen:
    # Every JVM here is short-lived (one available-now run): C1 only roughly halves the run.
    env = dict(env, LAKEHOUSE_ROOT=str(root), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_MASTER", None)
    if not submit:
        env["SPARK_MASTER"] = master
    env = with_jvm_options(env)
    gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "2000", "--seed", "5",
                          "--files", "4"], cwd=REPO, env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr
    root.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pipeline"]
    if submit:
        props = root.parent / "lakehouse.conf"
        written = subprocess.run([sys.executable, "-m", "common.spark", "--properties"], cwd=REPO, env=env,
                                 capture_output=True, text=True, check=True).stdout
        assert "spark.master" not in written
        assert "\nspark.jars " in written      # the cluster's executors get Delta's and Kafka's jars sent
        props.write_text(written)
        command = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
                   "--properties-file", str(props), "pipeline/__main__.py"]
    with open(root.parent / f"{root.name}-run-all.log", "wb") as log:
        return subprocess.Popen(command, cwd=REPO, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@pytest.mark.slow
def test_jobs_on_a_standalone_cluster_match_local_mode(spark, env, tmp_path, cluster):
    for var in ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR"):
        env.pop(var, None)
    state = cluster.state()
    assert state["status"] == "ALIVE" and state["aliveworkers"] == 2 and state["cores"] == 2

    roots = {"cluster": tmp_path / "cluster" / "lakehouse", "local": tmp_path / "local" / "lakehouse"}
    masters = {"cluster": cluster.master_url, "local": "local[2]"}
    started = time.monotonic()
    runs = {name: _start_pipeline(env, roots[name], masters[name], submit=name == "cluster") for name in roots}
    try:
        deadline = started + RUN_TIMEOUT
        codes = {name: run.wait(max(1.0, deadline - time.monotonic())) for name, run in runs.items()}
    finally:
        for run in runs.values():
            if run.poll() is None:
                kill_tree(run)
    elapsed = time.monotonic() - started
    for name, code in codes.items():
        assert code == 0, (f"run-all ({name}) failed with exit {code}:\n"
                           f"{_tail(roots[name].parent / 'lakehouse-run-all.log')}")

    # The pipeline really ran on the cluster: one finished application for every layer, with an
    # executor on both workers that ran tasks.
    state = cluster.state()
    assert sorted(a["name"] for a in state["completedapps"]) == sorted(APPS), state["completedapps"]
    assert all(a["state"] == "FINISHED" for a in state["completedapps"]), state["completedapps"]
    assert not state["activeapps"], state["activeapps"]
    for i in (1, 2):
        logs = list((cluster.base_dir / f"worker-{i}").glob("app-*/*/stderr"))
        assert len({log.parent.parent.name for log in logs}) == len(APPS), logs
        assert any("Finished task" in log.read_text(errors="replace") for log in logs), f"worker-{i} ran no task"

    for table in GOLD:
        cl = spark.read.format("delta").load(str(roots["cluster"] / "gold" / table))
        lo = spark.read.format("delta").load(str(roots["local"] / "gold" / table))
        n = lo.count()
        assert n > 0, table
        assert cl.count() == n, (table, cl.count(), n)
        only_cluster = cl.exceptAll(lo).limit(5).collect()
        only_local = lo.exceptAll(cl).limit(5).collect()
        assert not only_cluster and not only_local, (table, only_cluster, only_local)

    # Nothing left behind: daemons, executors (same process groups) and job drivers.
    cluster.stop()
    assert cluster.alive_pids() == []
    deadline = time.monotonic() + 30
    while (left := processes_using(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], left
    print(f"\nboth pipelines: {elapsed:.0f} s")


def test_a_master_given_to_spark_submit_or_spark_master_wins_over_conf(env, monkeypatch):
    from common.config import load_config
    from common.spark import master_override

    cfg = load_config(env={**env, "LAKEHOUSE__SPARK__MASTER": "local[3]"})
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert master_override(cfg) == "local[3]"          # plain python: conf
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4711")  # launched by spark-submit
    assert master_override(cfg) is None                # the submit's --master stays
    monkeypatch.setenv("SPARK_MASTER", "local[2]")
    assert master_override(load_config(env={**env, "SPARK_MASTER": "local[2]"})) == "local[2]"


def test_local_star_gets_the_conf_s_task_slots_per_core_and_other_masters_stay(spark, env, monkeypatch):
    from common.config import load_config
    from common.spark import local_master, master_override

    assert local_master("local[*]", 2, cores=2) == "local[4]"
    assert local_master("local[ * ]", 3, cores=8) == "local[24]"
    assert local_master("local[*]", 1, cores=2) == "local[*]"
    for explicit in ("local[3]", "local", "local[*,4]", "spark://127.0.0.1:7077"):
        assert local_master(explicit, 2, cores=2) == explicit
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    cfg = load_config(env=env)
    assert cfg.spark.master == "local[*]" and cfg.spark.local_slots_per_core == 1
    assert master_override(cfg) == "local[*]"
    cores = len(os.sched_getaffinity(0))
    two = load_config(env={**env, "LAKEHOUSE__SPARK__LOCAL_SLOTS_PER_CORE": "2"})
    assert master_override(two) == f"local[{2 * cores}]"
    # The suite's own session was built the same way (its slots follow the environment's conf).
    assert spark.sparkContext.master == local_master("local[*]", load_config().spark.local_slots_per_core)
