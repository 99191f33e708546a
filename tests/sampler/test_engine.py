"""The built-in engine: on the CPU the dynamic ``generate``; on CUDA the CUDA-graph decoder over a static
cache with the packed NVFP4 kernels, padded to its fixed batch, with weight swaps seen by the graph."""

import copy

import pytest
import torch

from nibble.model import ModelConfig, MoETransformer, tiny
from nibble.model.scoring import score
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state, quantize_state
from nibble.sampler.engine import BuiltinEngine

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12]]
OPTIONS = dict(n=4, max_new_tokens=12, temperature=0.9, top_p=1.0, stop_tokens=[2], seed=5)


# SmolLM2's layout at a smaller size: dense, tied embeddings, every MLP projection NVFP4, K over one GEMM tile
DENSE = ModelConfig(
    architecture="llama", vocab_size=32, hidden_size=256, intermediate_size=640, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128, tie_word_embeddings=True,
)  # fmt: skip


def policy(device: str, seed: int = 0, config: ModelConfig | None = None) -> MoETransformer:
    torch.manual_seed(seed)
    config = config or tiny(vocab_size=32)
    plan = PrecisionPlan(
        num_layers=config.num_hidden_layers,
        format="nvfp4",
        four_over_six="mse",
        quantize="experts" if config.is_moe else "all_linear",
        compute_dtype=("bfloat16" if device == "cuda" else "float32"),
    )
    return MoETransformer(config, plan).eval().to(device)


def test_on_the_cpu_batch_rows_are_ignored_and_generate_runs():
    engine = BuiltinEngine(copy.deepcopy(policy("cpu")).pack(), pad_id=0, batch_rows=8)
    assert engine.batch_rows is None
    groups = engine.generate(PROMPTS, **OPTIONS)
    assert [len(g) for g in groups] == [4, 4]
    assert all(len(s.tokens) == len(s.logprobs) and s.finish_reason in ("stop", "length") for g in groups for s in g)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, DENSE], ids=["moe", "dense"])
def test_on_cuda_the_graph_decoder_samples_a_padded_batch_with_the_trainers_scores_bit_for_bit(config):
    trainer = policy("cuda", config=config)
    engine = BuiltinEngine(copy.deepcopy(trainer).pack(), pad_id=0, batch_rows=16)
    groups = engine.generate(PROMPTS, **OPTIONS)  # 8 of 16 rows used: the rest are padding
    assert engine._decoder is not None and engine._decoder.batch == 16
    samples = [s for g in groups for s in g]
    assert len(samples) == 8
    with torch.no_grad():
        scores = score(trainer, [p for p in PROMPTS for _ in range(4)], [s.tokens for s in samples], temperature=0.9)
    sampled = torch.tensor([lp for s in samples for lp in s.logprobs])
    delta = (sampled - scores.logprobs[scores.mask].cpu()).abs()
    print(
        f"graph decode vs teacher forcing: max |Δlogprob| {delta.max():.3e}, mean {delta.mean():.3e}, "
        f"exact {int((delta == 0).sum())}/{delta.numel()}"
    )
    assert int((delta == 0).sum()) == delta.numel()  # prompts of two lengths: padding and cache length differ


@pytest.mark.gpu
def test_on_cuda_a_weight_swap_reaches_the_captured_graph_and_longer_prompts_rebuild_it():
    old, new = policy("cuda", 0), policy("cuda", 1)
    state = quantize_state(published_state(new), new.plan)  # weight-sync's form of version 1
    engine = BuiltinEngine(copy.deepcopy(old).pack(), pad_id=0, batch_rows=8)
    engine.generate(PROMPTS, **OPTIONS)  # captured with version 0's weights
    captured = engine._decoder
    fresh = BuiltinEngine(copy.deepcopy(old).pack(), pad_id=0, batch_rows=8)  # captured after the swap
    for e in (engine, fresh):
        e.pause()
        e.update_weights(1, state)
        e.resume()
    swapped = engine.generate(PROMPTS, **OPTIONS)
    assert engine._decoder is captured  # the same graph, replaying over the copied-in weights
    expected = fresh.generate(PROMPTS, **OPTIONS)
    assert [[s.tokens for s in g] for g in swapped] == [[s.tokens for s in g] for g in expected]
    assert [[s.logprobs for s in g] for g in swapped] == [[s.logprobs for s in g] for g in expected]
    engine.generate([[1] * 70], **{**OPTIONS, "n": 2})
    assert engine._decoder is not captured and engine._decoder.max_len >= 82
