"""Configuration: defaults, environment overrides, and errors that name the key and the file."""
import os
from pathlib import Path

import pytest
import yaml

from common.config import DEFAULT_CONF, ConfigError, load_config, parse_duration


def write_conf(tmp_path, mutate) -> Path:
    raw = yaml.safe_load(DEFAULT_CONF.read_text())
    mutate(raw)
    path = tmp_path / "lakehouse.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAKEHOUSE_ROOT", "LANDING", "KAFKA_BOOTSTRAP", "CHECKPOINT_ROOT", "SOURCE", "TRIGGER")
           and not k.startswith("LAKEHOUSE__")}
    env.update(extra)
    return env


def test_defaults_follow_the_layout_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(env=clean_env())
    assert cfg.root == tmp_path / "lakehouse"
    assert cfg.table_path("bronze", "events") == str(tmp_path / "lakehouse" / "bronze" / "events")
    assert cfg.table_name("gold", "device_sessions") == "gold.device_sessions"
    assert cfg.checkpoint("silver") == str(tmp_path / "lakehouse" / "_checkpoints" / "silver")
    assert cfg.landing == tmp_path / "lakehouse" / "landing" / "nest"
    assert cfg.gold.windows["session_gap"].seconds == 1800
    assert cfg.silver.dedup_watermark.spark() == "7200 seconds"
    assert cfg.spark.master == "local[*]"


def test_environment_overrides(tmp_path):
    cfg = load_config(env=clean_env(LAKEHOUSE_ROOT=str(tmp_path / "r"), LANDING=str(tmp_path / "in"),
                                    KAFKA_BOOTSTRAP="127.0.0.1:1234",
                                    LAKEHOUSE__GOLD__WINDOWS__SESSION_GAP="15 minutes"))
    assert cfg.root == tmp_path / "r"
    assert cfg.landing == tmp_path / "in"
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:1234"
    assert cfg.gold.windows["session_gap"].seconds == 900


def test_unknown_key_names_key_and_file(tmp_path):
    path = write_conf(tmp_path, lambda raw: raw["gold"].update(sesion_gap="5 minutes"))
    with pytest.raises(ConfigError) as err:
        load_config(path, env=clean_env())
    assert "gold.sesion_gap" in str(err.value) and str(path) in str(err.value)


def test_bad_duration_names_key_and_file(tmp_path):
    path = write_conf(tmp_path, lambda raw: raw["silver"].update(dedup_watermark="two hours"))
    with pytest.raises(ConfigError) as err:
        load_config(path, env=clean_env())
    assert "silver.dedup_watermark" in str(err.value) and str(path) in str(err.value)
    assert "two hours" in str(err.value)


def test_missing_key_names_key_and_file(tmp_path):
    path = write_conf(tmp_path, lambda raw: raw["paths"].pop("lakehouse_root"))
    with pytest.raises(ConfigError, match=r"key 'paths.lakehouse_root': missing") as err:
        load_config(path, env=clean_env())
    assert str(path) in str(err.value)


def test_missing_path_names_key_and_file(tmp_path):
    path = write_conf(tmp_path, lambda raw: raw["silver"].update(expectations="conf/nope.yaml"))
    with pytest.raises(ConfigError) as err:
        load_config(path, env=clean_env())
    assert "silver.expectations" in str(err.value) and "nope.yaml" in str(err.value)
    assert str(path) in str(err.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml", env=clean_env())


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="TRIGGER_INTERVAL"):
        load_config(env=clean_env(TRIGGER_INTERVAL="soon"))
    with pytest.raises(ConfigError, match="LAKEHOUSE__GOLD__NOPE"):
        load_config(env=clean_env(LAKEHOUSE__GOLD__NOPE="1"))


def test_overrides_beat_the_environment_and_name_their_origin():
    from common.config import Override

    env = clean_env(TRIGGER="processing-time", LAKEHOUSE__GOLD__STATS_TO_KAFKA="true")
    cfg = load_config(env=env, overrides={"streaming.trigger": "available-now", "kafka.port": 9999})
    assert cfg.streaming.trigger == "available-now" and cfg.kafka.port == 9999
    assert cfg.gold.stats_to_kafka                                  # the environment still applies
    with pytest.raises(ConfigError, match=r"key 'kafka.port': .* \(value from override 'kafka.port'\)$"):
        load_config(env=env, overrides={"kafka.port": "x"})
    with pytest.raises(ConfigError, match=r"key 'gold.nope': unknown key .* \(value from my flag\)$"):
        load_config(env=env, overrides={"gold.nope": Override("1", "my flag")})


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("10 minutes", 600), ("1 hour", 3600),
                                          ("1.5 h", 5400), ("250 ms", 0.25), ("2 days", 172800)])
def test_durations(text, seconds):
    assert parse_duration(text).seconds == seconds


@pytest.mark.parametrize("text", ["", "10", "ten minutes", "5 fortnights", "0 s", "-1 s"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_each_layer_triggers_on_its_own_interval_unless_one_is_given_for_all():
    from common.streaming import interval, trigger

    def seconds(cfg):
        return [interval(cfg, layer).seconds for layer in ("bronze", "silver", "gold")]

    live = load_config(env=clean_env(TRIGGER="processing-time"))
    # Bronze gathers landing files; silver and gold start as soon as there is something new.
    assert seconds(live) == [5, 1, 1]
    assert trigger(live, "gold") == {"processingTime": interval(live, "gold").spark()}
    assert seconds(load_config(env=clean_env(TRIGGER="processing-time", TRIGGER_INTERVAL="3 seconds"))) == [3, 3, 3]
    own = load_config(env=clean_env(TRIGGER="processing-time", LAKEHOUSE__STREAMING__GOLD_INTERVAL="30 seconds"))
    assert seconds(own) == [5, 1, 30]
    assert trigger(load_config(env=clean_env()), "gold") == {"availableNow": True}
