"""The fused RMSNorm Triton kernel (:mod:`nibble.kernels.gpu.rms_norm`) against the composition it replaces
(:class:`nibble.model.layers.RMSNorm` in bf16 compute), bit for bit.

Without CUDA the kernel runs under Triton's interpreter (``tests/conftest.py``). PyTorch's CPU ``mean``
divides by n where its CUDA ``mean`` (the composition the kernel stands for) multiplies by ``fl(1/n)``; the
two agree when n is a power of two, so the CPU compares with the composition itself at those n and with the
CUDA arithmetic spelled out at the others. The ``gpu`` tests compare with the composition on the H200,
where the kernel runs compiled, and check the module's dispatch.
"""

import pytest
import torch

from tests.helpers import assert_same_bits, gaussian, heavy_tailed

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import rms_norm  # imports triton, hence after the skip
from nibble.model import MoETransformer, tiny
from nibble.model.layers import RMSNorm
from nibble.model.rope import rotary
from nibble.recipe import compute
from nibble.recipe.modules import bf16_operand
from nibble.recipe.plan import PrecisionPlan

EPS = 1e-6
BF16_PLAN = PrecisionPlan(num_layers=1, compute_dtype="bfloat16")


def _composition(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`RMSNorm`'s composition in bf16 compute, op by op on ``x``'s device."""
    return bf16_operand(weight, BF16_PLAN) * compute.rms_normalize(x, eps).to(torch.bfloat16)


def _cuda_composition(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The composition as CUDA computes it (``mean`` as the sum times ``fl(1/n)``), spelled out on the CPU."""
    x64 = x.to(torch.float64)
    mean_sq = x64.pow(2).sum(-1, keepdim=True) * (1.0 / x.shape[-1])
    normed = (x64 * torch.rsqrt(mean_sq + eps)).to(torch.float32).to(torch.bfloat16)
    return weight.to(torch.bfloat16) * normed


def _rope_composition(x: torch.Tensor, weight: torch.Tensor, eps: float, cos, sin, norm=_cuda_composition):
    """:class:`Attention`'s q/k path: the norm over each head, then RoPE in bf16 (cos/sin ``[..., n]``)."""
    y = norm(x, weight, eps)
    cos, sin = cos.unsqueeze(-2).to(torch.bfloat16), sin.unsqueeze(-2).to(torch.bfloat16)
    half = x.shape[-1] // 2
    return y * cos + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin


def _rope_tables(batch: int, tokens: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.randint(0, 4096, (batch, tokens), generator=torch.Generator().manual_seed(seed))
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, n, 2, dtype=torch.float32) / n)
    return rotary(positions, inv_freq, 1.3)


def _inputs(rows: int, n: int, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    extremes = gaussian((rows, n), seed) * torch.logspace(-30, 30, rows).unsqueeze(1)  # a scale per row
    limit = torch.finfo(dtype).max
    return {
        "gaussian": gaussian((rows, n), seed).to(dtype),
        "heavy_tailed": heavy_tailed((rows, n), seed).to(dtype),
        "extremes": extremes.clamp(-limit, limit).to(dtype),
        "subnormal": (gaussian((rows, n), seed) * torch.finfo(dtype).smallest_normal).to(dtype),
        "zeros": torch.zeros((rows, n), dtype=dtype),
    }


@pytest.mark.parametrize("n", [1, 64, 128, 576, 2048, 2049, 5000])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_kernel_gives_the_composition_bits(n, x_dtype, w_dtype):
    rows = 3 if n > 2048 else 9
    weight = (1 + 0.3 * gaussian((n,), n + 1)).to(w_dtype)
    for name, x in _inputs(rows, n, n, x_dtype).items():
        y = rms_norm.rms_norm(x, weight, EPS)
        assert_same_bits(_cuda_composition(x, weight, EPS), y, f"{name}, n={n}")
        if n & (n - 1) == 0:  # CPU mean and CUDA mean agree
            assert_same_bits(_composition(x, weight, EPS), y, f"{name}, n={n} (module composition)")


def test_subnormal_weights_and_outputs():
    # bf16 subnormals in the weight, so in the output too (Triton's interpreter mishandles bf16 subnormals)
    n = 64
    weight = (gaussian((n,), 11) * torch.finfo(torch.bfloat16).smallest_normal).to(torch.bfloat16)
    assert (weight.abs() < torch.finfo(torch.bfloat16).smallest_normal).sum() > n // 4
    x = heavy_tailed((5, n), 12).to(torch.bfloat16)
    y = rms_norm.rms_norm(x, weight, EPS)
    assert (y.abs() < torch.finfo(torch.bfloat16).smallest_normal).sum() > 0
    assert_same_bits(_composition(x, weight, EPS), y, "subnormal weight")


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.1])
def test_eps_arrives_in_float64(eps):
    # a sum of squares of 1e-3 so that the eps term shows in the result's bits (1e-5 is not a float32)
    x = torch.full((4, 96), 1e-3) * (1 + 0.01 * gaussian((4, 96), 3))
    weight = gaussian((96,), 4)
    assert_same_bits(_cuda_composition(x, weight, eps), rms_norm.rms_norm(x, weight, eps), f"eps={eps}")


def test_non_finite_inputs_give_nan_rows_only():
    x = gaussian((4, 64), 5).to(torch.bfloat16)
    x[1, 7] = float("nan")
    x[2, 3] = float("inf")
    y = rms_norm.rms_norm(x, torch.ones(64), EPS)
    reference = _cuda_composition(x, torch.ones(64), EPS)
    # which NaN a NaN operand gives (sign, payload) is the hardware's: only where the NaNs are is compared
    assert torch.equal(y.isnan(), reference.isnan())
    assert y[1].isnan().all() and y[2, 3].isnan() and y[[0, 3]].isfinite().all()
    finite = ~y.isnan()
    assert_same_bits(reference[finite], y[finite], "non-finite rows, elsewhere")


def test_shapes_strides_and_empty_inputs():
    x = heavy_tailed((2, 5, 3, 128), 6).to(torch.bfloat16)
    weight = gaussian((128,), 7)
    y = rms_norm.rms_norm(x, weight, EPS)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert_same_bits(_cuda_composition(x, weight, EPS), y, "4-D input")
    strided = x.transpose(1, 2)  # not contiguous
    assert_same_bits(_cuda_composition(strided, weight, EPS), rms_norm.rms_norm(strided, weight, EPS), "strided")
    assert rms_norm.rms_norm(torch.empty((0, 128)), weight, EPS).shape == (0, 128)
    assert rms_norm.rms_norm(torch.empty((3, 0)), torch.empty(0), EPS).shape == (3, 0)


@pytest.mark.parametrize(
    "x,weight,eps,match",
    [
        (torch.ones(2, 8), torch.ones(7), EPS, r"x \[\.\.\., n\] and weight \[n\]"),
        (torch.ones(2, 8), torch.ones(2, 8), EPS, r"weight \[n\]"),
        (torch.tensor(1.0), torch.ones(1), EPS, r"x \[\.\.\., n\]"),
        (torch.ones(2, 8, dtype=torch.float64), torch.ones(8), EPS, "float64"),
        (torch.ones(2, 8), torch.ones(8, dtype=torch.int32), EPS, "int32"),
        (torch.ones(2, 8), torch.ones(8), -1e-6, "eps must be a finite float >= 0"),
        (torch.ones(2, 8), torch.ones(8), float("nan"), "eps must be a finite float >= 0"),
        (torch.ones(2, 8), torch.ones(8), "1e-6", "eps must be a finite float >= 0"),
        (torch.ones(2, 8), torch.ones(8), True, "eps must be a finite float >= 0"),
    ],
)
def test_rejects_bad_operands(x, weight, eps, match):
    with pytest.raises(ValueError, match=match):
        rms_norm.rms_norm(x, weight, eps)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        rms_norm.rms_norm(torch.ones(2, 8), torch.ones(8), EPS)


@pytest.mark.parametrize("n", [2, 32, 128, 576])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_rope_gives_the_attention_composition_bits(n, table_dtype):
    cos, sin = (t.to(table_dtype) for t in _rope_tables(2, 3, n, n))
    weight = 1 + 0.3 * gaussian((n,), n + 2)
    for name, x in _inputs(2 * 3 * 5, n, n + 3, torch.bfloat16).items():
        x = x.reshape(2, 3, 5, n)
        y = rms_norm.rms_norm(x, weight, EPS, rope=(cos, sin))
        assert_same_bits(_rope_composition(x, weight, EPS, cos, sin), y, f"{name}, n={n}")


@pytest.mark.parametrize(
    "x,tables,match",
    [
        (torch.ones(2, 3, 4, 8), (torch.ones(2, 3, 8),), r"rope needs \(cos, sin\)"),
        (torch.ones(2, 3, 4, 8), (torch.ones(2, 4, 8), torch.ones(2, 4, 8)), r"each \(2, 3, 8\)"),
        (torch.ones(8), (torch.ones(8), torch.ones(8)), r"x \[\.\.\., heads, n\]"),
        (torch.ones(2, 4, 7), (torch.ones(2, 7), torch.ones(2, 7)), "an even head size of at most 2048"),
        (torch.ones(1, 1, 4096), (torch.ones(1, 4096), torch.ones(1, 4096)), "an even head size of at most 2048"),
        (torch.ones(2, 4, 8), (torch.ones(2, 8), torch.ones(2, 8, dtype=torch.int64)), "int64"),
    ],
)
def test_rope_rejects_bad_tables(x, tables, match):
    with pytest.raises(ValueError, match=match):
        rms_norm.rms_norm(x, torch.ones(x.shape[-1]), EPS, rope=tables)


def test_the_module_keeps_the_composition_off_cuda():
    x = gaussian((3, 64), 8).to(torch.bfloat16)
    assert not compute.runs_rms_norm_kernel(x, torch.ones(64), torch.bfloat16)
    module = RMSNorm(64, EPS, BF16_PLAN)
    with torch.no_grad():
        assert_same_bits(_composition(x, module.weight, EPS), module(x), "CPU module")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [128, 576, 2048, 4096, 5000, 7168])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_kernel_gives_the_cuda_composition_bits(n, x_dtype):
    weight = (1 + 0.3 * gaussian((n,), n + 1)).cuda()
    for rows in (1, 64, 2048):
        for name, x in _inputs(rows, n, n + rows, x_dtype).items():
            x = x.cuda()
            reference = _composition(x, weight, EPS).cpu()
            assert_same_bits(reference, rms_norm.rms_norm(x, weight, EPS), f"{name}, {rows}×{n}")


@pytest.mark.gpu
def test_module_on_cuda_runs_the_kernel_without_a_gradient_and_the_composition_with_one(monkeypatch):
    module = RMSNorm(576, EPS, BF16_PLAN).cuda()
    with torch.no_grad():
        module.weight.copy_(1 + 0.3 * gaussian((576,), 9).cuda())
    x = heavy_tailed((4, 33, 576), 10).to(torch.bfloat16).cuda()
    calls = []
    launch = rms_norm.rms_norm
    monkeypatch.setattr(rms_norm, "rms_norm", lambda *a: calls.append(a) or launch(*a))
    with torch.no_grad():
        fused = module(x)
    assert len(calls) == 1
    trained = module(x)  # the weight requires a gradient: the composition, with its straight-through cast
    assert len(calls) == 1 and trained.requires_grad
    assert_same_bits(trained.detach().cpu(), fused, "module, no gradient against with one")
    trained.float().sum().backward()
    assert module.weight.grad is not None and module.weight.grad.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("n", [64, 128, 256])
def test_rope_gives_the_cuda_attention_composition_bits(n):
    cos, sin = (t.cuda() for t in _rope_tables(64, 2, n, n))
    weight = (1 + 0.3 * gaussian((n,), n + 2)).cuda()
    for name, x in _inputs(64 * 2 * 32, n, n + 3, torch.bfloat16).items():
        x = x.reshape(64, 2, 32, n).cuda()
        reference = _rope_composition(x, weight, EPS, cos, sin, norm=_composition).cpu()
        assert_same_bits(reference, rms_norm.rms_norm(x, weight, EPS, rope=(cos, sin)), f"{name}, n={n}")


@pytest.mark.gpu
def test_a_models_forward_without_a_gradient_gives_the_bits_of_its_forward_with_one(monkeypatch):
    # without a gradient every RMSNorm and the q/k norms with RoPE run fused; with one, the compositions
    torch.manual_seed(0)
    config = tiny(vocab_size=64)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers, compute_dtype="bfloat16", format="bf16")
    model = MoETransformer(config, plan).cuda()
    ids = torch.randint(0, 64, (3, 17), device="cuda")
    calls = []
    launch = rms_norm.rms_norm
    monkeypatch.setattr(rms_norm, "rms_norm", lambda *a, **kw: calls.append("rope" in kw) or launch(*a, **kw))
    with torch.no_grad():
        fused = model(ids)
    layers = config.num_hidden_layers
    assert calls.count(True) == 2 * layers and calls.count(False) == 2 * layers + 1  # q/k; input/post; final
    composed = model(ids)
    assert composed.requires_grad and len(calls) == 4 * layers + 1
    assert_same_bits(composed.detach().cpu(), fused, "logits")
