"""What the trainer checks of a (decoded, valid) group before it joins a batch (docs/design.md §5).

``validate_group`` decides whether an entry is a well-formed group at all; this module decides whether
*this* trainer can train on it: its tokens inside the model's vocabulary, prompt plus response inside
the model's context, sampled at the temperature the trainer scores with. A group that fails is
dead-lettered whole with the reason, so no content of the stream can stop the trainer.
"""

from __future__ import annotations

import math

from nibble.model.config import ModelConfig
from nibble.monitoring.reasons import TEMPERATURE_MISMATCH, TOKEN_OUT_OF_VOCAB, TOO_LONG
from nibble.wire import pb


def untrainable_reason(group: pb.TrajectoryGroup, model: ModelConfig, temperature: float) -> str | None:
    """Why the trainer cannot train on ``group`` (``"<code>: <detail>"``), or ``None``.

    Args:
        group: a group that passed :func:`nibble.transport.stream.validate.validate_group`.
        model: the trained model's configuration (``vocab_size``, ``max_position_embeddings``).
        temperature: the sampling temperature the trainer scores with (``sampler.temperature``).
    """
    where = f"group {group.group_id}"
    if group.prompt_tokens and max(group.prompt_tokens) >= model.vocab_size:
        return f"{TOKEN_OUT_OF_VOCAB}: {where} prompt holds token {max(group.prompt_tokens)} (vocab {model.vocab_size})"
    if not math.isclose(group.temperature, temperature, rel_tol=1e-6):
        return (
            f"{TEMPERATURE_MISMATCH}: {where} sampled at temperature {group.temperature}, "
            f"the trainer scores at {temperature}"
        )
    for i, response in enumerate(group.responses):
        if max(response.tokens) >= model.vocab_size:
            return (
                f"{TOKEN_OUT_OF_VOCAB}: {where} response {i} ({response.trajectory_id}) holds token "
                f"{max(response.tokens)} (vocab {model.vocab_size})"
            )
        length = len(group.prompt_tokens) + len(response.tokens)
        if length > model.max_position_embeddings:
            return (
                f"{TOO_LONG}: {where} response {i} ({response.trajectory_id}): prompt + response = {length} tokens, "
                f"max_position_embeddings={model.max_position_embeddings}"
            )
    return None
