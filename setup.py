"""Map the top-level folders into the one import namespace ``rankwatch``.

``hooks/`` becomes ``rankwatch.hooks`` and so on; ``app/`` (the composition root:
CLI and configuration) is ``rankwatch`` itself. It is not called ``rankwatch/``
because from the repo root such a folder would shadow the installed package.

Subpackages are found per folder with ``find_packages`` so a nested package can
never be silently left out of the wheel (tests/unit/test_packaging.py checks the built wheel).
"""

from setuptools import find_packages, setup

FOLDERS = {
    "rankwatch": "app",
    "rankwatch.hooks": "hooks",
    "rankwatch.agent": "agent",
    "rankwatch.workload": "workload",
    "rankwatch.schemas": "schemas",
    "rankwatch.sim": "sim",
    "rankwatch.streams": "streams",
    "rankwatch.grafana": "grafana",
}


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for name, folder in FOLDERS.items():
        packages.append(name)
        package_dir[name] = folder
        for sub in find_packages(where=folder):
            packages.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages()

setup(
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={
        "rankwatch.schemas": ["*.json", "migrations/*.sql"],
        "rankwatch.grafana": ["dashboards/*.json", "provisioning/**/*"],
        "rankwatch.hooks": ["py.typed"],
        "rankwatch": ["py.typed"],
    },
    include_package_data=False,
)
