"""The wheel holds every module of every folder, mapped into ``rankwatch``.

Guards the classic trap of a folder -> package mapping: a nested subpackage or a data
file (schemas, migrations) silently missing from the built wheel while the editable
install, which reads the source tree, keeps working.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "app": "rankwatch",
    "hooks": "rankwatch/hooks",
    "agent": "rankwatch/agent",
    "workload": "rankwatch/workload",
    "schemas": "rankwatch/schemas",
    "sim": "rankwatch/sim",
    "streams": "rankwatch/streams",
    "grafana": "rankwatch/grafana",
}
DATA_SUFFIXES = {".py", ".json", ".sql"}


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools' build folder keeps the modules of earlier builds: a module moved out of
    # the package (test helpers to tests/support) would still ship
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("rankwatch-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def expected_files() -> set[str]:
    files = set()
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*"):
            rel = path.relative_to(ROOT / folder)
            if path.suffix in DATA_SUFFIXES and "__pycache__" not in rel.parts:
                if folder == "app" and rel.parts[0] in FOLDERS:
                    continue
                files.add(f"{package}/{rel.as_posix()}")
    return files


def test_wheel_contains_every_module_and_contract_file(wheel_names: set[str]) -> None:
    missing = expected_files() - wheel_names
    assert not missing, f"left out of the wheel: {sorted(missing)}"


def test_wheel_holds_nothing_but_the_folders(wheel_names: set[str]) -> None:
    """No module without its source file: test helpers (tests/support) stay out."""
    shipped = {
        name
        for name in wheel_names
        if not name.startswith("rankwatch-") and Path(name).suffix in DATA_SUFFIXES
    }
    extra = shipped - expected_files()
    assert not extra, f"in the wheel without a source file: {sorted(extra)}"


def test_wheel_has_no_bare_top_level_packages(wheel_names: set[str]) -> None:
    tops = {name.split("/")[0] for name in wheel_names if not name.startswith("rankwatch-")}
    assert tops == {"rankwatch"}
