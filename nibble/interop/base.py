"""What a checkpoint layout defines: its tensor names, how it stores the global scale, its config files."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from nibble.recipe.plan import PrecisionPlan


class Layout(ABC):
    """One NVFP4 checkpoint layout; module ``M``'s weight is stored as ``M.<packed>``, ``M.<block>``,
    ``M.<global_>`` (the other names of :class:`~nibble.interop.layout.ModuleWeight`'s parts)."""

    name: str
    packed: str
    block: str = "weight_scale"
    global_: str
    ignored: tuple[str, ...] = ()
    """Per-module tensors of the layout Nibble reads past (static activation scales: Nibble's are dynamic)."""

    @abstractmethod
    def global_to_file(self, decode: torch.Tensor) -> torch.Tensor:
        """The stored global scale of a module whose decode scale is ``decode`` (float32 ``[]``)."""

    @abstractmethod
    def global_from_file(self, stored: torch.Tensor) -> torch.Tensor:
        """The decode scale (float32 ``[]``) of a stored global scale."""

    @abstractmethod
    def config_files(self, ignore: list[str], plan: PrecisionPlan | None) -> dict[str, dict]:
        """``{file name: JSON object}``: ``config.json``'s ``quantization_config`` under the key
        ``"quantization_config"``, and any file of its own."""

    @abstractmethod
    def matches(self, quantization_config: dict) -> bool:
        """Whether ``config.json``'s ``quantization_config`` names this layout."""

    @abstractmethod
    def check_config(self, quantization_config: dict, where: str) -> None:
        """Raise ``ValueError`` naming ``where`` when the config is this layout but not NVFP4 as Nibble
        reads it (another bit width, block size or scheme)."""

    def is_packed(self, tensor: torch.Tensor) -> bool:
        """Whether a tensor named ``M.<packed>`` holds packed codes (ModelOpt reuses ``weight``)."""
        return tensor.dtype == torch.uint8
