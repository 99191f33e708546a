"""The row-invariant Triton attention (``compute.attention`` on CUDA) against the float64 path it replaced
and against torch SDPA in bf16 (flash; not row-invariant: the speed of light), at decode and scoring shapes.

Head shapes: SmolLM2-135M (9 query heads, 3 key/value heads, head_dim 64) and Qwen3-30B-A3B (32, 4, 128).
Decode: batch 64, one query row per sequence over 256, 1024 or 4096 keys (a static cache whose last 64
slots are unwritten, masked). Scoring: batch 4, T = 512 or 2048 causal query rows. For each variant:
times (CUDA-graph replay, cold L2: ``benchmarks.kernels_gpu.graph_time``), the kernel's and flash's
relative error against float64, and the bit-identity checks of the contract: each decoded row equals the
same token's row when the whole sequence is scored with other left padding (decode), and each sequence
scored in its batch equals it scored alone without padding (scoring). A variant that fails to compile or
run is recorded with its error and the rest go on. Run on the GPU machine (about 2 minutes):

    python -m benchmarks.attention_gpu --out benchmarks/results/h200_attention.json
"""

from __future__ import annotations

import argparse
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from nibble.recipe import compute
from nibble.recipe.compute import AttentionMask

HEADS = {"smollm2_135m": (9, 3, 64), "qwen3_30b_a3b": (32, 4, 128)}
DECODE = {"batch": 64, "keys": (256, 1024, 4096), "unwritten": 64}
SCORING = {"batch": 4, "rows": (512, 2048)}
PAD = 5  # left padding of the other layout in the bit-identity checks


def _mask(key_mask: torch.Tensor, t: int, offset: int) -> AttentionMask:
    valid = torch.ones(key_mask.shape[0], t, dtype=torch.bool, device="cuda")
    return AttentionMask(key_mask, valid, torch.full((1,), offset, dtype=torch.long, device="cuda"))


def _float64(q, k, v, mask: AttentionMask) -> torch.Tensor:
    """The path the kernel replaced: float64 SDPA over the dense mask, rounded once."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.dense).to(q.dtype)


def _flash(q, k, v, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def _times(q, k, v, mask: AttentionMask, causal: bool) -> dict:
    _ = (mask.dense, mask.key_start)  # built before capture, outside the graphs' memory pools
    copies = copies_for(sum(x.numel() * x.element_size() for x in (q, k, v)))
    qs, ks, vs = ([x.clone() for _ in range(copies)] for x in (q, k, v))
    return {
        "triton": graph_time(lambda i: compute.attention(qs[i], ks[i], vs[i], mask), copies),
        "float64_path": graph_time(lambda i: _float64(q, k, v, mask), 1, iters=3),
        "bf16_flash_sdpa": graph_time(lambda i: _flash(qs[i], ks[i], vs[i], causal), copies),
    }


def _errors(q, k, v, mask: AttentionMask, causal: bool) -> dict:
    groups = q.shape[1] // k.shape[1]
    ref = F.scaled_dot_product_attention(
        q.double(), *(x.double().repeat_interleave(groups, 1) for x in (k, v)), attn_mask=mask.dense
    )
    return {
        "triton_rel_vs_float64": _rel(compute.attention(q, k, v, mask), ref),
        "flash_rel_vs_float64": _rel(_flash(q, k, v, causal), ref),
    }


def decode_variant(heads: tuple[int, int, int], keys: int) -> dict:
    h, kvh, d = heads
    b, slots = DECODE["batch"], keys + DECODE["unwritten"]
    q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, kvh, slots, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    key_mask = torch.zeros(b, slots, dtype=torch.bool, device="cuda")
    key_mask[:, :keys] = True
    mask = _mask(key_mask, 1, keys - 1)
    row = {
        **_times(q, k, v, mask, causal=False),
        **_errors(q, k[:, :, :keys], v[:, :, :keys], _mask(key_mask[:, :keys], 1, keys - 1), False),
    }
    # the same 4 sequences scored whole, left-padded by PAD: the last row must be the decoded row
    n = 4
    qs = torch.randn(n, h, PAD + keys, d, device="cuda", dtype=torch.bfloat16)
    qs[:, :, -1:] = q[:n]
    ks, vs = (torch.randn(n, kvh, PAD + keys, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ks[:, :, PAD:], vs[:, :, PAD:] = k[:n, :, :keys], v[:n, :, :keys]
    scored_mask = torch.ones(n, PAD + keys, dtype=torch.bool, device="cuda")
    scored_mask[:, :PAD] = False
    scored = compute.attention(qs, ks, vs, _mask(scored_mask, PAD + keys, 0))[:, :, -1:]
    row["decode_equals_scoring_rows"] = bool(torch.equal(compute.attention(q, k, v, mask)[:n], scored))
    return row


def scoring_variant(heads: tuple[int, int, int], t: int) -> dict:
    h, kvh, d = heads
    b = SCORING["batch"]
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, kvh, t, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    key_mask = torch.ones(b, t, dtype=torch.bool, device="cuda")
    key_mask[1:, :PAD] = False  # rows 1.. are padded in front: their sequences start at PAD
    mask = _mask(key_mask, t, 0)
    row = {**_times(q, k, v, mask, causal=True), **_errors(q[:1], k[:1], v[:1], _mask(key_mask[:1], t, 0), True)}
    batched = compute.attention(q, k, v, mask)
    alone = compute.attention(q[1:2, :, PAD:], k[1:2, :, PAD:], v[1:2, :, PAD:], _mask(key_mask[1:2, PAD:], t - PAD, 0))
    row["batch_equals_alone"] = bool(torch.equal(batched[1:2, :, PAD:], alone))
    return row


def _run(name: str, fn, *args) -> dict:
    start = time.perf_counter()
    try:
        row = {"variant": name, **fn(*args)}
    except Exception as error:  # a variant that fails to compile or run is recorded; the rest go on
        row = {"variant": name, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
    row["wall_s"] = time.perf_counter() - start
    us = " | ".join(
        f"{key} {row[key]['graph_s'] * 1e6:9.1f} us"
        for key in ("triton", "float64_path", "bf16_flash_sdpa")
        if key in row
    )
    checks = {key: row[key] for key in row if key.endswith(("_rows", "_alone", "_float64"))}
    print(f"{name:38s} {us} {checks} {row.get('error', '')}", flush=True)
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    result = {
        "machine": describe(),
        "command": "python -m benchmarks.attention_gpu",
        "decode": DECODE,
        "scoring": SCORING,
        "rows": [],
    }
    for model, heads in HEADS.items():
        for keys in DECODE["keys"]:
            result["rows"].append(_run(f"{model} decode S={keys}", decode_variant, heads, keys))
        for t in SCORING["rows"]:
            result["rows"].append(_run(f"{model} scoring T={t}", scoring_variant, heads, t))
    failed = [
        r["variant"]
        for r in result["rows"]
        if "error" in r or not all(r.get(k, True) for k in ("decode_equals_scoring_rows", "batch_equals_alone"))
    ]
    result["failed"] = failed
    print(f"failed or not bit-identical: {failed or 'none'}")
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
