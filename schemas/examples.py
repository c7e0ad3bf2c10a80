"""Valid example messages of every kind, for tests here and in the other packages.

Each call returns a fresh object, so a test may mutate it. Overrides replace fields.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.optypes import CODE

T0_NS = 1_732_000_000_000_000_000
"""2024-11-19T07:06:40Z, a round aligned-clock time."""


_OPS_HEADER: dict[str, Any] = {
    "job": "job-1",
    "host": "node-3",
    "rank": 5,
    "dp_rank": 1,
    "pp_rank": 2,
    "tp_rank": 0,
    "cp_rank": 0,
    "dp_size": 2,
    "pp_size": 4,
    "batch_seq": 17,
    "sent_ns": T0_NS + 10**9,
}
"""The header fields of the example ops batch, shared by its message and OpBatch forms."""


def example(kind: str, /, **overrides: Any) -> dict[str, Any]:
    """A valid message of ``kind`` (version 1)."""
    return {"schema": kind, "version": 1, **_BODIES[kind](), **overrides}


def example_batch(n: int = 8, *, extras: bool = False, **overrides: Any) -> OpBatch:
    """A valid op batch of ``n`` records of one rank: alternating forward/backward ops."""
    fwd, bwd = CODE["forward-compute"], CODE["backward-compute"]
    columns: dict[str, Any] = {
        "step": np.full(n, 3, dtype=np.int64),
        "optype": np.where(np.arange(n) % 2 == 0, fwd, bwd).astype(np.int8),
        "seq_id": np.arange(n, dtype=np.int64),
        "mb_id": np.arange(n, dtype=np.int64) // 2,
        "chunk": np.zeros(n, dtype=np.int64),
        "gmc": np.zeros(n, dtype=np.int64),
        "start_ns": T0_NS + np.arange(n, dtype=np.int64) * 1_000_000,
        "duration_ns": np.full(n, 900_000, dtype=np.int64),
    }
    if extras:
        columns["bytes"] = np.zeros(n, dtype=np.int64)
        columns["flops"] = np.full(n, 1.5e12)
        columns["stream"] = np.array(["compute"] * n, dtype=object)
    return OpBatch(**{**_OPS_HEADER, **columns, **overrides})


def _ops() -> dict[str, Any]:
    return {
        **_OPS_HEADER,
        "ops": {
            "step": [3, 3],
            "optype": ["forward-compute", "forward-send"],
            "seq_id": [0, 1],
            "mb_id": [0, -1],
            "chunk": [0, -1],
            "gmc": [0, -1],
            "start_ns": [T0_NS, T0_NS + 1_000_000],
            "duration_ns": [900_000, 50_000],
        },
        "extra": {"bytes": [0, 4_194_304], "stream": ["compute", "pp"]},
        "steps_done": [{"step": 2, "n_ops": 412}],
    }


def _heartbeats() -> dict[str, Any]:
    return {
        "job": "job-1",
        "host": "node-3",
        "rank": 5,
        "dp_rank": 1,
        "pp_rank": 2,
        "tp_rank": 0,
        "cp_rank": 0,
        "sent_ns": T0_NS + 5 * 10**9,
        "step": 3,
        "in_flight": {"optype": "forward-recv", "seq_id": 12, "mb_id": 4, "since_ns": T0_NS},
        "last_done": {"optype": "forward-compute", "seq_id": 11, "step": 3, "end_ns": T0_NS},
        "pid": 4242,
        "phase": {"name": "checkpoint-save", "since_ns": T0_NS, "bound_s": 600.0},
    }


def _stacks() -> dict[str, Any]:
    return {
        "job": "job-1",
        "host": "node-3",
        "rank": 5,
        "sent_ns": T0_NS + 60 * 10**9,
        "reason": "forward-recv in flight for 60 s",
        "threads": [
            {
                "name": "MainThread",
                "thread_id": 140_000_000_001,
                "native": False,
                "frames": [
                    {"file": "train.py", "line": 120, "function": "main"},
                    {"file": "schedule.py", "line": 77, "function": "recv_forward"},
                ],
            }
        ],
    }


def _metrics() -> dict[str, Any]:
    return {
        "job": "job-1",
        "host": "node-3",
        "ts_ns": T0_NS,
        "metrics": {"cpu_util": 41.5, "gpu0_sm_clock": 1410, "nic0_rx_bytes": 1.2e9},
    }


def _steps() -> dict[str, Any]:
    return {
        "job": "job-1",
        "step": 3,
        "start_ns": T0_NS,
        "t_base": 1.92,
        "t_sim": 1.90,
        "t_ideal": 1.52,
        "slowdown": 1.25,
        "waste": 0.2,
        "partial": False,
        "missing_workers": [],
        "n_ops": 4096,
        "top_attribution": {"dimension": "stage", "group": "3", "slowdown": 1.18},
    }


def _alerts() -> dict[str, Any]:
    return {
        "alert_id": "hang:job-1:1",
        "job": "job-1",
        "kind": "hang",
        "state": "firing",
        "severity": "critical",
        "ts_ns": T0_NS + 120 * 10**9,
        "summary": "job-1 hung at step 3: rank 5 (dp 1, pp 2) stopped in forward-recv",
        "evidence": {"culprit_ranks": [5], "waiting_ranks": [0, 1, 2, 3]},
    }


def _signals() -> dict[str, Any]:
    return {
        "job": "job-1",
        "step": 3,
        "rank": 5,
        "host": "node-3",
        "dp_rank": 1,
        "pp_rank": 2,
        "start_ns": T0_NS,
        "t_step": 1.0,
        "t_inter": 0.1,
        "v_inter": 0.1,
        "v_minority": 0.05,
        "throughput": 64.0,
        "flops_per_s": 3.2e14,
        "busbw": 1.1e11,
        "gc_s": 0.002,
        "gc_count": 1,
        "data_wait_s": 0.05,
        "issue_p50_us": None,
        "issue_p99_us": None,
        "anomalies": [],
    }


def rank_step(**overrides: Any) -> dict[str, Any]:
    """A valid ``rank_steps`` item of an ops v2 message (one rank, one step)."""
    return {
        "step": 3,
        "begin_ns": T0_NS + 100_000_000,
        "end_ns": T0_NS + 1_000_000_000,
        "prev_end_ns": T0_NS,
        "covered_ns": 850_000_000,
        "samples": 64,
        "gc_ns": 2_000_000,
        "gc_count": 1,
        "data_wait_ns": 50_000_000,
        "issue": None,
        "ops": [
            {"optype": "forward-compute", "n": 4, "time_ns": 300_000_000, "flops": 3.0e12},
            {
                "optype": "grads-reduce-scatter",
                "n": 1,
                "time_ns": 100_000_000,
                "bytes": 400_000_000,
                "group": 4,
                "algo": "all-reduce",
            },
        ],
        **overrides,
    }


def _jobstate() -> dict[str, Any]:
    return {
        "job": "job-1",
        "layout": [2, 4],
        "closed": [[0, 2]],
        "first_seen_ns": T0_NS,
        "hosts": ["node-3"],
        "coordinates": [[5, 1, 2, 0, 0]],
        "stored_batches": [[5, 17, 3]],
        "window": [{"step": 2, "count": [8.0, 8.0], "total": [0.4, 0.8], "median": [0.05, None]}],
        "slowdowns": [[2, 1.25]],
        "leaders": [{"step": 2, "dimension": "stage", "group": "3", "slowdown": 1.18}],
        "last_top": {"step": 2, "dimension": "stage", "group": "3", "slowdown": 1.18},
        "last_alert": None,
        "detector": None,
    }


_BODIES = {
    "ops": _ops,
    "heartbeats": _heartbeats,
    "stacks": _stacks,
    "metrics": _metrics,
    "steps": _steps,
    "alerts": _alerts,
    "signals": _signals,
    "jobstate": _jobstate,
}
