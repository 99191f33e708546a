"""The row-invariant dense Triton GEMM (:mod:`nibble.kernels.gpu.dense_gemm`) and its use by
:func:`nibble.recipe.compute.linear`.

Without CUDA the kernel runs under Triton's interpreter (``tests/conftest.py``) with float32 dot products,
so the CPU checks its indexing, masks, split-K and bias against float64 products; the ``gpu`` tests check
on the H200 what the interpreter cannot: that each row gets the same bits whatever the row count (the row
tile varies with M), and the autograd function and ``compute.linear`` dispatch in bf16.
"""

import pytest
import torch

from tests.helpers import gaussian, heavy_tailed

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import dense_gemm, row_invariance  # imports triton, hence after the skip
from nibble.recipe import compute

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# float32 accumulation of exact products of bf16 values: ~1e-7 relative on the interpreter's sums; the
# GPU's tensor-core accumulation may lose a few more bits
F32_TOLERANCE = 1e-6 if DEVICE == "cpu" else 1e-5
BF16_TOLERANCE = 2.0**-8  # one rounding to bf16: at most half an ulp (2^-9) relative per element


def _rel_frobenius(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref).norm() / ref.norm())


def _operands(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = heavy_tailed((m, k), seed).to(torch.bfloat16).to(DEVICE)
    w = gaussian((n, k), seed + 1).to(torch.bfloat16).to(DEVICE)
    b = gaussian((n,), seed + 2).to(torch.bfloat16).to(DEVICE)
    return x, w, b


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    y = x.double().cpu() @ w.double().cpu().T
    return y if b is None else y + b.double().cpu()


@pytest.mark.parametrize("m", [1, 5, 17, 70])
@pytest.mark.parametrize("n,k", [(48, 200), (70, 100), (33, 65)])  # (48, 200) splits K on the interpreter
def test_gemm_matches_float64_products(m, n, k):
    x, w, b = _operands(m, n, k, m + n)
    y = dense_gemm.matmul(x, w, out_dtype=torch.float32)
    assert y.shape == (m, n) and y.dtype == torch.float32 and y.device == x.device
    assert _rel_frobenius(y, _reference(x, w)) < F32_TOLERANCE
    y16 = dense_gemm.matmul(x, w, b)
    assert y16.dtype == torch.bfloat16
    assert _rel_frobenius(y16, _reference(x, w, b)) < BF16_TOLERANCE
    assert _rel_frobenius(dense_gemm.matmul(x, w, b, out_dtype=torch.float32), _reference(x, w, b)) < F32_TOLERANCE


def test_split_k_is_decided_by_columns_and_k_only():
    device = torch.device(DEVICE)
    assert dense_gemm.split_k(48, 200, device) == (2 if DEVICE == "cpu" else 1)
    assert dense_gemm.split_k(151936, 2048, torch.device("cuda")) == 1  # an LM head: enough column tiles
    assert dense_gemm.split_k(576, 4096, torch.device("cuda")) == 4  # 9 column tiles, K shared by 4


@pytest.mark.parametrize("tile", row_invariance.ROW_TILES_USED)
def test_every_row_tile_computes_the_product(tile):
    """Each (BLOCK_M, num_warps) of the row-tile table, forced, on shapes that leave partial row tiles."""
    x, w, b = _operands(70, 48, 200, 3)
    assert _rel_frobenius(dense_gemm.matmul(x, w, b, torch.float32, tile), _reference(x, w, b)) < F32_TOLERANCE


def test_empty_and_degenerate_shapes():
    x, w, b = _operands(0, 48, 200, 4)
    y = dense_gemm.matmul(x, w, b)
    assert y.shape == (0, 48) and y.dtype == torch.bfloat16
    x, w, b = _operands(3, 5, 0, 5)
    assert torch.equal(dense_gemm.matmul(x, w, b).float(), b.float().expand(3, 5))  # an empty sum
    assert dense_gemm.matmul(*_operands(3, 0, 7, 6)[:2]).shape == (3, 0)


def test_non_contiguous_operands():
    x, w, b = _operands(40, 48, 200, 7)
    xt = x.T.contiguous().T  # same values, column-major
    wt = w.T.contiguous().T
    assert not xt.is_contiguous() and not wt.is_contiguous()
    assert torch.equal(dense_gemm.matmul(xt, wt, b), dense_gemm.matmul(x, w, b))
    assert torch.equal(dense_gemm.matmul(x[::2], w), dense_gemm.matmul(x[::2].contiguous(), w))


def test_rejects_bad_operands():
    x, w, _ = _operands(4, 8, 32, 8)
    with pytest.raises(ValueError, match="x \\[M, K\\]"):
        dense_gemm.matmul(x, w[:, :16])
    with pytest.raises(ValueError, match="share a dtype"):
        dense_gemm.matmul(x, w.to(torch.float16))
    with pytest.raises(ValueError, match="out_dtype"):
        dense_gemm.matmul(x, w, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="bias"):
        dense_gemm.matmul(x, w, torch.zeros(7, dtype=torch.bfloat16, device=DEVICE))


def test_autograd_function_gradients_match_float64():
    """``DenseLinear`` (the interpreter runs its forward on the CPU; its backward is torch matmuls)."""
    x, w, b = (t.clone().requires_grad_(True) for t in _operands(17, 48, 200, 9))
    dy = gaussian((17, 48), 10).to(torch.bfloat16).to(DEVICE)
    y = compute.DenseLinear.apply(x, w, b)
    assert y.dtype == torch.bfloat16
    y.backward(dy)
    xd, wd, dyd = x.detach().double().cpu(), w.detach().double().cpu(), dy.double().cpu()
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.bfloat16
    assert _rel_frobenius(x.grad, dyd @ wd) < BF16_TOLERANCE
    assert _rel_frobenius(w.grad, dyd.T @ xd) < BF16_TOLERANCE
    assert _rel_frobenius(b.grad, dyd.sum(0)) < BF16_TOLERANCE
    assert _rel_frobenius(y.detach(), _reference(x.detach(), w.detach(), b.detach())) < BF16_TOLERANCE


def test_linear_keeps_the_float64_path_off_cuda():
    """On the CPU (and for float32 operands anywhere) ``compute.linear`` is the float64 path, bit for bit."""
    for dtype in (torch.float32, torch.bfloat16):
        x, w = gaussian((5, 3, 40), 11).to(dtype), gaussian((24, 40), 12).to(dtype)
        expected = torch.nn.functional.linear(x.double(), w.double()).to(dtype)
        assert not compute.runs_dense_gemm(x, w)
        assert torch.equal(compute.linear(x, w), expected)


@pytest.mark.gpu
def test_each_row_gets_the_same_bits_whatever_the_row_count():
    """The row tile changes with M: rows of small products equal the same rows of an M = 1500 product, on
    shapes without and with split-K, with and without bias, in bf16 and float32 output."""
    for n, k in ((384, 512), (576, 4096), (1000, 2048)):
        x, w, b = _operands(1500, n, k, n)
        for bias in (None, b):
            for out_dtype in (torch.bfloat16, torch.float32):
                full = dense_gemm.matmul(x, w, bias, out_dtype)
                for m in (1, 2, 5, 16, 17, 64, 65, 128, 1024):
                    assert torch.equal(dense_gemm.matmul(x[:m], w, bias, out_dtype), full[:m]), (n, k, m)
                    # a window of rows that does not start at row 0 (other tiles hold the rows)
                    assert torch.equal(dense_gemm.matmul(x[7 : 7 + m], w, bias, out_dtype), full[7 : 7 + m])
        assert _rel_frobenius(dense_gemm.matmul(x, w, None, torch.float32), _reference(x, w)) < F32_TOLERANCE


@pytest.mark.gpu
def test_every_row_tile_gives_the_same_bits():
    """Every tile of the table, forced at one M, gives the reference tile's bits."""
    x, w, b = _operands(300, 576, 4096, 13)
    ref = dense_gemm.matmul(x, w, b, tile=row_invariance.REFERENCE_TILE)
    for tile in row_invariance.ROW_TILES_USED:
        assert torch.equal(dense_gemm.matmul(x, w, b, tile=tile), ref), tile


@pytest.mark.gpu
def test_linear_on_cuda_bf16_runs_the_kernel_with_gradients():
    x, w, b = _operands(37, 200, 256, 14)
    x3 = x.reshape(1, 37, 256)
    assert compute.runs_dense_gemm(x3, w, b)
    with torch.no_grad():
        assert torch.equal(compute.linear(x3, w, b), dense_gemm.matmul(x, w, b).reshape(1, 37, 200))
    # gradients reach float32 masters through their bf16 casts (bf16_operand's form in bf16 compute)
    master_w = w.float().requires_grad_(True)
    master_b = b.float().requires_grad_(True)
    xg = x3.clone().requires_grad_(True)
    y = compute.linear(xg, master_w.to(torch.bfloat16), master_b.to(torch.bfloat16))
    assert torch.equal(y.detach(), dense_gemm.matmul(x, w, b).reshape(1, 37, 200))
    dy = gaussian((1, 37, 200), 15).to(torch.bfloat16).cuda()
    y.backward(dy)
    dyd, xd, wd = dy.double().cpu().reshape(37, 200), x.double().cpu(), w.double().cpu()
    assert master_w.grad.dtype == torch.float32 and xg.grad.dtype == torch.bfloat16
    assert _rel_frobenius(xg.grad.reshape(37, 256), dyd @ wd) < BF16_TOLERANCE
    assert _rel_frobenius(master_w.grad, dyd.T @ xd) < BF16_TOLERANCE
    assert _rel_frobenius(master_b.grad, dyd.sum(0)) < BF16_TOLERANCE
    # float32 operands on CUDA keep the float64 path
    assert not compute.runs_dense_gemm(x.float(), w.float())
