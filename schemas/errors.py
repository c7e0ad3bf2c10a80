"""The one error every decode or encode failure raises."""

from __future__ import annotations

REASONS: tuple[str, ...] = (
    "no-value",  # a record without a value: a tombstone (null) or zero bytes
    "no-key",  # a record of a job-keyed topic without a key (it may reach any worker)
    "malformed-json",  # not JSON, truncated, NaN/Infinity literals, ints beyond 64 bits
    "malformed-frame",  # a binary op batch (ops v3) cut short before its header ends
    "too-large",  # more bytes than the configured maximum
    "unknown-kind",  # no schema of that kind
    "unknown-version",  # the message's version has no schema file
    "schema",  # the message breaks its JSON Schema (missing field, wrong type...)
    "column-length",  # columns of one batch differ in length
    "bad-value",  # a value out of its bounds, non-finite, or not in its enum
)
"""Every ``InvalidMessage.reason``; dead-letter rows and counters are keyed by these."""


class InvalidMessage(ValueError):
    """A message that cannot be encoded or decoded.

    ``reason`` is a short code from :data:`REASONS` (for counters and dead letters);
    ``detail`` is human text naming the field or path at fault.
    """

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[InvalidMessage], tuple[str, str]]:
        return (type(self), (self.reason, self.detail))
