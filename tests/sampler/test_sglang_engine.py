"""``sampler.engine: sglang`` against a stand-in SGLang server (``fake_sglang``): generation with logprobs,
the pause → update_weights_from_disk → continue round on weight-sync's export directory, 503s retried,
timeouts, and the refusals — a version the engine does not serve, an aborted response, a server whose
quantisation or weight version disagrees."""

import threading
import time

import pytest

from nibble.config import RunConfig, WeightSyncConfig
from nibble.interop import version_dir
from nibble.sampler.main import sglang_url
from nibble.sampler.sglang import (
    SGLangEngine,
    SGLangError,
    SGLangTimeout,
    SGLangUnavailable,
    VersionMismatch,
)
from tests.sampler.fake_sglang import FakeSGLang

PROMPTS = [[5, 6, 7], [8, 9]]
OPTIONS = dict(n=3, max_new_tokens=10, temperature=1.0, top_p=0.9, stop_tokens=[2], seed=11)


@pytest.fixture
def server():
    fake = FakeSGLang()
    yield fake
    fake.stop()


def engine_for(server: FakeSGLang, export_dir, export_format="compressed-tensors", **options) -> SGLangEngine:
    options = {"timeout_seconds": 5.0, "retry_seconds": 5.0, **options}
    return SGLangEngine(server.url, export_dir=export_dir, export_format=export_format, **options)


def exported(export_dir, version: int):
    """A version directory as weight-sync's export leaves it (the stand-in checks only config.json)."""
    path = version_dir(export_dir, version)
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_generate_sends_one_seeded_row_per_sample_and_returns_the_servers_tokens_and_logprobs(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    groups = engine.generate(PROMPTS, **OPTIONS)
    (request,) = server.calls("/generate")
    assert request["input_ids"] == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3 and request["return_logprob"] is True
    params = request["sampling_params"]
    assert len({p["sampling_seed"] for p in params}) == 6  # SGLang's n would repeat one seed: identical samples
    assert all(p["top_p"] == 0.9 and p["stop_token_ids"] == [2] and p["max_new_tokens"] == 10 for p in params)
    assert [len(g) for g in groups] == [3, 3]
    samples = [s for g in groups for s in g]
    for prompt, p, sample in zip(request["input_ids"], params, samples, strict=True):
        expected = server.output(prompt, p, logprob=True)  # the stand-in draws from (prompt, seed) alone
        assert sample.tokens == expected["output_ids"]
        assert sample.logprobs == [lp for lp, _, _ in expected["meta_info"]["output_token_logprobs"]]
        assert sample.finish_reason == expected["meta_info"]["finish_reason"]["type"]
    assert len({tuple(s.tokens) for g in groups for s in g}) > 1


def test_a_weight_update_loads_weightsyncs_export_of_the_version_and_adopts_it_once_reported(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    path = exported(tmp_path, 1)
    engine.pause()
    engine.update_weights(1, None)
    engine.resume()
    (update,) = server.calls("/update_weights_from_disk")
    assert update["model_path"] == str(path) and update["weight_version"] == "1"
    assert [p for _, p, _ in server.log[-4:]] == [
        "/pause_generation", "/update_weights_from_disk", "/model_info", "/continue_generation",
    ]  # fmt: skip
    assert server.calls("/pause_generation") == [{"mode": "abort"}]  # nothing foreign runs on across the update
    assert engine.policy_version == 1
    assert engine.generate(PROMPTS, **OPTIONS)  # the server now reports "1" in every response


def test_update_refusals_keep_the_version(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    with pytest.raises(RuntimeError, match="paused"):
        engine.update_weights(1, None)
    engine.pause()
    with pytest.raises(ValueError, match="no export at"):
        engine.update_weights(1, None)  # never announced before it is on disk; a missing one is not sent
    assert not server.calls("/update_weights_from_disk")
    version_dir(tmp_path, 2).mkdir(parents=True)  # no config.json: the server refuses it
    with pytest.raises(ValueError, match="did not load"):
        engine.update_weights(2, None)
    assert engine.policy_version == 0 and server.weight_version == "0"
    with pytest.raises(RuntimeError, match="paused"):
        engine.generate(PROMPTS, **OPTIONS)


def test_503s_are_retried_with_backoff_and_generation_waits_out_an_update(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    server.unavailable = 3
    assert engine.generate(PROMPTS, **OPTIONS)
    assert len(server.calls("/generate")) == 4
    exported(tmp_path, 1)
    server.update_seconds = 2.0  # long enough that a busy machine still sends a request into it
    other = engine_for(server, tmp_path).connect(startup_seconds=5)  # a second client of the same server
    engine.pause()
    updating = threading.Thread(target=engine.update_weights, args=(1, None))
    updating.start()
    while not server.updating:
        time.sleep(0.01)
    with pytest.raises(VersionMismatch):  # 503s until the update ends, then the new version: not other's 0
        other.generate(PROMPTS, **OPTIONS)
    updating.join()
    assert len(server.calls("/generate")) > 5  # at least one 503 answered during the update
    assert engine.policy_version == 1


def test_a_server_unavailable_beyond_the_retry_budget_fails_with_how_long_it_was_tried(server, tmp_path):
    engine = engine_for(server, tmp_path, retry_seconds=0.5).connect(startup_seconds=5)
    server.unavailable = 10_000
    started = time.monotonic()
    with pytest.raises(SGLangUnavailable, match="503 Service Unavailable, still after retrying"):
        engine.generate(PROMPTS, **OPTIONS)
    assert time.monotonic() - started < 3
    server.stop()
    with pytest.raises(SGLangUnavailable, match="cannot connect"):
        engine_for(server, tmp_path, retry_seconds=0.2).connect(startup_seconds=0.2)


def test_a_slow_server_times_out(server, tmp_path):
    engine = engine_for(server, tmp_path, timeout_seconds=0.3).connect(startup_seconds=5)
    server.generate_delay = 4.0
    started = time.monotonic()
    with pytest.raises(SGLangTimeout, match=r"no answer within 0\.3 s"):
        engine.generate(PROMPTS, **OPTIONS)
    assert time.monotonic() - started < 3.0  # the 0.3 s timeout, not the server's 4 s


@pytest.mark.parametrize("fault", ["report_version", "split_versions"])
def test_a_response_of_another_version_refuses_the_whole_batch(server, tmp_path, fault):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    server.weight_version = "0"
    if fault == "report_version":
        server.report_version = "3"
    else:
        server.split_versions = True
        server.report_version = "1"  # spans 0 then 1: generated across an update
    with pytest.raises(VersionMismatch, match="the engine serves 0"):
        engine.generate(PROMPTS, **OPTIONS)


def test_an_aborted_response_fails_the_batch(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    server.abort = True
    with pytest.raises(SGLangError, match="did not finish: Abort before prefill"):
        engine.generate(PROMPTS, **OPTIONS)


def test_connect_waits_for_health_and_reads_the_servers_version(server, tmp_path):
    server.starting, server.weight_version, server.old_routes = 4, "7", True
    engine = engine_for(server, tmp_path).connect(startup_seconds=10)
    assert engine.policy_version == 7
    assert len(server.calls("/health_generate")) == 5 and server.calls("/get_server_info")


@pytest.mark.parametrize(
    ("export_format", "quantization", "accepted"),
    [
        ("compressed-tensors", "compressed-tensors", True),
        ("modelopt", "modelopt_fp4", True),
        ("compressed-tensors", None, False),
        ("compressed-tensors", "modelopt_fp4", False),
        ("modelopt", "fp8", False),
    ],
)
def test_connect_refuses_a_quantization_that_disagrees_with_the_plan(
    server, tmp_path, export_format, quantization, accepted
):
    server.quantization = quantization
    engine = engine_for(server, tmp_path, export_format=export_format)
    if accepted:
        engine.connect(startup_seconds=5)
        return
    with pytest.raises(ValueError, match=f"quantization={quantization!r}.*launch it with --quantization"):
        engine.connect(startup_seconds=5)


def test_connect_refuses_a_weight_version_that_is_no_policy_version(server, tmp_path):
    server.weight_version = "default"  # SGLang's own default
    with pytest.raises(ValueError, match=r"weight_version='default'.*--weight-version 0"):
        engine_for(server, tmp_path).connect(startup_seconds=5)


def test_an_export_format_without_nvfp4_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"weightsync\.export_format='none'"):
        SGLangEngine("http://127.0.0.1:1", export_dir=tmp_path, export_format="none")


def sglang_run(**sampler) -> dict:
    return {
        "num_samplers": 2,
        "weightsync": {"export_format": "compressed-tensors"},
        "sampler": {"engine": "sglang", "sglang_urls": ["http://a:30000", "http://b:30000"], **sampler},
    }


def test_config_checks_of_the_sglang_engine():
    assert RunConfig.model_validate(sglang_run()).sampler.engine == "sglang"
    cases = [
        ({"sampler": {"engine": "sglang"}}, "sampler.engine=sglang needs sampler.sglang_urls"),
        (sglang_run(sglang_urls=["a:30000", "http://b"]), "sampler.sglang_urls: 'a:30000' is not an http"),
        ({**sglang_run(), "weightsync": {}}, "set weightsync.export_format"),
        ({**sglang_run(), "plan": {"format": "bf16"}}, "plan.format=bf16 has no such export"),
        ({**sglang_run(), "num_samplers": 3}, "2 servers for num_samplers=3"),
    ]
    for data, message in cases:
        with pytest.raises(ValueError, match=message):
            RunConfig.model_validate(data)


def test_each_sampler_drives_its_own_server():
    urls = ["http://a", "http://b"]
    assert [sglang_url(urls, "sampler-0"), sglang_url(urls, "sampler-1")] == urls
    assert sglang_url(["http://a"], "sampler") == "http://a"
    with pytest.raises(ValueError, match="no server for sampler 'sampler-2'"):
        sglang_url(urls, "sampler-2")


class NoTensors:
    """A weight subscriber for an engine that loads from disk: fetching tensors would be a bug."""

    def fetch(self, version):
        pytest.fail(f"version {version}: tensors fetched for an engine that loads from disk")


def sampler_on(engine):
    from nibble.monitoring.metrics import Metrics
    from nibble.sampler.main import settings
    from nibble.sampler.service import Sampler
    from nibble.tasks import get_task

    config = RunConfig(task={"name": "addition", "options": {"digits": 1, "eval_size": 4, "holdout_fraction": 0.5}})
    task = get_task(config.task.name, **config.task.options)
    return Sampler(settings(config), task, engine, None, None, NoTensors(), Metrics("sampler"))


def test_the_sampler_swaps_an_sglang_server_to_an_announced_version_without_fetching_tensors(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    sampler = sampler_on(engine)
    exported(tmp_path, 1)
    sampler._pending_version = (1, time.time())
    sampler.maybe_update_weights()
    assert engine.policy_version == 1 and server.weight_version == "1" and not server.paused


def test_the_sampler_counts_a_refused_batch_as_an_engine_failure_and_writes_nothing(server, tmp_path):
    engine = engine_for(server, tmp_path).connect(startup_seconds=5)
    sampler = sampler_on(engine)
    server.report_version = "4"
    assert sampler.generate([next(sampler.task.train_stream(seed=0))]) is None
    assert sampler.stats.engine_failures == 1


@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt"])
def test_the_server_is_pointed_at_the_directory_weightsyncs_exporter_wrote(server, tmp_path, layout):
    from nibble.recipe.export import published_state, quantize_state
    from nibble.weightsync.export import VersionExporter
    from tests.sampler.test_engine import policy

    model = policy("cpu")
    exporter = VersionExporter(WeightSyncConfig(store_dir=tmp_path / "store", export_format=layout))
    path = exporter.write(1, quantize_state(published_state(model), model.plan), model.plan)
    server.quantization = "modelopt_fp4" if layout == "modelopt" else layout
    engine = engine_for(server, exporter.root, export_format=layout).connect(startup_seconds=5)
    engine.pause()
    engine.update_weights(1, None)
    engine.resume()
    assert server.calls("/update_weights_from_disk")[0]["model_path"] == str(path)
    assert engine.policy_version == 1


def test_the_sampler_service_connects_to_its_server_or_exits_naming_the_setting(server, tmp_path):
    from nibble.sampler.main import sglang_engine

    data = sglang_run()
    data["sampler"]["sglang_urls"] = [server.url, "http://127.0.0.1:1"]
    data["weightsync"]["export_dir"] = str(tmp_path)
    config = RunConfig.model_validate({**data, "sampler": {**data["sampler"], "sglang_startup_seconds": 0.3}})
    assert sglang_engine(config, "sampler-0").policy_version == 0
    with pytest.raises(ValueError, match=r"127\.0\.0\.1:1 did not pass /health_generate.*sglang_startup_seconds"):
        sglang_engine(config, "sampler-1")


def test_a_server_away_during_the_swap_keeps_the_version_and_the_swap_is_retried(server, tmp_path):
    engine = engine_for(server, tmp_path, retry_seconds=0.2).connect(startup_seconds=5)
    sampler = sampler_on(engine)
    exported(tmp_path, 1)
    sampler._pending_version = (1, time.time())
    server.unavailable = 10_000
    sampler.maybe_update_weights()  # no exception: counted, and kept for a retry after backoff
    assert engine.policy_version == 0
    assert sampler.metrics.rejected.labels(reason="fetch_failed")._value.get() == 1
    server.unavailable = 0
    sampler._fetch_retry_at = 0.0
    sampler.maybe_update_weights()
    assert engine.policy_version == 1 and server.weight_version == "1"
