"""Per-rank hooks that run inside training processes (standard library + orjson only).

::

    import rankwatch.hooks as rw

    rw.init()                                  # identity from RANK/WORLD_SIZE/RANKWATCH_*
    for step in range(steps):
        rw.step_begin(step)
        with rw.op("forward-compute", mb=i, chunk=c):
            ...
        rw.step_end()
        if step % 1000 == 999:
            with rw.phase("checkpoint-save", bound_s=600):   # no hang alert meanwhile
                save(...)

Records leave from a background thread (Kafka via aiokafka, a spool file, or an
in-process sink); the training thread never blocks on I/O. See ``tracker.py`` for the
object API, ``integrations.py`` for PyTorch pipelining stages, optimizer and GC.
"""

from rankwatch.hooks.clock import Clock, OffsetEstimate, estimate_offset
from rankwatch.hooks.identity import Identity, coordinates, identity_from_env
from rankwatch.hooks.publisher import PublisherConfig, PublisherStats
from rankwatch.hooks.session import (
    HooksConfig,
    current,
    init,
    op,
    phase,
    shutdown,
    step_begin,
    step_end,
)
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import KafkaTransport, SinkTransport, SpoolTransport
from rankwatch.schemas.spool import Spool

__all__ = [
    "Clock",
    "HooksConfig",
    "Identity",
    "KafkaTransport",
    "OffsetEstimate",
    "PublisherConfig",
    "PublisherStats",
    "RankWatch",
    "SinkTransport",
    "Spool",
    "SpoolTransport",
    "coordinates",
    "current",
    "estimate_offset",
    "identity_from_env",
    "init",
    "op",
    "phase",
    "shutdown",
    "step_begin",
    "step_end",
]
