"""Teacher-forced scoring: the chunked, recomputed logprob head gives the bits and gradients of one
full-vocabulary pass, and only the response's positions go through the LM head."""

import math

import pytest
import torch

from nibble.model import MoETransformer, scoring, tiny
from nibble.model.scoring import score, token_logprobs
from nibble.recipe import PrecisionPlan
from nibble.recipe.compute import log_softmax

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12], [5]]
RESPONSES = [[6, 7, 2], [1], [4, 4, 4, 4, 2]]


def _one_pass(logits, targets, temperature):
    """The scorer's arithmetic without chunks or recomputation (what it was before)."""
    logp_all = log_softmax(logits / temperature)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy


def test_chunks_give_one_passs_bits_and_gradients(monkeypatch):
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 37) * 4).requires_grad_(True)
    targets = torch.randint(0, 37, (3, 5))
    weights = torch.randn(3, 5)
    ref_lp, ref_entropy = _one_pass(logits, targets, 0.7)
    (ref_lp * weights).sum().backward()
    ref_grad, logits.grad = logits.grad.clone(), None
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 37 * 4)  # 4 rows a chunk: 15 rows in 4 chunks
    lp, entropy = token_logprobs(logits, targets, 0.7)
    assert torch.equal(lp, ref_lp) and torch.equal(entropy, ref_entropy)
    assert lp.requires_grad and not entropy.requires_grad
    (lp * weights).sum().backward()
    assert torch.equal(logits.grad, ref_grad)
    with torch.no_grad():
        assert torch.equal(token_logprobs(logits, targets, 0.7)[0], ref_lp)


def test_score_runs_the_lm_head_on_the_responses_only_and_keeps_the_logprobs():
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    model = MoETransformer(config, PrecisionPlan(num_layers=config.num_hidden_layers, format="nvfp4")).eval()
    rows = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[1]))
    with torch.no_grad():
        scores = score(model, PROMPTS, RESPONSES, temperature=0.9)
        # the full forward, sliced afterwards: every position through the LM head
        ids = torch.zeros(3, 6 + 5, dtype=torch.long)
        valid = torch.zeros(3, 11, dtype=torch.bool)
        for row, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
            ids[row, 6 - len(p) : 6] = torch.tensor(p)
            ids[row, 6 : 6 + len(r)] = torch.tensor(r)
            valid[row, 6 - len(p) : 6 + len(r)] = True
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        full = model(ids, positions=positions, attention_mask=valid)[:, 5:10]
    assert rows == [6, 11]  # responses (5) + the last prompt position; then the full reference pass
    expected = _one_pass(full, ids[:, 6:], 0.9)[0]
    assert torch.equal(scores.logprobs, expected)


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf, -math.inf, "0.7", None, True])
def test_token_logprobs_refuses_a_temperature_that_is_not_a_finite_positive_number(temperature):
    logits, targets = torch.randn(2, 3, 5), torch.randint(0, 5, (2, 3))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, targets, temperature)


@pytest.mark.parametrize(
    ("logits", "targets", "named"),
    [
        (torch.randn(6, 5), torch.zeros(6, dtype=torch.long), "logits"),  # 2-D
        (torch.randn(1, 2, 3, 5), torch.zeros(1, 2, dtype=torch.long), "logits"),  # 4-D
        (torch.randint(0, 9, (2, 3, 5)), torch.zeros(2, 3, dtype=torch.long), "logits"),  # integer logits
        (torch.randn(2, 3, 0), torch.zeros(2, 3, dtype=torch.long), "vocabulary is empty"),
        (torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), r"targets \(2, 4\)"),
        (torch.randn(2, 3, 5), torch.zeros(6, dtype=torch.long), r"targets \(6,\)"),
        (torch.randn(2, 3, 5), torch.zeros(2, 3), "targets: expected an integer"),  # float ids
        (torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.bool), "targets: expected an integer"),
        (torch.randn(2, 3, 5), torch.tensor([[0, 1, 5], [0, 0, 0]]), r"targets: ids must lie in \[0, 5\), got 0\.\.5"),
        (torch.randn(2, 3, 5), torch.tensor([[0, 1, 2], [0, -1, 0]]), r"ids must lie in \[0, 5\), got -1\.\.2"),
    ],
)
def test_token_logprobs_refuses_malformed_logits_and_targets_naming_them(logits, targets, named):
    with pytest.raises(ValueError, match=named):
        token_logprobs(logits, targets, 1.0)


def test_token_logprobs_of_no_rows_is_empty_and_int32_targets_are_ids():
    assert token_logprobs(torch.randn(0, 3, 5), torch.zeros(0, 3, dtype=torch.long), 1.0)[0].shape == (0, 3)
    targets = torch.randint(0, 5, (2, 3))
    logits = torch.randn(2, 3, 5)
    assert torch.equal(token_logprobs(logits, targets.int(), 1.0)[0], token_logprobs(logits, targets, 1.0)[0])


@pytest.mark.parametrize("temperature", [0.0, math.nan, math.inf])
def test_score_refuses_a_temperature_that_is_not_a_finite_positive_number(temperature):
    model = MoETransformer(tiny(vocab_size=32)).eval()
    with pytest.raises(ValueError, match="temperature"):
        score(model, PROMPTS, RESPONSES, temperature=temperature)


@pytest.mark.parametrize("logits_from", [-1, 6, 1.0, True, None])
def test_forward_refuses_logits_from_outside_the_sequence(logits_from):
    model = MoETransformer(tiny(vocab_size=32)).eval()
    ids = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        assert model(ids, logits_from=5).shape == (2, 0, 32)  # T itself: no position, allowed
        assert torch.equal(model(ids, logits_from=2), model(ids)[:, 2:])
        with pytest.raises(ValueError, match=r"logits_from=.*\[0, 5\]"):
            model(ids, logits_from=logits_from)
