"""Checks on the dependency model and the level plan the simulator walks.

The simulator processes *levels*: sets of ops whose inputs are all known once the
previous levels are done. A communication group is one unit (its members end only
when all have started), so all members of a group share a level. Walking levels
instead of single ops keeps the Python loop short (the graph's depth, not its size).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from rankwatch.schemas.optypes import CODE
from rankwatch.sim.errors import ModelError
from rankwatch.sim.graph import Level, padded
from rankwatch.sim.naming import list_names


def check_connected(
    n: int, deps: list[list[int]], groups: list[list[int]], labels: list[str]
) -> None:
    """Every op must be tied to every other through edges or groups."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in (*deps[i], *groups[i]):
            a, b = root(i), root(j)
            if a != b:
                parent[a] = b
    parts: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        parts[root(i)].append(i)
    if len(parts) > 1:
        main = max(parts.values(), key=len)
        loose = [labels[i] for part in parts.values() if part is not main for i in part]
        raise ModelError(
            f"the dependency model falls apart into {len(parts)} pieces; "
            f"not connected to the rest: {list_names(loose)}"
        )


def build_levels(
    deps: list[list[int]],
    groups: list[list[int]],
    dp_wide: np.ndarray,
    is_comm: np.ndarray,
    labels: list[str],
) -> tuple[tuple[Level, ...], np.ndarray]:
    """Levels (longest path from the step start) and each op's plan row; rejects cycles."""
    n = len(deps)
    unit_of = list(range(n))
    for i in range(n):
        if groups[i]:
            unit_of[i] = min(groups[i])
    units: dict[int, list[int]] = defaultdict(list)
    for i in range(n):
        units[unit_of[i]].append(i)
    needs = {u: {unit_of[d] for i in ms for d in deps[i]} for u, ms in units.items()}
    level = _longest_path(needs, units, labels)
    by_level: dict[int, list[int]] = defaultdict(list)
    for u, ms in units.items():
        by_level[level[u]].extend(ms)
    kind = np.where(is_comm, np.where(dp_wide, 2, 1), 0)
    size = [len(g) for g in groups]

    def place(i: int) -> tuple[int, int, int, int]:  # compute, then groups by size, id
        return (int(kind[i]), size[i], unit_of[i], i)

    order = [sorted(by_level[k], key=place) for k in sorted(by_level)]
    row = np.empty(n, dtype=np.int64)
    row[np.concatenate([np.asarray(o, dtype=np.int64) for o in order])] = np.arange(n)
    levels, begin = [], 0
    for nodes in order:
        levels.append(_level(np.asarray(nodes, dtype=np.int64), begin, kind, deps, size, row))
        begin += len(nodes)
    return tuple(levels), row


def _longest_path(
    needs: dict[int, set[int]], units: dict[int, list[int]], labels: list[str]
) -> dict[int, int]:
    users: dict[int, list[int]] = defaultdict(list)
    waiting = {}
    for u, ds in needs.items():
        if u in ds:
            names = [labels[i] for i in units[u]]
            raise ModelError(f"ops wait for their own group: {list_names(names)}")
        waiting[u] = len(ds)
        for d in ds:
            users[d].append(u)
    level = {u: 0 for u, c in waiting.items() if c == 0}
    ready = list(level)
    while ready:
        u = ready.pop()
        for v in users[u]:
            level[v] = max(level.get(v, 0), level[u] + 1)
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    stuck = [labels[i] for u, c in waiting.items() if c > 0 for i in units[u]]
    if stuck:
        raise ModelError(f"the dependency model has a cycle through: {list_names(stuck)}")
    return level


def _level(
    nodes: np.ndarray,
    begin: int,
    kind: np.ndarray,
    deps: list[list[int]],
    size: list[int],
    row: np.ndarray,
) -> Level:
    n = row.size
    counts = np.bincount(kind[nodes], minlength=3)
    compute_end = begin + int(counts[0])
    local_end = compute_end + int(counts[1])
    return Level(
        begin=begin,
        compute_end=compute_end,
        local_end=local_end,
        end=begin + nodes.size,
        nodes=nodes,
        compute_deps=padded([row[deps[i]] for i in nodes[: counts[0]].tolist()], n),
        comm_deps=padded([row[deps[i]] for i in nodes[counts[0] :].tolist()], n),
        local_runs=_runs(nodes[counts[0] : counts[0] + counts[1]], compute_end, size),
        wide_runs=_runs(nodes[counts[0] + counts[1] :], local_end, size),
    )


def _runs(nodes: np.ndarray, first: int, size: list[int]) -> tuple[tuple[int, int, int], ...]:
    """(begin, end, group size) of consecutive rows holding groups of one size."""
    runs: list[tuple[int, int, int]] = []
    for offset, node in enumerate(nodes.tolist()):
        k = max(size[node], 1)
        if runs and runs[-1][2] == k and runs[-1][1] == first + offset:
            runs[-1] = (runs[-1][0], first + offset + 1, k)
        else:
            runs.append((first + offset, first + offset + 1, k))
    return tuple(runs)


def final_nodes(optype: np.ndarray, deps: list[list[int]], n: int) -> np.ndarray:
    """The optimizer ops (the step ends with the last of them), else the ops nobody waits for."""
    opt = np.flatnonzero(optype == CODE["optimizer"])
    if opt.size:
        return opt
    used = {d for ds in deps for d in ds}
    return np.asarray([i for i in range(n) if i not in used], dtype=np.int64)
