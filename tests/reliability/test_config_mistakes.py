"""Config mistakes are reported against their source: a bad ``metrics_host`` names its key (one line, exit
status 2), a bad ``NIBBLE_*`` override names its variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nibble.config import load
from nibble.model import MoETransformer, tiny
from nibble.monitoring.metrics import Metrics


def test_metrics_host_that_is_not_an_address_of_this_machine_names_the_key():
    with pytest.raises(ValueError, match=r"cannot serve /metrics on sampler\.metrics_host='10\.255\.255\.1'"):
        Metrics("sampler").serve(0, "10.255.255.1", keys=("sampler.metrics_host", "sampler.metrics_port"))
    with pytest.raises(ValueError, match=r"trainer\.metrics_host='no-such-host\.invalid'"):
        Metrics("trainer").serve(0, "no-such-host.invalid", keys=("trainer.metrics_host", "trainer.metrics_port"))


def test_a_sampler_with_a_bad_metrics_host_exits_2_naming_it(tmp_path):
    MoETransformer(tiny(vocab_size=15)).save_pretrained(tmp_path / "model")
    config = tmp_path / "run.yaml"
    settings = {"model": {"checkpoint": str(tmp_path / "model")}, "sampler": {"metrics_host": "256.1.1.1"}}
    config.write_text(yaml.safe_dump(settings))
    result = subprocess.run(
        [sys.executable, "-m", "nibble.sampler", "--config", str(config)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stderr
    assert "error: cannot serve /metrics on sampler.metrics_host='256.1.1.1'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"NIBBLE_TRAINER__LERNING_RATE": "1e-4"},
            "NIBBLE_TRAINER__LERNING_RATE: trainer has no setting 'lerning_rate'",
        ),
        ({"NIBBLE_TRAINER__LEARNING_RATE": "fast"}, "NIBBLE_TRAINER__LEARNING_RATE: trainer.learning_rate:"),
        ({"NIBBLE_TRAINR__TOTAL_STEPS": "3"}, "NIBBLE_TRAINR__TOTAL_STEPS: the config has no setting 'trainr'"),
        ({"NIBBLE_SEED__X": "3"}, "NIBBLE_SEED__X: seed is a value, not a section"),
    ],
)
def test_environment_overrides_are_reported_against_the_variable(environ, message):
    with pytest.raises(ValueError) as info:
        load(Path("configs/smoke.yaml"), environ=environ)
    assert message in str(info.value)
    load(Path("configs/smoke.yaml"), environ={"NIBBLE_PUBLISH_TOKEN": "x", "NIBBLE_TEST_WARM_START": "/tmp"})
