"""Generated jobs published live through the real hooks (a test helper, not in the wheel).

Each rank is a real :class:`~rankwatch.hooks.tracker.RankWatch`: its buffer, its
publisher thread cutting messages by the batching rule, its Kafka transport (aiokafka)
and its spool, exactly as in a training process. Only the records are not timed: each
step's records are a generated trace's, put at the time the trace says the step ends,
on the wall clock, so that the content is the same in every run and a clean run of it
can be computed (:func:`~support.faults.clean_run`). Every ops message a rank makes is
tapped on its first way out (resends of the same bytes from the spool are not new), so
a test knows exactly what the hooks produced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import PublisherConfig, PublisherStats
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import KafkaTransport, Transport
from rankwatch.schemas.batching import BatchingRule
from rankwatch.schemas.optypes import OPTYPES
from rankwatch.schemas.spool import Message, Spool
from rankwatch.schemas.topics import TOPICS
from rankwatch.streams.ops.replay import ReplayedBatch, replay_batches


class Tap:
    """A transport that remembers every ops message it is handed, once per content."""

    def __init__(self, inner: Transport, seen: dict[bytes, None], lock: threading.Lock) -> None:
        self.inner, self.seen, self.lock = inner, seen, lock

    def send(self, messages: Sequence[Message]) -> list[bool]:
        with self.lock:
            for m in messages:
                if m.kind == "ops":
                    self.seen.setdefault(m.value, None)
        return self.inner.send(messages)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class RankPlan:
    """One rank's steps: each (step, when it ends in seconds from the start, records)."""

    identity: Identity
    steps: list[tuple[int, float, list[tuple[object, ...]]]]


def plans(batches: list[ReplayedBatch]) -> list[RankPlan]:
    """Per rank, the records of each of its steps and when the step ends, from a replay
    cut one message per rank and step (``BatchingRule(window_s=0)``)."""
    origin = min(b.sent_ns for b in batches)
    out: dict[tuple[str, int], RankPlan] = {}
    for item in batches:
        b = item.batch
        ((step, _),) = b.steps_done
        key = (b.job, b.rank)
        if key not in out:
            ident = Identity(
                job=b.job, host=b.host, rank=b.rank, dp_rank=b.dp_rank, pp_rank=b.pp_rank,
                dp_size=b.dp_size, pp_size=b.pp_size,
            )  # fmt: skip
            out[key] = RankPlan(ident, [])
        records = [
            (step, OPTYPES[int(b.optype[i])], int(b.seq_id[i]), int(b.mb_id[i]),
             int(b.chunk[i]), int(b.gmc[i]), int(b.start_ns[i]), int(b.duration_ns[i]))
            for i in range(len(b))
        ]  # fmt: skip
        out[key].steps.append((step, (item.sent_ns - origin) / 1e9, records))
    return list(out.values())


class HookedJob:
    """The ranks of ``batches`` (see :func:`plans`) publishing to ``bootstrap`` through
    the hooks, each with its spool in ``spool_dir``. :meth:`start` runs them in a thread
    on the wall clock; :meth:`join` waits for the end and closes every rank (what the
    broker did not take stays in its spool). ``stop_ranks_at``: seconds after which the
    ranks of the jobs named are closed at once (the job ends early, during an outage)."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        batches: list[ReplayedBatch],
        spool_dir: Path,
        *,
        stop_jobs_at: dict[str, float] | None = None,
    ) -> None:
        self.plans = plans(batches)
        self.stop_jobs_at = stop_jobs_at or {}
        self.produced: dict[bytes, None] = {}
        self.stats: dict[tuple[str, int], PublisherStats] = {}
        self._lock = threading.Lock()
        topics = {kind: f"{prefix}.{kind}" for kind in TOPICS}
        config = PublisherConfig(flush_interval_s=0.1, heartbeat_s=3600.0, resend_interval_s=0.5)
        self.ranks: dict[tuple[str, int], RankWatch] = {}
        for plan in self.plans:
            ident = plan.identity
            kafka = KafkaTransport(bootstrap, key=ident.job.encode(), topics=topics)
            meta = {
                "job": ident.job,
                "rank": ident.rank,
                "topic_prefix": prefix,
                "kafka": bootstrap,
            }
            spool = Spool(spool_dir / f"{ident.job}.rank{ident.rank}.spool", meta=meta)
            self.ranks[(ident.job, ident.rank)] = RankWatch(
                ident, Tap(kafka, self.produced, self._lock), publisher=config, spool=spool
            )
        self._thread = threading.Thread(target=self._run, name="hooked-job", daemon=True)
        self.error: BaseException | None = None

    @property
    def duration_s(self) -> float:
        return max(at for plan in self.plans for _, at, _ in plan.steps)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float = 120.0) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the hooked job did not end"
        if self.error is not None:
            raise self.error

    def records(self) -> int:
        """Op records the hooks produced (every message tapped, each once)."""
        from rankwatch.schemas.codec import decode_ops

        return sum(len(decode_ops(value)) for value in self.produced)

    def _run(self) -> None:
        try:
            self._play()
        except BaseException as exc:  # surfaced by join
            self.error = exc

    def _play(self) -> None:
        events = sorted(
            (at, step, plan.identity.job, plan.identity.rank, records)
            for plan in self.plans
            for step, at, records in plan.steps
        )
        start = time.monotonic()
        for at, step, job, rank, records in events:
            stop = self.stop_jobs_at.get(job)
            if stop is not None and at >= stop:
                self._close_job(job)
                continue
            wait = start + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            rw = self.ranks[(job, rank)]
            rw.step_begin(step)
            for record in records:
                rw.buffer.put(record)
            rw.step_end()
        for job in {job for job, _ in self.ranks}:
            self._close_job(job)

    def _close_job(self, job: str) -> None:
        for (name, rank), rw in self.ranks.items():
            if name == job and (name, rank) not in self.stats:
                self.stats[(name, rank)] = rw.close()


def one_message_per_step() -> BatchingRule:
    """The cut :func:`plans` reads (the hooks then cut the steps as they would)."""
    return BatchingRule(window_s=0.0)


__all__ = ["HookedJob", "Tap", "one_message_per_step", "plans", "replay_batches"]
