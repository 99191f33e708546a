"""One running stack at ``max_staleness: 1`` — real processes, a real redis-server, real gRPC, real HTTP:

- what the trainer trained stays within the staleness cap, and samplers never started more groups than
  admission control allows (docs/design.md §5), read back from the trainer's records and Redis's write log;
- bad inputs at the boundaries (garbage stream entries; corrupt, mis-shaped or unauthenticated weight
  publications) are refused and counted while every service keeps running;
- a real Prometheus scrapes every docs/design.md §6 metric, with its labels, from every service.

The tests share the stack and run in file order: the first two while the trainer trains, the others
after it stopped; each waits for the state it needs, so any one also runs alone.
"""

import queue
import threading
from collections import defaultdict

import grpc
import pytest
from google.protobuf.message import DecodeError

from nibble.config.admission import allowed_groups
from nibble.model import from_pretrained, load_config
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state
from nibble.trainer import checkpoint
from nibble.transport.stream import AdmissionCounter, validate_group
from nibble.transport.weights import GrpcWeightPublisher, GrpcWeightSubscriber, stream_items
from nibble.wire import pb
from tests.helpers import DESIGN_METRICS, corrupted, raw_publish, trajectory_group
from tests.launcher.stack import Stack, aof_commands, scrape
from tests.services import PROMETHEUS, PrometheusServer

MAX_STALENESS = 1
MIN_STEPS = 8
SAMPLERS = ("sampler-0", "sampler-1")
INJECTED = "test-injected"  # sampler_id of the groups a test writes itself


@pytest.fixture(scope="module")
def stack(warm_start, tmp_path_factory):
    # the trainer trains until a test stops it (total_steps is out of reach); one evaluation, at step 0
    stack = Stack(
        tmp_path_factory.mktemp("stack"), warm_start, max_staleness=MAX_STALENESS, total_steps=10_000, eval_every=10_000
    )
    try:
        yield stack.start()
    finally:
        stack.stop()


def test_garbage_stream_entries_are_dead_lettered_counted_and_training_goes_on(stack):
    stack.wait_for_step(1)
    redis = stack.config.redis
    client = stack.redis.client()
    garbage = b"\xff\xfe not a protobuf"
    invalid = trajectory_group("garbage", size=3)
    del invalid.responses[1].logprobs[-1]  # 3 tokens, 2 logprobs
    undecodable_id = client.xadd(redis.stream, {b"group": garbage}).decode()
    invalid_id = client.xadd(redis.stream, {b"group": invalid.SerializeToString()}).decode()

    def dead_lettered() -> dict[str, float]:
        return {
            dict(labels)["reason"]: value
            for (name, labels), value in scrape(stack.metrics_ports["trainer"]).items()
            if name == "nibble_dead_lettered_total" and value
        }

    stack.wait_for(lambda: sum(dead_lettered().values()) >= 2, "the trainer dead-letters both entries")
    # Read only now: up to 2 steps' groups can queue ahead of the entries, so the step that reads them may
    # come later than 2 steps after the XADD; every record from the next one on counts them.
    step = stack.steps()[-1]["step"]
    assert dead_lettered() == {"undecodable": 1, "length_mismatch": 1}
    dead = {fields[b"id"].decode(): fields for _, fields in client.xrange(redis.dead_letter_stream)}
    assert set(dead) == {undecodable_id, invalid_id}
    assert dead[undecodable_id][b"reason"].startswith(b"undecodable: ")
    assert dead[invalid_id][b"reason"].startswith(b"length_mismatch: group garbage response 1")
    assert dead[undecodable_id][b"payload"] == garbage
    assert dead[invalid_id][b"payload"] == invalid.SerializeToString()
    pending = client.xpending_range(redis.stream, redis.consumer_group, min="-", max="+", count=1000)
    assert not {p["message_id"].decode() for p in pending} & set(dead), "a dead-lettered entry is still pending"

    stack.wait_for_step(step + 2)  # the trainer trains on
    assert stack.steps()[-1]["dead_lettered_total"] == 2
    for name, log in stack.logs().items():
        assert "Traceback" not in log, name


def test_a_real_prometheus_scrapes_every_design_metric_with_its_labels_from_every_service(stack, tmp_path):
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary on PATH (scripts/setup installs Debian's prometheus package)")
    processes = {"weightsync": ["weightsync"], "trainer": ["trainer"], "sampler": list(SAMPLERS)}
    targets = {job: [f"127.0.0.1:{stack.metrics_ports[p]}" for p in names] for job, names in processes.items()}
    instances = {address for addresses in targets.values() for address in addresses}
    stack.check_alive()
    assert stack.trainer.process.poll() is None, "the trainer stopped before Prometheus could scrape it"
    with PrometheusServer(tmp_path / "prometheus", targets) as prometheus:
        prometheus.wait_until_scraped()
        series = prometheus.api("series", **{"match[]": '{__name__=~"nibble_.+"}'})
        metadata = prometheus.api("metadata")
    by_name = defaultdict(list)
    for labels in series:
        by_name[labels["__name__"]].append(labels)
    for name, (kind, label) in DESIGN_METRICS.items():
        found = by_name[f"{name}_bucket" if kind == "histogram" else name]
        assert {s["instance"] for s in found} == instances, f"{name} is not exported by every service"
        # scraped as OpenMetrics, where a counter's family name has no _total
        family = metadata[name.removesuffix("_total") if kind == "counter" else name]
        assert [m["type"] for m in family] == [kind], (name, family)
        expected = {
            "__name__",
            "job",
            "instance",
            *([label] if label else []),
            *(["le"] if kind == "histogram" else []),
        }
        assert all(set(s) == expected for s in found), (name, [s for s in found if set(s) != expected])
        if label == "role":  # each service reports its own role
            assert {(s["job"], s["role"]) for s in found} == {(job, job) for job in processes}, name


def trained_groups_and_admission(stack: Stack) -> tuple[dict[str, tuple[int, int]], int, int]:
    """Replay Redis's write log: check admission control at every reservation and every written group,
    and find the staleness of every trained group (its version against the trainer's when it was trained).

    Returns ((staleness, responses) by trained group id, reservations checked, groups written).
    """
    config = stack.config
    t, stream = config.trainer, config.redis.stream
    assert t.publish_every == 1 and t.checkpoint_every == 1  # each step: publish (SET version), checkpoint, XACK
    admission = AdmissionCounter(stack.redis.client(), config.redis)
    started_key, version_key = admission.started_key.encode(), admission.version_key.encode()
    trained = set(checkpoint.load_state(checkpoint.latest(t.checkpoint_dir)).trained)
    version = started = released = written = reservations = 0
    groups: dict[bytes, pb.TrajectoryGroup] = {}
    staleness: dict[str, tuple[int, int]] = {}
    for command in aof_commands(stack.redis.directory):
        op, key = command[0].upper(), command[1] if len(command) > 1 else b""
        if key == version_key and op == b"SET":
            version = int(command[2])
        elif key == started_key and op == b"INCR":
            started, reservations = started + 1, reservations + 1
            allowed = allowed_groups(version, MAX_STALENESS, t.groups_per_step)
            assert started <= allowed, f"group {started} started at trainer version {version} (allowed {allowed})"
        elif key == started_key and op == b"DECRBY":
            started, released = started - int(command[2]), released + int(command[2])
        elif key == started_key and op == b"SET":
            started = int(command[2])
        elif key == stream.encode() and op == b"XADD":
            try:
                group = pb.TrajectoryGroup.FromString(command[command.index(b"group") + 1])
            except DecodeError:
                continue  # the garbage entry of the dead-letter test
            if validate_group(group) is not None:
                continue
            groups[command[2]] = group
            if group.sampler_id == INJECTED:
                continue  # the test's own, written without a slot
            written += 1
            # every written group held a slot: written ≤ reserved = started + released
            allowed = allowed_groups(version, MAX_STALENESS, t.groups_per_step) + released
            assert written <= allowed, f"{written} groups written at trainer version {version} ({released} released)"
        elif key == stream.encode() and op == b"XACK":
            for entry_id in command[3:]:
                group = groups.get(entry_id)
                if group is not None and group.responses[0].trajectory_id in trained:
                    # acknowledged after the step that trained it published version + 1
                    late = version - 1 - group.policy_version
                    staleness.setdefault(group.group_id, (late, len(group.responses)))
    return staleness, reservations, written


def acknowledged(stack: Stack, entry_id: str) -> bool:
    """Whether stream entry ``entry_id`` was delivered to the trainer and acknowledged: it is acknowledged only
    once a checkpoint records what became of it."""
    redis = stack.config.redis
    client = stack.redis.client()
    [group] = [g for g in client.xinfo_groups(redis.stream) if g["name"].decode() == redis.consumer_group]
    delivered = stream_id(group["last-delivered-id"].decode()) >= stream_id(entry_id)
    pending = client.xpending_range(redis.stream, redis.consumer_group, min=entry_id, max=entry_id, count=1)
    return delivered and not pending


def stream_id(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def test_trained_groups_are_at_most_1_version_old_and_admission_bounds_what_samplers_start(stack):
    # admission control keeps samplers from producing such groups: inject one, 2 versions old
    stack.wait_for_step(2)
    admission = AdmissionCounter(stack.redis.client(), stack.config.redis)
    stale = trajectory_group("stale", size=4, sampler_id=INJECTED, version=admission.trainer_version() - 2)
    entry_id = stack.redis.client().xadd(stack.config.redis.stream, {b"group": stale.SerializeToString()}).decode()
    # Waiting on this entry, not on nibble_stale_dropped_total: the samplers' own groups are dropped too once
    # the dead-letter test's entries, which held no admission slot, gave slots back (2 more groups in flight
    # than the rule allows, going 2 versions stale by turns), so the counter passes 4 before this group is read.
    stack.wait_for(lambda: acknowledged(stack, entry_id), "the trainer drops the stale group and acknowledges it")
    assert stack.value("trainer", "nibble_stale_dropped_total") >= 4
    stack.finish_training(MIN_STEPS)
    state = checkpoint.load_state(checkpoint.latest(stack.config.trainer.checkpoint_dir))
    assert {r.trajectory_id for r in stale.responses} <= set(state.stale_dropped) - set(state.trained)
    records = stack.steps()
    assert len(records) >= MIN_STEPS
    # the trainer's own view: its records and its histogram
    assert all(x["staleness_max"] <= MAX_STALENESS for x in records), [x["staleness_max"] for x in records]
    scraped = stack.trainer_metrics
    count = scraped[("nibble_staleness_steps_count", frozenset())]
    assert count > 0 and scraped[("nibble_staleness_steps_bucket", frozenset({("le", "1.0")}))] == count
    # Redis's view: every written group, every reservation, every acknowledgement, in order
    trained, reservations, written = trained_groups_and_admission(stack)
    lateness = [late for late, _ in trained.values()]
    assert sum(n for _, n in trained.values()) == sum(x["trained_trajectories"] for x in records)
    assert min(lateness) >= 0 and max(lateness) <= MAX_STALENESS, sorted(lateness)
    assert 1 in lateness, "no group was trained a version late: the run was never asynchronous"
    by_records = sum(x["staleness_mean"] * x["trained_trajectories"] for x in records)
    assert sum(late * n for late, n in trained.values()) == pytest.approx(by_records)  # both views agree
    assert reservations >= written >= len(trained)
    print(f"{len(records)} steps, {len(trained)} groups trained (staleness {sorted(lateness)}), {written} written, "
          f"{reservations} reservations, stale dropped {records[-1]['stale_dropped_total']}")  # fmt: skip


REFUSED = [
    ("bad_checksum", grpc.StatusCode.DATA_LOSS),  # a corrupt chunk
    ("digest_mismatch", grpc.StatusCode.DATA_LOSS),  # the whole-payload digest fails
    ("unknown_chunk", grpc.StatusCode.INVALID_ARGUMENT),  # a chunk beyond the manifest
    ("layout_mismatch", grpc.StatusCode.INVALID_ARGUMENT),  # a tensor the model does not have
]


def warm_start_state(stack: Stack) -> tuple[dict, PrecisionPlan]:
    """A publication of the right layout: the warm start's weights as the trainer publishes them."""
    source = stack.config.model.checkpoint
    plan = PrecisionPlan.from_config(stack.config.plan, load_config(source).num_hidden_layers)
    return published_state(from_pretrained(source, plan=plan)), plan


def test_bad_publications_are_refused_counted_never_announced_and_samplers_keep_their_version(stack):
    stack.finish_training(MIN_STEPS)
    ws = stack.config.weightsync
    publish_token, fetch_token = stack.env["NIBBLE_PUBLISH_TOKEN"], stack.env["NIBBLE_FETCH_TOKEN"]
    publish_target = f"127.0.0.1:{ws.publish_port}"
    publisher = GrpcWeightPublisher(publish_target, publish_token, attempts=1)
    subscriber = GrpcWeightSubscriber(f"127.0.0.1:{ws.port}", fetch_token)
    try:
        held = publisher.latest_version()

        def sampler_versions() -> list[float]:
            return [stack.value(p, "nibble_policy_version", role="sampler") for p in SAMPLERS]

        stack.wait_for(lambda: sampler_versions() == [held, held], f"both samplers apply version {held}")
        announced: queue.Queue = queue.Queue()
        watch = threading.Thread(
            target=lambda: [announced.put(a.policy_version) for a in subscriber.watch(held)], daemon=True
        )
        watch.start()
        state, plan = warm_start_state(stack)

        def rejected(reason: str) -> float:
            return stack.value("weightsync", "nibble_rejected_total", reason=reason)

        for offset, (how, code) in enumerate(REFUSED, 1):  # each under a version number of its own
            items = corrupted(list(stream_items(held + offset, state, plan.model_dump_json(), chunk_bytes=2**16)), how)
            before = rejected(how)
            with pytest.raises(grpc.RpcError) as info:
                raw_publish(publish_target, items, publish_token)
            assert info.value.code() == code and how in info.value.details(), (how, info.value)
            assert rejected(how) == before + 1, how
        before = rejected("bad_token")
        for token in (None, "wrong", fetch_token):
            with pytest.raises(grpc.RpcError) as info:
                raw_publish(publish_target, stream_items(held + 9, state, plan.model_dump_json()), token)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, token
        assert rejected("bad_token") == before + 3

        assert publisher.versions().latest_version == held
        assert sampler_versions() == [held, held]
        good = held + 10
        publisher.publish(good, state, plan)
        # the first announcement after `held` is the good version: no refused one was ever announced
        assert announced.get(timeout=60) == good
        stack.wait_for(lambda: sampler_versions() == [good, good], f"both samplers apply version {good}")
        for p in SAMPLERS:  # the samplers never saw a bad version
            assert stack.value(p, "nibble_rejected_total", reason="bad_manifest") == 0, p
    finally:
        subscriber.close()
        publisher.close()
    watch.join(timeout=10)
    stack.check_alive()
    for name, log in stack.logs().items():
        assert "Traceback" not in log, name
