"""``rankwatch workload --kafka``: its hooks settings reach the ranks, and it says what
happened to every record, failing when any was lost (on main it ignored
``RANKWATCH_HOOKS_SPOOL``, dropped 34,048 of 114,000 records and exited 0)."""

from __future__ import annotations

import pytest

from rankwatch.cli import build_parser
from rankwatch.commands.workload import report_delivery
from rankwatch.hooks.session import HooksConfig


def test_the_spool_and_relay_flags_are_the_workloads() -> None:
    args = build_parser().parse_args(
        ["workload", "--kafka", "b:9092", "--spool-dir", "/s", "--relay", "/r.sock"]
    )
    assert (args.spool_dir, args.relay) == ("/s", "/r.sock")


def test_the_ranks_take_the_hooks_environment_unless_the_workload_sets_it() -> None:
    env = {"RANKWATCH_HOOKS_SPOOL": "/env/spool", "RANKWATCH_RELAY": "/env/relay"}
    from_env = HooksConfig.from_env(env, kafka="b:9092", spool_dir=None, relay=None)
    assert (from_env.spool_dir, from_env.relay) == ("/env/spool", "/env/relay")
    given = HooksConfig.from_env(env, kafka="b:9092", spool_dir="/flag", relay=None)
    assert given.spool_dir == "/flag"


def stats(**counts: int) -> dict[str, int]:
    return {"put": 0, "sent": 0, "resent": 0, "in_spool": 0, "dropped_send": 0, **counts}


def test_a_run_that_lost_records_fails_and_says_how_many(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ranks = [stats(put=100, sent=60, dropped_send=40), stats(put=100, sent=100)]
    assert report_delivery("j", 2, 10, ranks) == 1
    out = capsys.readouterr().out
    assert "200 made" in out and "40 dropped" in out and "were lost" in out


def test_records_left_in_a_spool_are_not_lost(capsys: pytest.CaptureFixture[str]) -> None:
    ranks = [stats(put=100, sent=70, in_spool=30)]
    assert report_delivery("j", 1, 10, ranks) == 0
    assert "30 records wait in the ranks' spools" in capsys.readouterr().out
