"""The Makefile's own decisions, by running make: which STORE it refuses, and that a target
after setup starts its tool without a setup check in Python first. No Spark."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STORE", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("goal", ["audit", "sql", "status", "run-all", "maintain", "clean-lakehouse"])
def test_a_target_that_ignores_store_refuses_it_before_running(goal):
    # -n: were the refusal missing, nothing would run anyway.
    done = make("-n", goal, "STORE=s3", "Q=SELECT 1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "STORE=s3 is read by `make demo` alone" in done.stderr
    assert f"`make {goal}` works on LAKEHOUSE_ROOT" in done.stderr
    assert 'eval "$(make -s s3-env PREFIX=demo)"' in done.stderr
    assert done.stdout == ""


def test_store_is_accepted_where_it_is_read_or_harmless():
    assert make("-n", "demo", "STORE=s3").returncode == 0
    assert make("help", "STORE=s3").returncode == 0
    assert make("-n", "s3-env", "STORE=s3", "PREFIX=demo").stdout.split() == \
        [".venv/bin/python", "-m", "tools.s3_server", "env", "--prefix", "demo"]
    assert make("-n", "audit", "STORE=local").returncode == 0


def test_an_unknown_store_is_refused_even_for_the_demo():
    done = make("-n", "demo", "STORE=gcs")
    assert done.returncode == 2 and "STORE=gcs: STORE takes local or s3" in done.stderr


def test_once_set_up_a_target_starts_its_tool_without_a_setup_check():
    """make judges the .ready stamp from file times; before, every target ran
    `python -m pipeline.class_archive` (a Python start) ahead of its own tool."""
    planned = [line.strip() for line in make("-n", "sql", "Q=SELECT 1").stdout.splitlines()]
    assert planned == ['.venv/bin/python -m tools.sql "$Q"'], f"{planned} (run `make setup` first)"


def test_refresh_needs_a_table_and_hands_it_to_the_refresh():
    assert "usage: make refresh TABLE=gold|gold.<table>|silver" in make("-n", "refresh").stdout
    planned = [line.strip() for line in make("-n", "refresh", "TABLE=gold.device_sessions", "WAIT=5").stdout.splitlines()]
    assert planned[-1] == '.venv/bin/python -m pipeline.refresh "gold.device_sessions" --wait "5"', planned
