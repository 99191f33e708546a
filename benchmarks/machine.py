"""Describe the machine a benchmark ran on, for the JSON records under benchmarks/results/."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch


def describe() -> dict:
    """CPU model, cores, torch threads and version, and the GPU (and whether CUDA MPS is up) when CUDA is present."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "hostname": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda_mps"] = mps_running()
        info["nvfp4_gemm"] = nvfp4_gemm()
    return info


def nvfp4_gemm() -> str:
    """Which NVFP4 GEMMs this CUDA machine runs: timings (and, before 2026-12-02, product bits) depend on it.
    Records without the field ran the tensor-core-ordered Triton GEMM, except the first block-ordered ones,
    written on 2026-12-02 before the field existed (the README's "GPU kernels" section lists them)."""
    from nibble.kernels.gpu import gemm  # imports triton

    kernels = "CUDA fragment kernels" if gemm.cuda_kernels(torch.device("cuda")) else "Triton kernel"
    return f"block-ordered (docs/design.md §2.6), {kernels}"


def mps_running() -> bool:
    """Whether a CUDA MPS control daemon is up (its control pipe exists), so that processes sharing a GPU
    run their kernels side by side instead of taking turns: step times under load depend on it."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipes, "control"))


def out_problem(path: Path) -> str | None:
    """Why a benchmark could not write its record to ``path`` after its run (a directory, a missing folder), or
    None: command lines check it before they look for a GPU."""
    try:
        if path.is_dir():
            return "a directory"
        return None if path.parent.is_dir() else "its folder does not exist"
    except OSError as exc:  # a name too long for the file system, say
        return f"not a usable path ({exc.strerror or exc})"


def write_record(
    path: Path, record: dict, indent: int = 2, default: Callable | None = None, announce: bool = True
) -> None:
    """Write a benchmark's ``record`` to ``path`` as JSON (creating its folder) and, if ``announce``, say where.

    Args:
        path: the results file; an existing one is replaced (callers that must not overwrite check first).
        record: JSON-serialisable; ``default`` converts what ``json`` cannot (``str`` for paths, say).
        announce: False for the interim records of a run that rewrites its file as it goes.
    Raises:
        OSError: the folder cannot be created or the file written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=indent, default=default) + "\n")
    if announce:
        print(f"wrote {path}")
