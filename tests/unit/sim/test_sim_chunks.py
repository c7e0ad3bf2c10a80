"""Memory-bounded offline analysis: chunks, narrow columns and step numbering change no
figure (benchmarks/README.md, "Offline analysis of a 1,024-worker job")."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from rankwatch.sim import Trace, Workspace, analyse, analyse_step, infer_graph, measure_trace
from rankwatch.sim import analysis as analysis_module
from rankwatch.sim import durations as durations_module
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace

CFG = GenConfig(
    dp=4,
    pp=4,
    microbatches=8,
    steps=5,
    noise=0.05,
    launch_delay_s=1e-4,
    stragglers=(Straggler(1, 2, 1.6),),
)


@pytest.fixture(scope="module")
def job():
    return generate_trace(CFG)


@pytest.fixture(scope="module")
def reference(job) -> dict:
    trace, meta = job
    return analyse(trace, meta).to_json()


def with_columns(trace: Trace, **columns: np.ndarray) -> Trace:
    return replace(trace, **columns)


@pytest.mark.parametrize(
    ("chunk_bytes", "chunk_cells"), [(1, 1), (40_000, 300), (1 << 30, 1 << 30)]
)
def test_any_chunk_size_gives_the_same_figures(
    job, reference, monkeypatch, chunk_bytes: int, chunk_cells: int
) -> None:
    """1 byte: one scenario on one step per simulation, one step per measured chunk."""
    monkeypatch.setattr(analysis_module, "_MAX_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(durations_module, "_CHUNK_CELLS", chunk_cells)
    trace, meta = job
    assert analyse(trace, meta).to_json() == reference


def test_int32_columns_give_the_same_figures(job, reference) -> None:
    trace, meta = job
    narrow = Trace(
        **{
            f.name: getattr(trace, f.name).astype(np.int32)
            if getattr(trace, f.name).dtype == np.int64
            else getattr(trace, f.name)
            for f in fields(Trace)
        }
    )
    assert narrow.step.dtype == np.int32
    assert analyse(narrow, meta).to_json() == reference


@pytest.mark.parametrize("numbers", [(3, 5, 6, 9, 10), (0, 10**9, 10**9 + 1, 2 * 10**9, 3 * 10**9)])
def test_step_numbers_with_gaps_give_the_same_figures(job, reference, numbers) -> None:
    """Gapped numbers take the lookup table, sparse ones the sort: the same figures."""
    trace, meta = job
    renumbered = with_columns(trace, step=np.asarray(numbers, dtype=np.int64)[trace.step])
    result = analyse(renumbered, meta).to_json()
    assert result["layout"] == reference["layout"]
    old = [str(s) for s in range(CFG.steps)]
    new = [str(s) for s in numbers]
    for key in ("base", "simulated", "ideal"):
        ours = result["step_time"][key]  # type: ignore[index]
        theirs = reference["step_time"][key]  # type: ignore[index]
        assert [ours[n] for n in new] == [theirs[o] for o in old]
    for key in ("slowdown", "launch_slowdown", "M_W", "M_S", "attribution", "replay_error"):
        assert result[key] == reference[key], key


def test_clamped_costs_and_delays_are_made_from_the_exact_ones(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    measured = measure_trace(graph, trace)
    np.testing.assert_array_equal(measured.cost_NSD, np.maximum(measured.exact_cost_NSD, 0))
    np.testing.assert_array_equal(measured.delay_NSD, np.maximum(measured.exact_delay_NSD, 0))
    assert measured.cost_NSD is measured.cost_NSD  # made once


def test_a_workspace_serves_larger_then_smaller_jobs(job) -> None:
    """Buffers grow to the largest call; a smaller one gets a view of them."""
    trace, meta = job
    small_cfg = replace(CFG, dp=2, pp=2, microbatches=4, steps=2, stragglers=())
    small, small_meta = generate_trace(small_cfg)
    workspace = Workspace()
    for t, m in ((trace, meta), (small, small_meta), (trace, meta)):
        graph = infer_graph(t, m)
        first = t.select(t.step == t.step.min())
        ideal = analyse(t, m).ideal
        fresh = analyse_step(graph, first, ideal).to_json()
        assert analyse_step(graph, first, ideal, workspace).to_json() == fresh
    held = workspace.nbytes
    graph = infer_graph(small, small_meta)
    analyse_step(graph, small.select(small.step == 0), analyse(small, small_meta).ideal, workspace)
    assert workspace.nbytes == held


DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "stragglers"


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no shipped traces at {DATA}")
def test_the_shipped_trace_in_small_chunks_gives_the_same_figures(monkeypatch) -> None:
    """SE has no-op records (left out without a copy of the trace) and 43 steps."""
    from rankwatch.traceio import read_meta, read_trace

    trace, meta = read_trace(DATA / "trace-SE.parquet"), read_meta(DATA / "meta-SE.yaml")
    whole = analyse(trace, meta).to_json()
    monkeypatch.setattr(analysis_module, "_MAX_CHUNK_BYTES", 200_000)
    monkeypatch.setattr(durations_module, "_CHUNK_CELLS", 5_000)
    assert analyse(trace, meta).to_json() == whole


@pytest.mark.parametrize("chunk_cells", [1, 1 << 30])
def test_measuring_in_place_gives_the_same_costs(job, monkeypatch, chunk_cells: int) -> None:
    from rankwatch.sim.align import align
    from rankwatch.sim.durations import measure

    monkeypatch.setattr(durations_module, "_CHUNK_CELLS", chunk_cells)
    trace, meta = job
    graph = infer_graph(trace, meta)
    times = align(graph, trace)
    apart = measure(graph, times)
    together = measure(graph, times, in_place=True)
    assert together.exact_cost_NSD is times.duration_NSD
    for name in ("exact_cost_NSD", "exact_delay_NSD", "base_S", "steps"):
        np.testing.assert_array_equal(getattr(together, name), getattr(apart, name), err_msg=name)
