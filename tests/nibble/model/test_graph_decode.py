"""Static-shape decode: GraphDecoder samples what generate() samples; its CUDA graph replays its eager step."""

import copy

import pytest
import torch

from nibble.model import MoETransformer, tiny
from nibble.model.generate import CacheDecoder, generate, left_pad
from nibble.model.graph_decode import GraphDecoder
from nibble.recipe import PrecisionPlan

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12], [5], [9, 9, 9, 2]]
SAMPLING = {"temperature": 0.9, "stop_tokens": [2], "pad_id": 0}


def model_with(plan_options: dict, device: str = "cpu") -> MoETransformer:
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers, **plan_options)
    return MoETransformer(config, plan).eval().to(device)


def sample_both(model: MoETransformer, max_new_tokens: int, decoder: GraphDecoder | None = None):
    """``generate()`` (the growing cache) and the static decoder, from the same random stream."""
    device = next(model.parameters()).device
    dynamic = generate(
        model,
        PROMPTS,
        max_new_tokens=max_new_tokens,
        generator=torch.Generator(device).manual_seed(0),
        **SAMPLING,
    )
    decoder = decoder or GraphDecoder(model, len(PROMPTS), 6 + max_new_tokens)
    static = decoder.generate(
        PROMPTS, max_new_tokens=max_new_tokens, generator=torch.Generator(device).manual_seed(0), **SAMPLING
    )
    return dynamic, static


def flat(logprobs: list[list[float]]) -> torch.Tensor:
    return torch.cat([torch.tensor(row) for row in logprobs])


@pytest.mark.parametrize(
    ("plan_options", "packed", "max_new_tokens"),
    [
        ({"format": "bf16"}, False, 24),
        ({"format": "bf16"}, True, 24),
        ({"format": "nvfp4", "bf16_last_fraction": 0.0}, True, 24),
        # the training form re-quantises every expert each forward on the CPU: a short run suffices
        ({"format": "nvfp4", "bf16_last_fraction": 0.0}, False, 4),
    ],
)
def test_static_decode_samples_the_tokens_and_logprobs_of_generate(plan_options, packed, max_new_tokens):
    model = model_with(plan_options)
    model = copy.deepcopy(model).pack() if packed else model
    dynamic, static = sample_both(model, max_new_tokens)
    assert static.tokens == dynamic.tokens
    assert static.finish_reasons == dynamic.finish_reasons
    assert sum(len(t) for t in static.tokens) >= 4 * min(max_new_tokens, 10)
    # Masked keys add exact zeros, and float32 compute attends in float64 (nibble.recipe.compute), so a
    # longer key axis leaves the float32 results alone; measured: identical.
    torch.testing.assert_close(flat(static.logprobs), flat(dynamic.logprobs), atol=1e-6, rtol=0)


def test_static_step_logits_equal_the_dynamic_step_with_stopped_rows():
    model = copy.deepcopy(model_with({"format": "nvfp4", "bf16_last_fraction": 0.25})).pack()
    ids, valid = left_pad(PROMPTS, 0)
    dynamic, static = CacheDecoder(model, 4, 12), GraphDecoder(model, 4, 12)
    torch.testing.assert_close(static.prefill(ids, valid), dynamic.prefill(ids, valid), atol=0, rtol=0)
    running = torch.tensor([True, False, True, True])
    for step in range(5):
        token = torch.tensor([5 + step, 0, 7, 1 + step])
        running[3] = step < 2  # a row stops mid-way and feeds pads from then on
        torch.testing.assert_close(static.step(token, running), dynamic.step(token, running), atol=1e-6, rtol=0)


def test_a_decoder_is_reused_across_batches():
    model = copy.deepcopy(model_with({"format": "bf16"})).pack()
    decoder = GraphDecoder(model, 4, 20)
    for _ in range(2):  # the second prefill must forget the first batch's keys
        dynamic, static = sample_both(model, 10, decoder)
        assert static.tokens == dynamic.tokens


def test_bad_decoder_input_is_named():
    model = model_with({"format": "bf16"})
    with pytest.raises(ValueError, match="max_len"):
        GraphDecoder(model, 4, 10_000)
    with pytest.raises(ValueError, match="needs a model on CUDA"):
        GraphDecoder(model, 4, 16, graph=True)
    decoder = GraphDecoder(model, 4, 10)
    with pytest.raises(ValueError, match="step before prefill"):
        decoder.step(torch.ones(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="3 prompts for a decoder of batch 4"):
        decoder.generate(PROMPTS[:3], max_new_tokens=2)
    with pytest.raises(ValueError, match="exceeds the decoder's max_len=10"):
        decoder.generate(PROMPTS, max_new_tokens=5)
    ids, valid = left_pad(PROMPTS, 0)
    decoder.prefill(ids, valid)
    with pytest.raises(ValueError, match=r"shape \[4\]"):
        decoder.step(torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool))
    for _ in range(4):
        decoder.step(torch.ones(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions are filled"):
        decoder.step(torch.ones(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))


def gpu_model(fmt: str) -> MoETransformer:
    options = {"format": fmt, "bf16_last_fraction": 0.0, "compute_dtype": "bfloat16"}
    return copy.deepcopy(model_with(options, "cuda")).pack()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "bf16"])
def test_cuda_graph_replay_equals_the_eager_step(fmt):
    model = gpu_model(fmt)
    ids, valid = left_pad(PROMPTS, 0, "cuda")
    replayed, eager = GraphDecoder(model, 4, 16), GraphDecoder(model, 4, 16, graph=False)
    assert replayed.graph is not None and eager.graph is None
    first = replayed.prefill(ids, valid)
    torch.testing.assert_close(eager.prefill(ids, valid), first, atol=0, rtol=0)
    token, running = first.argmax(-1), torch.tensor([True, True, False, True], device="cuda")
    for _ in range(8):
        logits = replayed.step(token, running)
        # the same kernels on the same bytes, launched from a graph or one by one
        torch.testing.assert_close(eager.step(token, running), logits, atol=0, rtol=0)
        token = logits.argmax(-1)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "bf16"])
def test_on_cuda_graph_decode_samples_what_generate_samples_bit_for_bit(fmt):
    dynamic, static = sample_both(gpu_model(fmt), 16)
    # bf16 attention runs the row-invariant kernel, whose key blocks start at each row's first real key:
    # the static cache's 16 positions (unwritten ones masked) give the filled positions' bits
    assert static.tokens == dynamic.tokens
    assert static.logprobs == dynamic.logprobs
