"""The metric names the host agent sends on ``<prefix>.metrics``: a contract between
the agent (which samples them) and the Minder worker (which refuses, at start, a model
none of whose metrics it will ever receive). Both read the tables here.

Each table maps where a sampler reads a value to the name it sends: host gauges are
read as they are, host and process rates are per-second differences of cumulative
counters (``PROCESS_RATES`` carries the scale: 100 turns CPU seconds per second into
percent of one CPU). NVML metrics are per device, ``gpu<i>_<probe>``.
"""

from __future__ import annotations

import re

HOST_GAUGES = ("cpu_util", "cpu_iowait", "load1", "mem_used_bytes", "mem_util")
HOST_RATES = (
    ("net/dev.rx_bytes", "net_rx_Bps"),
    ("net/dev.tx_bytes", "net_tx_Bps"),
    ("diskstats.read_bytes", "disk_read_Bps"),
    ("diskstats.write_bytes", "disk_write_Bps"),
    ("net/netstat.ce_pkts", "net_ecn_ce_pps"),
)
PROCESS_GAUGES = {"status.rss_bytes": "rss_bytes", "stat.threads": "threads"}
PROCESS_RATES = (
    ("stat.cpu_s", "cpu_util", 100.0),
    ("schedstat.wait_s", "cpu_wait", 100.0),
    ("stat.majflt", "major_faults_ps", 1.0),
    ("stat.minflt", "minor_faults_ps", 1.0),
    ("status.nvcsw", "involuntary_switches_ps", 1.0),
    ("io.read_bytes", "io_read_Bps", 1.0),
    ("io.write_bytes", "io_write_Bps", 1.0),
    ("net/dev.rx_bytes", "net_rx_Bps", 1.0),
    ("net/dev.tx_bytes", "net_tx_Bps", 1.0),
)
RDMA_COUNTERS = {
    # RoCE congestion control (mlx5 hw_counters): CNPs sent as notification point,
    # CNPs handled as reaction point, ECN-marked RoCE packets received
    "hw_counters/np_cnp_sent": "rdma_cnp_sent_ps",
    "hw_counters/rp_cnp_handled": "rdma_cnp_handled_ps",
    "hw_counters/np_ecn_marked_roce_packets": "rdma_ecn_marked_ps",
    # port data counters are in units of 4 bytes
    "counters/port_xmit_data": "rdma_tx_Bps",
    "counters/port_rcv_data": "rdma_rx_Bps",
}
CGROUP_ONLY = ("cpu_throttled_pct",)
"""The container sampler's own metric; its others are named as the process sampler's."""

GPU_PREFIX = re.compile(r"^gpu\d+_")

_NAMES = frozenset(
    [
        *HOST_GAUGES,
        *(dst for _, dst in HOST_RATES),
        *PROCESS_GAUGES.values(),
        *(dst for _, dst, _ in PROCESS_RATES),
        *RDMA_COUNTERS.values(),
        *CGROUP_ONLY,
    ]
)


def agent_metric(name: str) -> bool:
    """Whether the agent (any of its samplers) can send a metric of this name: a model
    trained on other names (ASD's ``m1``...) can score nothing the agent sends."""
    return bool(name in _NAMES or GPU_PREFIX.match(name))


def agent_metric_examples() -> list[str]:
    """A few of the agent's metric names, for an error message."""
    return [*HOST_GAUGES[:2], HOST_RATES[0][1], PROCESS_RATES[3][1], "gpu0_util"]
