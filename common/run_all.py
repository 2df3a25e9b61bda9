"""make run-all: bronze, silver and gold, as three job processes.

    python -m common.run_all [--trigger available-now|processing-time]

available-now: one after the other, each processing what is there; stops at the first failure.
processing-time: all three at once, each on its own interval (streaming.<layer>_interval), until
stopped. A layer starts once the table it reads exists. SIGINT or SIGTERM is passed on once to
every job, which stops after its current micro-batch. If a job exits on its own, the others are
stopped the same way and run-all exits non-zero naming it; a job that does not stop within
streaming.stop_timeout is killed (its checkpoint makes the replay exactly once), so it never hangs.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.config import ConfigError, load_config
from common.streaming import apply_trigger_args

LAYERS = (("bronze", None), ("silver", ("bronze", "events")), ("gold", ("silver", None)))


def _spawn(layer: str, env: dict) -> subprocess.Popen:
    # Own process group: a Ctrl-C in the terminal reaches run-all only, which sends each job
    # exactly one SIGTERM (a second signal would make the job stop without finishing its batch).
    return subprocess.Popen([sys.executable, "-m", f"{layer}.job"], env=env, start_new_session=True)


def run_in_order(env: dict) -> int:
    for layer, _ in LAYERS:
        code = _spawn(layer, env).wait()
        if code != 0:
            print(f"run-all: {layer} failed (exit {code}); later layers not started", file=sys.stderr)
            return code
    return 0


class Supervisor:
    def __init__(self, cfg, env: dict, poll: float = 0.5):
        self.cfg, self.env, self.poll = cfg, env, poll
        self.jobs: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def request_stop(self, signum=None, _frame=None) -> None:
        if not self.stopping:
            print("run-all: stopping every job after its current micro-batch", file=sys.stderr, flush=True)
        self.stopping = True

    def _stop_all(self) -> None:
        for job in self.jobs.values():
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.streaming.stop_timeout.seconds
        for layer, job in self.jobs.items():
            try:
                job.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"run-all: {layer} did not stop in {self.cfg.streaming.stop_timeout}; killing it",
                      file=sys.stderr, flush=True)
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()

    def run(self) -> int:
        pending = list(LAYERS)
        died = None
        while not self.stopping:
            if pending:
                layer, needs = pending[0]
                if needs == ("silver", None):       # the profile's silver table
                    needs = ("silver", self.cfg.silver_table)
                if needs is None or (Path(self.cfg.table_path(*needs)) / "_delta_log").is_dir():
                    self.jobs[layer] = _spawn(layer, self.env)
                    print(f"run-all: started {layer} (pid {self.jobs[layer].pid})", flush=True)
                    pending.pop(0)
            died = next(((layer, job.returncode) for layer, job in self.jobs.items()
                         if job.poll() is not None), None)
            if died:
                break
            time.sleep(self.poll)
        self._stop_all()
        if died:
            layer, code = died
            how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            print(f"run-all: {layer} stopped on its own ({how}); stopped the other jobs", file=sys.stderr)
            return code if code > 0 else 1
        failed = {layer: job.returncode for layer, job in self.jobs.items() if job.returncode}
        if failed:
            print(f"run-all: jobs failed while stopping: {failed}", file=sys.stderr)
            return 1
        print("run-all: every job stopped cleanly", flush=True)
        return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="common.run_all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trigger", choices=["available-now", "processing-time"])
    args = parser.parse_args(argv)
    env = apply_trigger_args(args, os.environ)
    try:
        cfg = load_config(env=env)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env["TRIGGER"] = cfg.streaming.trigger
    if cfg.streaming.trigger == "available-now":
        return run_in_order(env)
    supervisor = Supervisor(cfg, env)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, supervisor.request_stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
