"""The functional core stays pure: enforced on the import statements of each folder."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# folder -> rankwatch subpackages and third-party modules it must never import
FORBIDDEN = {
    "sim": (
        "rankwatch.streams",
        "rankwatch.hooks",
        "rankwatch.grafana",
        "rankwatch.config",
        "rankwatch.cli",
        "rankwatch.commands",
        "faust",
        "aiokafka",
        "clickhouse_connect",
        "chdb",
        "pyarrow",
        "torch",
    ),
    "schemas": (
        "rankwatch.streams",
        "rankwatch.hooks",
        "rankwatch.sim",
        "faust",
        "aiokafka",
        "clickhouse_connect",
        "chdb",
    ),
    "hooks": (
        "rankwatch.streams",
        "rankwatch.sim",
        "rankwatch.grafana",
        "faust",
        "clickhouse_connect",
        "chdb",
        "numpy",
        "pyarrow",
    ),
}
# pure subpackages living inside a shell folder
FORBIDDEN["streams/minder"] = FORBIDDEN["sim"] + ("rankwatch.sim",)
FORBIDDEN["streams/hang"] = FORBIDDEN["sim"] + ("rankwatch.sim",)
FORBIDDEN["streams/slowdown"] = FORBIDDEN["sim"] + ("rankwatch.sim",)
# modules of the core that may do I/O: shells living beside the pure code
SHELL_MODULES = {"sim/heatmap.py"}  # renders a PNG with matplotlib (imported lazily)
# the real training workload is a torch program, not part of the hooks' import path
EXEMPT_DIRS = ("hooks/workload/",)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_core_folders_do_not_import_shells(folder: str) -> None:
    offenders = []
    own = "rankwatch." + folder.replace("/", ".")
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in SHELL_MODULES or rel.startswith(EXEMPT_DIRS):
            continue
        for module in imported_modules(path):
            if module == own or module.startswith(own + "."):
                continue
            for banned in FORBIDDEN[folder]:
                if module == banned or module.startswith(banned + "."):
                    offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_sim_does_no_io() -> None:
    """No file, socket or clock access in the engine (the heatmap shell aside)."""
    banned_calls = {"open", "print"}
    banned_modules = {"socket", "time", "os", "subprocess", "pathlib"}
    offenders = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        if str(path.relative_to(ROOT)) in SHELL_MODULES:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in banned_calls:
                offenders.append(f"{path.name}:{node.lineno} calls {node.func.id}")  # type: ignore[attr-defined]
        offenders += [
            f"{path.name} imports {m}" for m in imported_modules(path) if m in banned_modules
        ]
    assert not offenders, "\n".join(offenders)
