"""The trainer's compute backend, ``trainer.backend``: ``nibble`` (Nibble's own NVFP4 modules, on the CPU
and any CUDA GPU) or ``transformer_engine`` (Transformer Engine's NVFP4 recipe).

The Transformer Engine backend is not built yet. It can only run where TE's NVFP4 recipe runs: TE's
compiled core and a Blackwell GPU (compute capability 10.0 or above; TE refuses NVFP4 on Hopper, 9.0).
Choosing it fails before anything starts with every missing piece named. Nibble's backend already follows
TE 2.20.2's NVFP4 reference bit for bit (docs/design.md §2.2), so a TE-trained policy and a Nibble sampler agree.
"""

from __future__ import annotations

import importlib.util

BLACKWELL = (10, 0)
TE_CORE_MODULE = "transformer_engine_torch"
"""The compiled extension TE's PyTorch frontend imports (from the ``transformer-engine-torch`` wheel)."""


def check_backend(backend: str, device: str) -> None:
    """Refuse a backend that cannot run here.

    Args:
        backend: ``trainer.backend``.
        device: ``trainer.device`` (``cpu``, ``cuda`` or ``cuda:N``).
    Raises:
        ValueError: for ``transformer_engine``, naming everything missing on this machine.
    """
    if backend == "nibble":
        return
    missing = "; ".join(missing_for_transformer_engine(device))
    raise ValueError(
        f"trainer.backend=transformer_engine cannot run here, it needs: {missing}. Use trainer.backend: nibble"
    )


def missing_for_transformer_engine(device: str) -> list[str]:
    """What the Transformer Engine backend lacks on this machine, in the order a user would fix it."""
    missing = []
    if importlib.util.find_spec(TE_CORE_MODULE) is None:
        missing.append(
            "Transformer Engine's compiled core (pip install 'transformer-engine[pytorch]==2.20.2': the "
            f"{TE_CORE_MODULE} and CUDA core wheels, 264-695 MB; the 1.2 MB transformer-engine wheel the tests "
            "use holds only the Python reference)"
        )
    gpu = _gpu_shortfall(device)
    if gpu:
        missing.append(gpu)
    missing.append("Nibble's Transformer Engine trainer backend itself (not built yet; README, 'Engines')")
    return missing


def _gpu_shortfall(device: str) -> str | None:
    need = f"a Blackwell GPU (compute capability {BLACKWELL[0]}.{BLACKWELL[1]}+; TE refuses NVFP4 on Hopper)"
    if device == "cpu":
        return f"{need} as trainer.device, which is cpu"
    import torch

    if not torch.cuda.is_available():
        return f"{need}: no CUDA GPU is visible"
    index = int(device.partition(":")[2] or torch.cuda.current_device())
    if index >= torch.cuda.device_count():
        return f"{need}: trainer.device={device} but {torch.cuda.device_count()} GPU(s) are visible"
    capability = torch.cuda.get_device_capability(index)
    if capability < BLACKWELL:
        name = torch.cuda.get_device_name(index)
        return f"{need}: {device} is {name}, compute capability {capability[0]}.{capability[1]}"
    return None
