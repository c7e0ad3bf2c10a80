"""Records no producer of ours sends, in every worker's core: a tombstone (null value),
an empty value, a record of a job-keyed topic without a key. Each is a dead letter with
its reason, counted; nothing raises (a tombstone on the ops topic crashed the ops agent
in ``schemas/joined.py``, and faust restarted it, the record neither dead-lettered nor
counted)."""

from __future__ import annotations

import pytest
from support.memstore import MemoryStore
from support.workers import several_jobs

from rankwatch.schemas.codec import (
    InvalidMessage,
    decode,
    decode_ops,
    decode_ops_members,
    encode,
    encode_ops,
)
from rankwatch.schemas.examples import example
from rankwatch.streams.hang.service import HangService
from rankwatch.streams.kit.output import Source
from rankwatch.streams.minder.worker import MinderSettings, MinderState
from rankwatch.streams.ops.pipeline import Pipeline


@pytest.mark.parametrize("value", [None, b""], ids=["tombstone", "empty"])
@pytest.mark.parametrize("kind", ["ops", "heartbeats", "stacks", "metrics", "jobstate"])
def test_the_codec_refuses_a_record_without_a_value(kind: str, value: bytes | None) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(kind, value)  # type: ignore[arg-type]
    assert caught.value.reason == "no-value"
    if kind == "ops":
        for read in (decode_ops, decode_ops_members):
            with pytest.raises(InvalidMessage, match="no-value"):
                read(value)  # type: ignore[arg-type]


def _letters(out: object) -> list[tuple[str, str]]:
    rows = out.rows.get("dead_letters", [])  # type: ignore[attr-defined]
    return [(r["reason"], r["payload"]) for r in rows]


@pytest.mark.parametrize("value", [None, b""], ids=["tombstone", "empty"])
def test_the_ops_pipeline_dead_letters_a_record_without_a_value(value: bytes | None) -> None:
    pipeline = Pipeline()
    out = pipeline.on_message(value, Source("p.ops", 0, 7, b"j"), 0)  # type: ignore[arg-type]
    assert _letters(out) == [("no-value", "")]
    (letter,) = out.dead_letters
    assert letter.data == b"" and letter.key == "j" and letter.offset == 7
    assert pipeline.dead_letter_reasons == {"no-value": 1}


def test_the_ops_pipeline_refuses_a_keyless_record_of_a_topic_and_keeps_the_job() -> None:
    """A batch with no key (b"" from the shell) is refused before it can fix the job's
    identity; the same batch keyed by its job goes on."""
    batch = several_jobs(["j"], steps=1, origin_ns=0)[0].batch
    pipeline = Pipeline()
    out = pipeline.on_message(encode_ops(batch), Source("p.ops", 0, 1, b""), 0)
    assert [r for r, _ in _letters(out)] == ["no-key"] and not pipeline.knows("j")
    out = pipeline.on_message(encode_ops(batch), Source("p.ops", 0, 2, b"j"), 0)
    assert not out.rows.get("dead_letters") and pipeline.knows("j")


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [(None, b"j", "no-value"), (b"", b"j", "no-value"), (None, None, "no-key")],
    ids=["tombstone", "empty", "keyless-tombstone"],
)
def test_the_hang_service_dead_letters_heartbeats_and_stacks_without(
    value: bytes | None, key: bytes | None, reason: str
) -> None:
    service = HangService()
    for on in (service.on_heartbeat, service.on_stacks):
        out = on(value, Source("p.heartbeats", 3, 9, key), 0)  # type: ignore[arg-type]
        assert [r for r, _ in _letters(out)] == [reason]
    assert service.dead_letters == 2 and service.detector.jobs() == []


def test_the_hang_service_refuses_a_keyless_heartbeat_read_from_a_topic() -> None:
    beat = encode("heartbeats", example("heartbeats"))
    service = HangService()
    out = service.on_heartbeat(beat, Source("p.heartbeats", 0, 1, None), 0)
    assert [r for r, _ in _letters(out)] == ["no-key"] and service.detector.jobs() == []
    service.on_heartbeat(beat, Source("p.heartbeats"), 0)  # in-process: no topic, no key
    assert service.detector.jobs() == [example("heartbeats")["job"]]


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [
        (None, b"j", "no-value"),
        (b"", b"j", "no-value"),
        (encode("metrics", example("metrics")), None, "no-key"),
    ],
    ids=["tombstone", "empty", "keyless"],
)
def test_the_minder_worker_dead_letters_samples_without(
    value: bytes | None, key: bytes | None, reason: str
) -> None:
    store = MemoryStore()
    state = MinderState(MinderSettings("b", "chdb://unused"), store=store)  # type: ignore[arg-type]
    state.on_message(value, "p.metrics", 0, 4, token="t", key=key)  # type: ignore[arg-type]
    assert state.dead_letters == 1 and state.monitors == {}
    assert state.on_tick()
    assert [r["reason"] for r in store.rows["dead_letters"]] == [reason]
    assert state.take_acks() == ["t"]  # refused, it is acknowledged: never read again
