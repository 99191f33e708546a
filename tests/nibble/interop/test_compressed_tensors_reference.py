"""Nibble's exports read by compressed-tensors' own code (the library vLLM and SGLang share for this
layout): its config model, its FP4 unpacking and dequantisation, its ModelOpt → compressed-tensors
converter. compressed-tensors is a test dependency; Nibble never imports it."""

import json

import pytest
import torch
from safetensors.torch import load_file

from nibble.interop import QuantizedCheckpoint, export_checkpoint, split_state
from nibble.kernels import NVFP4Tensor, nvfp4
from tests.nibble.interop.conftest import bits

ct_quant = pytest.importorskip("compressed_tensors.quantization")
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: E402


@pytest.fixture(scope="module")
def exported(moe, dense, tmp_path_factory):
    """``(checkpoint, config, tensors)`` of the compressed-tensors export of both models."""
    out = []
    for checkpoint in (moe, dense):
        path = export_checkpoint(checkpoint, tmp_path_factory.mktemp("ct") / "out", "compressed-tensors")
        config = json.loads((path / "config.json").read_text())["quantization_config"]
        out.append((checkpoint, config, load_file(path / "model.safetensors")))
    return out


def scheme_of(config):
    parsed = ct_quant.QuantizationConfig.model_validate(config)
    (scheme,) = parsed.config_groups.values()
    return parsed, scheme


def modules(checkpoint: QuantizedCheckpoint):
    return split_state(checkpoint.state)[0].items()


def test_the_config_parses_as_nvfp4_with_dynamic_activations_and_no_static_input_scale(exported):
    for _, config, _ in exported:
        parsed, scheme = scheme_of(config)
        assert parsed.format == "nvfp4-pack-quantized" and parsed.quantization_status == "compressed"
        assert scheme.input_activations.dynamic is True and scheme.weights.strategy == "tensor_group"
        # compressed-tensors' own list of what a module stores under this scheme
        assert NVFP4PackedCompressor.compression_param_names(scheme) == (
            "weight_packed",
            "weight_scale",
            "weight_global_scale",
        )
        assert NVFP4PackedCompressor.can_compress(torch.nn.Linear, scheme)


def test_its_fp4_unpacking_gives_nibbles_e2m1_values_bit_for_bit(exported):
    for checkpoint, _, tensors in exported:
        for module, weight in modules(checkpoint):
            packed = tensors[f"{module}.weight_packed"]
            n, k = packed.shape[0], 2 * packed.shape[1]
            sut = unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32)
            ref = nvfp4.e2m1_decode(nvfp4.unpack_e2m1(weight.codes))  # nibble order and signed zeros too
            assert torch.equal(bits(sut), bits(ref)), module


def test_its_dequantisation_of_the_block_scaled_values_is_nibbles_bit_for_bit(exported):
    for checkpoint, config, tensors in exported:
        _, scheme = scheme_of(config)
        for module, weight in modules(checkpoint):
            packed = tensors[f"{module}.weight_packed"]
            n, k = packed.shape[0], 2 * packed.shape[1]
            x_q = unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32)
            scale = tensors[f"{module}.weight_scale"].to(torch.float32)
            sut = dequantize(x_q=x_q, scale=scale, args=scheme.weights, dtype=torch.float32)
            unit = NVFP4Tensor(weight.codes, weight.block_scales, torch.ones(()), False, torch.Size((n, k)))
            assert torch.equal(bits(sut), bits(unit.dequantize(torch.float32))), module


def test_with_its_global_scale_it_decodes_within_two_float32_ulps_of_nibble(exported):
    """compressed-tensors decodes ``fl(e2m1 · fl(weight_scale / S))``, Transformer Engine (and so Nibble)
    ``fl(fl(e2m1 · weight_scale) · g)`` whose first product is exact: where the global scale is not a
    power of two, ``1/S`` is ``g`` only up to half an ulp before rounding, and its two roundings against
    Nibble's one differ by up to 2 ulps in float32 (bit-identical for a power of two: next test). The
    stored scale itself is exact: ``fl(1 / S) == g``."""
    for checkpoint, config, tensors in exported:
        _, scheme = scheme_of(config)
        for module, weight in modules(checkpoint):
            packed, s = tensors[f"{module}.weight_packed"], tensors[f"{module}.weight_global_scale"]
            n, k = packed.shape[0], 2 * packed.shape[1]
            assert (torch.ones(1) / s).view(torch.int32).item() == weight.global_scale.view(torch.int32).item()
            x_q = unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32)
            scale = tensors[f"{module}.weight_scale"].to(torch.float32)
            sut = dequantize(x_q=x_q, scale=scale, args=scheme.weights, dtype=torch.float32, global_scale=s)
            ref = NVFP4Tensor(weight.codes, weight.block_scales, weight.global_scale, False, torch.Size((n, k)))
            ref = ref.dequantize(torch.float32)
            ulps = (sut.view(torch.int32).long() - ref.view(torch.int32).long()).abs()
            assert int(ulps.max()) <= 2, module  # the roundings of the docstring


def test_with_a_power_of_two_global_scale_its_decompressor_gives_nibbles_values_bit_for_bit(tmp_path):
    amax = 2688.0 * 2.0**-10  # S = 6 · 448 / amax = 1024: every product is exact on both sides
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    x = (x / x.abs().max() * amax).to(torch.bfloat16)
    q = nvfp4.quantize(x)
    assert q.global_scale.item() == 2.0**-10
    state = {"m.proj.weight::codes": q.codes, "m.proj.weight::block_scales": q.block_scales}
    state["m.proj.weight::global_scale"] = q.global_scale
    path = export_checkpoint(QuantizedCheckpoint(state), tmp_path / "o", "compressed-tensors")
    config = json.loads((path / "config.json").read_text())["quantization_config"]
    _, scheme = scheme_of(config)
    tensors = {k.removeprefix("m.proj."): v for k, v in load_file(path / "model.safetensors").items()}
    sut = NVFP4PackedCompressor.decompress(tensors, scheme)["weight"]  # bfloat16, its default
    assert torch.equal(bits(sut), bits(q.dequantize(torch.bfloat16)))


def test_its_modelopt_converter_turns_nibbles_modelopt_export_into_nibbles_compressed_tensors_export(moe, tmp_path):
    ct = load_file(export_checkpoint(moe, tmp_path / "ct", "compressed-tensors") / "model.safetensors")
    mo = load_file(export_checkpoint(moe, tmp_path / "mo", "modelopt") / "model.safetensors")
    converted = ModelOptNvfp4Converter().validate(dict(mo))  # raises on orphan or missing scales
    assert sorted(converted) == sorted(ct)
    for name, tensor in ct.items():
        if name.endswith("weight_global_scale"):  # its 1/x and Nibble's exact preimage: same g within 1 ulp
            g = (torch.ones(1) / tensor).view(torch.int32).long()
            assert (g - (torch.ones(1) / converted[name]).view(torch.int32).long()).abs().item() <= 1, name
        else:
            assert torch.equal(bits(converted[name]), bits(tensor)), name
