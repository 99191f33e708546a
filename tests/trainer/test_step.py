"""One trainer step on real groups: whole groups, finite metrics, the model moves toward reward."""

import torch

from nibble.config import TrainerConfig
from nibble.model import MoETransformer, tiny
from nibble.model.generate import generate
from nibble.recipe import PrecisionPlan, param_groups
from nibble.trainer.batch import assemble
from nibble.trainer.step import train_on_batch
from nibble.wire import pb


def sampled_groups(model, prompts, group_size=4, version=0):
    out = generate(
        model,
        [p for p in prompts for _ in range(group_size)],
        max_new_tokens=4,
        temperature=1.0,
        stop_tokens=[2],
        generator=torch.Generator().manual_seed(0),
    )
    groups = []
    for gi, prompt in enumerate(prompts):
        g = pb.TrajectoryGroup(
            group_id=f"g{gi}",
            example_id="e",
            prompt_tokens=prompt,
            policy_version=version,
            sampler_id="s",
            temperature=1.0,
        )
        for j in range(group_size):
            row = gi * group_size + j
            tokens = out.tokens[row]
            g.responses.add(
                trajectory_id=f"t{row}",
                tokens=tokens,
                logprobs=out.logprobs[row],
                reward=float(tokens[0] == 7),
                finish_reason=pb.STOP,
            )
        groups.append(g)
    return groups


def test_a_step_trains_on_whole_groups_and_raises_the_rewarded_tokens_probability():
    torch.manual_seed(0)
    config = tiny(vocab_size=16)
    plan = PrecisionPlan(num_layers=4)
    model = MoETransformer(config, plan)
    sampler = MoETransformer(config, plan)
    sampler.load_state_dict(model.state_dict())
    sampler.pack()
    prompts = [[1, 3, 4], [1, 5], [1, 6, 6, 6]]
    groups = sampled_groups(sampler, prompts, group_size=8)
    batch = assemble(groups, trainer_version=0)
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=3e-3)
    logits_before = model(torch.tensor([[1, 3, 4]]))[0, -1].log_softmax(-1)[7]
    result = train_on_batch(model, optimizer, batch, TrainerConfig(updates_per_batch=1))
    logits_after = model(torch.tensor([[1, 3, 4]]))[0, -1].log_softmax(-1)[7]
    assert result.skipped_updates == 0 and torch.isfinite(torch.tensor(result.loss))
    # The trainer reproduces the sampler's logprobs up to float rounding: no activation code differs
    # (a flipped NVFP4 code moves a logprob by ~1e-2, far above this bound).
    assert result.stats["logprob_abs_diff"] < 1e-6
    assert result.fresh is not None and result.fresh["logprob_abs_diff"] < 1e-6 and result.entropy > 0
    assert result.trained_tokens == int(batch.mask.sum())
    if any(r.reward for g in groups for r in g.responses):
        assert logits_after > logits_before


def test_zero_std_groups_can_be_dropped_and_are_counted():
    torch.manual_seed(1)
    config = tiny(vocab_size=16)
    plan = PrecisionPlan(num_layers=4, format="bf16")
    model = MoETransformer(config, plan)
    groups = sampled_groups(model, [[1, 3], [1, 4]], group_size=4)
    for r in groups[0].responses:
        r.reward = 1.0
    batch = assemble(groups, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    result = train_on_batch(model, optimizer, batch, TrainerConfig(drop_zero_std_groups=True))
    assert result.zero_std_groups >= 1 and result.dropped_zero_std_groups >= 1
    assert result.trained_tokens < int(batch.mask.sum())
