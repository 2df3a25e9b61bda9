"""make run-all with processing-time triggers: one process, every layer's queries in one
application, stopped together by one signal."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Run:
    """run-all as a process, its output collected line by line."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline"], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        from common.log import message_of

        for line in self.proc.stdout:              # each line as printed, without its timestamp
            self.lines.append(message_of(line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            assert self.proc.poll() is None, f"run-all exited early:\n{self.text()[-4000:]}"
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text()[-4000:]}")

    def stop(self, timeout: float = 240) -> None:
        """SIGINT, Ctrl-C in the terminal of a processing-time run (SIGTERM: tests/test_bronze.py,
        test_refresh.py); it must exit 0 in time."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout) == 0, self.text()[-4000:]

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def test_continuous_run_all_is_one_application_and_a_signal_stops_it_cleanly(spark, env, cfg):
    env = dict(env, TRIGGER="processing-time", TRIGGER_INTERVAL="2 seconds")
    gen = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "600", "--seed", "4",
                          "--files", "3"], cwd=REPO, env=env, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr

    run = Run(env)
    try:
        for layer in ("bronze", "silver", "gold"):
            run.wait_for(rf"^{layer}: .* -> .*\(processing-time\)", 300)
        # the gold query (every gold table) has run a batch that read the data
        run.wait_for(r"^gold\s+batch \d+  [1-9][\d,]* rows", 400)
        # one application: a single JVM below the one Python driver
        from tools.processes import command_line, descendants

        jvms = [p for p in descendants(run.proc.pid) if "java" in command_line(p)]
        assert len(jvms) == 1, jvms
        run.stop()
    finally:
        run.kill_if_running()
    assert "pipeline: SIGINT: stopping every query after its current micro-batch" in run.text()
    assert "pipeline: every query stopped cleanly" in run.text()
    # Spark's own shutdown adds no stack trace (the state stores' maintenance stops first), and
    # PySpark's handler of SIGINT (a KeyboardInterrupt) is not the one that answers.
    assert "SparkEnv not active" not in run.text() and "\tat org.apache" not in run.text(), run.text()[-3000:]
    assert "Traceback" not in run.text(), run.text()[-3000:]
    silver = spark.read.format("delta").load(cfg.table_path("silver", "camera_events")).count()
    assert silver == 600
    # nothing left running that holds a checkpoint
    import fcntl

    for q in ("bronze_files", "silver", "gold"):
        with open(Path(cfg.checkpoint(q)).with_name(f"{q}.lock"), "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


