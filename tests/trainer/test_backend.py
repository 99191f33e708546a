"""``trainer.backend``: the Transformer Engine backend is refused before anything starts, naming what is
missing on the machine (TE's compiled core, a Blackwell GPU, the backend itself)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nibble.config import TrainerConfig
from nibble.trainer import backend
from nibble.trainer.backend import check_backend

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def test_the_nibble_backend_is_the_default_and_runs_anywhere():
    assert TrainerConfig().backend == "nibble"
    check_backend("nibble", "cpu")


def test_transformer_engine_on_the_cpu_fails_in_the_config():
    with pytest.raises(
        ValueError, match=r"trainer\.backend=transformer_engine needs trainer\.device: cuda on a Blackwell"
    ):
        TrainerConfig(backend="transformer_engine")
    with pytest.raises(ValueError, match="backend"):
        TrainerConfig(backend="megatron")


def test_on_this_machine_every_missing_piece_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError) as caught:
        check_backend("transformer_engine", "cuda")
    message = str(caught.value)
    assert "Transformer Engine's compiled core (pip install 'transformer-engine[pytorch]==2.20.2'" in message
    assert "a Blackwell GPU (compute capability 10.0+; TE refuses NVFP4 on Hopper): no CUDA GPU is visible" in message
    assert "backend itself (not built yet" in message and message.endswith("Use trainer.backend: nibble")


def gpu(monkeypatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda module: object())  # TE's core present
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: name)


def test_a_hopper_gpu_is_named_with_its_compute_capability(monkeypatch):
    gpu(monkeypatch, (9, 0), "NVIDIA H200")
    missing = backend.missing_for_transformer_engine("cuda:0")
    assert missing[0] == (
        "a Blackwell GPU (compute capability 10.0+; TE refuses NVFP4 on Hopper): cuda:0 is NVIDIA H200, "
        "compute capability 9.0"
    )
    assert len(missing) == 2  # the core is there; the backend is not built


def test_on_blackwell_with_te_only_the_backend_itself_is_missing(monkeypatch):
    gpu(monkeypatch, (10, 0), "NVIDIA B200")
    assert backend.missing_for_transformer_engine("cuda") == [
        "Nibble's Transformer Engine trainer backend itself (not built yet; README, 'Engines')"
    ]


def test_nibble_run_refuses_it_before_starting_anything(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("trainer:\n  backend: transformer_engine\n  device: cuda\n")
    done = subprocess.run(
        [NIBBLE, "run", "--config", str(config), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "trainer.backend=transformer_engine cannot run here" in done.stderr and "compiled core" in done.stderr
    assert not (tmp_path / "run" / "trainer").exists()
