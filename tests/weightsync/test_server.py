"""Weight-sync over real gRPC on loopback: publish → announce → fetch → apply, and every refusal."""

import copy
import queue
import shutil
import subprocess
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nibble.model import MoETransformer, tiny
from nibble.recipe.export import load_sampler_state, published_state, quantize_state
from nibble.transport.weights import (
    FetchFailed,
    GrpcWeightPublisher,
    GrpcWeightSubscriber,
    VersionUnavailable,
    WeightRejected,
    stream_items,
)
from nibble.transport.weights.grpc_util import open_channel
from nibble.wire import pb
from tests.helpers import corrupted
from tests.weightsync.conftest import FETCH_TOKEN, PUBLISH_TOKEN


def next_version(seen: queue.Queue, timeout: float = 10.0):
    item = seen.get(timeout=timeout)
    if isinstance(item, Exception):
        raise item
    return item


def test_a_published_version_is_announced_fetched_and_reproduces_the_trainers_logits(harness, trainer, state):
    model, plan = trainer
    server = harness.start()
    seen = harness.watch(harness.subscriber(server))
    reply = harness.publisher(server).publish(1, state, plan)
    assert reply.policy_version == 1 and reply.bytes_received >= sum(t.nbytes for t in state.values())
    assert next_version(seen) == 1
    m = server.metrics
    assert m.value("nibble_weight_bytes_total") == reply.bytes_received  # chunk data received

    manifest, tensors = harness.subscriber(server).fetch(1)
    assert manifest.quantized and manifest.plan == plan.model_dump_json()
    expected = quantize_state(state, plan)
    assert set(tensors) == set(expected)
    sampler = MoETransformer(tiny(vocab_size=32), plan).pack()
    load_sampler_state(sampler, tensors)
    ids = torch.randint(1, 32, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(sampler(ids), model(ids))

    assert m.value("nibble_policy_version") == 1
    sent = m.value("nibble_weight_bytes_total") - reply.bytes_received  # chunk messages: data + ~100 bytes each
    assert manifest.total_bytes < sent < manifest.total_bytes + 200 * manifest.chunk_count
    assert 0 < m.value("nibble_four_over_six_fraction") < 1
    expert = "model.layers.0.mlp.experts.gate_up_proj"
    assert 0 < m.value("nibble_quant_rel_error", layer=expert) < 0.05
    assert harness.publisher(server).latest_version() == 1


def test_consecutive_versions_land_intact_in_one_reused_receive_buffer(harness, trainer, state):
    model, plan = trainer
    server = harness.start()
    publisher, subscriber = harness.publisher(server), harness.subscriber(server)
    sampler = MoETransformer(tiny(vocab_size=32), plan).pack()
    ids = torch.randint(1, 32, (2, 9), generator=torch.Generator().manual_seed(3))
    buffers = set()
    for version, sign in ((1, 1.0), (2, -1.0), (3, 0.5)):
        changed = copy.deepcopy(model)
        with torch.no_grad():
            changed.lm_head.weight.mul_(sign)
        publisher.publish(version, published_state(changed), plan)
        _, tensors = subscriber.fetch(version)
        buffers.add(next(iter(tensors.values())).untyped_storage().data_ptr())
        load_sampler_state(sampler, tensors)
        with torch.no_grad():
            assert torch.equal(sampler(ids), changed(ids)), version
    assert len(buffers) == 1


@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("bad_checksum", grpc.StatusCode.DATA_LOSS),
        ("digest_mismatch", grpc.StatusCode.DATA_LOSS),
        ("missing_chunks", grpc.StatusCode.INVALID_ARGUMENT),
        ("out_of_order", grpc.StatusCode.INVALID_ARGUMENT),
        ("unknown_chunk", grpc.StatusCode.INVALID_ARGUMENT),
        ("bad_extent", grpc.StatusCode.INVALID_ARGUMENT),
        ("bad_tensor", grpc.StatusCode.INVALID_ARGUMENT),
        ("layout_mismatch", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_a_corrupt_publication_is_rejected_counted_and_never_announced(harness, trainer, state, how, code):
    _, plan = trainer
    server = harness.start()
    harness.publisher(server).publish(1, state, plan)
    seen = harness.watch(harness.subscriber(server), after=1)
    items = list(stream_items(2, state, plan.model_dump_json(), chunk_bytes=16 * 1024))
    with pytest.raises(grpc.RpcError) as info:
        harness.raw_publish(server, corrupted(items, how))
    assert info.value.code() == code and how in info.value.details()
    assert server.metrics.value("nibble_rejected_total", reason=how) == 1
    assert harness.publisher(server).versions().available_versions == [1]
    manifest, _ = harness.subscriber(server).fetch(1)  # the held version is intact
    harness.publisher(server).publish(2, state, plan)
    assert next_version(seen) == 2  # the first announcement after the rejected one is the good one
    assert manifest.policy_version == 1


def test_versions_only_increase(harness, trainer, state):
    _, plan = trainer
    server = harness.start()
    publisher = harness.publisher(server)
    publisher.publish(2, state, plan)
    for stale in (2, 1):
        with pytest.raises(grpc.RpcError) as info:
            publisher.publish(stale, state, plan)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert server.metrics.value("nibble_rejected_total", reason="stale_version") == 2
    assert publisher.versions().available_versions == [2]


def test_tokens_are_required_and_separate(harness, trainer, state):
    _, plan = trainer
    server = harness.start()
    for token in (None, "wrong", FETCH_TOKEN):
        with pytest.raises(grpc.RpcError) as info:
            harness.publisher(server, token=token).publish(1, state, plan)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for token in (None, PUBLISH_TOKEN):
        with pytest.raises(grpc.RpcError) as info:
            harness.subscriber(server, token=token).latest_version()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as info:
        next_version(harness.watch(harness.subscriber(server, token="wrong")))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED  # watching gives up: retrying cannot help
    assert server.metrics.value("nibble_rejected_total", reason="bad_token") == 6
    assert harness.subscriber(server).latest_version() == 0


def test_fetching_a_version_not_held_is_not_found(harness, trainer, state):
    server = harness.start()
    harness.publisher(server).publish(1, state, trainer[1])
    with pytest.raises(VersionUnavailable, match=r"version 7: .*held: \[1\]") as info:
        harness.subscriber(server).fetch(7)
    assert info.value.__cause__.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(FetchFailed, match="UNAUTHENTICATED"):  # after its retries: try again later
        harness.subscriber(server, token="wrong").fetch(1)


def test_the_publish_port_answers_only_get_version(harness):
    server = harness.start()
    publisher = harness.publisher(server)
    assert publisher.latest_version() == 0
    with pytest.raises(grpc.RpcError) as info:
        list(publisher._sync.FetchWeights(pb.FetchRequest(policy_version=1), metadata=publisher._metadata, timeout=5))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_every_watcher_receives_every_version_once_in_order(harness, trainer, state):
    _, plan = trainer
    server = harness.start()
    publisher = harness.publisher(server)
    publisher.publish(1, state, plan)
    watchers = [harness.watch(harness.subscriber(server)) for _ in range(2)]
    # each watch is open before more versions come: a late one would find 1 evicted (3 versions kept)
    assert [next_version(seen) for seen in watchers] == [1, 1]
    late = harness.watch(harness.subscriber(server), after=2)
    for version in (2, 3, 5):
        publisher.publish(version, state, plan)
    for seen in watchers:
        assert [next_version(seen) for _ in range(3)] == [2, 3, 5]
    assert [next_version(late) for _ in range(2)] == [3, 5]
    assert late.empty() and all(seen.empty() for seen in watchers)


def test_a_watcher_reconnects_to_a_restarted_server_without_repeating_versions(harness, trainer, state):
    _, plan = trainer
    first = harness.start()
    harness.publisher(first).publish(1, state, plan)
    seen = harness.watch(harness.subscriber(first))
    assert next_version(seen) == 1
    first.stop(0)
    second = harness.start(port=first.port)
    assert harness.publisher(second).latest_version() == 1  # reloaded from the store
    harness.publisher(second).publish(2, state, plan)
    assert next_version(seen) == 2
    assert seen.empty()


def test_a_second_server_on_a_port_in_use_fails_to_bind_it_instead_of_sharing_it(harness):
    first = harness.start()
    with pytest.raises(ValueError):  # with SO_REUSEPORT (gRPC's default) both would listen, sharing connections
        harness.start(publish_port=first.publish_port)


def test_both_ports_report_serving_without_a_token_and_metrics_are_exported(harness):
    server = harness.start()
    for port in (server.publish_port, server.port):
        with open_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    assert 'nibble_policy_version{role="weightsync"} 0.0' in text
    assert 'nibble_rejected_total{reason="bad_checksum"} 0.0' in text


def test_the_subscriber_verifies_what_it_fetches(harness, trainer, state, monkeypatch):
    server = harness.start()
    harness.publisher(server).publish(1, state, trainer[1])
    real = server.sync.store.open_stream

    def tampered(version):
        for frame in real(version):
            item = pb.WeightStreamItem.FromString(frame)
            if item.HasField("chunk") and item.chunk.index == 1:
                item.chunk.data = b"\0" * len(item.chunk.data)
            yield item.SerializeToString()

    monkeypatch.setattr(server.sync.store, "open_stream", tampered)
    with pytest.raises(WeightRejected, match="bad_checksum"):
        harness.subscriber(server).fetch(1)


def test_tls_round_trip_and_plaintext_is_refused(harness, trainer, state, tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("the TLS test needs the openssl command (Debian's openssl package)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = harness.start(tls_cert_file=cert, tls_key_file=key)
    publisher = GrpcWeightPublisher(f"localhost:{server.publish_port}", PUBLISH_TOKEN, ca_file=cert, attempts=1)
    subscriber = GrpcWeightSubscriber(f"localhost:{server.port}", FETCH_TOKEN, ca_file=cert, attempts=1)
    harness.clients += [publisher, subscriber]
    publisher.publish(1, state, trainer[1])
    manifest, _ = subscriber.fetch(1)
    assert manifest.policy_version == 1
    with pytest.raises(grpc.RpcError) as info:
        harness.subscriber(server, attempts=1, rpc_timeout=5).latest_version()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
