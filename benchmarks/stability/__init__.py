"""Stability evidence: the RL loop over a grid of precision variants × seeds, with per-step records.

``variants`` (the plans), ``setting`` (the RL setting; the model, task and devices: the CPU warm start by
default, or a run config's), ``run`` (one run and the grid), ``results`` (the JSON, grown in parts),
``__main__`` (the command):

    .venv/bin/python -m benchmarks.stability [--checkpoint runs/warm_start | --config FILE]
        [--seeds 0 1 2 3 4] [--steps 100] [--variants ...] [--workers 2 | --devices cuda:0 cuda:1]
        [--append] [--out benchmarks/results/stability.json]

Then ``nibble report stability benchmarks/results/stability.json --out docs/stability``.
"""

from benchmarks.stability.results import dumps, results_document
from benchmarks.stability.run import run_grid, run_one
from benchmarks.stability.setting import Setting, Source
from benchmarks.stability.variants import VARIANTS

__all__ = ["VARIANTS", "Setting", "Source", "dumps", "results_document", "run_grid", "run_one"]
