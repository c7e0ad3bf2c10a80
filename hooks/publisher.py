"""The background thread that turns buffered records into messages and ships them.

Per rank, records are grouped by step and cut into messages by the batching rule
(``rankwatch.schemas.batching``, which ``rankwatch replay`` follows too): a finished
step's records leave together with every other finished step still held (one message,
each step with its ``steps_done`` count and ``rank_steps`` summary); a finished step is
held only while the rank's next step is expected to end within ``batch_window_s`` of it,
so long steps leave at once and short ones share a message. A step still running is
flushed after ``partial_flush_s`` or past ``max_batch`` records, always holding its
last record back so the step's closing message is never empty. The thread runs a round
every ``flush_interval_s``, when woken at a step end, and when held steps fall due.
Failed messages go to the spool (when configured) or are dropped and counted; the spool
is resent while the transport works. While the spool holds anything, new op messages
join it behind the older ones instead of overtaking them: a rank's messages reach the
worker in the order they were made, so after a broker outage a step's spooled records
come before the records of later steps, not after them. Heartbeats go out every ``heartbeat_s``; the
watchdog (``watchdog.py``), when given, is asked each round whether the op in flight is
stuck and its stack dump sent.

A rank told not to send its ops (``PublisherConfig.send_ops``: the tensor- and
context-parallel peers of a large job, see ``HooksConfig.ops_from``) still times them
(the watchdog and the heartbeats need the op in flight) and sends heartbeats and stack
dumps; its records are taken from the buffer and counted as ``withheld``.

Every record put is accounted for in :class:`PublisherStats`:
``put = dropped_buffer + sent + resent + in_spool + dropped_send + pending + withheld``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from rankwatch.hooks.buffer import RecordBuffer
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.records import MAX_STEPS_DONE, encode_ops
from rankwatch.hooks.signals import StepSummaries
from rankwatch.hooks.transports import Transport
from rankwatch.schemas.batching import MAX_STEPS, BatchingRule, StepHold
from rankwatch.schemas.beacon import Beacon
from rankwatch.schemas.spool import Message, Spool

_RULE = BatchingRule()
log = logging.getLogger("rankwatch.hooks")


@dataclass(frozen=True)
class PublisherConfig:
    flush_interval_s: float = 0.5
    """How often the thread runs a round when nothing wakes it (heartbeats, watchdog)."""
    max_batch: int = _RULE.max_records
    batch_window_s: float = _RULE.window_s
    """How long a finished step may wait to share a message with the next ones."""
    partial_flush_s: float = _RULE.partial_s
    """How long records of a running step may wait before they leave without its end."""
    heartbeat_s: float = 2.0
    """The hang worker calls a rank silent after three missed beats (``silent_after_s``,
    6 s), and a hang must be alerted within seconds: a heartbeat is a few hundred bytes,
    so even 10,000 ranks beating every 2 s are 5,000 small messages a second."""
    resend_interval_s: float = 2.0
    close_timeout_s: float = 10.0
    send_ops: bool = True
    """False: this rank's op records are not sent (only heartbeats and stacks)."""


@dataclass
class PublisherStats:
    put: int = 0
    dropped_buffer: int = 0
    sent: int = 0
    spooled: int = 0
    resent: int = 0
    in_spool: int = 0
    dropped_send: int = 0
    pending: int = 0
    messages_sent: int = 0
    send_failures: int = 0
    heartbeats_sent: int = 0
    heartbeats_dropped: int = 0
    beacon_errors: int = 0
    """Heartbeats the beacon file could not take (the disk full, the folder gone)."""
    stacks_sent: int = 0
    stacks_dropped: int = 0
    errors: int = 0
    """Exceptions caught in the publisher loop (it keeps going)."""
    withheld: int = 0
    """Records of a rank that does not send its ops (``PublisherConfig.send_ops``)."""

    def accounted(self) -> bool:
        """Every record put is sent, resent, spooled, dropped or still pending."""
        return self.put == (
            self.dropped_buffer
            + self.sent
            + self.resent
            + self.in_spool
            + self.dropped_send
            + self.pending
            + self.withheld
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Publisher:
    def __init__(
        self,
        identity: Identity,
        buffer: RecordBuffer,
        transport: Transport,
        now_ns: Callable[[], int],
        config: PublisherConfig | None = None,
        spool: Spool | None = None,
        heartbeat: Callable[[bool], bytes] | None = None,
        watchdog: Callable[[], bytes | None] | None = None,
        beacon: Beacon | None = None,
    ) -> None:
        self.identity = identity
        self.buffer = buffer
        self.transport = transport
        self.now_ns = now_ns
        self.config = config or PublisherConfig()
        self.spool = spool
        self.heartbeat = heartbeat
        self.watchdog = watchdog
        self.beacon = beacon
        """Each heartbeat also goes into this file, for the host's agent (removed at a
        clean end): a rank whose heartbeats stop is looked at from outside."""
        self.stats = PublisherStats()
        self._pending: dict[int, list[tuple]] = {}  # step -> records not yet sent
        self._counts: dict[int, int] = {}  # step -> records of it handed to messages
        self._ended: list[int] = []
        """Finished steps whose records are held (see :class:`StepHold`)."""
        self.hold = StepHold(self.config.batch_window_s)
        self.summaries = StepSummaries()
        """Per-step sums for the ``rank_steps`` item of each step's closing message."""
        self._first_pending: float | None = None
        self._batch_seq = 0
        self._lock = threading.Lock()  # one flush at a time (thread loop vs close)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_heartbeat = 0.0
        self._next_resend = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rankwatch-publisher", daemon=True)
        self._thread.start()

    def beat_soon(self) -> None:
        """Send a heartbeat in the next round, which starts now (a phase began or ended:
        the hang detector must not wait a heartbeat period to hear of it); never blocks."""
        self._next_heartbeat = 0.0
        self._wake.set()

    def wake(self) -> None:
        """Ask for a flush soon (a step ended); never blocks."""
        self._wake.set()

    def close(self) -> PublisherStats:
        """Stop the thread, send what is left (spool resend included), close the transport;
        what the broker did not take stays in the spool, for the host's agent or relay
        (``rankwatch.agent.spools``) to send once this process is gone."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.config.close_timeout_s)
            if self._thread.is_alive():  # stuck in a send: give up, keep the counts
                return self.snapshot()
        with self._lock:
            self._flush(final=True)
            self._resend()
            if self.heartbeat is not None:
                self._send_heartbeat(finished=True)
            try:
                self.transport.close()
            except Exception:
                self.stats.errors += 1
            stats = self.snapshot()
            if self.spool is not None:
                if stats.in_spool:
                    log.warning(
                        "%d records left in spool %s: the host's rankwatch agent or relay"
                        " sends them once the broker answers",
                        stats.in_spool,
                        self.spool.path,
                    )
                self.spool.close()
        return stats

    def snapshot(self) -> PublisherStats:
        s = self.stats
        s.put = self.buffer.put_count
        s.dropped_buffer = self.buffer.dropped_count
        s.pending = len(self.buffer) + sum(len(r) for r in self._pending.values())
        s.in_spool = self.spool.pending_records() if self.spool is not None else 0
        return PublisherStats(**asdict(s))

    # -- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self.config.flush_interval_s
            deadline = self.hold.deadline
            if deadline is not None:  # held steps fall due before the next round
                wait = min(wait, max(deadline - time.monotonic(), 0.0))
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                try:
                    self.step_once(time.monotonic())
                except Exception:
                    self.stats.errors += 1

    def step_once(self, now: float) -> None:
        """One round: flush, heartbeat when due, stacks when the watchdog says, resend
        the spool when due."""
        self._flush(final=False, now=now)
        if self.heartbeat is not None and now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_s
            self._send_heartbeat()
        if self.watchdog is not None:
            dump = self.watchdog()
            if dump is not None:
                self._send_stacks(dump)
        if self.spool is not None and self.spool.size and now >= self._next_resend:
            self._next_resend = now + self.config.resend_interval_s
            self._resend()

    def _flush(self, final: bool, now: float = 0.0) -> None:
        records, ends, notes = self.buffer.take_all()
        if not self.config.send_ops:
            self.stats.withheld += len(records)
            return
        self.summaries.add_notes(notes)
        self.summaries.add_records(records)
        for r in records:
            self._pending.setdefault(r[0], []).append(r)
        for step in ends:
            self._ended.append(step)
            self.hold.ended(now)
        messages: list[Message] = []
        ended = set(self._ended)
        held = sum(len(self._pending.get(step, ())) for step in ended)
        if self._ended and (final or held >= self.config.max_batch or self.hold.due(now)):
            messages += self._ended_messages(self._ended)
            self._ended.clear()
            self.hold.sent()
        running = [step for step in self._pending if step not in ended]
        if running and self._first_pending is None:
            self._first_pending = now
        first = self._first_pending
        waited = first is not None and now - first >= self.config.partial_flush_s
        big = sum(len(self._pending[step]) for step in running) >= self.config.max_batch
        if final or waited or big:
            for step in running:
                messages += self._step_messages(step, hold_last=not final)
            running = [step for step in self._pending if step not in ended]
            self._first_pending = now if running else None
        elif not running:
            self._first_pending = None
        self._deliver(messages)

    def _ended_messages(self, steps: list[int]) -> list[Message]:
        """The held records of the finished ``steps``, in as few messages as the limits
        allow; each step's count and summary go with its last record."""
        size = self.config.max_batch
        out: list[Message] = []
        chunk: list[tuple] = []
        done: list[tuple[int, int]] = []
        summaries: list[dict] = []
        for step in dict.fromkeys(steps):
            records = self._pending.pop(step, [])
            if not records:
                self._counts.pop(step, None)  # nothing of it reached us (all dropped)
                continue
            at = 0
            while at < len(records):
                part = records[at : at + size - len(chunk)]
                chunk += part
                at += len(part)
                self._counts[step] = self._counts.get(step, 0) + len(part)
                if at == len(records):
                    done.append((step, self._counts.pop(step)))
                    summary = self.summaries.pop(step)
                    if summary:
                        summaries.append(summary)
                if len(chunk) >= size or len(done) >= MAX_STEPS:
                    out.append(self._encode(chunk, done, summaries))
                    chunk, done, summaries = [], [], []
        if chunk:
            out.append(self._encode(chunk, done, summaries))
        self._forget_lost_ends()
        return out

    def _step_messages(self, step: int, hold_last: bool) -> list[Message]:
        """Records of a running step, without its end (all but the latest one)."""
        records = self._pending.pop(step, [])
        if hold_last and records:
            self._pending[step] = [records.pop()]
        out = []
        size = self.config.max_batch
        for lo in range(0, len(records), size):
            chunk = records[lo : lo + size]
            self._counts[step] = self._counts.get(step, 0) + len(chunk)
            out.append(self._encode(chunk, []))
        self._forget_lost_ends()
        return out

    def _forget_lost_ends(self) -> None:
        if len(self._counts) > MAX_STEPS_DONE:  # steps whose end was lost: forget them
            for old in sorted(self._counts)[: len(self._counts) - MAX_STEPS_DONE]:
                del self._counts[old]

    def _encode(
        self,
        records: list[tuple],
        steps_done: list[tuple[int, int]],
        rank_steps: list[dict] | None = None,
    ) -> Message:
        value = encode_ops(
            self.identity,
            records,
            batch_seq=self._batch_seq,
            sent_ns=self.now_ns(),
            steps_done=steps_done,
            rank_steps=rank_steps or (),
        )
        self._batch_seq += 1
        return Message("ops", value, len(records))

    def _deliver(self, messages: list[Message]) -> None:
        if not messages:
            return
        if self.spool is not None and self.spool.size:  # older ones wait there: in line
            for message in messages:
                self._keep(message)
            return
        for message, ok in zip(messages, self._send(messages), strict=True):
            if ok:
                self.stats.sent += message.records
                self.stats.messages_sent += 1
            else:
                self._keep(message)

    def _send(self, messages: list[Message]) -> list[bool]:
        try:
            ok = self.transport.send(messages)
        except Exception:
            self.stats.errors += 1
            ok = [False] * len(messages)
        self.stats.send_failures += ok.count(False)
        return ok

    def _keep(self, message: Message) -> None:
        if self.spool is not None and self.spool.append(message):
            self.stats.spooled += message.records
        else:
            self.stats.dropped_send += message.records

    def _send_heartbeat(self, finished: bool = False) -> None:
        assert self.heartbeat is not None
        value = self.heartbeat(finished)
        if self.beacon is not None:
            try:  # written even when the send fails: the process lives, says the file
                self.beacon.remove() if finished else self.beacon.write(value)
            except OSError:
                self.stats.beacon_errors += 1
        ok = self._send([Message("heartbeats", value, 0)])
        if ok[0]:
            self.stats.heartbeats_sent += 1
        else:
            self.stats.heartbeats_dropped += 1

    def _send_stacks(self, value: bytes) -> None:
        """A stack dump is sent once, never spooled: it is only useful while the hang is."""
        if self._send([Message("stacks", value, 0)])[0]:
            self.stats.stacks_sent += 1
        else:
            self.stats.stacks_dropped += 1

    def _resend(self) -> None:
        if self.spool is None or not self.spool.size:
            return
        messages = self.spool.read()
        ok = self._send(messages)
        kept = [m for m, delivered in zip(messages, ok, strict=True) if not delivered]
        self.stats.resent += sum(m.records for m, d in zip(messages, ok, strict=True) if d)
        self.spool.replace(kept)
