"""The compressed-tensors NVFP4 layout (``nvfp4-pack-quantized``), as vLLM and SGLang load it.

Per quantised module ``M`` (compressed-tensors 0.20.1, ``compressors/nvfp4/base.py``,
``NVFP4PackedCompressor.compression_param_names``):

- ``M.weight_packed``: uint8 ``[N, K/2]``, element ``2i`` in the low nibble (``helpers.py``,
  ``pack_fp4_to_uint8``: ``indices[:, 0] | (indices[:, 1] << 4)``), code bits sign·exponent·mantissa as
  in docs/design.md §2.1;
- ``M.weight_scale``: float8_e4m3fn ``[N, K/16]``;
- ``M.weight_global_scale``: float32 ``[1]``, an ENCODE scale ``S``: compressed-tensors decodes
  ``x̂ = e2m1 · (weight_scale / S)`` (``quantization/lifecycle/forward_helpers.py``, ``_dequantize``) and
  writes ``S = 448 · 6 / amax`` (``quantization/utils/helpers.py``, ``generate_gparam``). Nibble keeps
  Transformer Engine's decode scale ``g = 1/S`` and writes an ``S`` with ``fl(1/S) == g`` exactly
  (:func:`~nibble.interop.layout.encode_scale`), so importing gives ``g`` back bit for bit.

``config.json`` carries ``quantization_config`` with one config group: weights NVFP4 (``tensor_group``,
group 16, E4M3 scales, static) and input activations NVFP4 with ``dynamic: true`` — every activation
scale is computed when the layer runs, so no ``input_global_scale`` is stored (``compression_param_names``
omits it for dynamic activations). compressed-tensors has no per-token global scale for NVFP4: ``dynamic``
is its nearest spelling of Nibble's per-token activation scales; an engine computes one global scale per
activation tensor (``nibble_plan.json``, written beside, records the plan exactly).
"""

from __future__ import annotations

import torch

from nibble.interop.base import Layout
from nibble.interop.layout import decode_scale, encode_scale
from nibble.recipe.plan import PrecisionPlan

FORMAT = "nvfp4-pack-quantized"
_NVFP4_ARGS = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "group_size": 16,
    "strategy": "tensor_group",
    "scale_dtype": "torch.float8_e4m3fn",
}


class CompressedTensors(Layout):
    name = "compressed-tensors"
    packed = "weight_packed"
    global_ = "weight_global_scale"
    ignored = ("input_global_scale",)

    def is_packed(self, tensor: torch.Tensor) -> bool:
        return True  # the name alone says packed codes: a tensor of another dtype is an error, not a dense weight

    def global_to_file(self, decode: torch.Tensor) -> torch.Tensor:
        return encode_scale(decode.reshape(1))

    def global_from_file(self, stored: torch.Tensor) -> torch.Tensor:
        return decode_scale(stored.reshape(()))

    def config_files(self, ignore: list[str], plan: PrecisionPlan | None) -> dict[str, dict]:
        group = {
            "targets": ["Linear"],
            "weights": {**_NVFP4_ARGS, "dynamic": False},
            "input_activations": {**_NVFP4_ARGS, "dynamic": True},
            "output_activations": None,
            "format": FORMAT,
        }
        config = {
            "quant_method": "compressed-tensors",
            "format": FORMAT,
            "quantization_status": "compressed",
            "config_groups": {"group_0": group},
            "ignore": ignore,
            "kv_cache_scheme": None,
        }
        return {"quantization_config": config}

    def matches(self, quantization_config: dict) -> bool:
        return quantization_config.get("quant_method") == "compressed-tensors"

    def check_config(self, quantization_config: dict, where: str) -> None:
        if quantization_config.get("format") != FORMAT:
            raise ValueError(
                f"{where}: compressed-tensors format {quantization_config.get('format')!r}, "
                f"Nibble reads {FORMAT!r} (NVFP4) only"
            )
        for name, group in (quantization_config.get("config_groups") or {}).items():
            weights = group.get("weights") or {}
            if (weights.get("num_bits"), weights.get("type"), weights.get("group_size")) != (4, "float", 16):
                raise ValueError(
                    f"{where}: config group {name!r} does not quantise weights as NVFP4 (4-bit float, group 16)"
                )


COMPRESSED_TENSORS = CompressedTensors()
