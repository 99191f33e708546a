"""The MoE routing order on CUDA: ``torch.argsort(stable=True)`` with its gathers against the one-launch
counting kernel (:mod:`nibble.kernels.gpu.expert_order`), and where one overtakes the other.

For top-8 of 128 experts (Qwen3-30B-A3B) and token counts from one to prefill, this checks that the kernel's
``(order, experts, token)`` equal PyTorch's, times both (CUDA-graph replay, ``benchmarks.kernels_gpu.graph_time``)
and records the largest slot count up to which the kernel is faster at every size measured: the kernel's
``MAX_SLOTS``, which the MoE layer dispatches on, must not exceed it (the run fails if it does). Run on the
GPU machine (under a minute):

    python -m benchmarks.expert_order_gpu --out benchmarks/results/h200_expert_order.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.kernels_gpu import graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels.gpu.expert_order import MAX_SLOTS, expert_order

TOP_K, EXPERTS = 8, 128
TOKENS = (1, 8, 64, 256, 512, 1024, 2048, 4096)


def _torch_order(top_k_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, flat[order], order // top_k_index.shape[1]


def variant(tokens: int) -> dict:
    """Agreement and time of both orders for ``tokens`` tokens."""
    gen = torch.Generator().manual_seed(tokens)
    top_k_index = torch.rand(tokens, EXPERTS, generator=gen).topk(TOP_K, dim=1).indices.cuda()
    same = all(torch.equal(a, b) for a, b in zip(_torch_order(top_k_index), expert_order(top_k_index), strict=True))
    row = {"tokens": tokens, "slots": tokens * TOP_K, "identical": same}
    for name, fn in (("torch_argsort", _torch_order), ("kernel", expert_order)):
        row[f"{name}_s"] = graph_time(lambda _i, f=fn: f(top_k_index), copies=1)["graph_s"]
    print(row)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    rows = [variant(tokens) for tokens in TOKENS]
    faster = 0  # the sizes from the smallest up, while the kernel keeps winning
    for row in rows:
        if row["kernel_s"] >= row["torch_argsort_s"]:
            break
        faster = row["slots"]
    result = {
        "machine": describe(),
        "command": "python -m benchmarks.expert_order_gpu",
        "shape": {"top_k": TOP_K, "experts": EXPERTS},
        "rows": rows,
        "largest_slots_kernel_faster": faster,
        "max_slots_dispatched": MAX_SLOTS,
    }
    print(f"kernel faster up to {result['largest_slots_kernel_faster']} slots; the MoE layer uses it up to {MAX_SLOTS}")
    if args.out:
        write_record(args.out, result)
    if not all(row["identical"] for row in rows):
        raise SystemExit("the kernel's order differs from torch.argsort's")
    if faster < MAX_SLOTS:
        raise SystemExit(f"MAX_SLOTS = {MAX_SLOTS} is past the measured crossover ({faster} slots): lower it")


if __name__ == "__main__":
    main()
