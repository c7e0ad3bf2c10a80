"""The functional core stays pure: enforced on the import statements of each folder."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The parts of the app (the composition root, ``rankwatch`` itself): no other folder
# imports them.
APP = ("rankwatch.cli", "rankwatch.commands", "rankwatch.config")
STORAGE = ("faust", "aiokafka", "clickhouse_connect", "chdb", "pyarrow")

# folder -> rankwatch subpackages and third-party modules it must never import.
# Every top-level source folder has an entry (test_every_folder_is_covered).
FORBIDDEN = {
    "sim": (
        "rankwatch.streams",
        "rankwatch.hooks",
        "rankwatch.grafana",
        "rankwatch.agent",
        "rankwatch.workload",
        *APP,
        *STORAGE,
        "matplotlib",
        "torch",
    ),
    "schemas": (
        "rankwatch.streams",
        "rankwatch.hooks",
        "rankwatch.sim",
        "rankwatch.grafana",
        "rankwatch.agent",
        "rankwatch.workload",
        *APP,
        "faust",
        "aiokafka",
        "clickhouse_connect",
        "chdb",
        "torch",
    ),
    # what runs inside each training process: standard library, orjson, schemas
    "hooks": (
        "rankwatch.streams",
        "rankwatch.sim",
        "rankwatch.grafana",
        "rankwatch.agent",
        "rankwatch.workload",
        *APP,
        "faust",
        "clickhouse_connect",
        "chdb",
        "numpy",
        "pyarrow",
        "torch",
    ),
    # the per-machine metrics agent: standard library and orjson (aiokafka, pynvml lazily)
    "agent": (
        "rankwatch.streams",
        "rankwatch.sim",
        "rankwatch.grafana",
        "rankwatch.hooks",
        "rankwatch.workload",
        *APP,
        "faust",
        "clickhouse_connect",
        "chdb",
        "numpy",
        "pyarrow",
        "torch",
    ),
    # the training job: torch and the hooks; its analysis is the app's (rankwatch.validation)
    "workload": (
        "rankwatch.streams",
        "rankwatch.sim",
        "rankwatch.grafana",
        "rankwatch.agent",
        *APP,
        *STORAGE,
    ),
    # the stream workers: pure cores (below) and their shells
    "streams": (
        "rankwatch.hooks",
        "rankwatch.grafana",
        "rankwatch.agent",
        "rankwatch.workload",
        *APP,
    ),
    "grafana": (
        "rankwatch.hooks",
        "rankwatch.agent",
        "rankwatch.workload",
        *APP,
        "faust",
        "torch",
    ),
    # the composition root may import every part, but never torch: it starts the
    # workload as processes (rankwatch.workload.launch), it does not train
    "app": (
        "rankwatch.workload.train",
        "rankwatch.workload.model",
        "rankwatch.workload.clocksync",
        "torch",
    ),
}
# pure subpackages living inside a shell folder
FORBIDDEN["streams/minder"] = FORBIDDEN["sim"] + ("rankwatch.sim",)
FORBIDDEN["streams/hang"] = FORBIDDEN["sim"] + ("rankwatch.sim",)
FORBIDDEN["streams/slowdown"] = FORBIDDEN["sim"] + ("rankwatch.sim",)


def wheel_folders() -> dict[str, str]:
    """folder -> package, as setup.py's FOLDERS maps them into the wheel."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FOLDERS":
            return {folder: package for package, folder in ast.literal_eval(node.value).items()}
    raise AssertionError("setup.py has no FOLDERS")


PACKAGES = wheel_folders()


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
    top, _, sub = folder.partition("/")
    # the app is ``rankwatch`` itself: every import would count as its own
    own = PACKAGES[top] + ("." + sub.replace("/", ".") if sub else "") if top != "app" else "-"
    for path in sorted((ROOT / folder).rglob("*.py")):
        for module in imported_modules(path):
            if module == own or module.startswith(own + "."):
                continue
            for banned in FORBIDDEN[folder]:
                if module == banned or module.startswith(banned + "."):
                    offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_every_folder_is_covered() -> None:
    """Each top-level source folder of the wheel has its forbidden list: no exemptions."""
    assert set(PACKAGES) == {f for f in FORBIDDEN if "/" not in f}


def test_sim_does_no_io() -> None:
    """No file, socket or clock access in the engine."""
    banned_calls = {"open", "print"}
    banned_modules = {"socket", "time", "os", "subprocess", "pathlib"}
    offenders = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in banned_calls:
                offenders.append(f"{path.name}:{node.lineno} calls {node.func.id}")  # type: ignore[attr-defined]
        offenders += [
            f"{path.name} imports {m}" for m in imported_modules(path) if m in banned_modules
        ]
    assert not offenders, "\n".join(offenders)
