"""The `lakehouse` console command (console.commands) and the logging it configures (common.log).

The installed script is not used (the venv is shared): the group is checked to be what
pyproject.toml's [project.scripts] names, and run through click's CliRunner and through
`python -m console` in a child process.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from common import log
from console.commands import lakehouse

REPO = Path(__file__).resolve().parent.parent
# What the console must offer: every tool the Makefile runs with `python -m ...`.
COMMANDS = {"run", "generate", "locations", "seed-locations", "sql", "status", "report", "dq-docs", "audit", "diff", "changes", "backfill",
            "restore", "maintain", "chaos", "bench", "bench-audit", "soak", "kafka", "s3", "class-archive",
            "state", "check", "graph", "refresh"}
STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \S")


@pytest.fixture
def cli(monkeypatch):
    """CliRunner; the group writes LOG_LEVEL/LOG_JSON into os.environ, monkeypatch puts them back."""
    monkeypatch.setenv("LOG_LEVEL", "INFO")
    monkeypatch.setenv("LOG_JSON", "0")
    yield lambda *args: CliRunner().invoke(lakehouse, list(args), prog_name="lakehouse")
    log.configure(force=True)          # plain INFO again for the tests after this one


def console(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_pyproject_script_is_the_click_group():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["lakehouse"].partition(":")
    group = getattr(importlib.import_module(module), attr)
    assert isinstance(group, click.Group) and group is lakehouse
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert module.split(".")[0] in packages and "bench" in packages


def test_help_lists_every_command_with_a_one_line_summary(cli):
    result = cli("--help")
    assert result.exit_code == 0, result.output
    listing = result.output.split("Commands:\n", 1)[1]
    rows = dict(line.split(None, 1) for line in listing.splitlines() if line.strip())
    assert set(rows) == COMMANDS, rows
    assert all(len(summary) > 15 for summary in rows.values()), rows
    assert "--log-level" in result.output and "--log-json" in result.output


# Per command: the arguments before --help, and options its own parser defines.
HELP_CASES = [
    (["run", "all"], ["--trigger", "--interval", "--source", "--only"]),
    (["run", "silver"], ["--trigger", "--interval"]),
    (["generate"], ["--events", "--seed", "--sink", "--manifest"]),
    (["seed-locations"], ["--csv"]),
    (["locations"], ["{load}"]),
    (["locations", "load"], ["file", "as_of"]),
    (["changes"], ["--from", "--to", "--json"]),
    (["backfill"], ["--from", "--to", "--dry-run", "--json"]),
    (["sql"], ["--limit", "-f FILE"]),
    (["status"], ["--json"]),
    (["state"], ["[query]", "--json", "--limit"]),
    (["check"], ["{all,bronze,silver,gold}", "--source", "--only"]),
    (["graph"], ["--source", "--png"]),
    (["report"], ["--out"]),
    (["dq-docs"], ["--last", "--layer", "--suite"]),
    (["audit"], ["--table", "--json"]),
    (["diff"], ["TABLE FROM TO", "--sample", "--json"]),
    (["restore"], ["TABLE VERSION", "--yes"]),
    (["refresh"], ["table", "--wait"]),
    (["maintain"], ["--table", "--no-vacuum", "--json"]),
    (["chaos"], ["--kills", "--mode", "--root"]),
    (["bench"], ["--events", "--only", "--stream-seconds"]),
    (["bench-audit"], ["--versions"]),
    (["soak"], ["--minutes", "--rate", "--no-maintenance"]),
    (["kafka"], ["{up,down,status}"]),
    (["s3"], ["{up,down,status,env}", "--prefix"]),
    (["class-archive"], ["--force", "--path"]),

]


@pytest.mark.parametrize("args, options", HELP_CASES)
def test_each_command_help_is_the_tools_own_under_its_lakehouse_name(cli, args, options):
    result = cli(*args, "--help")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"usage: lakehouse {' '.join(args)} "), result.output[:200]
    for option in options:
        assert option in result.output, (option, result.output)


def test_every_command_is_covered_by_the_help_test():
    covered = {args[0] for args, _ in HELP_CASES}
    assert covered == set(lakehouse.commands) == COMMANDS


def test_run_takes_a_layer_and_shows_the_choices(cli):
    result = cli("run", "--help")
    assert result.exit_code == 0 and "{all|bronze|silver|gold}" in result.output, result.output
    result = cli("run", "platinum")
    assert result.exit_code == 2 and "'platinum' is not one of" in result.output, result.output


def test_an_unknown_command_or_a_bad_argument_is_a_usage_error_exit_2(cli):
    result = cli("nope")
    assert result.exit_code == 2 and "No such command 'nope'" in result.output, result.output
    result = cli("diff", "gold.x")                        # the tool's own argparse error, its exit code
    assert result.exit_code == 2 and "lakehouse diff: error:" in result.output, result.output
    result = cli("--log-level", "loud", "status")
    assert result.exit_code == 2 and "--log-level" in result.output, result.output


def test_a_tools_exit_code_comes_through(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_DATA_DIR", str(tmp_path / "kafka"))
    result = cli("kafka", "status")                       # no broker there: the tool returns 1
    assert result.exit_code == 1 and "kafka down" in result.output, result.output


def test_generate_through_the_console_writes_the_landing_files_with_timestamped_lines(env, tmp_path):
    manifest = tmp_path / "m.json"
    proc = console(env, "generate", "-n", "200", "--seed", "3", "--files", "4", "--manifest", str(manifest))
    assert proc.returncode == 0, proc.stderr
    m = json.loads(manifest.read_text())
    landing = Path(env["LAKEHOUSE_ROOT"]) / "landing"
    files = sorted(p for p in landing.rglob("*") if p.is_file())
    assert len(m["files"]) == 4 and sorted(map(Path, m["files"])) == files
    assert Path(m["locations"]).is_file()
    assert sum(len(Path(f).read_bytes().splitlines()) for f in m["files"]) == m["records"]
    assert m["events"] == 200
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(STAMPED.match(line) for line in lines), proc.stdout
    assert log.message_of(lines[0]).startswith(f"wrote {m['records']} records ({m['valid']} valid with 200 events")
    assert log.message_of(lines[1]).startswith("event time ") and f": {m['sessions']['count']}," in lines[1]


def test_json_mode_gives_one_object_per_line_with_the_records_fields(env, tmp_path):
    for args, extra in ((["--log-json", "generate"], {}), (["generate"], {"LOG_JSON": "1"})):
        proc = console({**env, **extra}, *args, "-n", "200", "--seed", "3")
        assert proc.returncode == 0, proc.stderr
        docs = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [d["event"] for d in docs] == ["generated", "sessions"], proc.stdout
        doc = docs[0]
        assert doc["level"] == "INFO" and doc["logger"] == "tools.generator.events"
        assert STAMPED.match(doc["time"] + " x") and doc["message"].startswith("wrote ")
        assert doc["events"] == 200 and doc["records"] > 0
        assert docs[1]["sessions"]["count"] > 0 and docs[1]["sessions"]["minutes"]["max"] > 0

    # The same through the tool itself, not launched by lakehouse: errors are JSON on stderr.
    proc = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "10"], cwd=REPO, text=True,
                          env={**env, "LOG_JSON": "1", "LAKEHOUSE__GENERATOR__DUPLICATE_RATE": "7"},
                          capture_output=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc
    doc = json.loads(proc.stderr.strip().splitlines()[-1])
    assert doc["level"] == "ERROR" and "generator.duplicate_rate" in doc["message"], doc


def test_log_level_warning_silences_info_and_a_bad_level_is_named(env):
    proc = console({**env, "LOG_LEVEL": "warning"}, "generate", "-n", "50")
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
    proc = subprocess.run([sys.executable, "-m", "tools.generator", "-n", "50"], cwd=REPO, text=True,
                          env={**env, "LOG_LEVEL": "chatty"}, capture_output=True, timeout=120)
    assert proc.returncode == 2 and "LOG_LEVEL" in proc.stderr and "'CHATTY'" in proc.stderr, proc.stderr


def test_plain_lines_are_the_old_lines_behind_a_timestamp():
    def line(level, msg):
        record = logging.LogRecord("pipeline.runner", level, __file__, 1, msg, None, None)
        return log.PlainFormatter().format(record)

    batch = "silver    batch 42  12,345 rows  8,210 rows/s  1.5 s  wm 12:04"
    assert STAMPED.match(line(logging.INFO, batch)) and log.message_of(line(logging.INFO, batch)) == batch
    assert log.message_of(line(logging.ERROR, "checkpoint x is in use")) == "error: checkpoint x is in use"
    assert log.message_of(line(logging.WARNING, "renewing failed")) == "warning: renewing failed"
    assert log.message_of(batch) == batch                 # a line without a timestamp is left alone


def test_parseable_env_asks_children_for_plain_info_lines():
    assert log.parseable_env({"LOG_JSON": "1", "LOG_LEVEL": "ERROR"}) == {"LOG_JSON": "0", "LOG_LEVEL": "INFO"}
    assert log.parseable_env({"LOG_LEVEL": "debug"})["LOG_LEVEL"] == "debug"


def test_another_librarys_info_lines_stay_out_even_when_it_sets_its_own_level(env):
    code = ("import logging; from common.log import configure; configure(); "
            "gx = logging.getLogger('great_expectations.data_context'); gx.setLevel(logging.INFO); "
            "gx.info('Created temporary directory for ephemeral docs site'); gx.warning('a real warning'); "
            "logging.getLogger('silver.job').info('ours')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ephemeral" not in proc.stdout + proc.stderr
    assert "a real warning" in proc.stderr and log.message_of(proc.stdout.strip()) == "ours"


def test_run_flags_are_config_overrides_and_leave_the_environment_alone(monkeypatch, caplog):
    """--trigger/--interval/--source reach the loader as overrides: they beat the environment,
    which is only read, and a bad value is reported naming the flag."""
    from common.config import ConfigError, load_config
    from pipeline import cli as pipeline_cli

    monkeypatch.setenv("TRIGGER", "available-now")
    monkeypatch.setenv("TRIGGER_INTERVAL", "3 seconds")
    monkeypatch.delenv("SOURCE", raising=False)
    before = dict(os.environ)
    args = pipeline_cli.parser().parse_args(["--trigger", "processing-time", "--interval", "7 seconds",
                                             "--source", "kafka"])
    cfg = load_config(overrides=pipeline_cli.overrides(args))
    assert dict(os.environ) == before
    assert cfg.streaming.trigger == "processing-time" and cfg.bronze.source == "kafka"
    assert cfg.streaming.trigger_interval.seconds == 7 and cfg.streaming_interval_forced
    assert load_config(overrides=pipeline_cli.overrides(pipeline_cli.parser().parse_args([]))).streaming.trigger \
        == "available-now"                                # no flag: the environment's value

    with pytest.raises(ConfigError) as err:
        load_config(overrides=pipeline_cli.overrides(pipeline_cli.parser().parse_args(["--interval", "soon"])))
    assert "key 'streaming.trigger_interval': bad duration 'soon'" in str(err.value)
    assert str(err.value).endswith("(value from command-line flag --interval)"), str(err.value)

    # The whole command: exit 2 before Spark starts, the same message, the environment as it was.
    with caplog.at_level(logging.ERROR, logger="pipeline.cli"):
        assert pipeline_cli.main(["--layer", "silver", "--interval", "soon"]) == 2
    assert any(r.getMessage().endswith("(value from command-line flag --interval)") for r in caplog.records)
    assert dict(os.environ) == before


@pytest.mark.parametrize("only, expected", [
    ("sessions, sightings", "exit 0"),
    (",", "--only: names no table; give one or more of sightings, activity, sessions, devices"),
    ("sessions,nope", "--only: unknown ['nope'] for profile nest"),
])
def test_only_is_read_once_for_run_and_check_and_a_flag_naming_no_table_is_refused(only, expected):
    """`--only` of run and check go through one parser: blanks around commas are ignored, and
    `--only ,` is refused by name instead of running every table."""
    from common.config import ConfigError, load_config
    from gold.job import select
    from pipeline import check, cli as pipeline_cli

    keys = pipeline_cli.only_keys(pipeline_cli.parser().parse_args(["--only", only]))
    assert keys == pipeline_cli.only_keys(check.parser("check").parse_args(["--only", only]))
    assert pipeline_cli.only_keys(pipeline_cli.parser().parse_args([])) is None
    cfg = load_config()
    if expected == "exit 0":
        assert [t.key for t in select(cfg, keys)] == ["sightings", "sessions"]
        return
    with pytest.raises(ConfigError) as err:
        select(cfg, keys)
    assert str(err.value).startswith(expected), str(err.value)
