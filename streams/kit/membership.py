"""Whether this worker still owns what it is about to store, and whether it can reach
the broker at all (shell: it talks to Kafka).

A worker that was paused (SIGSTOP, a long GC, a VM migration) or cut off longer than
its group session is no longer a member when it runs again: the group gave its
partitions to another worker, which re-read and stored their messages. The paused one
does not know it yet. Its consumer finds out at its next heartbeat, but its own timer
may run first, close every open step as partial (their grace ran out during the pause)
and store those rows over the new owner's complete ones. Found on main: 6 stale step
rows stored, one partial row that won ``FINAL`` over the complete one.

So a worker asks before it stores. :class:`GroupLease` sends, on its own connection, a
heartbeat in this member's name to the group's coordinator: the coordinator answers
from the group's state, so "yes" means the member and its generation are current now
(a rebalance under way counts: under the eager protocol the member keeps its
partitions until it rejoins, after its revocation handler has stored and handed them
over). A "yes" is good for a third of the session timeout (:attr:`GroupLease.lease_s`):
the coordinator cannot evict a member sooner than a session after it last heard of it.
Whatever the answer, nothing else changes: the consumer's own heartbeats go on.

What it cannot cover, and the rows' versions do (:mod:`~rankwatch.streams.kit.versions`):
a pause that falls between the "yes" and the insert. A row from an older generation or
a partial step never wins ``FINAL`` over the new owner's.

The same connection's answers (metadata, then the heartbeat) say whether the broker is
reachable: a worker that cannot reach it says so in its health, instead of showing the
last lag it knew (``lag=0``) while nothing moves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rankwatch.membership")

ASK_TIMEOUT_S = 2.0
"""How long one question to the broker may take before it counts as unanswered."""


@dataclass(frozen=True)
class Member:
    """This worker as its group knows it: the generation of its assignment, and its id."""

    group: str
    generation: int
    member_id: str


def member_of(app: Any) -> Member | None:
    """The member a faust app's consumer is now (None before it joined, or after the
    coordinator stopped recognising it: aiokafka then resets its generation to -1 and its
    id to "" before it rejoins)."""
    try:
        coordinator = app.consumer._thread._ensure_consumer()._coordinator
    except Exception:  # not started yet, or being rebuilt
        return None
    generation, member_id = int(coordinator.generation), str(coordinator.member_id or "")
    if generation < 0 or not member_id:
        return None
    return Member(str(coordinator.group_id), generation, member_id)


class GroupLease:
    """A worker's right to store for the partitions it was assigned (see the module doc).

    ``member``: what this worker is in its group now (:func:`member_of`); ``assigned``:
    the generation of the assignment its state was built on (faust's
    ``app.consumer_generation_id``). Used from the worker's event loop only."""

    def __init__(
        self,
        bootstrap: str,
        session_timeout_s: float,
        member: Callable[[], Member | None],
        assigned: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bootstrap = bootstrap
        self.lease_s = session_timeout_s / 3
        self.member = member
        self.assigned = assigned
        self.clock = clock
        self._client: Any = None
        self._checking: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        """Stale clients being closed (a reference each, so none is collected mid-way)."""
        self._confirmed_at: float | None = None
        self._confirmed: Member | None = None
        self.reachable_at: float | None = None
        """When the broker last answered (``clock``)."""
        self.unreachable_since: float | None = None
        """When the broker stopped answering (None while it answers)."""
        self.last_error = ""
        self.refusals = 0
        """Stores this lease withheld: the member was no longer the owner, or could not ask."""

    # -- what the worker asks ------------------------------------------------------------

    def lost(self) -> bool:
        """Whether this worker's assignment is no longer its own, as far as its own
        consumer knows: it is no member now, or a member of another generation than the
        one its assignment came with."""
        member = self.member()
        return member is None or member.generation != self.assigned()

    async def may_store(self) -> bool:
        """Whether a store may run now: the member holds its assignment's generation,
        confirmed by the coordinator within :attr:`lease_s`. False (counted, logged)
        when it does not or cannot be asked: the rows wait."""
        member = self.member()
        if member is None or member.generation != self.assigned():
            return self._refuse("this worker is no longer the owner of its partitions")
        fresh = self._confirmed_at is not None and self.clock() - self._confirmed_at < self.lease_s
        if fresh and self._confirmed == member:
            return True
        answer = await self._ask(member)
        if answer is True:
            return True
        why = "the group no longer counts this member" if answer is False else self.last_error
        return self._refuse(why)

    async def check(self) -> None:
        """Once a tick: ask the broker, and the coordinator when this worker is a member,
        so that health says at once when either stopped answering."""
        member = self.member()
        if member is not None and member.generation == self.assigned():
            await self._ask(member)
        else:
            await self._reach()

    def poll(self) -> None:
        """:meth:`check` in the background unless one runs: a tick never waits on a
        broker that does not answer (a question may take ``ASK_TIMEOUT_S`` twice)."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._logged_check())

    async def _logged_check(self) -> None:
        try:
            await self.check()
        except Exception:  # a bug: logged, never lost in a task nobody awaits
            log.exception("checking the broker failed")

    def snapshot(self) -> dict[str, Any]:
        """For the health file: whether the broker answers, and for how long it has not."""
        down = self.unreachable_since
        return {
            "broker_reachable": down is None and self.reachable_at is not None,
            "broker_unreachable_s": round(self.clock() - down, 1) if down is not None else 0.0,
            "broker_error": self.last_error if down is not None else "",
            "stores_fenced": self.refusals,
        }

    async def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), ASK_TIMEOUT_S)
            except Exception:  # closing a client of a dead broker
                log.debug("closing the lease's client failed", exc_info=True)

    # -- talking to the broker -----------------------------------------------------------

    def _refuse(self, why: str) -> bool:
        self.refusals += 1
        if self.refusals == 1 or self.refusals % 100 == 0:
            log.warning("store withheld (%d so far): %s", self.refusals, why)
        return False

    async def _ask(self, member: Member) -> bool | None:
        """The coordinator's word on ``member``: True (current; a rebalance under way
        included), False (unknown member, or another generation), None (no answer)."""
        from aiokafka import errors
        from aiokafka.client import ConnectionGroup, CoordinationType
        from aiokafka.protocol.group import HeartbeatRequest

        try:
            client = await self._connected()
            node = await asyncio.wait_for(
                client.coordinator_lookup(CoordinationType.GROUP, member.group), ASK_TIMEOUT_S
            )
            request = HeartbeatRequest(member.group, member.generation, member.member_id)
            response = await asyncio.wait_for(
                client.send(node, request, group=ConnectionGroup.COORDINATION), ASK_TIMEOUT_S
            )
        except Exception as exc:  # unreachable, coordinator moving, timed out
            self._unreachable(exc)
            return None
        self._reached()
        error = errors.for_code(response.error_code)
        if error in (errors.NoError, errors.RebalanceInProgressError):
            self._confirmed_at, self._confirmed = self.clock(), member
            return True
        self._confirmed_at = None
        if error in (errors.UnknownMemberIdError, errors.IllegalGenerationError):
            return False
        self.last_error = f"coordinator answered {error.__name__}"
        return None

    async def _reach(self) -> None:
        try:
            client = await self._connected()
            await asyncio.wait_for(client.fetch_all_metadata(), ASK_TIMEOUT_S)
        except Exception as exc:
            self._unreachable(exc)
            return
        self._reached()

    async def _connected(self) -> Any:
        if self._client is None:
            from aiokafka.client import AIOKafkaClient

            client = AIOKafkaClient(
                bootstrap_servers=self.bootstrap, request_timeout_ms=int(ASK_TIMEOUT_S * 1000)
            )
            try:
                await asyncio.wait_for(client.bootstrap(), ASK_TIMEOUT_S)
            except BaseException:
                await asyncio.shield(client.close())
                raise
            self._client = client
        return self._client

    def _reached(self) -> None:
        if self.unreachable_since is not None:
            log.info("broker reachable again after %.1f s", self.clock() - self.unreachable_since)
        self.reachable_at, self.unreachable_since = self.clock(), None

    def _unreachable(self, exc: BaseException) -> None:
        self.last_error = f"broker unreachable: {type(exc).__name__}: {exc}"[:300]
        if self.unreachable_since is None:
            self.unreachable_since = self.clock()
            log.warning("%s", self.last_error)
        # the next question bootstraps a new client: one whose broker went away may keep
        # stale metadata and connections
        client, self._client = self._client, None
        if client is not None:
            task = asyncio.ensure_future(_close_quietly(client))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


async def _close_quietly(client: Any) -> None:
    try:
        await asyncio.wait_for(client.close(), ASK_TIMEOUT_S)
    except Exception:
        log.debug("closing a stale client failed", exc_info=True)
