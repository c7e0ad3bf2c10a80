"""The what-if engine (docs/whatif.md): pure numpy, no I/O.

Offline, over a whole trace::

    analysis = rankwatch.sim.analyse(trace, meta)
    analysis.slowdown, analysis.attribution("stage"), analysis.to_json()

Online, per job (stream workers)::

    graph = infer_graph(first_complete_step, meta)      # once, cached per job
    workspace = Workspace()                              # once per thread: scratch memory
    measured = measure_trace(graph, step_trace)          # each new complete step
    window = window.push(graph, measured)                # RollingIdeal, pure
    result = analyse_measured(graph, measured, window.ideal(), workspace)
    # or: analyse_step(graph, step_trace, window.ideal(), workspace)
    # several steps closed at once, each with its own window's ideal, in one pass:
    results = analyse_each(graph, measured_of_steps, ideals, workspace)

All paths run the same code over one or many steps.
Traces that cannot be modelled raise :class:`ModelError` naming the ops.
"""

from rankwatch.sim.analysis import (
    Analysis,
    analyse,
    analyse_each,
    analyse_measured,
    analyse_step,
    measure_trace,
    slowdown_of,
    waste_of,
)
from rankwatch.sim.durations import Measured
from rankwatch.sim.errors import ModelError
from rankwatch.sim.graph import OpGraph
from rankwatch.sim.ideal import IdealCosts, RollingIdeal, ideal_costs
from rankwatch.sim.inference import infer_graph
from rankwatch.sim.trace import JobMeta, Trace, TraceError
from rankwatch.sim.workspace import Workspace

__all__ = [
    "Analysis",
    "IdealCosts",
    "JobMeta",
    "Measured",
    "ModelError",
    "OpGraph",
    "RollingIdeal",
    "Trace",
    "TraceError",
    "Workspace",
    "analyse",
    "analyse_each",
    "analyse_measured",
    "analyse_step",
    "ideal_costs",
    "infer_graph",
    "measure_trace",
    "slowdown_of",
    "waste_of",
]
