"""The NVFP4 quantise kernel's own arithmetic against the spec's definitions (docs/design.md §2.1, §2.3).

The kernel rounds to E2M1 with a magic-number add instead of seven threshold compares, codes the 4/6
path's chosen candidate from its rounded magnitude (``code_word``), and computes the 4/6 error's
per-element ``d`` once per grid magnitude or from two float64 products per block instead of one division
per element (kernels/gpu/nvfp4_quantize.py and nvfp4_four_over_six.py prove them). These tests
run the kernel's own ``@triton.jit`` functions through probe kernels — under the Triton interpreter on the
CPU, compiled on a GPU — on every float32 near the E2M1 grid, and on blocks spanning the whole float32
range of scales and amax.
"""

import numpy as np
import pytest
import torch

from nibble.kernels import nvfp4
from nibble.kernels.codecs import e2m1_decode, e2m1_rne, pack_e2m1
from tests.helpers import assert_same_bits, heavy_tailed

triton = pytest.importorskip("triton", reason="the triton package is not installed")
import triton.language as tl  # noqa: E402  (after the skip)

from nibble.kernels.gpu import nvfp4 as gpu_nvfp4  # noqa: E402
from nibble.kernels.gpu.nvfp4_four_over_six import (  # noqa: E402
    block_error_exact,
    block_error_fast,
    fast_rows,
    fast_terms,
    sum16_in_order,
)
from nibble.kernels.gpu.nvfp4_quantize import code_word, e2m1_magnitude, e2m1_round, e2m1_value  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROBE = 1 << 16


@triton.jit
def _e2m1_probe(v_ptr, code_ptr, rounded_ptr, word_ptr, BLOCK: tl.constexpr):
    """``e2m1_round`` and ``e2m1_magnitude`` per element, and the 4/6 path's ``code_word`` of each 8."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(v_ptr + offs)
    tl.store(code_ptr + offs, e2m1_round(v))
    tl.store(rounded_ptr + offs, e2m1_magnitude(v))
    eights = tl.reshape(v, (BLOCK // 8, 1, 8))
    words = tl.program_id(0) * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    tl.store(word_ptr + words[:, None], code_word(e2m1_magnitude(eights), eights))


@triton.jit
def _error_probe(
    x_ptr, enc_ptr, sf_ptr, amax_ptr, spec_ptr, exact_ptr, fast_ptr, ok_ptr, MSE: tl.constexpr, NB: tl.constexpr
):  # fmt: skip
    """``NB`` blocks ``x [NB, 16]``, each its own row (own ``amax``) with its ``enc`` and ``sf``: the 4/6 error
    as docs/design.md §2.3 writes it (signed ``d``, one division per element), the kernel's two forms, and
    the fast form's flag."""
    blocks = tl.program_id(0) * NB + tl.arange(0, NB)
    offs = blocks[:, None, None] * 16 + tl.arange(0, 8)[None, None, :]
    x_lo = tl.load(x_ptr + offs)
    x_hi = tl.load(x_ptr + offs + 8)
    enc = tl.load(enc_ptr + blocks)[:, None]
    sf = tl.load(sf_ptr + blocks)[:, None]
    amax = tl.load(amax_ptr + blocks)
    c_lo, r_lo = e2m1_round(x_lo * enc[:, :, None]), e2m1_magnitude(x_lo * enc[:, :, None])
    c_hi, r_hi = e2m1_round(x_hi * enc[:, :, None]), e2m1_magnitude(x_hi * enc[:, :, None])
    six_e = tl.full(x_lo.shape, 1536.0, tl.float32)
    d_lo = tl.div_rn((e2m1_value(c_lo) * sf[:, :, None]) * amax[:, None, None], six_e)
    d_hi = tl.div_rn((e2m1_value(c_hi) * sf[:, :, None]) * amax[:, None, None], six_e)
    if MSE:
        spec = sum16_in_order((d_lo - x_lo) * (d_lo - x_lo), (d_hi - x_hi) * (d_hi - x_hi))
    else:
        spec = sum16_in_order(tl.abs(d_lo - x_lo), tl.abs(d_hi - x_hi))
    b1, b15 = fast_terms(sf, amax, 1536.0)
    ok = fast_rows(amax, amax == amax, 1536.0)
    tl.store(spec_ptr + blocks[:, None], spec)
    tl.store(exact_ptr + blocks[:, None], block_error_exact(r_lo, r_hi, x_lo, x_hi, sf, amax, 1536.0, MSE))
    tl.store(fast_ptr + blocks[:, None], block_error_fast(r_lo, r_hi, x_lo, x_hi, b1, b15, MSE))
    tl.store(ok_ptr + blocks, ok.to(tl.int8))


@triton.jit
def _fast_terms_probe(y_ptr, b1_ptr, b15_ptr, N, BLOCK: tl.constexpr):
    """``fast_terms`` with ``sf = 1`` and ``amax = y``: ``fl(y / 1536)`` and ``fl(fl(1.5 · y) / 1536)``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    y = tl.load(y_ptr + offs, mask=ok, other=0.0)
    b1, b15 = fast_terms(tl.full((BLOCK, 1), 1.0, tl.float32), y, 1536.0)
    tl.store(b1_ptr + offs[:, None], b1, mask=ok[:, None])
    tl.store(b15_ptr + offs[:, None], b15, mask=ok[:, None])


def _run_e2m1(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    v = torch.nn.functional.pad(v, (0, -v.numel() % PROBE)).to(DEVICE)  # whole probes: zeros appended
    code = torch.empty(v.shape, dtype=torch.int32, device=DEVICE)
    rounded = torch.empty(v.shape, dtype=torch.float32, device=DEVICE)
    words = torch.empty(v.numel() // 8, dtype=torch.int32, device=DEVICE)
    _e2m1_probe[(v.numel() // PROBE,)](v, code, rounded, words, BLOCK=PROBE, enable_fp_fusion=False)
    return code.cpu(), rounded.cpu(), words.cpu()


def _check_e2m1(bits: np.ndarray) -> None:
    v = torch.from_numpy(bits.view(np.float32))
    code, rounded, words = _run_e2m1(v)
    want = e2m1_rne(v)
    n = v.numel()
    bad = code[:n] != want.to(torch.int32)
    assert not bad.any(), f"{int(bad.sum())} codes differ, first at {v[bad][:4].tolist()}"
    assert_same_bits(e2m1_decode(want).abs(), rounded[:n], "rounded magnitude")
    # the word layout of the kernel's codes (little-endian bytes of pack_e2m1), padding coded as +0
    packed = pack_e2m1(torch.nn.functional.pad(want, (0, code.numel() - n)))
    assert_same_bits(packed.view(torch.int32), words, "code_word from the rounded magnitude")


@pytest.mark.parametrize("sign", [0, 1])
@pytest.mark.long
def test_e2m1_round_on_every_float32_from_2e_minus_8_to_8(sign):
    """Every float32 of magnitude in [2^-8, 8): every tie, midpoint neighbour and binade edge of the grid."""
    for exponent in range(119, 130):
        bits = (np.arange(1 << 23, dtype=np.uint32) | np.uint32(exponent << 23)) | np.uint32(sign << 31)
        _check_e2m1(bits)


def test_e2m1_round_below_2e_minus_8_above_8_and_special_values():
    """Magnitudes below 2^-8 all round to 0 (the add only sees ``2^22 + m``); above 6 all saturate: a
    random sample of each, every exponent's first and last mantissa, zeros, subnormals and infinities."""
    gen = np.random.default_rng(0)
    small = gen.integers(0, 119 << 23, 1 << 20, dtype=np.uint32)
    large = gen.integers(130 << 23, 0x7F800001, 1 << 20, dtype=np.uint32)
    edges = np.array([(e << 23) | m for e in range(256) for m in (0, 1, 0x7FFFFF)], dtype=np.uint32)
    edges = edges[(edges & 0x7FFFFFFF) <= 0x7F800000]  # no NaN: the quantiser rejects it
    bits = np.concatenate([small, large, edges])
    _check_e2m1(np.concatenate([bits, bits | np.uint32(1 << 31)]))


def test_fast_terms_float64_quotient_equals_float32_division_on_every_significand():
    """``fast_terms`` divides by 6E = 1536 through a float64 product; the proof (its docstring) says only
    the significand matters while the quotient is a normal float32. Every one of the 2^23 significands at
    three binades — [2^-114, 2^-113), which holds the lowest ``y`` :func:`fast_rows` admits (about
    1.5 · 2^-114), [1, 2) and [2^123, 2^124), the largest — against IEEE float32 division."""
    significands = np.arange(1 << 23, dtype=np.uint32)
    for exponent in (127 - 114, 127, 127 + 123):
        y = torch.from_numpy((significands | np.uint32(exponent << 23)).view(np.float32))
        b1, b15 = (torch.empty_like(y, device=DEVICE) for _ in range(2))
        _fast_terms_probe[(triton.cdiv(y.numel(), PROBE),)](
            y.to(DEVICE), b1, b15, y.numel(), BLOCK=PROBE, enable_fp_fusion=False
        )  # fmt: skip
        binade = f"y in [2^{exponent - 127}, 2^{exponent - 126})"
        assert_same_bits(y / 1536.0, b1.cpu(), f"fl(y / 1536), {binade}")
        assert_same_bits((y * 1.5) / 1536.0, b15.cpu(), f"fl(1.5 y / 1536), {binade}")


def _e4m3_values() -> torch.Tensor:
    """Every non-negative finite E4M3 value (0 and 126 positive), float32."""
    return torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


@pytest.mark.parametrize("metric", ["mse", "mae"])
def test_four_over_six_error_forms_equal_the_spec_form(metric):
    """Blocks with every E4M3 scale, amax log-uniform over all of float32 (plus its edges), encode scales
    around and far from the one the scale implies, and elements of every magnitude: the per-magnitude form
    always, and the fast form wherever its row flag is set, give the spec's error bits; the flag is set on
    rows of ordinary magnitude."""
    gen = torch.Generator().manual_seed(1)
    sf = _e4m3_values().repeat(64)
    n = sf.numel()
    amax = torch.exp2(torch.empty(n).uniform_(-149, 128, generator=gen)).clamp(max=torch.finfo(torch.float32).max)
    amax[:8] = torch.tensor([0.0, 2.0**-149, 2.0**-126, 1.0, 448.0, 2.0**100, 2.0**126, torch.finfo(torch.float32).max])
    g = amax / 1536.0
    enc = torch.where(sf * g > 0, 1.0 / (sf * g), torch.finfo(torch.float32).max)
    enc = enc * torch.exp2(torch.empty(n).uniform_(-2, 2, generator=gen))  # off the implied scale too
    enc = enc.clamp(max=torch.finfo(torch.float32).max)  # as the kernel's encode scale is
    x = torch.randn(n, 16, generator=gen) * (sf * g).clamp(min=2.0**-149).unsqueeze(-1) * 4.0
    x[::7] = heavy_tailed((len(x[::7]), 16), 3) * amax[::7].unsqueeze(-1) / 8
    x = torch.nan_to_num(x, posinf=0.0, neginf=0.0)
    spec, exact, fast = (torch.empty(n, device=DEVICE) for _ in range(3))
    ok = torch.empty(n, dtype=torch.int8, device=DEVICE)
    _error_probe[(n // 64,)](
        x.to(DEVICE), enc.to(DEVICE), sf.to(DEVICE), amax.to(DEVICE), spec, exact, fast, ok,
        MSE=metric == "mse", NB=64, enable_fp_fusion=False,
    )  # fmt: skip
    ok = ok.cpu().bool()
    assert_same_bits(spec.cpu(), exact.cpu(), "per-magnitude 4/6 error")
    assert_same_bits(spec.cpu()[ok], fast.cpu()[ok], "fast 4/6 error")
    ordinary = (amax > 2.0**-90) & (amax < 2.0**100)
    assert ok[ordinary].all(), "the fast form should cover every row of ordinary magnitude"
    assert not ok[(amax > 0) & (amax < 2.0**-120)].any(), "rows this small must take the exact form"


@pytest.mark.gpu
@pytest.mark.parametrize("four_over_six", [None, "mse", "mae"])
@pytest.mark.parametrize("launch", [None, (512, 1), (2048, 4), (4096, 8)])
def test_benchmark_shapes_are_bit_identical_on_cuda(four_over_six, launch):
    """The benchmark's activation and weight shapes (bf16, per token and per tensor), compiled on the GPU
    with the default and other launches, against the torch reference on CUDA (itself CPU-identical)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in [(8192, 7168), (32, 7168), (64, 2048), (4096, 4096)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        x[: shape[0] // 4] *= torch.exp2(
            torch.randint(-20, 20, (shape[0] // 4, 1), device="cuda", generator=gen).float()
        )
        for scale in ("per_token", "per_tensor"):
            ref, ref_map = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=four_over_six, backend="reference")
            out, out_map = gpu_nvfp4.quantize(
                x, per_token=scale == "per_token", four_over_six=four_over_six, with_choices=True, launch=launch
            )
            assert_same_bits(ref.codes.cpu(), out.codes, f"{shape} {scale} codes")
            assert_same_bits(ref.block_scales.cpu(), out.block_scales, f"{shape} {scale} block scales")
            assert_same_bits(
                ref.global_scale.cpu(), out.global_scale.reshape(ref.global_scale.shape), f"{shape} {scale} g"
            )
            if four_over_six:
                assert_same_bits(ref_map.cpu(), out_map, f"{shape} {scale} map-to-4")
