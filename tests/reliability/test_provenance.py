"""Provenance (git revision, config hash, package versions, machine) in every checkpoint and summary."""

from __future__ import annotations

import importlib.metadata
import subprocess

from nibble.analysis.run_report import summarize
from nibble.rundir.provenance import config_hash
from nibble.rundir.segments import Segment
from nibble.trainer import checkpoint
from tests.reliability.conftest import InProcessTrainer, run_config


def test_checkpoints_and_summaries_carry_provenance(stream_config, tmp_path):
    config = run_config(stream_config, tmp_path)
    service = InProcessTrainer(config, tmp_path / "out")
    service.trainer.checkpoint()
    state = checkpoint.load_state(checkpoint.latest(config.trainer.checkpoint_dir))
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for record in (
        state.provenance,
        summarize(tmp_path / "out", config, [Segment(started_at=0.0, first_step=0, status="finished", ended_at=1.0)])[
            "provenance"
        ],
    ):
        assert record["git_revision"].removesuffix("+dirty") == head
        assert record["config_sha256"] == config_hash(config) != config_hash(run_config(stream_config, tmp_path / "x"))
        assert record["packages"]["torch"] == importlib.metadata.version("torch")
        assert record["machine"]["cpus"] >= 1 and record["machine"]["python"]
