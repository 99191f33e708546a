"""The throughput–stability simulator (docs/design.md §7): plan a run before paying for it.

Pure Python (no torch, no numpy), so ``nibble simulate`` starts fast. Modules: ``drift_model`` (the
throughput–stability formulas, and ``drift_headroom`` for the trainer's gauge), ``config`` (knobs),
``calibrate`` (measured inputs and their sources) with ``calibration_files`` (the files it reads),
``timeline`` (samplers, queue, trainer, weight sync), ``dynamics`` (drift and reward), ``simulate`` (one run
with its baseline and ghosts), ``optimize`` (the frontier), ``plots`` (PNG, matplotlib) and ``page`` (the
interactive HTML page, from the assets in ``web/``).
"""

from nibble.simulator.calibrate import Calibration, load, published
from nibble.simulator.config import HORIZONS, SimConfig
from nibble.simulator.simulate import Run, SimResult, run_config, simulate

__all__ = ["HORIZONS", "Calibration", "Run", "SimConfig", "SimResult", "load", "published", "run_config", "simulate"]
