"""The grouped GEMMs' row tiles in one launch (:mod:`nibble.kernels.gpu.expert_tiles`) against their
definition written with PyTorch operators, every entry of every array, and against what a tile must be
(inside one expert's rows, the rows covered once and in order). On the CPU under Triton's interpreter;
the ``gpu`` test repeats it compiled, prefill-sized.
"""

import pytest
import torch

pytest.importorskip("triton", reason="the triton package is not installed")
from nibble.kernels.gpu.expert_tiles import expert_tiles  # imports triton, hence after the skip

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _definition(experts: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, ...]:
    counts = torch.bincount(experts, minlength=num_experts)
    tiles = (counts + block_m - 1) // block_m
    cum = torch.cumsum(tiles, 0)
    first = torch.cumsum(counts, 0) - counts
    t = torch.arange(-(-experts.shape[0] // block_m) + num_experts)
    expert = torch.searchsorted(cum, t, right=True).clamp(max=num_experts - 1)
    start = first[expert] + (t - (cum - tiles)[expert]) * block_m
    end = first[expert] + counts[expert]
    return expert, start, end, cum[-1:]


def _routed(tokens: int, top_k: int, num_experts: int, seed: int, skew: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(num_experts, generator=gen) ** (8 if skew else 1)  # skew: most experts near-empty
    picks = torch.multinomial(weights.expand(tokens, -1), top_k, generator=gen)
    return torch.sort(picks.reshape(-1), stable=True).values


CASES = [
    # tokens, top_k, experts, block_m, skewed routing
    (64, 8, 128, 4, False),  # sampler decode: 4 rows per expert
    (64, 8, 128, 16, True),
    (5, 2, 8, 1, False),
    (1, 1, 1, 64, False),
    (300, 2, 7, 8, False),
    (17, 3, 40, 16, True),
]


def _check(experts: torch.Tensor, num_experts: int, block_m: int) -> None:
    got = expert_tiles(experts.to(DEVICE), num_experts, block_m)
    want = _definition(experts, num_experts, block_m)
    assert got[4] == want[0].shape[0]
    for name, g, w in zip(("tile_expert", "tile_start", "tile_end", "num_tiles"), got[:4], want, strict=True):
        assert g.dtype == torch.int32 and torch.equal(g.cpu(), w.to(torch.int32)), name
    real = int(got[3])
    tiles = zip(*(g[:real].cpu().tolist() for g in got[:3]), strict=True)
    spans = [(expert, torch.arange(start, min(start + block_m, end))) for expert, start, end in tiles]
    covered = torch.cat([torch.zeros(0, dtype=torch.int64)] + [rows for _, rows in spans])
    assert torch.equal(covered, torch.arange(experts.shape[0]))  # every row once, in order
    assert all((experts[rows] == expert).all() for expert, rows in spans)  # a tile inside one expert's rows


@pytest.mark.parametrize("tokens,top_k,num_experts,block_m,skew", CASES)
def test_tiles_match_their_definition(tokens, top_k, num_experts, block_m, skew):
    _check(_routed(tokens, top_k, num_experts, tokens + num_experts, skew), num_experts, block_m)


def test_no_rows_and_empty_experts():
    _check(torch.zeros(0, dtype=torch.int64), 4, 8)
    _check(torch.full((10,), 3, dtype=torch.int64), 6, 4)  # every row on the last expert, the rest empty
    _check(torch.zeros(10, dtype=torch.int64), 6, 4)  # every row on the first


@pytest.mark.parametrize(
    "experts,num_experts,block_m,match",
    [
        (torch.zeros(4, dtype=torch.int64), 0, 4, "num_experts an int"),
        (torch.zeros(4, dtype=torch.int64), 2, 0, "block_m an int"),
        (torch.zeros(4, dtype=torch.int32), 2, 4, "int64 experts"),
        (torch.zeros(2, 2, dtype=torch.int64), 2, 4, r"experts \[R\]"),
        ([0, 1], 2, 4, r"experts \[R\]"),
        (torch.zeros(4, dtype=torch.int64), 2.0, 4, r"num_experts an int in \[1, 2\*\*30\)"),
        (torch.zeros(4, dtype=torch.int64), True, 4, "num_experts an int"),
        (torch.zeros(4, dtype=torch.int64), 2, 2**31 - 1, "block_m an int"),
    ],
)
def test_rejects_bad_arguments(experts, num_experts, block_m, match):
    with pytest.raises(ValueError, match=match):
        expert_tiles(experts, num_experts, block_m)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        expert_tiles(torch.zeros(4, dtype=torch.int64), 2, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m", [4, 16, 64])
@pytest.mark.parametrize("num_experts", [1, 3, 128, 160])
def test_prefill_sized_routing_on_cuda(block_m, num_experts):
    _check(_routed(8192, min(8, num_experts), num_experts, block_m, skew=True), num_experts, block_m)
