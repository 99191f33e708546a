"""``nibble run`` and the services with a mistaken ``NIBBLE_*`` variable: exit 2 naming the variable, before
anything starts or is written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SMOKE = str(ROOT / "configs" / "smoke.yaml")
MISTAKES = {
    "misspelt field": ("NIBBLE_TRAINER__LEARNIN_RATE", "1e-4", "did you mean NIBBLE_TRAINER__LEARNING_RATE?"),
    "misspelt section": ("NIBBLE_TRAINR__LEARNING_RATE", "1e-4", "did you mean NIBBLE_TRAINER?"),
    "bad value": ("NIBBLE_TRAINER__LEARNING_RATE", "fast", "trainer.learning_rate: Input should be a valid number"),
}


@pytest.mark.parametrize(("variable", "value", "message"), MISTAKES.values(), ids=MISTAKES)
def test_nibble_run_exits_2_naming_the_variable(tmp_path, variable, value, message):
    env = {**os.environ, variable: value}
    argv = [str(BIN / "nibble"), "run", "--config", SMOKE, "--out", str(tmp_path / "run")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {variable}: ") and message in result.stderr, result.stderr
    assert "smoke.yaml" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("service", ["trainer", "sampler", "weightsync"])
def test_a_service_exits_2_naming_the_variable(service):
    env = {**os.environ, "NIBBLE_TRAINR__LEARNING_RATE": "1e-4"}
    argv = [sys.executable, "-m", f"nibble.{service}", "--config", SMOKE]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and "NIBBLE_TRAINR__LEARNING_RATE: the config has no setting 'trainr'" in (
        result.stderr
    ), result.stderr
