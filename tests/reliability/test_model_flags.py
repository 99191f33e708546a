"""Every model-config flag the loader accepts works through trainer → weight-sync → sampler → trainer:
the warm start loads, a trained version crosses real gRPC to a sampler that computes what the trainer's
own packed copy computes, and the trained model's checkpoint loads back to the same logits."""

from __future__ import annotations

import copy

import pytest
import torch

from nibble.model import MoETransformer, from_pretrained, tiny
from nibble.model.rope import YarnScaling
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state
from nibble.sampler.engine import BuiltinEngine
from tests.weightsync.conftest import Harness

BASE = tiny(vocab_size=32).model_copy(update={"num_hidden_layers": 2, "max_position_embeddings": 64})
FLAGS = {
    "tie_word_embeddings": {"tie_word_embeddings": True},
    "qwen2_moe": {"architecture": "qwen2_moe"},
    "norm_topk_prob_false": {"norm_topk_prob": False},
    "mlp_only_layers": {"mlp_only_layers": (1,)},
    "decoder_sparse_step": {"decoder_sparse_step": 2},
    "no_shared_expert": {"shared_expert_intermediate_size": 0},
    "rope_theta_rms_norm_eps": {"rope_theta": 1e6, "rms_norm_eps": 1e-5},
    "yarn": {"rope_scaling": YarnScaling(factor=4.0, original_max_position_embeddings=16)},
}


def logits(model: MoETransformer, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize("flag", list(FLAGS))
def test_flag_survives_trainer_weightsync_sampler_trainer(flag, tmp_path):
    config = BASE.model_validate({**BASE.model_dump(), **FLAGS[flag]})
    plan = PrecisionPlan(num_layers=config.num_hidden_layers)  # NVFP4 experts, as the default run
    torch.manual_seed(0)
    trainer = MoETransformer(config, plan)
    trainer.save_pretrained(tmp_path / "warm")
    ids = torch.randint(0, config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    sampler_model = from_pretrained(tmp_path / "warm", plan=plan)
    assert sampler_model.config == config  # nothing of the flag was lost on the way through config.json
    torch.testing.assert_close(logits(sampler_model, ids), logits(trainer, ids), atol=0, rtol=0)
    engine = BuiltinEngine(sampler_model.pack(), pad_id=0)

    with torch.no_grad():  # "training": every parameter moves
        for param in trainer.parameters():
            param.add_(0.05 * torch.randn_like(param))
    harness = Harness(tmp_path / "store")
    try:
        server = harness.start()
        harness.publisher(server).publish(1, published_state(trainer), plan)
        _, state = harness.subscriber(server).fetch(1)
        engine.pause()
        engine.update_weights(1, state)
        engine.resume()
    finally:
        harness.close()
    reference = copy.deepcopy(trainer).to(torch.bfloat16).pack()  # the trainer's own sampler-form copy
    applied = logits(engine.model, ids)
    torch.testing.assert_close(applied, logits(reference, ids), atol=1e-5, rtol=1e-5)
    assert (applied - logits(from_pretrained(tmp_path / "warm", plan=plan).pack(), ids)).abs().max() > 1e-2

    trainer.save_pretrained(tmp_path / "trained")  # the trainer's checkpoint, loaded back
    resumed = from_pretrained(tmp_path / "trained", plan=plan)
    torch.testing.assert_close(logits(resumed, ids), logits(trainer, ids), atol=0, rtol=0)
