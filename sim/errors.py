"""The one error of the what-if engine: a trace its dependency model cannot represent."""

from __future__ import annotations


class ModelError(ValueError):
    """The trace cannot be modelled (missing or extra ops, a cycle, a split graph...).

    The message names the offending ops as ``<optype>_<seq_id>_<stage>`` with the
    pipelining shorthand in brackets for compute ops (``2F0`` = stage 2, forward,
    microbatch 0), so a reader can find them in the trace.
    """
