"""The faust stream worker: a thin shell around :class:`WorkerState`.

One agent consumes ``<prefix>.ops`` (keyed by job, so one worker owns a job's open
steps) with acknowledgements under our control: an event is acknowledged only when
what it fed is stored and every event read before it on its partition was acknowledged
(faust commits what is acknowledged, and past a gap if there is one). A step that
closes is stored, acknowledged and announced at once, or as soon as ``store_gap_s``
since the previous store allows (:meth:`WorkerState.settle_in`). A timer closes steps
whose grace period ran out, asks for a store of the buffer and writes the health file.
A task of its own runs the stores (acknowledging and publishing what they stored), with
the inserts in a thread, while the agent reads on (docs/architecture.md, "Delivery").
A job first met is restored in a task of its own, its store read in a thread, its
messages held meanwhile, in order, while the agent reads the other jobs' on. All logic
is in :mod:`~rankwatch.streams.ops.worker_state` and the pure core; this module moves
bytes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

from rankwatch.schemas.codec import prepare
from rankwatch.streams.kit.changelog import ChangelogReader
from rankwatch.streams.kit.delivery import in_thread, publish
from rankwatch.streams.kit.faustapp import input_topic, new_app, output_topics, shorten_fetch_wait
from rankwatch.streams.kit.health import StatusReporter
from rankwatch.streams.kit.membership import GroupLease, member_of
from rankwatch.streams.kit.output import DEAD_LETTERS, Source
from rankwatch.streams.kit.rewind import StallGuard
from rankwatch.streams.kit.store import StoreError
from rankwatch.streams.ops.worker_state import (
    JOBSTATE_MAX_BYTES,
    HeldMessage,
    Recollection,
    WorkerSettings,
    WorkerState,
    first_batch,
)

__all__ = ["WorkerSettings", "WorkerState", "build_app"]

log = logging.getLogger("rankwatch.worker")

TAKE_AT_ONCE = 256
"""Held messages a restored job's task takes between two turns of the event loop."""


def topic_names(settings: WorkerSettings) -> list[str]:
    """The topics the ops worker reads (first) and writes."""
    return [f"{settings.topic_prefix}.{kind}" for kind in ("ops", *OUTPUT_KINDS)]


def consumer_settings(settings: WorkerSettings) -> dict[str, Any]:
    """The faust settings of the ops worker's consumer (also those of the benchmarks'
    consumer-alone app, ``benchmarks/faust_floor.py``, so both read alike)."""
    return {
        "consumer_max_fetch_size": settings.fetch_bytes,
        "stream_buffer_maxsize": settings.stream_buffer,
        "broker_commit_interval": settings.commit_interval_s,
        "stream_wait_empty": False,  # unacknowledged events wait for their steps, not rebalances
    }


def build_app(settings: WorkerSettings) -> tuple[faust.App, WorkerState]:
    app = new_app(
        settings,
        **consumer_settings(settings),
        producer_max_request_size=JOBSTATE_MAX_BYTES + 65536,  # a large job's jobstate
    )
    state = WorkerState(settings)
    prepare("ops", JOBSTATE, "steps", "alerts", "signals")  # not on a job's first step
    ops_topic = input_topic(app, settings.topic_prefix, "ops", settings.partitions)
    out_topics = output_topics(app, settings.topic_prefix, OUTPUT_KINDS)
    jobstate_topic = output_topics(app, settings.topic_prefix, [JOBSTATE])[JOBSTATE]
    changelog = ChangelogReader(
        settings.bootstrap, f"{settings.topic_prefix}.{JOBSTATE}", JOBSTATE_MAX_BYTES
    )
    guard = StallGuard(app, [ops_topic.get_topic_name()], log)
    lease = GroupLease(
        settings.bootstrap,
        settings.session_timeout_s,
        member=lambda: member_of(app),
        assigned=lambda: app.consumer_generation_id,
    )
    status = StatusReporter(app, settings.status_file, log, guard=guard, lease=lease)

    settling = asyncio.Lock()
    """One store-and-hand-over at a time: the agent (back-pressure), ``settler``, the
    revocation handler and the shutdown all settle, and two interleaved ones could put a job's older
    jobstate message on the topic after its newer one (the next owner restores the
    latest). Publishing stays outside: announcements are deduplicated downstream."""

    async def settle(every: bool = False) -> None:
        """Store, hand the changed jobs' state over (``every`` job's: the worker stops),
        acknowledge what is stored, announce it (and the dead letters)."""
        async with settling:
            await store_and_hand_over(every)
        await publish(state.delivery, out_topics)

    async def store_and_hand_over(every: bool) -> None:
        """The part of :func:`settle` that holds ``settling``. The inserts run in a
        thread: the agent goes on taking messages while the store answers (a slow or
        hung server holds the rows of one store, not the worker)."""
        if state.wants_store() and not await lease.may_store():
            return  # not (or no longer) the owner: nothing is stored, its rows wait
        store = state.begin_store()
        if store is None:  # backing off
            return
        states = state.handover(every)  # exactly the rows this store takes
        try:
            await in_thread(state.delivery.run, store.flush)
        finally:
            tokens = state.end_store(store)
            if not state.stored:
                state.handed_over(states, ok=False)
        sent = state.stored and await send_jobstates(states)
        for event in state.release(tokens, sent):
            event.ack()

    async def send_jobstates(states: list[tuple[str, int, bytes]]) -> bool:
        """Send jobstate messages to their jobs' input partitions; True once the broker
        has them all (then the messages they cover may be acknowledged)."""
        if not states:
            return True
        count = max(state.topics.get(jobstate_topic_name(settings), 0), 1)
        try:
            futures = [
                await jobstate_topic.send(key=job.encode(), value=data, partition=p % count)
                for job, p, data in states
            ]
            for future in futures:
                await future
        except Exception as exc:  # the broker is down: retried at the next settle
            state.handed_over(states, ok=False)
            log.warning("%d jobstate messages not sent yet (%s)", len(states), exc)
            return False
        state.handed_over(states, ok=True)
        return True

    async def jobstate_of(job: str, partition: int, ticket: int) -> bytes | None:
        """``job``'s latest jobstate message (None: there is none), read again while the
        topic cannot be read, until restore ``ticket`` goes stale."""
        count = max(state.topics.get(jobstate_topic_name(settings), 0), 1)
        while state.recall_subject(job, ticket) is not None:
            try:
                return (await changelog.latest(partition % count)).get(job.encode())
            except Exception as exc:  # broker unreachable: the job waits, the worker lives
                log.warning("cannot read the jobstate topic (%s): retrying", exc)
                await asyncio.sleep(1.0)
        return None

    async def recall(job: str, ticket: int) -> None:
        """Restore a job first met from its jobstate message or the store, its messages
        held meanwhile (:meth:`WorkerState.hold`), and take them once it is restored. It
        waits while either cannot be read: going on without them would analyse and
        store twice. The store is read in a thread, once no store runs (the store
        serves one caller at a time, and a store under way may hold the job's rows)."""
        first = state.recall_subject(job, ticket)
        if first is None:
            return
        saved = await jobstate_of(job, first.source.partition, ticket)
        layout = (first.batch.dp_size, first.batch.pp_size)
        while state.recall_subject(job, ticket) is not None:
            async with settling:
                found = await look_up(job, layout, saved)
                if found is not None and state.restore_held(job, ticket, found):
                    break
            # the store backs off, or refused for good (said in the log): ask again later
            await asyncio.sleep(min(max(state.delivery.retry_in(), 1.0), 5.0))
        more = True
        while more:  # in parts, the event loop free in between (up to 10,000 wait)
            more = state.take_held(job, ticket, TAKE_AT_ONCE)
            if state.settle_in() is not None:
                wanted.set()
            while state.full:  # back-pressure, as in the agent
                await settle()
                if state.full:
                    await asyncio.sleep(min(max(state.delivery.retry_in(), 0.05), 1.0))
            await asyncio.sleep(0)

    async def look_up(
        job: str, layout: tuple[int, int], saved: bytes | None
    ) -> Recollection | None:
        """:meth:`WorkerState.look_up` in a thread; None while the store cannot answer."""
        if not state.delivery.store_ready:
            return None
        handed = state.jobstate_history(job, saved)
        try:
            return await asyncio.to_thread(state.look_up, job, layout, handed)
        except StoreError as exc:  # backed off, and said in the log: asked again later
            state.delivery.failed(exc)
        except Exception:  # a bug: the job waits (its messages held), logged
            log.exception("job %s: restoring it failed", job)
        return None

    async def logged_recall(job: str, ticket: int) -> None:
        try:
            await recall(job, ticket)
        except Exception:  # a bug: logged here, not lost in a task nobody awaits
            log.exception("restoring job %s failed", job)

    def start_recalls() -> None:
        for job, ticket in state.take_recalls():
            task = asyncio.ensure_future(logged_recall(job, ticket))
            recalling.add(task)
            task.add_done_callback(recalling.discard)

    recalling: set[asyncio.Task[None]] = set()
    """A reference to each running restore, so that none is collected mid-way."""

    @app.agent(ops_topic)
    async def ops(stream: Any) -> None:
        guard.stream(ops_topic.get_topic_name(), stream)
        async for event in stream.noack().events():
            msg = event.message
            guard.handed(msg)
            members = state.decode(event.value)
            batch = first_batch(members)
            stamp = round(msg.timestamp * 1e9) if msg.timestamp else None
            key = event.key or b""  # a record without a key: refused (``no-key``)
            source = Source(msg.topic, msg.partition, msg.offset, key, stamp)
            if batch is not None and state.must_hold(batch, key):
                state.hold(HeldMessage(event, event.value, source, members, batch))
                start_recalls()
            else:
                state.on_message(event, event.value, source, members)
            if state.settle_in() is not None:  # a step closed: stored and announced by
                wanted.set()  # `settler` now, or once the gap (or backoff) has passed
            while state.full:  # back-pressure: nothing more in memory until it is stored
                await settle()
                if state.full:
                    await asyncio.sleep(min(max(state.delivery.retry_in(), 0.05), 1.0))
            while state.held_full:  # restores hold too much: read on once one answers
                await asyncio.sleep(0.05)

    wanted = asyncio.Event()
    """Set when a store is wanted (steps closed, or the tick's): :func:`settler` runs it."""
    tick_wanted = [False]

    @app.task
    async def settler() -> None:
        """Every store but back-pressure's and the last: closed steps at once or once
        their gap has passed, and the buffer once a tick. A task of its own, so that the
        agent reads on and the timer writes the health file while the store answers."""
        while True:
            wait = state.settle_in()
            if tick_wanted[0] or wait == 0:
                tick_wanted[0] = False
                await settle()
            elif wait is None:
                wanted.clear()
                await wanted.wait()
            else:
                await asyncio.sleep(wait)

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        shorten_fetch_wait(app, settings.fetch_wait_ms)
        lease.poll()
        state.on_tick(blind=lease.unreachable_since is not None)
        tick_wanted[0] = True  # the buffer is stored by `settler`, which a slow store
        wanted.set()  # holds, not the health file written here
        snapshot = state.snapshot()
        state.input_lag_s = state.delivery.flush_s = 0.0
        await status(snapshot)

    async def on_revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        gone = {(tp.topic, tp.partition) for tp in revoked}
        if not gone:  # a first assignment: nothing was held
            return
        state.forget_held(gone)  # now: a restore answering while this waits is stale
        if lease.lost():  # taken away while this worker could not answer: store nothing
            log.warning("partitions lost, not handed over: their rows go unstored here")
            state.lose_partitions(gone)
            changelog.forget()
            return
        async with settling:  # no settle between the handover and forgetting the jobs
            await store_and_hand_over(every=True)  # the new owner restores from these
            state.forget_partitions(gone)
        await publish(state.delivery, out_topics)
        changelog.forget()  # re-read at the next job met: the partitions may come back

    warming: list[asyncio.Task[None]] = []

    async def on_assigned(sender: Any, assigned: set[Any], **_: Any) -> None:
        """Read the assigned partitions' jobstate ahead of their jobs' first messages, in
        the background (the group's rebalance does not wait for it). Rows from now on
        carry this assignment's generation in their versions."""
        state.pipeline.generation = app.consumer_generation_id
        count = max(state.topics.get(jobstate_topic_name(settings), 0), 1)
        mine = {tp.partition % count for tp in assigned if tp.topic == topic_names(settings)[0]}
        warming[:] = [t for t in warming if not t.done()]
        if mine:
            warming.append(asyncio.ensure_future(changelog.warm(mine)))

    async def on_shutdown(sender: Any, **_: Any) -> None:
        """A graceful stop: faust calls no revocation handler then (the group hears of
        the member leaving), so store and hand every job over here, while the producer
        still runs; the next owners re-read from the committed offsets."""
        try:
            await settle(every=True)
        except Exception:  # never keep the process from stopping
            log.exception("final settle at shutdown failed")
        for task in [*warming, *recalling]:
            task.cancel()
        await changelog.stop()
        await lease.close()

    app.on_before_shutdown.connect(on_shutdown)  # type: ignore[arg-type]

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]

    return app, state


OUTPUT_KINDS = ("steps", "alerts", "signals", DEAD_LETTERS)
JOBSTATE = "jobstate"
"""The compacted topic ``<prefix>.jobstate``: each job's handover state (:mod:`~.handover`)."""


JOBSTATE_TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",  # the latest state per job, for as long as its ops
    # The active segment is never compacted, so a restore reads every state sent since it
    # rolled: one-minute segments, cleaned as soon as they are dirty, keep that read to
    # about a minute of messages per job (an hour's, with hourly segments: measured in
    # docs/sizing.md, "Costs and limits").
    "segment.ms": str(60 * 1000),
    "min.cleanable.dirty.ratio": "0.01",
    "max.message.bytes": str(JOBSTATE_MAX_BYTES + 65536),
}


def jobstate_topic_name(settings: WorkerSettings) -> str:
    return f"{settings.topic_prefix}.{JOBSTATE}"
