"""Reading a labelled server group from disk: one ``*.npz`` per server, any names.

The format is that of the ASD dataset (``docs/minder.md``): per server ``train``
[rows, K] and ``test`` [rows, K] float arrays and ``test_label`` [rows]; optionally
``train_time`` and ``test_time`` [rows] integer timestamps (any unit shared by the
group). Servers may have different numbers of rows; they are aligned on time
(:mod:`rankwatch.streams.minder.series`), never on row numbers. No torch here: detection
with a trained model reads groups too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rankwatch.streams.minder.series import Split, make_split
from rankwatch.streams.minder.study import Group, group_from_splits


class GroupFileError(ValueError):
    """A group file that cannot be read or whose arrays do not fit together."""


def group_files(directory: Path) -> list[Path]:
    """The server files of a directory in server order, numbers in names compared as
    numbers (omi-2 before omi-10, node9 before node10). Any names: the study's dataset
    is one of many in this layout, and another's servers are named otherwise. A server
    file is an ``.npz`` with a ``train`` or ``test`` array; others there (a trained
    model written beside its data) are not servers."""
    files = sorted((p for p in directory.glob("*.npz") if _is_server(p)), key=_natural)
    if not files:
        raise GroupFileError(f"{directory}: no *.npz server files there")
    return files


def _is_server(path: Path) -> bool:
    try:
        with np.load(path, allow_pickle=False) as z:
            return bool({"train", "test"} & set(z.files))
    except (OSError, ValueError):
        return True  # a server file that cannot be read is an error, said when read


def _natural(path: Path) -> list[tuple[int, int | str]]:
    return [
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", path.name)
    ]


def read_server(path: Path) -> tuple[Split, Split]:
    """One server's (train, test) splits."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise GroupFileError(f"{path.name}: cannot read: {exc}") from exc
    missing = [k for k in ("train", "test", "test_label") if k not in arrays]
    if missing:
        raise GroupFileError(f"{path.name}: no {', '.join(missing)} array")
    try:
        train = make_split(arrays["train"], "train", arrays.get("train_time"))
        test = make_split(arrays["test"], "test", arrays.get("test_time"), arrays["test_label"])
    except ValueError as exc:
        raise GroupFileError(f"{path.name}: {exc}") from exc
    return train, test


def load_group(directory: Path) -> tuple[Group, list[str]]:
    """The group in a directory, on common time grids, and its server names."""
    files = group_files(directory)
    timed = []
    for f in files:
        with np.load(f, allow_pickle=False) as z:
            timed.append(("train_time" in z.files, "test_time" in z.files))
    if len(set(timed)) > 1:
        raise GroupFileError(f"{directory}: some servers have timestamps, others not")
    servers = [read_server(f) for f in files]
    try:
        group = group_from_splits([s[0] for s in servers], [s[1] for s in servers])
    except ValueError as exc:
        raise GroupFileError(f"{directory}: {exc}") from exc
    return group, [f.stem for f in files]
