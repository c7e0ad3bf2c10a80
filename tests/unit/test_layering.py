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

# streams/: one wing per worker over the shell kit. Each wing's __init__ names its shell
# modules (SHELL); every other module of the wing is pure core.
WINGS = ("kit", "ops", "hang", "minder", "slowdown")
PURE_FORBIDDEN = FORBIDDEN["sim"]  # no faust, Kafka, ClickHouse, torch, app
# the wings whose cores may use the engine, and what a wing may import of other wings
# (the kit's pure modules: every wing)
USES_SIM = {"ops"}
USES_WINGS = {"kit": (), "ops": ("slowdown",), "hang": (), "minder": (), "slowdown": ()}


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


def wing_shells(wing: str) -> tuple[str, ...]:
    """The SHELL names of ``streams/<wing>/__init__.py``."""
    tree = ast.parse((ROOT / "streams" / wing / "__init__.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign):
            target = node.targets[0]
        if getattr(target, "id", "") == "SHELL" and node.value is not None:  # type: ignore[union-attr]
            return tuple(ast.literal_eval(node.value))  # type: ignore[union-attr, arg-type]
    raise AssertionError(f"streams/{wing}/__init__.py names no SHELL")


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


def test_streams_is_wings_only() -> None:
    """Every stream module lives in a wing, and every shell a wing names exists."""
    loose = sorted(p.name for p in (ROOT / "streams").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside a wing: {loose}"
    folders = {p.name for p in (ROOT / "streams").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(WINGS)
    for wing in WINGS:
        modules = {p.stem for p in (ROOT / "streams" / wing).glob("*.py")}
        assert set(wing_shells(wing)) <= modules, wing


@pytest.mark.parametrize("wing", WINGS)
def test_each_wing_core_is_pure(wing: str) -> None:
    """A wing's core imports no faust, Kafka, ClickHouse, torch nor any shell module, and
    of the other wings only the kit's core (and what USES_WINGS allows)."""
    shells = {f"rankwatch.streams.{w}.{module}" for w in WINGS for module in wing_shells(w)}
    banned = PURE_FORBIDDEN + (() if wing in USES_SIM else ("rankwatch.sim",))
    allowed_wings = {wing, "kit", *USES_WINGS[wing]}
    offenders = []
    for path in sorted((ROOT / "streams" / wing).glob("*.py")):
        if path.stem in wing_shells(wing):
            continue
        for module in imported_modules(path):
            parts = module.split(".")
            if module in shells or any(module.startswith(s + ".") for s in shells):
                offenders.append(f"{path.name} imports the shell {module}")
            elif parts[:2] == ["rankwatch", "streams"] and len(parts) > 2:
                if parts[2] not in allowed_wings:
                    offenders.append(f"{path.name} imports the wing {module}")
            elif any(module == b or module.startswith(b + ".") for b in banned):
                offenders.append(f"{path.name} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_the_kit_knows_no_wing() -> None:
    offenders = [
        f"{path.name} imports {module}"
        for path in sorted((ROOT / "streams" / "kit").glob("*.py"))
        for module in imported_modules(path)
        if module.split(".")[:2] == ["rankwatch", "streams"]
        and len(module.split(".")) > 2
        and module.split(".")[2] != "kit"
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("wing", [w for w in WINGS if w != "kit"])
def test_a_wing_shell_uses_the_kit_and_its_own_core(wing: str) -> None:
    allowed_wings = {wing, "kit", *USES_WINGS[wing]}
    offenders = [
        f"{path.name} imports {module}"
        for path in sorted((ROOT / "streams" / wing).glob("*.py"))
        if path.stem in wing_shells(wing)
        for module in imported_modules(path)
        if module.split(".")[:2] == ["rankwatch", "streams"]
        and len(module.split(".")) > 2
        and module.split(".")[2] not in allowed_wings
    ]
    assert not offenders, "\n".join(offenders)


def test_the_readme_layout_names_every_folder_wing_and_stream_module() -> None:
    """The README's layout tables match the code: a newcomer finds every worker's files."""
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    missing = [f"{folder}/" for folder in PACKAGES if f"`{folder}/`" not in layout]
    for wing in WINGS:
        if f"`streams/{wing}/`" not in layout:
            missing.append(f"streams/{wing}/")
        for path in sorted((ROOT / "streams" / wing).glob("*.py")):
            if path.name != "__init__.py" and f"`{path.name}`" not in layout:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"not in the README's layout: {missing}"
