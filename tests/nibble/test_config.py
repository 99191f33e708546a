"""Run configuration: YAML + NIBBLE_ environment, errors that name the key, the shipped configs."""

from pathlib import Path

import pytest

from nibble.config import load

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_embedded_default_is_configs_default_yaml():
    assert load(CONFIGS / "default.yaml") == load(None)


@pytest.mark.parametrize("name", ["default", "smoke", "sync", "bf16"])
def test_shipped_configs_load(name):
    config = load(CONFIGS / f"{name}.yaml")
    assert config.trainer.max_staleness == (0 if name == "sync" else 2)
    assert config.plan.format == ("bf16" if name == "bf16" else "nvfp4")


def test_environment_overrides_yaml_values():
    config = load(
        CONFIGS / "default.yaml",
        {
            "NIBBLE_TRAINER__LEARNING_RATE": "3e-4",
            "NIBBLE_NUM_SAMPLERS": "4",
            "NIBBLE_PUBLISH_TOKEN": "not-a-config-key",
        },
    )
    assert config.trainer.learning_rate == 3e-4 and config.num_samplers == 4


@pytest.mark.parametrize(
    ("yaml_text", "env", "message"),
    [
        ("trainer:\n  lerning_rate: 1\n", {}, "trainer.lerning_rate: Extra inputs"),
        ("trainer:\n  max_staleness: -1\n", {}, "trainer.max_staleness"),
        ("trainer:\n  learning_rate: fast\n", {}, "trainer.learning_rate"),
        ("redis:\n  queue_capacity: 2\n", {}, "queue_capacity=2 < trainer.groups_per_step"),
        ("sampler:\n  groups_per_batch: 100\n", {"NIBBLE_TRAINER__MAX_STALENESS": "0"}, "admission control"),
        ("weightsync:\n  port: 5000\n  publish_port: 5000\n", {}, "must differ"),
        ("- a list\n", {}, "top level must be a mapping"),
        ("trainer: [unclosed\n", {}, "not valid YAML"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, yaml_text, env, message):
    path = tmp_path / "run.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValueError, match=message) as info:
        load(path, env)
    assert str(path) in str(info.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="config file not found"):
        load(tmp_path / "nope.yaml")
