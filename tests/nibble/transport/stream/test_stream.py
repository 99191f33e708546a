"""The trajectory stream against a real Redis: delivery, claiming, restarts, dead letters, trimming,
backpressure and depth."""

import time

import pytest

from nibble.transport.stream import RedisTrajectoryReader, RedisTrajectoryWriter, StreamEntry, connect
from nibble.wire import pb
from tests.helpers import trajectory_group


@pytest.fixture
def client(stream_config):
    client = connect(stream_config)
    yield client
    client.close()


def write_groups(client, config, n, prefix="g"):
    writer = RedisTrajectoryWriter(client, config)
    return [writer.write(trajectory_group(f"{prefix}{i}")) for i in range(n)]


def ids(entries):
    return [e.entry_id for e in entries]


def test_entries_written_before_the_reader_starts_are_read_whole(client, stream_config):
    written = write_groups(client, stream_config, 3)
    entries = RedisTrajectoryReader(client, stream_config, "trainer-0").read(10)
    assert ids(entries) == written
    assert all(isinstance(e, StreamEntry) and isinstance(e.group, pb.TrajectoryGroup) for e in entries)
    assert entries[1].group == trajectory_group("g1")


def test_two_readers_get_distinct_entries(client, stream_config):
    written = write_groups(client, stream_config, 10)
    first, second = RedisTrajectoryReader(client, stream_config, "a"), RedisTrajectoryReader(client, stream_config, "b")
    got_a, got_b = [], []
    for _ in range(3):
        got_a += ids(first.read(2))
        got_b += ids(second.read(2))
    got_a += ids(first.read(10))
    assert not set(got_a) & set(got_b)
    assert sorted(got_a + got_b) == written


def test_entries_of_a_silent_consumer_are_claimed_after_the_idle_timeout(client, stream_config):
    config = stream_config.model_copy(update={"claim_idle_seconds": 1.0})
    written = write_groups(client, config, 5)
    dead = RedisTrajectoryReader(client, config, "dead")
    assert ids(dead.read(3)) == written[:3]  # ... and never acknowledged
    survivor = RedisTrajectoryReader(client, config, "survivor")
    assert ids(survivor.read(10)) == written[3:]  # not idle for 1 s yet: only the new ones
    time.sleep(1.1)
    assert ids(survivor.read(10)) == written[:3]
    owners = client.xpending_range(config.stream, config.consumer_group, "-", "+", 10)
    assert {o["consumer"] for o in owners} == {b"survivor"}
    assert survivor.read(10) == []  # held by the survivor now: not handed out again


def test_a_restarted_consumer_rereads_its_own_pending_entries_first(client, stream_config):
    written = write_groups(client, stream_config, 6)
    before = RedisTrajectoryReader(client, stream_config, "trainer-0")
    assert ids(before.read(4)) == written[:4]
    before.ack(written[:1])  # the checkpoint held the first one only
    after = RedisTrajectoryReader(client, stream_config, "trainer-0")  # same name: a restart
    assert ids(after.read(2)) == written[1:3]
    assert ids(after.read(2)) == [written[3], written[4]]  # the last pending one, then new
    assert ids(after.read(5)) == written[5:]


def test_garbage_and_invalid_groups_are_dead_lettered_with_reasons_and_counted(client, stream_config):
    writer = RedisTrajectoryWriter(client, stream_config)
    good = writer.write(trajectory_group("good"))
    garbage = client.xadd(stream_config.stream, {b"group": b"\x0a\xff"}).decode()
    lonely = trajectory_group("lonely")
    del lonely.responses[1:]
    invalid = client.xadd(stream_config.stream, {b"group": lonely.SerializeToString()}).decode()
    stranger = client.xadd(stream_config.stream, {b"other": b"x"}).decode()
    good_too = writer.write(trajectory_group("good-too"))
    counted = []
    reader = RedisTrajectoryReader(client, stream_config, "trainer-0", on_dead_letter=counted.append)

    assert ids(reader.read(10)) == [good, good_too]
    assert reader.dead_lettered == {"undecodable": 2, "too_few_responses": 1}
    assert sorted(counted) == ["too_few_responses", "undecodable", "undecodable"]
    dead = client.xrange(stream_config.dead_letter_stream)
    by_id = {fields[b"id"].decode(): fields for _, fields in dead}
    assert set(by_id) == {garbage, invalid, stranger}
    assert by_id[garbage][b"payload"] == b"\x0a\xff" and by_id[garbage][b"reason"].startswith(b"undecodable: ")
    assert by_id[invalid][b"reason"].startswith(b"too_few_responses: 1 response")
    assert by_id[invalid][b"payload"] == lonely.SerializeToString()
    pending = client.xpending_range(stream_config.stream, stream_config.consumer_group, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [good, good_too]  # dead letters are acknowledged


def test_the_writer_refuses_an_invalid_group():
    lonely = trajectory_group("lonely")
    del lonely.responses[1:]
    with pytest.raises(ValueError, match=r"lonely.*too_few_responses"):
        RedisTrajectoryWriter(None, None).write(lonely)


def test_ack_and_trim_keep_the_stream_bounded_and_never_drop_undelivered_entries(client, stream_config):
    writer, reader = RedisTrajectoryWriter(client, stream_config), RedisTrajectoryReader(client, stream_config, "t")
    written = write_groups(client, stream_config, 8)
    batch = ids(reader.read(4))
    reader.ack(batch[1:])  # the oldest delivered entry is still pending: it and everything after stay
    reader.trim()
    assert client.xlen(stream_config.stream) == 8
    reader.ack(batch[:1])
    assert reader.trim() == 4
    assert [i.decode() for i, _ in client.xrange(stream_config.stream)] == written[4:]  # undelivered, kept

    for step in range(30):  # a long run: the stream holds at most what is unread or in flight
        for i in range(3):
            writer.write(trajectory_group(f"s{step}-{i}"))
        reader.ack(ids(reader.read(3)))
        reader.trim()
        assert client.xlen(stream_config.stream) <= 4 + 3
    remaining = ids(reader.read(100))
    assert len(remaining) == 4 and client.xlen(stream_config.stream) == 4
    reader.ack(remaining)
    reader.trim()
    assert client.xlen(stream_config.stream) == 0 and reader.depth() == 0


def test_backpressure_flips_at_queue_capacity_and_depth_counts_pending(client, stream_config):
    config = stream_config.model_copy(update={"queue_capacity": 3})
    writer = RedisTrajectoryWriter(client, config)
    assert not writer.backpressure()
    write_groups(client, config, 2)
    assert not writer.backpressure()
    write_groups(client, config, 1, prefix="h")
    assert writer.backpressure()  # no trainer yet: every entry is undelivered
    reader = RedisTrajectoryReader(client, config, "t")
    assert writer.backpressure() and reader.depth() == 3
    batch = reader.read(1)
    assert not writer.backpressure() and reader.depth() == 3  # 2 undelivered + 1 pending
    reader.ack(ids(batch))
    assert reader.depth() == 2


def test_read_rejects_bad_arguments(client, stream_config):
    reader = RedisTrajectoryReader(client, stream_config, "t")
    with pytest.raises(ValueError, match="count 0"):
        reader.read(0)
    with pytest.raises(ValueError, match="socket_timeout_seconds"):
        reader.read(1, block_seconds=stream_config.socket_timeout_seconds)
    start = time.monotonic()
    assert reader.read(1, block_seconds=0.2) == []
    assert 0.15 < time.monotonic() - start < 2.0
