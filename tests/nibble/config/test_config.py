"""Run configuration: YAML + NIBBLE_ environment, errors that name the key, the shipped configs."""

from pathlib import Path

import pytest

from nibble.config import load

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


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


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # a misspelt field: named, with the real one, never blamed on the file
        ({"NIBBLE_TRAINER__LEARNIN_RATE": "1e-4"},
         r"NIBBLE_TRAINER__LEARNIN_RATE: trainer has no setting 'learnin_rate' \(did you mean "
         r"NIBBLE_TRAINER__LEARNING_RATE\?\)"),
        # a misspelt section used to be ignored silently (the run took the default)
        ({"NIBBLE_TRAINR__LEARNING_RATE": "1e-4"}, r"NIBBLE_TRAINR__LEARNING_RATE: the config has no setting 'trainr' "
         r"\(did you mean NIBBLE_TRAINER\?\)"),
        ({"NIBBLE_TRAINER__LEARNING_RATE": "fast"},
         "NIBBLE_TRAINER__LEARNING_RATE: trainer.learning_rate: Input should be a valid number"),
        ({"NIBBLE_TRAINER__MAX_STALENESS": "-1"}, "NIBBLE_TRAINER__MAX_STALENESS: trainer.max_staleness: Input should "
         "be greater than or equal to 0"),
        ({"NIBBLE_SEED__VALUE": "1"}, r"NIBBLE_SEED__VALUE: seed is a value, not a section \(use NIBBLE_SEED\)"),
        ({"NIBBLE_TRAINER": "1"}, "NIBBLE_TRAINER: trainer: Input should be a valid dictionary"),
        ({"NIBBLE_TRAINER__LEARNING_RATE": "[1"}, r"NIBBLE_TRAINER__LEARNING_RATE='\[1': not a YAML value"),
        ({"NIBBLE_": "1"}, "NIBBLE_: the config has no setting ''"),
    ],
)  # fmt: skip
def test_every_environment_mistake_names_its_variable(env, message):
    with pytest.raises(ValueError, match=message) as info:
        load(CONFIGS / "smoke.yaml", env)
    assert "smoke.yaml" not in str(info.value)


def test_a_cross_field_conflict_names_the_file_and_the_variables(tmp_path):
    with pytest.raises(ValueError, match=r"smoke.yaml with NIBBLE_REDIS__QUEUE_CAPACITY: .*queue_capacity=2"):
        load(CONFIGS / "smoke.yaml", {"NIBBLE_REDIS__QUEUE_CAPACITY": "2"})


def test_free_form_sections_and_secrets_pass_through():
    config = load(
        CONFIGS / "smoke.yaml",
        {
            "NIBBLE_TASK__OPTIONS__DIGITS": "3",  # task options are the task's own keys
            "NIBBLE_MODEL__CHECKPOINT": "elsewhere",
            "NIBBLE_REDIS_PASSWORD": "secret",
            "NIBBLE_FETCH_TOKEN": "secret",
            "NIBBLE_TEST_WARM_START": "/tmp/warm",
        },
    )
    assert config.task.options["digits"] == 3 and config.task.options["eval_size"] == 512
    assert str(config.model.checkpoint) == "elsewhere"


def test_the_variables_the_services_read_are_not_mistaken_for_config_keys():
    from nibble.config.env import NOT_CONFIG
    from nibble.transport.stream.connection import PASSWORD_ENV
    from nibble.transport.weights.auth import FETCH_TOKEN_ENV, PUBLISH_TOKEN_ENV

    assert {FETCH_TOKEN_ENV, PUBLISH_TOKEN_ENV, PASSWORD_ENV} <= NOT_CONFIG
