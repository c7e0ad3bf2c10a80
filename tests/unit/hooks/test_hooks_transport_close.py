"""A Kafka transport closed while the broker is away leaves nothing pending on its loop.

A producer stopped without a broker leaves its metadata and sender tasks waiting and
connection futures nobody read. Left on a closed loop, they are reported whenever the
garbage collector meets them ("Task was destroyed but it is pending!", "Future exception
was never retrieved"), with a traceback, on the training job's stderr, from whichever
thread collects them; on CPython 3.11.7 such a traceback printed beside an import can
fail that import (gh-106905). This is what CI's fault suite ran into.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from rankwatch.hooks import transports


def leave_pending(loop: asyncio.AbstractEventLoop) -> None:
    """What a producer stopped without a broker leaves on its loop."""

    async def waits_forever() -> None:
        await loop.create_future()

    loop.create_task(waits_forever())
    failed = loop.create_future()
    failed.set_exception(ConnectionRefusedError(111, "Connect call failed"))
    loop.run_until_complete(asyncio.sleep(0))


def test_closing_the_loop_cancels_what_is_pending_and_reports_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(transports._quiet)
    leave_pending(loop)
    with caplog.at_level(logging.DEBUG):
        transports._close_loop(loop)
        del loop
        gc.collect()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_without_it_the_default_handler_prints_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The control: the same loop closed as before reports both, at error level."""
    loop = asyncio.new_event_loop()
    leave_pending(loop)
    with caplog.at_level(logging.DEBUG):
        loop.close()
        del loop
        gc.collect()
    said = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert any("destroyed but it is pending" in m for m in said), said
    assert any("never retrieved" in m for m in said), said
