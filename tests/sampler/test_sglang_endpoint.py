"""A Nibble sampler's engine served under SGLang's ``/generate`` (``sampler.http_port``): the same samples
as the engine itself, in SGLang's response shape, refusals that name the field — and the real
``sglang-router`` balancing requests over two such samplers."""

import copy
import time

import pytest
import requests

from nibble.sampler.engine import BuiltinEngine
from nibble.sampler.sglang import GenerateEndpoint
from nibble.sampler.sglang.protocol import GenerateOutput
from tests.sampler.test_engine import policy
from tests.services import SGLangRouter

PARAMS = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "stop_token_ids": [2], "sampling_seed": 4}


@pytest.fixture(scope="module")
def model():
    return policy("cpu").pack()


def serve(model, version: int = 0) -> GenerateEndpoint:
    engine = BuiltinEngine(copy.deepcopy(model), pad_id=0, policy_version=version)
    return GenerateEndpoint(engine, model_path="runs/warm_start", decode=lambda ids: ",".join(map(str, ids))).start()


def test_generate_answers_in_sglangs_shape_with_the_engines_samples_and_version(model):
    endpoint = serve(model, version=5)
    try:
        url = f"http://127.0.0.1:{endpoint.port}"
        body = {"input_ids": [[3, 4, 5], [6, 7]], "sampling_params": {**PARAMS, "n": 2}, "return_logprob": True}
        reply = requests.post(f"{url}/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        outputs = [GenerateOutput.model_validate(item) for item in reply.json()]
        options = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, stop_tokens=[2], seed=4)
        expected = [s for p in body["input_ids"] for s in endpoint.engine.generate([p], n=2, **options)[0]]
        assert len(outputs) == 4
        for out, sample in zip(outputs, expected, strict=True):
            assert out.output_ids == sample.tokens
            assert [lp for lp, _, _ in out.meta_info.output_token_logprobs] == sample.logprobs
            assert [t for _, t, _ in out.meta_info.output_token_logprobs] == sample.tokens
            assert out.meta_info.finish_reason.type == sample.finish_reason
            assert out.meta_info.weight_version == "5" and out.text == ",".join(map(str, sample.tokens))
        single = requests.post(f"{url}/generate", json={"input_ids": [3, 4], "sampling_params": PARAMS}, timeout=60)
        assert isinstance(single.json(), dict) and "output_token_logprobs" not in single.json()["meta_info"]
        assert requests.get(f"{url}/model_info", timeout=5).json()["weight_version"] == "5"
        assert requests.get(f"{url}/health_generate", timeout=5).status_code == 200
    finally:
        endpoint.stop()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_ids": [3], "sampling_params": {"top_k": 5}}, "sampling_params.top_k: Extra inputs are not permitted"),
        ({"text": "hi"}, "input_ids: Field required"),
        ({"input_ids": [3], "stream": True}, "stream: Input should be False"),
        ({"input_ids": [3], "return_hidden_states": True}, "return_hidden_states: Input should be False"),
        ({"input_ids": [[3], [4]], "sampling_params": [PARAMS]}, "1 entries for 2 prompts"),
    ],
)
def test_requests_beyond_the_subset_are_refused_naming_the_field(model, body, message):
    endpoint = serve(model)
    try:
        reply = requests.post(f"http://127.0.0.1:{endpoint.port}/generate", json=body, timeout=10)
        assert reply.status_code == 400 and message in reply.json()["error"], reply.text
    finally:
        endpoint.stop()


def test_a_paused_engine_answers_503(model):
    endpoint = serve(model)
    try:
        endpoint.engine.pause()
        reply = requests.post(f"http://127.0.0.1:{endpoint.port}/generate", json={"input_ids": [3]}, timeout=10)
        assert reply.status_code == 503 and "paused" in reply.json()["error"]
    finally:
        endpoint.stop()


def test_the_real_sglang_router_balances_over_two_nibble_samplers(model, tmp_path):
    endpoints = [serve(model, version=1), serve(model, version=1)]
    try:
        with SGLangRouter(tmp_path, [f"http://127.0.0.1:{e.port}" for e in endpoints]) as router:
            body = {"input_ids": [3, 4, 5], "sampling_params": PARAMS, "return_logprob": True}
            first = wait_for_router(router, body)
            outputs = [first] + [post(router, body) for _ in range(7)]
    finally:
        for endpoint in endpoints:
            endpoint.stop()
    served = [e.requests_served for e in endpoints]
    print(f"requests served per sampler: {served}")
    assert min(served) >= 3 and sum(served) >= 8, served  # round robin: each sampler got its share
    for out in map(GenerateOutput.model_validate, outputs):
        assert out.meta_info.weight_version == "1" and out.meta_info.finish_reason.type in ("stop", "length")
        assert [t for _, t, _ in out.meta_info.output_token_logprobs] == out.output_ids
    same_seed = {tuple(GenerateOutput.model_validate(o).output_ids) for o in outputs}
    assert len(same_seed) == 1  # one seed, one model: whichever sampler served it, the same sample


def post(router: SGLangRouter, body: dict) -> dict:
    reply = requests.post(f"{router.url}/generate", json=body, timeout=60)
    assert reply.status_code == 200, f"{reply.status_code} {reply.text[:500]}\n{router.log_tail()}"
    return reply.json()


def wait_for_router(router: SGLangRouter, body: dict, timeout: float = 90.0) -> dict:
    """The first answer through the router, once it is up and has found its workers healthy."""
    deadline, last = time.monotonic() + timeout, "no answer"
    while time.monotonic() < deadline:
        if router.process.poll() is not None:
            pytest.fail(f"sglang-router exited ({router.process.returncode}): {router.log_tail()}")
        try:
            reply = requests.post(f"{router.url}/generate", json=body, timeout=30)
            if reply.status_code == 200:
                return reply.json()
            last = f"{reply.status_code} {reply.text[:300]}"
        except requests.ConnectionError as exc:
            last = f"{type(exc).__name__}"
        time.sleep(0.5)
    pytest.fail(f"sglang-router answered no /generate within {timeout} s (last: {last}): {router.log_tail()}")
