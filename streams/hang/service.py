"""Heartbeats and stack dumps in, hang rows and alerts out (no I/O, no clock reads).

The stream worker feeds every ``heartbeats`` and ``stacks`` message here and calls
:meth:`HangService.on_tick` every second or so; it stores the rows and publishes
the alert messages it gets back. Bad messages become dead-letter rows, as in the ops
pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rankwatch.schemas.codec import InvalidMessage, decode
from rankwatch.schemas.tables import table_row
from rankwatch.streams.hang.detector import Episode, HangConfig, HangDetector
from rankwatch.streams.hang.stacks import MergedStack, merge_stacks
from rankwatch.streams.kit.deadletter import dead_letter, dead_letter_row
from rankwatch.streams.kit.output import Output, Source, alert_row, keyless
from rankwatch.streams.kit.times import utc
from rankwatch.streams.kit.versions import row_version

MAX_DUMPS_PER_JOB = 4096
"""Latest stack dump kept per rank; beyond this many ranks a job's oldest are dropped."""


@dataclass(frozen=True)
class Dump:
    """A rank's latest stack dump and when the rank took it (its own aligned clock, like
    the progress times its heartbeats report)."""

    sent_ns: int
    threads: Any


Recall = Callable[[str], tuple[Episode | None, list[float]]]
"""job -> its open episode and recent step times as stored (the shell's store lookup
for a job first met)."""


@dataclass
class HangService:
    config: HangConfig = field(default_factory=HangConfig)
    dead_letters: int = 0
    recall: Recall | None = None
    """Asked once per job this service first meets: an episode it returns is reopened,
    so a restarted worker neither declares it again nor forgets to resolve it."""
    generation: int = 0
    """The consumer group's generation of the worker's assignment (0: no group): part of
    each row's version, so a later owner's rows win (:mod:`~rankwatch.streams.kit.versions`)."""

    def __post_init__(self) -> None:
        self.detector = HangDetector(self.config)
        self._dumps: dict[str, dict[int, Dump]] = {}

    def on_heartbeat(self, data: bytes, source: Source, now_ns: int) -> Output:
        message, out = self.read_heartbeat(data, source, now_ns)
        if message is not None:
            job = message["job"]
            if self.recall is not None and not self.detector.knows(job):
                self.detector.restore(job, *self.recall(job))
            self.detector.observe(message, now_ns)
        return out

    def read_heartbeat(
        self, data: bytes, source: Source, now_ns: int
    ) -> tuple[dict[str, Any] | None, Output]:
        """The decoded heartbeat and no rows, or None and its dead-letter rows (for a
        shell that recalls a job first met on its own time, then ``detector.observe``)."""
        refused = keyless(source)
        if refused is not None:
            return None, self._dead(data, source, now_ns, refused)
        try:
            return decode("heartbeats", data), Output()
        except InvalidMessage as exc:
            return None, self._dead(data, source, now_ns, exc)

    def forget(self, job: str) -> None:
        """Drop what is known of ``job``: its ranks, episode and stack dumps."""
        self.detector.forget(job)
        self._dumps.pop(job, None)

    def on_stacks(self, data: bytes, source: Source, now_ns: int) -> Output:
        """Keep the rank's latest dump; if its job is hung, re-merge the episode's stacks."""
        refused = keyless(source)
        if refused is not None:
            return self._dead(data, source, now_ns, refused)
        try:
            message = decode("stacks", data)
        except InvalidMessage as exc:
            return self._dead(data, source, now_ns, exc)
        dumps = self._dumps.setdefault(message["job"], {})
        dumps.pop(message["rank"], None)
        dumps[message["rank"]] = Dump(int(message["sent_ns"]), message["threads"])
        while len(dumps) > MAX_DUMPS_PER_JOB:
            dumps.pop(next(iter(dumps)))
        out = Output()
        for episode in self.detector.episodes():
            # a dump that comes once the job moves again (a resumed rank's watchdog sees
            # its op in flight since before the stop) must not replace the hung picture
            if episode.job == message["job"] and not self.detector.resuming(episode):
                _add_stacks(
                    out,
                    episode,
                    self.merged(episode),
                    row_version(now_ns, generation=self.generation),
                )
        return out

    def on_tick(self, now_ns: int) -> Output:
        out = Output()
        for episode in self.detector.evaluate(now_ns):
            version = row_version(now_ns, generation=self.generation)
            out.add("hangs", hang_row(episode, version))
            if episode.open:
                _add_stacks(out, episode, self.merged(episode), version)
            alert = hang_alert(episode, now_ns)
            out.add("alerts", alert_row(alert))
            out.messages.append(("alerts", episode.job, alert))
        return out

    def merged(self, episode: Episode) -> list[MergedStack]:
        """The episode's merged stacks, from the dumps that describe where each rank is
        stuck: a dump taken before the rank's last progress is a wait it got out of (the
        watchdog dumps any op in flight too long, and a loaded machine makes healthy
        waits long), so it is left out and the rank counts as absent from every path."""
        ranks = self.detector.ranks(episode.job)
        progress = {r.rank: r.progress_ns for r in ranks}
        dumps = {
            rank: dump.threads
            for rank, dump in self._dumps.get(episode.job, {}).items()
            if dump.sent_ns >= progress.get(rank, 0)
        }
        return merge_stacks(dumps, [r.rank for r in ranks])

    def _dead(self, data: bytes, source: Source, now_ns: int, exc: InvalidMessage) -> Output:
        self.dead_letters += 1
        out = Output()
        out.add("dead_letters", dead_letter_row(data, source, now_ns, exc.reason, exc.detail))
        out.dead_letters.append(dead_letter(data, source, exc.reason, exc.detail))
        return out


def hang_row(ep: Episode, version: int) -> dict[str, Any]:
    return table_row(
        "hangs",
        job=ep.job,
        episode_id=ep.episode_id,
        time=utc(ep.declared_ns),
        last_progress=utc(ep.last_progress_ns),
        resolved_at=None if ep.resolved_ns is None else utc(ep.resolved_ns),
        step=ep.step,
        culprit_ranks=list(ep.culprits),
        waiting_ranks=list(ep.waiting),
        silent_ranks=list(ep.silent),
        culprit_hosts=list(ep.culprit_hosts),
        culprit_where=ep.culprit_where,
        summary=ep.summary,
        version=version,
    )


def hang_alert(ep: Episode, now_ns: int) -> dict[str, Any]:
    """The ``alerts`` message of an episode (one id per episode, firing then resolved)."""
    return {
        "schema": "alerts",
        "version": 1,
        "alert_id": ep.episode_id,
        "job": ep.job,
        "kind": "hang",
        "state": "firing" if ep.open else "resolved",
        "severity": "critical" if ep.open else "info",
        "ts_ns": now_ns,
        "summary": ep.summary if ep.open else f"resolved: {ep.summary}",
        "evidence": {
            "culprits": list(ep.culprits),
            "waiting": list(ep.waiting),
            "silent": list(ep.silent),
            "suspects": list(ep.suspects),
            "first_stopped": ep.first_stopped,
            "culprit_hosts": list(ep.culprit_hosts),
            "where": ep.culprit_where,
            "step": ep.step,
            "last_progress_ns": ep.last_progress_ns,
            "declared_ns": ep.declared_ns,
        },
    }


def episode_from_alert(alert: Mapping[str, Any]) -> Episode | None:
    """The open episode a stored firing ``hang`` alert describes (None: resolved, or
    stored before alerts carried ``last_progress_ns``)."""
    ev = alert["evidence"]
    if alert["state"] != "firing" or "last_progress_ns" not in ev:
        return None
    return Episode(
        job=alert["job"],
        episode_id=alert["alert_id"],
        declared_ns=int(ev.get("declared_ns", alert["ts_ns"])),
        last_progress_ns=int(ev["last_progress_ns"]),
        step=int(ev["step"]),
        culprits=tuple(ev["culprits"]),
        waiting=tuple(ev["waiting"]),
        silent=tuple(ev["silent"]),
        suspects=tuple(ev["suspects"]),
        first_stopped=int(ev["first_stopped"]),
        culprit_hosts=tuple(ev["culprit_hosts"]),
        culprit_where=ev["where"],
        summary=alert["summary"],
    )


def _add_stacks(out: Output, ep: Episode, merged: list[MergedStack], version: int) -> None:
    for m in merged:
        row = table_row(
            "stacks",
            job=ep.job,
            episode_id=ep.episode_id,
            time=utc(ep.declared_ns),
            stack=m.stack,
            native=int(m.native),
            ranks=list(m.ranks),
            ranks_text=m.ranks_text,
            absent_ranks_text=m.absent_text,
            n_ranks=len(m.ranks),
            version=version,
        )
        out.add("stacks", row)
