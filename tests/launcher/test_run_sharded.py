"""``nibble run`` with the trainer under ``torchrun`` (2 gloo processes, FSDP2): it trains, publishes to the
samplers, checkpoints with ``torch.distributed.checkpoint`` and resumes from that checkpoint; a checkpoint
of the other layout, or a GPU that is not there, is refused with a clear error."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.services import run_launcher

ROOT = Path(__file__).resolve().parents[2]
NIBBLE = str(Path(sys.executable).with_name("nibble"))


def _run(out: Path, warm_start: Path, total_steps: int, *flags: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "NIBBLE_MODEL__CHECKPOINT": str(warm_start),
        "NIBBLE_TRAINER__NPROC_PER_NODE": "2",
        "NIBBLE_TRAINER__TOTAL_STEPS": str(total_steps),
    }
    argv = [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(out), *flags]
    return run_launcher(argv, timeout=600, env=env)


def _steps(out: Path) -> list[dict]:
    return [line for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if line["step"] > 0]


@pytest.fixture(scope="module")
def sharded_run(warm_start, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "run"
    first = _run(out, warm_start, total_steps=3)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    after_first = _steps(out)
    second = _run(out, warm_start, 5, "--resume")  # extends the finished 3-step run
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    return out, after_first


def test_the_sharded_trainer_trains_and_publishes(sharded_run):
    out, first = sharded_run
    assert [line["step"] for line in first] == [1, 2, 3]
    versions = [line["policy_version"] for line in first]
    assert versions == sorted(versions) and versions[-1] >= 3
    assert all(line["trained_tokens"] > 0 and line["loss"] == line["loss"] for line in first)
    samplers = [json.loads(p.read_text()) for p in (out / "samplers").glob("*.json")]
    assert samplers and all(s["policy_version"] > 0 for s in samplers)  # they applied published versions
    log = (out / "logs" / "trainer.log").read_text()
    assert "Traceback" not in log


def test_checkpoints_are_sharded_and_the_run_resumes_from_them(sharded_run):
    out, first = sharded_run
    latest = out / "trainer" / (out / "trainer" / "latest").read_text().strip()
    assert latest.name == "step-00000005"
    assert (latest / "sharded" / ".metadata").is_file() and (latest / "config.json").is_file()
    assert len(list((latest / "sharded").glob("*.distcp"))) == 2  # one file per rank
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["step"] == 5 and state["policy_version"] >= 5
    steps = _steps(out)
    assert [line["step"] for line in steps] == [1, 2, 3, 4, 5]  # resumed at 4, nothing repeated
    assert steps[3]["policy_version"] > first[-1]["policy_version"]


def _trainer(config: Path, **env: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "nibble.trainer", "--config", str(config), "--out", str(config.parent / "again")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_a_single_process_trainer_refuses_a_sharded_checkpoint(sharded_run):
    out, _ = sharded_run
    done = _trainer(out / "config.yaml")
    assert done.returncode == 2
    assert "written by a sharded trainer" in done.stderr and "nproc_per_node" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_damaged_sharded_checkpoint_is_refused_with_its_name(sharded_run, tmp_path):
    out, _ = sharded_run
    copy = tmp_path / "trainer"
    shutil.copytree(out / "trainer", copy)
    latest = copy / (copy / "latest").read_text().strip()
    next((latest / "sharded").glob("*.distcp")).unlink()
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["trainer"]["checkpoint_dir"] = str(copy)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv += ["-m", "nibble.trainer", "--config", str(path), "--out", str(tmp_path / "out")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    assert f"{latest}: unreadable sharded checkpoint" in done.stderr, done.stderr[-3000:]


def test_nibble_run_refuses_gpus_it_does_not_have_before_starting_anything(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {**os.environ, "NIBBLE_TRAINER__DEVICE": "cuda", "NIBBLE_TRAINER__NPROC_PER_NODE": "2"}
    argv = [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(tmp_path / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "needs that many GPUs; 0 visible" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "logs").exists()


def test_a_cuda_trainer_without_a_gpu_is_refused(sharded_run):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out, _ = sharded_run
    done = _trainer(out / "config.yaml", NIBBLE_TRAINER__DEVICE="cuda")
    assert done.returncode == 2 and "trainer.device=cuda" in done.stderr, done.stderr[-2000:]
