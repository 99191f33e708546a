"""NVIDIA ModelOpt's unified Hugging Face NVFP4 layout (``quant_algo: NVFP4``), as vLLM, SGLang and
TensorRT-LLM load it.

Per quantised module ``M`` (vLLM ``model_executor/layers/quantization/modelopt.py``,
``ModelOptNvFp4LinearMethod.create_weights``; compressed-tensors 0.20.1
``entrypoints/convert/converters/modelopt_nvfp4.py`` maps these names onto its own):

- ``M.weight``: uint8 ``[N, K/2]`` packed E2M1, element ``2i`` in the low nibble (the same bytes as
  compressed-tensors' ``weight_packed``; a non-uint8 ``weight`` is an unquantised layer);
- ``M.weight_scale``: float8_e4m3fn ``[N, K/16]``;
- ``M.weight_scale_2``: float32 ``[]``, a DECODE scale: ``x̂ = e2m1 · weight_scale · weight_scale_2`` —
  Nibble's (Transformer Engine's) ``g``, written and read unchanged;
- ``M.input_scale``: float32, the static activation decode scale of a calibrated model. Nibble's
  activation scales are per token and computed as the layer runs, so it writes none and reads past one.

Config: ``hf_quant_config.json`` (``{"producer": …, "quantization": {"quant_algo": "NVFP4", "group_size":
16, "kv_cache_quant_algo": null, "exclude_modules": [...]}}``) and the same in ``config.json``'s
``quantization_config`` (``quant_method: modelopt``, ``ignore``), the two forms vLLM's
``ModelOptQuantConfigBase.from_config`` reads. ModelOpt's format has no spelling for dynamic NVFP4
activations: engines that run it as W4A4 expect the calibrated ``input_scale`` (on Hopper, SGLang and vLLM
run it weight-only, W4A16, and need none). ``nibble_plan.json`` records Nibble's per-token plan.
"""

from __future__ import annotations

import torch

from nibble import __version__
from nibble.interop.base import Layout
from nibble.recipe.plan import PrecisionPlan

QUANT_ALGO = "NVFP4"


class ModelOpt(Layout):
    name = "modelopt"
    packed = "weight"
    global_ = "weight_scale_2"
    ignored = ("input_scale",)

    def global_to_file(self, decode: torch.Tensor) -> torch.Tensor:
        return decode.reshape(())

    def global_from_file(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.reshape(())

    def config_files(self, ignore: list[str], plan: PrecisionPlan | None) -> dict[str, dict]:
        quantization = {"quant_algo": QUANT_ALGO, "kv_cache_quant_algo": None, "group_size": 16}
        return {
            "hf_quant_config.json": {
                "producer": {"name": "nibble", "version": __version__},
                "quantization": {**quantization, "exclude_modules": ignore},
            },
            "quantization_config": {"quant_method": "modelopt", **quantization, "ignore": ignore},
        }

    def matches(self, quantization_config: dict) -> bool:
        return str(quantization_config.get("quant_method", "")).lower().startswith("modelopt")

    def check_config(self, quantization_config: dict, where: str) -> None:
        algo = quantization_config.get("quant_algo") or (quantization_config.get("quantization") or {}).get(
            "quant_algo"
        )
        if str(algo).upper() != QUANT_ALGO:
            raise ValueError(f"{where}: ModelOpt quant_algo {algo!r}, Nibble reads {QUANT_ALGO!r} only")
        group = quantization_config.get("group_size", (quantization_config.get("quantization") or {}).get("group_size"))
        if group is not None and group != 16:
            raise ValueError(f"{where}: ModelOpt group_size {group!r}, NVFP4 blocks are 16 elements")


MODELOPT = ModelOpt()
