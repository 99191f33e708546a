"""No content of the stream stops the trainer: what it cannot train is dead-lettered, acked, counted, and
its admission slot comes back (README "Failure semantics")."""

from __future__ import annotations

import pytest

from nibble.monitoring.reasons import TEMPERATURE_MISMATCH, TOKEN_OUT_OF_VOCAB, TOO_LONG
from tests.reliability.conftest import InProcessTrainer, make_group, run_config


def dead_letters(client, config) -> list[dict]:
    return [
        {k.decode(): v.decode(errors="replace") for k, v in fields.items() if k != b"payload"}
        for _, fields in client.xrange(config.dead_letter_stream)
    ]


@pytest.mark.parametrize(
    ("poison", "code"),
    [
        # the input: valid for validate_group, but token 25 is outside the model's vocab of 15
        (make_group("poison", [[25, 2], [3, 4]]), TOKEN_OUT_OF_VOCAB),
        (make_group("poison", [[3] * 20, [3, 4]]), TOO_LONG),  # 3 + 20 tokens > max_position_embeddings 16
        (make_group("poison", [[3, 2], [3, 4]], temperature=0.5), TEMPERATURE_MISMATCH),
    ],
    ids=["out_of_vocab", "too_long", "temperature"],
)
def test_untrainable_group_is_dead_lettered_and_the_trainer_goes_on(stream_config, writer, tmp_path, poison, code):
    config = run_config(stream_config, tmp_path)
    service = InProcessTrainer(config, tmp_path / "out")
    admission = service.admission
    assert admission.reserve(10, "s") and admission.reserve(10, "s")  # a sampler's slots for the two groups
    commit = lambda pipe: admission.commit("s", pipe)  # noqa: E731 (as the sampler writes)
    writer.write(poison, also=commit)
    writer.write(make_group("good", [[3, 2], [4, 5]]), also=commit)
    assert admission.held("s") == 0 and admission.started() == 2

    service.trainer.step()  # trains on the good group; the poison one never reaches a batch

    assert service.trainer.ledger.ids() == ["good-0", "good-1"]
    assert service.metrics.value("nibble_dead_lettered_total", reason=code) == 1
    [letter] = dead_letters(service.client, stream_config)
    assert letter["reason"].startswith(f"{code}: group poison-g")
    assert service.client.xpending(stream_config.stream, stream_config.consumer_group)["pending"] == 0
    assert admission.started() == 1  # the dead-lettered group's slot came back; the trained one's stays

    # A restarted trainer (same checkpoint, same stream) neither re-reads nor trips over the entry.
    again = InProcessTrainer(config, tmp_path / "out")
    assert admission.reserve(10, "s")
    writer.write(make_group("next", [[3, 2], [4, 5]]), also=commit)
    again.trainer.step()
    assert again.trainer.ledger.ids()[-2:] == ["next-0", "next-1"]
    assert len(dead_letters(service.client, stream_config)) == 1
