"""The host relay path: the hooks' ``RelayTransport`` (never waits, falls back to Kafka)
and the relay process's loop (``rankwatch.agent.relay``) on real Unix datagram sockets;
the producer is a recording stand-in (the broker path: tests/integration)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankwatch.agent.relay import Relay, bind
from rankwatch.hooks.transports import RelayTransport
from rankwatch.schemas import bundle, joined
from rankwatch.schemas.batching import RelayRule
from rankwatch.schemas.codec import OpBatch, decode_ops_members, encode_ops
from rankwatch.schemas.examples import example_batch
from rankwatch.schemas.spool import Message


class Direct:
    """What the hooks would send to Kafka themselves."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.closed = False

    def send(self, messages: list[Message]) -> list[bool]:
        self.sent += messages
        return [True] * len(messages)

    def close(self) -> None:
        self.closed = True


class Producer:
    """The relay's producer: records what it sends, or fails while ``down``."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.down = False

    def __call__(self, items: list[tuple[bytes, bytes]]) -> None:
        if self.down:
            raise ConnectionError("broker away")
        self.sent += items


def frame(rank: int, job: str = "job-1", n: int = 6) -> bytes:
    return encode_ops(example_batch(n, rank=rank, job=job, batch_seq=rank))


def until(check: Callable[[], bool], relay: Relay, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        relay.round(wait_s=0.02)


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "relay.sock")


def test_without_a_relay_every_message_goes_direct_at_once(path: str) -> None:
    direct = Direct()
    hooks = RelayTransport(path, direct)  # nothing listens at path
    messages = [Message("ops", frame(0), 6), Message("heartbeats", b"{}", 0)]
    started = time.perf_counter()
    assert hooks.send(messages) == [True, True]
    assert time.perf_counter() - started < 0.5
    assert direct.sent == messages and (hooks.relayed, hooks.fallbacks) == (0, 1)
    hooks.close()
    assert direct.closed


def test_small_op_frames_go_to_the_relay_and_the_rest_direct(path: str) -> None:
    listener = bind(path)
    direct = Direct()
    hooks = RelayTransport(path, direct, alone_bytes=2_000)
    small, large = frame(0), frame(1, n=200)
    beat = Message("heartbeats", b"{}", 0)
    assert hooks.send([Message("ops", small, 6), Message("ops", large, 200), beat]) == [True] * 3
    assert listener.recv(65536) == small
    assert [m.value for m in direct.sent] == [large, b"{}"] and hooks.relayed == 1
    listener.close()


def test_a_hosts_frames_leave_as_one_bundle_per_job(path: str) -> None:
    producer = Producer()
    relay = Relay(bind(path), producer, RelayRule(linger_s=0.05))
    hooks = RelayTransport(path, Direct())
    frames = [frame(0), frame(1), frame(2, job="job-2"), frame(3)]
    assert hooks.send([Message("ops", f, 6) for f in frames]) == [True] * 4
    until(lambda: relay.snapshot().frames_sent == 4, relay)
    by_key = dict(producer.sent)
    assert sorted(by_key) == [b"job-1", b"job-2"] and len(producer.sent) == 2
    assert by_key[b"job-2"] == frames[2]  # alone: sent as it is
    assert joined.is_joined(by_key[b"job-1"])  # one set of column blocks for the three
    members = decode_ops_members(by_key[b"job-1"])
    assert [m.rank for _, m in members if isinstance(m, OpBatch)] == [0, 1, 3]
    counters = relay.snapshot()
    assert (counters.frames_in, counters.bundles_sent, counters.messages_sent) == (4, 1, 2)
    assert counters.joined_sent == 1


def test_a_relay_told_not_to_join_sends_bundles_of_whole_frames(path: str) -> None:
    """For workers older than the joined layout (``rankwatch relay --no-join``)."""
    producer = Producer()
    relay = Relay(bind(path), producer, RelayRule(linger_s=0.05, join=False))
    hooks = RelayTransport(path, Direct())
    frames = [frame(0), frame(1)]
    assert hooks.send([Message("ops", f, 6) for f in frames]) == [True] * 2
    until(lambda: relay.snapshot().frames_sent == 2, relay)
    [(_, value)] = producer.sent
    assert bundle.is_bundle(value) and [bytes(m) for m in bundle.split(value)] == frames
    assert relay.snapshot().joined_sent == 0


def test_a_steady_stream_does_not_keep_a_due_bundle_back(path: str) -> None:
    """Frames arriving all the time (a burst of 8 every 10 ms) still leave in bundles
    of about one linger's worth, not when the stream pauses."""
    sent: list[tuple[float, int]] = []

    def producer(items: list[tuple[bytes, bytes]]) -> None:
        sent.extend((time.monotonic(), len(bundle_frames(v))) for _, v in items)

    relay = Relay(bind(path), producer, RelayRule(linger_s=0.05))
    stop = threading.Event()
    loop = threading.Thread(target=relay.run, args=(stop,))
    loop.start()
    hooks = RelayTransport(path, Direct())
    started = time.monotonic()
    try:
        while time.monotonic() - started < 0.6:
            hooks.send([Message("ops", frame(r), 6) for r in range(8)])
            time.sleep(0.01)
        first_out = sent[0][0] - started if sent else None
    finally:
        stop.set()
        loop.join(10)
    assert first_out is not None and first_out < 0.3  # not only once the stream stops
    assert len(sent) >= 4 and max(n for _, n in sent) <= 8 * 20  # 50 ms is 5 bursts


def bundle_frames(value: bytes) -> list[memoryview | bytes]:
    if joined.is_joined(value):
        return joined.split(value)[0]  # a header a member
    return bundle.split(value) if bundle.is_bundle(value) else [value]


def test_a_datagram_naming_no_job_goes_alone_for_the_worker_to_refuse(path: str) -> None:
    producer = Producer()
    relay = Relay(bind(path), producer, RelayRule(linger_s=0.01))
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    junk = [b"hello", frame(0)[:9], bundle.pack([frame(0)])]
    for data in [*junk, frame(1)]:
        sender.sendto(data, path)
    until(lambda: relay.snapshot().messages_sent == 4, relay)
    assert sorted(producer.sent) == sorted([(b"", d) for d in junk] + [(b"job-1", frame(1))])
    assert relay.snapshot().unnamed == 3


def test_a_datagram_larger_than_the_relay_reads_is_counted_and_dropped(path: str) -> None:
    producer = Producer()
    relay = Relay(bind(path), producer, RelayRule(linger_s=0.01, max_bytes=1_000))
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.sendto(frame(0, n=100), path)
    sender.sendto(frame(1), path)
    until(lambda: relay.snapshot().messages_sent == 1, relay)
    assert producer.sent == [(b"job-1", frame(1))] and relay.snapshot().truncated == 1


def test_while_the_broker_is_away_the_relay_keeps_its_frames_and_the_ranks_go_direct(
    path: str,
) -> None:
    producer = Producer()
    producer.down = True
    relay = Relay(bind(path), producer, RelayRule(linger_s=0.01), retry_s=0.05)
    direct = Direct()
    hooks = RelayTransport(path, direct)
    hooks.send([Message("ops", frame(0), 6)])
    until(lambda: relay.snapshot().send_failures >= 2, relay)
    assert relay.snapshot().held == 1
    sent_direct = 0
    for i in range(5000):  # the relay reads nothing now: its queue fills
        hooks.send([Message("ops", frame(i % 8), 6)])
        if direct.sent:
            sent_direct = i
            break
    assert direct.sent and hooks.fallbacks == 1 and hooks.relayed == sent_direct + 1
    producer.down = False
    until(lambda: relay.snapshot().frames_sent == hooks.relayed, relay, timeout_s=20)
    counters = relay.snapshot()
    assert counters.frames_in == counters.frames_sent == hooks.relayed and counters.held == 0


def test_a_relay_stopped_sends_its_open_bundles_and_counts_what_it_could_not(
    path: str,
) -> None:
    producer = Producer()
    relay = Relay(bind(path), producer, RelayRule(linger_s=60.0))
    hooks = RelayTransport(path, Direct())
    hooks.send([Message("ops", frame(r), 6) for r in range(3)])
    until(lambda: relay.snapshot().held == 3, relay)
    relay.close()
    assert relay.snapshot().frames_sent == 3 and len(producer.sent) == 1

    stuck = Relay(bind(path + "2"), Producer(), RelayRule(linger_s=60.0))
    stuck.send.down = True  # type: ignore[attr-defined]
    RelayTransport(path + "2", Direct()).send([Message("ops", frame(0), 6)])
    until(lambda: stuck.snapshot().held == 1, stuck)
    stuck.close()
    assert stuck.snapshot().lost_at_close == 1 and stuck.snapshot().held == 0


def test_bind_replaces_a_stale_socket_and_refuses_other_files(path: str) -> None:
    bind(path).close()
    bind(path).close()  # the stale socket file is replaced
    Path(path).unlink()
    Path(path).write_text("not a socket")
    with pytest.raises(FileExistsError):
        bind(path)
