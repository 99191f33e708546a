"""A loader nobody here wrote: Hugging Face transformers (with compressed-tensors' quantizer) loads Nibble's
compressed-tensors export of the dense NVFP4 model, decodes every NVFP4 weight to exactly Nibble's values
(in the checkpoint's bf16), and computes the logits Nibble computes from those weights.

transformers decodes here (``dequantize=True``): running the packed weights needs CUDA kernels. The
engines' fused ``gate_up_proj`` is not exercised by transformers (it keeps one ``nn.Linear`` each); that
the pair shares one global scale is checked on the tensors themselves (``test_checkpoint.py``)."""

from __future__ import annotations

import pytest
import torch

from nibble.interop import dequantized_state, export_checkpoint, write_dequantized
from nibble.model import from_pretrained

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")


def test_transformers_decodes_nibbles_nvfp4_export_to_nibbles_values(dense, tmp_path):
    out = export_checkpoint(dense, tmp_path / "ct", "compressed-tensors")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(dequantize=True)
    ).eval()
    ours = dequantized_state(dense, torch.bfloat16)
    loaded = theirs.state_dict()
    nvfp4 = [name.removesuffix("::codes") for name in dense.state if name.endswith("::codes")]
    assert nvfp4, "the fixture has NVFP4 weights"
    for name in nvfp4:
        assert torch.equal(loaded[name], ours[name].float()), name

    nibble = from_pretrained(write_dequantized(dense, tmp_path / "bf16", dtype=torch.bfloat16)).eval()
    ids = torch.randint(0, dense.model_config["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(nibble(ids), theirs(ids).logits, atol=1e-4, rtol=1e-4)
