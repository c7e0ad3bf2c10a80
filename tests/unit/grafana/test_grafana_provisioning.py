"""Provisioning files: valid YAML, the datasource variables match what ``grafana env``
derives from a DSN, the dashboards provider points at the boards."""

from __future__ import annotations

import re

import pytest
import yaml

from rankwatch.cli import main
from rankwatch.grafana.common import PLUGIN
from rankwatch.grafana.provisioning import PROVISIONING_DIR, datasource_env


def test_datasource_file_reads_the_variables_env_prints() -> None:
    text = (PROVISIONING_DIR / "datasources" / "rankwatch-clickhouse.yaml").read_text()
    (source,) = yaml.safe_load(text)["datasources"]
    assert source["type"] == PLUGIN
    used = set(re.findall(r"\$\{(\w+)\}", text))
    assert used == set(datasource_env("https://u:p@h:9/db"))


def test_dashboards_provider() -> None:
    data = yaml.safe_load((PROVISIONING_DIR / "dashboards" / "rankwatch.yaml").read_text())
    (provider,) = data["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "${RANKWATCH_DASHBOARDS}"


def test_datasource_env_from_dsn() -> None:
    env = datasource_env("https://ro%40x:s3cr%2Ft@ch.example:8443/metrics")
    assert env == {
        "RANKWATCH_CH_HOST": "ch.example",
        "RANKWATCH_CH_PORT": "8443",
        "RANKWATCH_CH_PROTOCOL": "http",
        "RANKWATCH_CH_SECURE": "true",
        "RANKWATCH_CH_USER": "ro@x",
        "RANKWATCH_CH_PASSWORD": "s3cr/t",
        "RANKWATCH_CH_DATABASE": "metrics",
    }
    assert datasource_env("http://h")["RANKWATCH_CH_PORT"] == "8123"
    with pytest.raises(ValueError, match="needs a ClickHouse server"):
        datasource_env("chdb://var/chdb")
    with pytest.raises(ValueError) as info:
        datasource_env("tcp://user:SECRET@h:9000")
    assert "SECRET" not in str(info.value)


def test_env_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grafana", "env", "--clickhouse", "http://u:it's@h:1/d"]) == 0
    out = capsys.readouterr().out
    assert "export RANKWATCH_CH_PASSWORD='it'\\''s'" in out
    assert main(["grafana", "env", "--clickhouse", "chdb://x"]) == 2


def test_build_check_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grafana", "build", "--check"]) == 0
    assert capsys.readouterr().out == ""
