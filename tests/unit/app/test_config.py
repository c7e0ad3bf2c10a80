"""Configuration precedence (defaults < file < environment) and clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rankwatch.commands.config import as_toml
from rankwatch.config import (
    DEFAULT_DSN,
    ENVIRONMENT,
    Config,
    load_config,
    load_config_origins,
    service_settings,
    settings,
    with_flags,
)
from rankwatch.errors import UserError
from rankwatch.streams.hang.detector import HangConfig


def test_defaults_need_no_file_and_no_environment() -> None:
    config = load_config(env={})
    assert config.clickhouse.dsn == DEFAULT_DSN
    assert config.kafka.topic_prefix == "rankwatch"
    assert config.clickhouse.database == ""  # the DSN's database, else rankwatch


def test_the_minder_worker_takes_blend_scoring(tmp_path: Path) -> None:
    path = tmp_path / "rankwatch.toml"
    path.write_text('[minder]\nscoring = "blend"\nwindow_s = 20\n')
    assert load_config(path, env={}).minder.scoring == "blend"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rankwatch.toml"
    path.write_text('[kafka]\nbootstrap = "k1:9092"\ngroup = "g"\n[assembly]\ngrace_s = 5\n')
    config = load_config(path, env={"RANKWATCH_KAFKA": "k2:9092", "RANKWATCH_GRACE_S": "7.5"})
    assert config.kafka.bootstrap == "k2:9092"
    assert config.kafka.group == "g"
    assert config.assembly.grace_s == 7.5
    assert load_config(env={"RANKWATCH_LATE": "reanalyse"}).assembly.late == "reanalyse"


def test_the_slowdown_detector_takes_its_section(tmp_path: Path) -> None:
    from rankwatch.streams.ops.worker_state import WorkerSettings, WorkerState

    path = tmp_path / "rankwatch.toml"
    path.write_text("[slowdown]\nopen_after = 3\nflops_drop = 0.4\n")
    config = load_config(path, env={})
    assert (config.slowdown.open_after, config.slowdown.flops_drop) == (3, 0.4)
    state = WorkerState(WorkerSettings(**service_settings(config), slowdown=config.slowdown))
    assert state.pipeline.slowdown is not None
    assert state.pipeline.slowdown.config.open_after == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nope]\nx = 1\n", "unknown config section [nope]"),
        ("[kafka]\nbootsrap = 'x'\n", "unknown key 'bootsrap'"),
        ("[assembly]\ngrace_s = 'soon'\n", "grace_s must be float"),
        ("[assembly]\nlate = 'retry'\n", "late must be one of drop, reanalyse"),
        ("[slowdown]\nopen_after = 12\n", "need 1 <= open_after <= open_within"),
        ("[minder]\nscoring = 'paper'\n", "scoring must be one of pairwise, residual, blend"),
        ("[kafka\n", "cannot read config"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace("[", r"\[")):
        load_config(path, env={})


def test_each_setting_says_where_it_came_from(tmp_path: Path) -> None:
    path = tmp_path / "rankwatch.toml"
    path.write_text("[worker]\nwindow = 30\n[hang]\nk = 4.0\n")
    env = {"RANKWATCH_KEEP_OPS": "0", "RANKWATCH_SESSION_TIMEOUT_S": "6"}
    config, origins = load_config_origins(path, env=env)
    config = with_flags(config, {"hang.k": 3.0, "hang.floor_s": None}, origins)
    assert (config.worker.window, origins["worker.window"]) == (30, str(path))
    assert (config.worker.keep_ops, origins["worker.keep_ops"]) == (False, "env RANKWATCH_KEEP_OPS")
    assert config.kafka.session_timeout_s == 6.0
    assert (config.hang.k, origins["hang.k"]) == (3.0, "flag")  # the flag beats the file
    assert "hang.floor_s" not in origins  # a flag not given changes nothing
    assert settings(config, origins)["hang"]["floor_s"] == (HangConfig.floor_s, "default")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANKWATCH_KEEP_OPS": "maybe"}, "keep_ops must be bool"),
        ({"RANKWATCH_WINDOW": "2.5"}, "window must be int"),
        ({"RANKWATCH_TICK_S": "soon"}, "tick_s must be float"),
        ({"RANKWATCH_STORE_GAP_S": "-0.1"}, "store_gap_s must be 0 or more"),
        ({"RANKWATCH_RETIRE_AFTER_S": "0"}, "retire_after_s must be above 0"),
        ({"RANKWATCH_STORE_TIMEOUT_S": "0"}, "timeout_s must be above 0"),
    ],
)
def test_a_bad_environment_value_names_its_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=f"env {next(iter(env))} .*{message}"):
        load_config(env=env)


def test_every_environment_variable_names_a_setting() -> None:
    tree = settings(Config(), {})
    for var, setting in ENVIRONMENT.items():
        section, key = setting.split(".")
        assert key in tree[section], var


def test_config_show_prints_a_config_file_that_loads_back(tmp_path: Path) -> None:
    changed = {"RANKWATCH_GROUP": "g", "RANKWATCH_KEEP_OPS": "false", "RANKWATCH_WINDOW": "7"}
    config, origins = load_config_origins(env=changed)
    text = as_toml(settings(config, origins))
    assert 'group = "rankwatch-worker"' not in text and "# env RANKWATCH_GROUP" in text
    path = tmp_path / "shown.toml"
    path.write_text(text)
    assert load_config(path, env={}) == config


def test_only_the_config_module_reads_the_environment_on_the_service_side() -> None:
    """Settings have one place (issue: one config tree); hooks run in the training
    process and read their own, the test helpers (tests/support) theirs."""
    root = Path(__file__).resolve().parents[3]
    readers = {
        str(p.relative_to(root))
        for folder in ("app", "streams", "sim", "schemas", "grafana")
        for p in (root / folder).rglob("*.py")
        if re.search(r"os\.environ|getenv", p.read_text())
    }
    assert readers == {"app/config.py"}


def test_the_readme_config_excerpt_is_a_valid_config(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("## Configuration") :]
    block = section[section.index("```toml") + len("```toml") : section.index("```\n", 10)]
    path = tmp_path / "readme.toml"
    path.write_text(block)
    config = load_config(path, env={})
    assert config.kafka.bootstrap == "kafka-1:9092,kafka-2:9092"
    assert config.worker.window == 20


def test_every_worker_takes_the_shared_settings() -> None:
    from rankwatch.streams.hang.worker import HangSettings
    from rankwatch.streams.minder.worker import MinderSettings
    from rankwatch.streams.ops.worker_state import WorkerSettings

    env = {"RANKWATCH_SESSION_TIMEOUT_S": "6", "RANKWATCH_GROUP": "g"}
    config = load_config(env={**env, "RANKWATCH_STORE_TIMEOUT_S": "4"})
    for kind, suffix in ((WorkerSettings, ""), (HangSettings, "-hang"), (MinderSettings, "-m")):
        settings_ = kind(**service_settings(config, suffix))
        assert (settings_.group, settings_.session_timeout_s) == (f"g{suffix}", 6.0)
        assert settings_.store_timeout_s == 4.0
