"""Fuzzing (hypothesis): random and mutated stream entries, weight streams and config files never crash a
service; each bad input is refused with its reason, and the reason counters count exactly those."""

from __future__ import annotations

import json
import math

import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nibble.config import load
from nibble.model import load_config, tiny
from nibble.monitoring import reasons as v
from nibble.monitoring.reasons import WEIGHT_REASONS
from nibble.transport.stream import connect, reason_code
from nibble.transport.weights import WeightAssembler, WeightRejected, stream_items
from nibble.wire import pb
from tests.reliability.conftest import InProcessTrainer, make_group, run_config
from tests.services import redis_config

VOCAB, CONTEXT = 15, 16  # the in-process trainer's model


def mutated(name: str, mutation: str, k: int) -> pb.TrajectoryGroup:
    """A valid group with one fault of kind ``mutation`` (``k`` picks the value or position)."""
    g = make_group(name, [[3, 4, 5], [6, 7]])
    r = g.responses[k % 2]
    if mutation == v.TOKEN_OUT_OF_VOCAB:
        (r.tokens if k % 3 else g.prompt_tokens)[0] = VOCAB + k
    elif mutation == v.NEGATIVE_TOKEN:
        r.tokens[-1] = -1 - k
    elif mutation == v.LENGTH_MISMATCH:
        r.logprobs.append(-0.5) if k % 2 else r.logprobs.pop()
    elif mutation == v.NON_FINITE_REWARD:
        r.reward = (math.nan, math.inf, -math.inf)[k % 3]
    elif mutation == v.BAD_TEMPERATURE:
        g.temperature = (0.0, -1.0, math.nan, math.inf)[k % 4]
    elif mutation == v.TEMPERATURE_MISMATCH:
        g.temperature = 0.25 + 0.1 * (k % 5)
    elif mutation == v.TOO_LONG:
        r.tokens.extend([3] * CONTEXT)
        r.logprobs.extend([-1.0] * CONTEXT)
    elif mutation == v.MISSING_ID:
        (r.__setattr__("trajectory_id", "") if k % 2 else g.__setattr__("sampler_id", ""))
    elif mutation == v.DUPLICATE_TRAJECTORY_ID:
        g.responses[1].trajectory_id = g.responses[0].trajectory_id
    elif mutation == v.TOO_FEW_RESPONSES:
        del g.responses[1:]
    elif mutation == v.EMPTY_PROMPT:
        del g.prompt_tokens[:]
    elif mutation == v.EMPTY_RESPONSE:
        del r.tokens[:], r.logprobs[:]
    return g


MUTATIONS = [
    v.TOKEN_OUT_OF_VOCAB, v.NEGATIVE_TOKEN, v.LENGTH_MISMATCH, v.NON_FINITE_REWARD, v.BAD_TEMPERATURE,
    v.TEMPERATURE_MISMATCH, v.TOO_LONG, v.MISSING_ID, v.DUPLICATE_TRAJECTORY_ID, v.TOO_FEW_RESPONSES,
    v.EMPTY_PROMPT, v.EMPTY_RESPONSE,
]  # fmt: skip
ENTRY = st.one_of(
    st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 60)).map(
        lambda m: (m[0], {b"group": m}),
    ),
    st.binary(max_size=64).map(lambda b: (None, {b"group": b})),  # random bytes: almost never a valid group
    st.binary(min_size=1, max_size=8).map(lambda b: (v.UNDECODABLE, {b"other": b})),  # no payload field
)

SLOW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SLOW
@given(entries=st.lists(ENTRY, min_size=1, max_size=4))
def test_no_stream_entry_stops_the_trainer_and_each_is_counted_by_its_reason(redis_server, tmp_path_factory, entries):
    config = run_config(redis_config(redis_server.url), tmp_path_factory.mktemp("fuzz"))
    service = InProcessTrainer(config, tmp_path_factory.mktemp("out"))
    client = connect(config.redis)
    expected = []
    for i, (code, fields) in enumerate(entries):
        if isinstance(fields.get(b"group"), tuple):
            mutation, k = fields[b"group"]
            fields = {b"group": mutated(f"m{i}", mutation, k).SerializeToString()}
        client.xadd(config.redis.stream, fields)
        expected.append(code)
    good = make_group("good", [[3, 2], [4, 5]])
    client.xadd(config.redis.stream, {b"group": good.SerializeToString()})
    for _ in range(len(entries) + 1):
        assert service.admission.reserve(100, "fuzzer")

    service.trainer.step()  # must not raise, whatever came before the good group

    assert service.trainer.ledger.ids() == ["good-0", "good-1"]
    letters = client.xrange(config.redis.dead_letter_stream)
    assert len(letters) == len(entries)  # every fuzzed entry dead-lettered, none trained
    codes = [reason_code(f[b"reason"].decode()) for _, f in letters]
    for code, got in zip(expected, codes, strict=True):
        assert got in v.DEAD_LETTER_REASONS and (code is None or got == code), (code, got)
    for code in v.DEAD_LETTER_REASONS:
        assert service.metrics.value("nibble_dead_lettered_total", reason=code) == codes.count(code)
    assert service.admission.started() == 1  # only the trained group still holds its slot
    assert client.xpending(config.redis.stream, config.redis.consumer_group)["pending"] == 0


LOGPROB = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    responses=st.lists(
        st.lists(st.tuples(st.integers(0, VOCAB - 1), LOGPROB), min_size=1, max_size=CONTEXT - 3),
        min_size=2,
        max_size=4,
    ),
    rewards=st.lists(st.floats(-1e6, 1e6), min_size=4, max_size=4),
)
def test_any_valid_group_trains(redis_server, tmp_path_factory, responses, rewards):
    """Groups inside the vocabulary and context with any logprobs (NaN, ±inf included) and rewards train."""
    config = run_config(redis_config(redis_server.url), tmp_path_factory.mktemp("fuzz"))
    service = InProcessTrainer(config, tmp_path_factory.mktemp("out"))
    group = make_group("g", [[t for t, _ in r] for r in responses])
    for response, r, reward in zip(group.responses, responses, rewards, strict=False):
        response.logprobs[:] = [lp for _, lp in r]
        response.reward = reward
    connect(config.redis).xadd(config.redis.stream, {b"group": group.SerializeToString()})
    result = service.trainer.step()
    assert len(service.trainer.ledger.ids()) == len(responses)
    assert math.isfinite(result.loss) or result.skipped_updates == 1


# ---- weight streams ----------------------------------------------------------------------------------

STATE = {"a": torch.arange(300, dtype=torch.float32).reshape(20, 15).to(torch.bfloat16), "b": torch.ones(7)}
ITEMS = list(stream_items(3, {k: t.to(torch.bfloat16) for k, t in STATE.items()}, "{}", chunk_bytes=128))


def mutate_stream(items: list[pb.WeightStreamItem], op: str, i: int, value: int) -> list[pb.WeightStreamItem]:
    items = [pb.WeightStreamItem.FromString(x.SerializeToString()) for x in items]
    target = items[i % len(items)]
    if op == "drop":
        del items[i % len(items)]
    elif op == "duplicate":
        items.insert(i % len(items), target)
    elif op == "swap" and len(items) > 2:
        j = 1 + i % (len(items) - 1)
        items[j], items[j - 1] = items[j - 1], items[j]
    elif op == "flip" and target.HasField("chunk") and target.chunk.data:
        data = bytearray(target.chunk.data)
        data[value % len(data)] ^= 1 + value % 255
        target.chunk.data = bytes(data)
    elif op == "manifest":
        m = items[0].manifest
        field = ("chunk_count", "total_bytes", "policy_version", "shape", "offset", "dtype")[value % 6]
        if field in ("chunk_count", "total_bytes", "policy_version"):
            setattr(m, field, getattr(m, field) + 1 + value)
        elif field == "shape":
            m.tensors[value % len(m.tensors)].shape[0] += 1 + value % 3
        elif field == "offset":
            m.tensors[value % len(m.tensors)].offset += 1 + value
        else:
            m.tensors[value % len(m.tensors)].dtype = "float8"
    elif op == "garbage":
        items[i % len(items)] = pb.WeightStreamItem.FromString(bytes([10, 2, 8, value % 128]))
    return items


@settings(max_examples=150, deadline=None)
@given(
    op=st.sampled_from(["drop", "duplicate", "swap", "flip", "manifest", "garbage"]),
    i=st.integers(0, 100),
    value=st.integers(0, 1000),
)
def test_mutated_weight_streams_are_rejected_with_a_reason_never_applied(op, i, value):
    items = mutate_stream(ITEMS, op, i, value)
    try:
        _, tensors = WeightAssembler(version=3, quantized=False).assemble(items)
    except WeightRejected as exc:
        assert exc.reason in WEIGHT_REASONS
        return
    # accepted only when the mutation changed nothing that matters: then the tensors are the originals
    assert all(torch.equal(tensors[k], t.to(torch.bfloat16)) for k, t in STATE.items())


# ---- config files ------------------------------------------------------------------------------------

SMOKE = open("configs/smoke.yaml").read()  # noqa: SIM115 (read once at import)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=8))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(["trainer", "sampler", "redis", "weightsync", "plan", "task", "model"]),
       key=st.text(min_size=1, max_size=20), value=SCALAR, raw=st.binary(max_size=40))  # fmt: skip
def test_mutated_run_configs_load_or_are_refused_naming_the_file(tmp_path, section, key, value, raw):
    path = tmp_path / "run.yaml"
    base = yaml.safe_load(SMOKE)
    fields = list(base.get(section, {}) or {}) or [key]
    base.setdefault(section, {})[fields[len(key) % len(fields)] if len(key) % 2 else key] = value
    for text in (yaml.safe_dump(base), raw.decode("latin-1")):
        path.write_text(text)
        try:
            load(path, environ={})
        except ValueError as exc:
            assert str(path) in str(exc)


MODEL_KEYS = ["vocab_size", "hidden_size", "num_experts", "rope_parameters", "head_dim", "mlp_only_layers",
              "tie_word_embeddings", "model_type", "anything"]  # fmt: skip
ANY_JSON = st.one_of(SCALAR, st.lists(SCALAR, max_size=3), st.dictionaries(st.text(max_size=5), SCALAR, max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(MODEL_KEYS), value=ANY_JSON)
def test_mutated_model_configs_load_or_are_refused_naming_the_file(tmp_path, key, value):
    hf = tiny(vocab_size=32).to_hf()
    hf[key] = value
    (tmp_path / "config.json").write_text(json.dumps(hf, allow_nan=True))
    try:
        load_config(tmp_path)
    except ValueError as exc:
        assert "config.json" in str(exc)
