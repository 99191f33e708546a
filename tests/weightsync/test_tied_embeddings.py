"""A dense model with tied embeddings (SmolLM2's layout) through weight-sync over gRPC: the tied head travels
once, as the embedding, and a sampler's head follows every update of it."""

import copy

import torch

from nibble.model import MoETransformer
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import load_sampler_state, published_state, quantize_state
from tests.helpers import TINY_LLAMA

CONFIG = TINY_LLAMA
EMBED = "model.embed_tokens.weight"


def test_a_tied_head_is_published_once_and_every_sampler_update_moves_it(harness):
    plan = PrecisionPlan(num_layers=3, quantize="all_linear", bf16_last_fraction=0.34)  # last layer BF16
    torch.manual_seed(0)
    trainer = MoETransformer(CONFIG, plan)
    state = published_state(trainer)
    assert EMBED in state and "lm_head.weight" not in state  # one tensor, not two copies to keep in step

    server = harness.start()
    publisher, subscriber = harness.publisher(server), harness.subscriber(server)
    torch.manual_seed(1)
    sampler = MoETransformer(CONFIG, plan).pack()  # other initial weights
    assert sampler.lm_head.weight is sampler.model.embed_tokens.weight
    ids = torch.randint(0, 48, (2, 9), generator=torch.Generator().manual_seed(3))
    for version in (1, 2):
        if version == 2:  # an update that moves only the embedding: the head must move with it
            trainer = copy.deepcopy(trainer)
            with torch.no_grad():
                trainer.model.embed_tokens.weight.mul_(-0.5)
        publisher.publish(version, published_state(trainer), plan)
        manifest, tensors = subscriber.fetch(version)
        names = [meta.name for meta in manifest.tensors]
        assert names.count(EMBED) == 1 and not any(n.startswith("lm_head") for n in names)
        assert any(n.startswith("model.layers.0.mlp.gate_proj.weight::") for n in names)  # all_linear: NVFP4
        assert set(tensors) == set(quantize_state(published_state(trainer), plan))
        load_sampler_state(sampler, tensors)
        assert sampler.lm_head.weight is sampler.model.embed_tokens.weight
        with torch.no_grad():
            assert torch.equal(sampler(ids), trainer(ids)), version
