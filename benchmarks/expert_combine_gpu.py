"""The MoE combine on CUDA: ``index_add`` (atomics) against the fixed-order combine that replaced it, as
PyTorch operators and as one Triton launch.

Each token's ``top_k`` weighted expert outputs are summed into its row. CUDA's ``index_add`` adds them with
atomics in thread order, rounding bf16 at every add; :func:`nibble.recipe.modules.combine_in_expert_order`
accumulates in float32 in ascending expert order and rounds once, the CPU's result — on CUDA in one launch
(:mod:`nibble.kernels.gpu.expert_combine`), written with PyTorch operators in
:func:`nibble.recipe.modules.combine_composed`. For Qwen3-30B-A3B's
shape (8 of 128 experts, hidden 2048) at decode (64 tokens) and prefill (4096 tokens), with the rows
sorted by expert as the MoE layer holds them, this records how many output elements differ from the first
of ``--repeats`` calls (the contract needs 0), how many differ from the CPU's result, and the time per call
of each (CUDA-graph replay, ``benchmarks.kernels_gpu.graph_time``). Run on the GPU machine (under a minute):

    python -m benchmarks.expert_combine_gpu --out benchmarks/results/h200_expert_combine.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.kernels_gpu import graph_time
from benchmarks.machine import describe, write_record
from nibble.recipe.modules import combine_composed, combine_in_expert_order

TOP_K, EXPERTS, HIDDEN = 8, 128, 2048


def _routing(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    top_i = torch.rand(tokens, EXPERTS, generator=gen).topk(TOP_K, dim=1).indices
    order = torch.argsort(top_i.reshape(-1), stable=True)
    weighted = torch.randn(tokens * TOP_K, HIDDEN, generator=gen).to(torch.bfloat16)
    return weighted, top_i, order


def _index_add(weighted: torch.Tensor, top_i: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    tokens = top_i.shape[0]
    return torch.zeros((tokens, HIDDEN), dtype=weighted.dtype, device=weighted.device).index_add(
        0, order // TOP_K, weighted
    )


def _differing(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.cpu().view(torch.int16) != b.cpu().view(torch.int16)).sum())


def variant(tokens: int, repeats: int) -> dict:
    """Repeatability, agreement with the CPU and time of the three combines for ``tokens`` tokens."""
    routing = _routing(tokens, tokens)
    cpu = combine_in_expert_order(*routing)
    routing = tuple(t.cuda() for t in routing)
    row = {"tokens": tokens, "elements": tokens * HIDDEN}
    for name, combine in (
        ("index_add", _index_add),
        ("expert_order_composed", combine_composed),
        ("expert_order_kernel", combine_in_expert_order),
    ):
        outputs = [combine(*routing) for _ in range(repeats)]
        row[name] = {
            "max_differing_from_first_call": max(_differing(outputs[0], out) for out in outputs),
            "differing_from_cpu_combine": _differing(cpu, outputs[0]),
            "graph_s": graph_time(lambda _i, c=combine: c(*routing), copies=1)["graph_s"],
        }
        print(f"tokens={tokens} {name}: {row[name]}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50, help="calls compared with the first")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    result = {
        "machine": describe(),
        "command": "python -m benchmarks.expert_combine_gpu",
        "shape": {"top_k": TOP_K, "experts": EXPERTS, "hidden": HIDDEN, "dtype": "bfloat16"},
        "repeats": args.repeats,
        "rows": [variant(tokens, args.repeats) for tokens in (64, 4096)],
    }
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
