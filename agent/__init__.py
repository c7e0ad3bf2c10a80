"""The per-machine metrics agent (``rankwatch agent``) for the faulty-machine detector.

Samples host metrics once a second (CPU, memory, network and disk throughput, ECN
marks from /proc; GPU metrics through NVML when ``pynvml`` imports), or one process's
metrics when asked to treat a process as a machine, tags them with job and host and
publishes ``metrics`` messages to ``<prefix>.metrics``. Standard library and orjson
only; aiokafka and pynvml are imported lazily. Like the hooks, it never blocks on
the network and never dies of a sample it cannot take.
"""

from rankwatch.agent.outbox import KafkaTransport, LinesTransport, Outbox
from rankwatch.agent.runner import Agent, AgentConfig, metrics_message, run_agents
from rankwatch.agent.sampler import HostSampler, ProcessSampler

__all__ = [
    "Agent",
    "AgentConfig",
    "HostSampler",
    "KafkaTransport",
    "LinesTransport",
    "Outbox",
    "ProcessSampler",
    "metrics_message",
    "run_agents",
]
