"""Where a service runs: the ``device`` setting (``cpu`` | ``cuda`` | ``cuda:N``), the GPU a launched child
may see, and its share of that GPU's memory.

``cuda:N`` names physical GPU ``N``. ``nibble run`` starts such a child with ``CUDA_VISIBLE_DEVICES=N``, so
inside it that GPU is ``cuda:0``; a service started by hand (a pod whose GPU the device plugin chose)
takes ``cuda:N`` among the GPUs it can see.
"""

from __future__ import annotations

import os
import re

_PATTERN = re.compile(r"^(cpu|cuda(:(0|[1-9][0-9]*))?)$")


def check(field: str, device: str) -> str:
    """``device`` itself when it is ``cpu``, ``cuda`` or ``cuda:N``.

    Raises:
        ValueError: naming ``field`` and the accepted forms.
    """
    if not isinstance(device, str) or not _PATTERN.match(device):
        raise ValueError(f"{field}={device!r} is not a device: use cpu, cuda or cuda:N (N a GPU index)")
    return device


def gpu_index(device: str) -> int | None:
    """The physical GPU a device names: ``N`` for ``cuda:N``, 0 for ``cuda``, None for ``cpu``."""
    if device == "cpu":
        return None
    return int(device.partition(":")[2] or 0)


def child_environment(device: str) -> dict[str, str]:
    """What the launcher adds to a child's environment: ``CUDA_VISIBLE_DEVICES`` of its one GPU."""
    index = gpu_index(device)
    return {} if index is None or device == "cuda" else {"CUDA_VISIBLE_DEVICES": str(index)}


def resolve(field: str, device: str, memory_fraction: float | None = None):
    """The ``torch.device`` this process computes on, with its cap of the GPU's memory applied.

    Args:
        field: the config key, for errors (``sampler.device``).
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        memory_fraction: the share (0, 1] of the GPU's memory this process may allocate; None: no cap.
    Raises:
        ValueError: a CUDA device that this process cannot see (naming ``field`` and what is visible).
    """
    import torch

    check(field, device)
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"{field}={device} but no CUDA GPU is visible to this process")
    index = gpu_index(device)
    if device != "cuda" and os.environ.get("CUDA_VISIBLE_DEVICES") == str(index):
        index = 0  # the launcher made physical GPU N this process's only one
    if index >= torch.cuda.device_count():
        raise ValueError(f"{field}={device}: this process sees {torch.cuda.device_count()} GPU(s)")
    resolved = torch.device("cuda", index)
    if memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(memory_fraction, resolved)
    return resolved
