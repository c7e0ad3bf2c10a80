"""Configuration precedence (defaults < file < environment) and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankwatch.config import DEFAULT_DSN, load_config
from rankwatch.errors import UserError


def test_defaults_need_no_file_and_no_environment() -> None:
    config = load_config(env={})
    assert config.clickhouse.dsn == DEFAULT_DSN
    assert config.kafka.topic_prefix == "rankwatch"
    assert config.clickhouse.database == ""  # the DSN's database, else rankwatch


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rankwatch.toml"
    path.write_text('[kafka]\nbootstrap = "k1:9092"\ngroup = "g"\n[assembly]\ngrace_s = 5\n')
    config = load_config(path, env={"RANKWATCH_KAFKA": "k2:9092", "RANKWATCH_GRACE_S": "7.5"})
    assert config.kafka.bootstrap == "k2:9092"
    assert config.kafka.group == "g"
    assert config.assembly.grace_s == 7.5
    assert load_config(env={"RANKWATCH_LATE": "reanalyse"}).assembly.late == "reanalyse"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nope]\nx = 1\n", "unknown config section [nope]"),
        ("[kafka]\nbootsrap = 'x'\n", "unknown key 'bootsrap'"),
        ("[assembly]\ngrace_s = 'soon'\n", "grace_s must be float"),
        ("[assembly]\nlate = 'retry'\n", "late must be one of drop, reanalyse"),
        ("[kafka\n", "cannot read config"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace("[", r"\[")):
        load_config(path, env={})
