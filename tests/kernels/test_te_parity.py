"""Nibble's NVFP4 equals Transformer Engine 2.20.2's own reference quantiser bit for bit (docs/design.md §2.2–2.3).

TE's ``NVFP4QuantizerRef`` is executed from the ``transformer-engine`` wheel (a test dependency; its
compiled core is absent here) — codes, block-scale bytes, global decode scales and 4/6 choices are
compared on every input family of the parity tests plus the cases where the float32 operation order
decides: E4M3 ties of the block scale (plain and ×1.5), −0.0, blocks whose scale underflows, zero rows
and tensors, tiny rows and per-token rows 2^±30 apart, in float32, bfloat16 and float16. On CUDA the
same TE outputs (computed on the CPU) are compared with the CUDA reference and the Triton kernels.
"""

import functools

import pytest
import torch

from nibble.kernels import nvfp4
from nibble.kernels.contract import with_te
from nibble.kernels.te_reference import TE_VERSION, TEReference
from tests.helpers import (
    e4m3_scale_ties,
    heavy_tailed,
    outlier_activations,
    parity_inputs,
    rows_of_distant_magnitude,
    signed_zeros,
    tiny_rows,
    underflowing_blocks,
)

MODES = [
    ("per_tensor", None),
    ("per_token", None),
    ("per_tensor", "mse"),
    ("per_token", "mse"),
    ("per_tensor", "mae"),
    ("per_token", "mae"),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def te() -> TEReference:
    ref = TEReference()
    assert ref.version == TE_VERSION, f"tests pin Transformer Engine {TE_VERSION}, found {ref.version}"
    return ref


@functools.cache
def te_cases(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every parity-test input (trimmed) and the TE-specific families, cast to ``dtype``."""
    cases = {name: x.reshape(-1, x.shape[-1])[:32] for name, x in parity_inputs(torch.float32).items()}
    cases |= {
        "e4m3_scale_ties": e4m3_scale_ties(24, 512, four_over_six=False, seed=11),
        "e4m3_scale_ties_46": e4m3_scale_ties(24, 512, four_over_six=True, seed=12),
        "signed_zeros": signed_zeros(16, 128, 13),
        "underflowing_blocks": underflowing_blocks(8, 128, 14),
        "zero_tensor": torch.zeros(4, 64),
        "negative_zero_tensor": torch.full((4, 64), -0.0),
        "tiny_rows": tiny_rows(),
        "distant_rows": rows_of_distant_magnitude(9, 256, 15),
        "outlier_activations": outlier_activations(128, 2048, 16, torch.float32),
        "heavy_tailed_small": heavy_tailed((32, 512), 18),
    }
    limit = torch.finfo(dtype).max / 2
    return {name: x.clamp(-limit, limit).to(dtype) for name, x in cases.items()}


def assert_agrees(te, x, scale, four_over_six, what, backend=None) -> None:
    agreement = with_te(te, x, scale=scale, four_over_six=four_over_six, backend=backend)
    assert agreement.identical, f"{what} ({scale}, 4/6 {four_over_six}) vs TE {TE_VERSION}: {agreement.describe()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("scale", "four_over_six"), MODES)
def test_reference_equals_transformer_engine(te, dtype, scale, four_over_six):
    for name, x in te_cases(dtype).items():
        assert_agrees(te, x, scale, four_over_six, name)


def test_the_issue_examples_store_what_te_stores(te):
    """The bytes quoted when the convention changed: amax 1 with bmax 0x1.5b6db6p-3 (plain) stores 80, not
    72; amax 1.25 with bmax 0x1.18p-4 and an element 0x1.3cp-5 picks map-to-4 under MSE with scale 22 (the
    old order's map-to-4 candidate was 20, and the choice flipped)."""
    plain = torch.zeros(1, 32)
    plain[0, 0], plain[0, 16] = 1.0, float.fromhex("0x1.5b6db6p-3")
    assert nvfp4.quantize(plain).block_scales[0, 1].float().item() == 80.0
    four_six = torch.zeros(1, 32)
    four_six[0, 0], four_six[0, 16], four_six[0, 17] = 1.25, float.fromhex("0x1.18p-4"), float.fromhex("0x1.3cp-5")
    q, choice = nvfp4.quantize_with_choices(four_six, four_over_six="mse")
    assert choice[0, 1] and q.block_scales[0, 1].float().item() == 22.0
    assert_agrees(te, plain, "per_tensor", None, "plain example")
    assert_agrees(te, four_six, "per_tensor", "mse", "4/6 example")


def test_an_all_zero_tensor_has_te_s_decode_scale(te):
    q = nvfp4.quantize(torch.zeros(2, 32))
    assert q.global_scale.item() == 2.0**-128  # 1 / FLT_MAX, a float32 subnormal
    assert (q.dequantize() == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("scale", "four_over_six"), MODES)
def test_cuda_backends_equal_transformer_engine(te, backend, dtype, scale, four_over_six):
    for name, x in te_cases(dtype).items():
        assert_agrees(te, x.cuda(), scale, four_over_six, f"{backend} {name}", backend=backend)


def test_a_missing_or_wrong_wheel_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TEReference(tmp_path / "transformer_engine-2.20.2-py3-none-any.whl")
    not_zip = tmp_path / "transformer_engine-2.20.2-py3-none-any.whl"
    not_zip.write_text("not a zip")
    with pytest.raises(ValueError, match="not a wheel"):
        TEReference(not_zip)
