"""The row-invariant Triton attention (:mod:`nibble.kernels.gpu.attention`) and its use by
:func:`nibble.recipe.compute.attention`.

Without CUDA the kernel runs under Triton's interpreter (``tests/conftest.py``) with float32 dot products:
the CPU checks its indexing, GQA head mapping, masks and online softmax against float64 SDPA, and that a
row's bits do not depend on its batch companions, padding, key-buffer length or query count. The ``gpu``
tests check the same on the H200 in bf16 and float32 at the models' head shapes, and the autograd function.
"""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu import attention as kernel  # imports triton, hence after the skip
from nibble.recipe import compute
from nibble.recipe.compute import AttentionMask

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# Outputs are convex combinations of unit-scale values. float32 online softmax: each score, exp2 and
# rescale is rounded once (~2^-24 relative; the GPU's ex2.approx ~2^-22), and sums over S <= 600 keys
# accumulate at most S such errors: ~1e-6 relative on the interpreter, a few more bits on the GPU.
F32_TOLERANCE = 2e-6 if DEVICE == "cpu" else 2e-5
BF16_TOLERANCE = 2.0**-8  # one rounding to bf16 (half an ulp, 2^-9 relative) plus float32's error above


def _randn(shape, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def _offset(value: int) -> torch.Tensor:
    return torch.full((1,), value, dtype=torch.long, device=DEVICE)


def _run(q, k, v, key_mask, query_offset: int, query_valid=None) -> torch.Tensor:
    valid = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=DEVICE) if query_valid is None else query_valid
    mask = AttentionMask(key_mask=key_mask, query_valid=valid, query_offset=_offset(query_offset))
    return kernel.attention(q, k, v, mask.key_mask, mask.key_start, mask.query_offset)


def _reference(q, k, v, mask: AttentionMask) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = (x.double().cpu().repeat_interleave(groups, 1) for x in (k, v))
    return F.scaled_dot_product_attention(q.double().cpu(), k, v, attn_mask=mask.dense.cpu())


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (3, 1, 24), (2, 2, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_float64_attention(heads, kv_heads, head_dim, dtype):
    """Left-padded sequences (one wholly padding), a cache offset, keys past the causal end."""
    b, t, offset = 3, 21, 9
    s = offset + t + 5  # five slots after the last query: masked by causality, as in a static cache
    q = _randn((b, heads, t, head_dim), 1, dtype)
    k, v = _randn((b, kv_heads, s, head_dim), 2, dtype), _randn((b, kv_heads, s, head_dim), 3, dtype)
    first = torch.tensor([0, 12, s], device=DEVICE)  # the last row has no real key
    key_mask = torch.arange(s, device=DEVICE)[None, :] >= first[:, None]
    valid = (torch.arange(t, device=DEVICE) + offset)[None, :] >= first[:, None]
    mask = AttentionMask(key_mask=key_mask, query_valid=valid, query_offset=_offset(offset))
    out = kernel.attention(q, k, v, key_mask, mask.key_start, mask.query_offset)
    assert out.shape == q.shape and out.dtype == dtype
    real = valid[:, None, :, None].expand_as(out).cpu()
    ref = _reference(q, k, v, mask)
    err = float((out.double().cpu() - ref)[real].abs().max())
    assert err < (F32_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE * float(ref.abs().max()))
    # a padding query before its sequence's first real key attends to nothing: zeros, not NaN
    assert torch.equal(out.cpu()[~real], torch.zeros(int((~real).sum()), dtype=dtype))


def _sequence(n: int, heads: int, kv_heads: int, head_dim: int, seed: int, dtype: torch.dtype):
    """One sequence's queries ``[H, n, D]`` and keys, values ``[KVH, n, D]``."""
    return (
        _randn((heads, n, head_dim), seed, dtype),
        *(_randn((kv_heads, n, head_dim), seed + i, dtype) for i in (1, 2)),
    )


def _batch(seqs, fronts, width: int, seed: int):
    """Sequences placed at ``fronts`` in a key buffer of ``width`` slots, random values elsewhere (finite, as
    padding and unwritten cache slots are): ``q [B, H, width, D]``, ``k, v [B, KVH, width, D]``, key_mask."""
    (h, _, d), kvh, dtype = seqs[0][0].shape, seqs[0][1].shape[0], seqs[0][0].dtype
    q = _randn((len(seqs), h, width, d), seed, dtype)
    k, v = _randn((len(seqs), kvh, width, d), seed + 1, dtype), _randn((len(seqs), kvh, width, d), seed + 2, dtype)
    key_mask = torch.zeros(len(seqs), width, dtype=torch.bool, device=DEVICE)
    for row, ((sq, sk, sv), front) in enumerate(zip(seqs, fronts, strict=True)):
        n = sq.shape[1]
        q[row, :, front : front + n], k[row, :, front : front + n], v[row, :, front : front + n] = sq, sk, sv
        key_mask[row, front : front + n] = True
    return q, k, v, key_mask


def _assert_rows_invariant(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, n: int, max_len: int):
    """A sequence scored whole (trainer: batch companions, its own left padding, right padding after it)
    and decoded one query at a time (sampler: other companions and padding, a key buffer of ``max_len``
    slots with the unwritten ones masked) and prefilled in a chunk: the same bits for each of its rows."""
    target = _sequence(n, heads, kv_heads, head_dim, 10, dtype)
    others = [_sequence(m, heads, kv_heads, head_dim, 20 + m, dtype) for m in (n + 7, 3, n // 2)]
    # trainer: the target left-padded by 4, right-padded by 6; companions of other lengths and pads
    width = n + 10
    q, k, v, key_mask = _batch([others[0], target, others[1]], [3, 4, 0], width, 1)
    scored = _run(q, k, v, key_mask, 0)[1, :, 4 : 4 + n]
    # sampler: prefill of the first `prompt` tokens left-padded by 9, then one query per step
    prompt, front = n // 3, 9
    q, k, v, key_mask = _batch([target, others[2]], [front, 0], max_len, 2)
    key_mask[:, front + prompt :] = False  # not yet written
    filled = front + prompt
    prefilled = _run(q[:, :, :filled], k[:, :, :filled], v[:, :, :filled], key_mask[:, :filled], 0)
    assert torch.equal(prefilled[0, :, front:], scored[:, :prompt])
    for step in range(prompt, n):
        key_mask[:, front + step] = True
        row = _run(q[:, :, front + step : front + step + 1], k, v, key_mask, front + step)
        assert torch.equal(row[0, :, 0], scored[:, step]), f"step {step}"
    # a batch of one, alone, with no padding: the same again
    q, k, v, key_mask = _batch([target], [0], n, 3)
    assert torch.equal(_run(q, k, v, key_mask, 0)[0], scored)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_gets_the_same_bits_however_it_is_batched_padded_or_buffered(dtype):
    _assert_rows_invariant(4, 2, 32, dtype, n=37, max_len=60)


def test_compute_attention_on_the_cpu_is_the_float64_path_bit_for_bit():
    q, k, v = (
        _randn((2, 4, 5, 16), 1, torch.float32),
        _randn((2, 2, 9, 16), 2, torch.float32),
        _randn((2, 2, 9, 16), 3, torch.float32),
    )
    key_mask = torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
    key_mask[1, :3] = False
    valid = torch.ones(2, 5, dtype=torch.bool, device=DEVICE)
    valid[1, 4] = False
    mask = AttentionMask(key_mask=key_mask, query_valid=valid, query_offset=_offset(4))
    with torch.no_grad():
        ref = _reference(q.cpu(), k.cpu(), v.cpu(), mask).float()
        out = compute.attention(q.cpu(), k.cpu(), v.cpu(), AttentionMask(key_mask.cpu(), valid.cpu(), _offset(4).cpu()))
    assert torch.equal(out, ref)
    assert mask.key_start.tolist() == [0, 3]
    dense = mask.dense.cpu()[:, 0]
    key_mask[1, 7:] = False
    pad_key = AttentionMask(key_mask=key_mask, query_valid=valid, query_offset=_offset(4)).dense.cpu()[1, 0, 4]
    assert pad_key.tolist() == [False] * 3 + [True] * 4 + [False, True]  # a padding query sees its own key too
    assert dense[0, 0].tolist() == [True] * 5 + [False] * 4  # causal from the offset


def test_bad_input_is_named():
    q, k = _randn((1, 3, 4, 16), 1, torch.float32), _randn((1, 2, 4, 16), 2, torch.float32)
    km, start, off = (
        torch.ones(1, 4, dtype=torch.bool, device=DEVICE),
        torch.zeros(1, dtype=torch.long, device=DEVICE),
        _offset(0),
    )
    with pytest.raises(ValueError, match="do not fit"):
        kernel.attention(q, k, k, km, start, off)
    with pytest.raises(ValueError, match="share a dtype"):
        kernel.attention(q[:, :2].half(), k.half(), k.half(), km, start, off)
    with pytest.raises(ValueError, match="key_mask must be bool"):
        kernel.attention(q[:, :2], k, k, km[:, :3], start, off)
    with pytest.raises(ValueError, match="head_dim"):
        big = _randn((1, 2, 4, 320), 3, torch.float32)
        kernel.attention(big, big, big, km, start, off)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim", [(9, 3, 64), (32, 4, 128), (4, 2, 32), (14, 2, 64)]
)  # SmolLM2-135M, Qwen3-30B-A3B, the tiny test model, Qwen2.5-0.5B
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_cuda_rows_are_invariant_at_the_models_head_shapes(heads, kv_heads, head_dim, dtype):
    _assert_rows_invariant(heads, kv_heads, head_dim, dtype, n=300, max_len=600)


@pytest.mark.gpu
def test_on_cuda_compute_attention_runs_the_kernel_with_gradients():
    b, h, kvh, t, d = 2, 8, 2, 70, 64
    q = _randn((b, h, t, d), 1, torch.bfloat16)
    k, v = _randn((b, kvh, t, d), 2, torch.bfloat16), _randn((b, kvh, t, d), 3, torch.bfloat16)
    valid = torch.ones(b, t, dtype=torch.bool, device=DEVICE)
    valid[1, :11] = False
    mask = AttentionMask(key_mask=valid, query_valid=valid, query_offset=_offset(0))
    assert compute.runs_attention_kernel(q, k, v)
    assert not any(
        compute.runs_attention_kernel(*(x.to(dtype) for x in (q, k, v))) for dtype in (torch.half, torch.float)
    )
    with torch.no_grad():
        plain = compute.attention(q, k, v, mask)
    leaves = [x.float().requires_grad_(True) for x in (q, k, v)]
    out = compute.attention(*(x.to(torch.bfloat16) for x in leaves), mask)
    assert torch.equal(out.detach(), plain)
    dy = _randn(out.shape, 4, torch.bfloat16) * valid[:, None, :, None]  # padding rows get no gradient
    out.backward(dy)
    ref_leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    ref = _reference(*ref_leaves, mask)
    ref.backward(dy.double().cpu())
    for leaf, ref_leaf in zip(leaves, ref_leaves, strict=True):
        ref_grad = ref_leaf.grad.cpu()
        rel = float((leaf.grad.double().cpu() - ref_grad).norm() / ref_grad.norm())
        assert rel < BF16_TOLERANCE, rel
