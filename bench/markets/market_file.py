"""What every market generator shares: the file's shape and the coordinator's filter.

A market file is JSON Lines, gzip-compressed, one host a line: the fields of a vast.ai
offer as ``vastai search offers --raw`` returns them, plus ``true_rate_per_hour`` (the
host's steady-state proofs/hour), ``measured_rate_per_hour`` (one benchmark of it) and,
where the generator knows its physics, ``oracle_rate_per_hour`` (what an oracle that
knows the hardware physics but no host's own effect would predict). docs/discovery.md
("Markets") describes the format. Every rate in these files is simulated.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The least RAM share (GB, vast.ai's) the coordinator deploys (``VM_MIN_INSTANCE_RAM_GB``'s
#: default); a market holds only offers it would predict and deploy.
MIN_RAM_SHARE_GB = 128.0

#: Offer fields a market line keeps (what the rate model and the planner read, and a
#: few an operator would look at); the rest of vast.ai's fields would only make the file
#: bigger.
KEEP = ("id", "machine_id", "host_id", "num_gpus", "gpu_name", "gpu_ram", "gpu_mem_bw",
        "total_flops", "dlperf", "compute_cap", "cpu_name", "cpu_cores",
        "cpu_cores_effective", "cpu_ghz", "cpu_ram", "disk_bw", "pci_gen", "gpu_lanes",
        "pcie_bw", "inet_down", "inet_up", "dph_total", "reliability", "geolocation",
        "duration")


def ram_share_gb(offer: Mapping[str, Any]) -> float:
    """vast.ai's RAM share of an instance: the host's RAM times its share of the cores."""
    return float(offer["cpu_ram"]) / 1000.0 * min(
        1.0, float(offer["cpu_cores_effective"]) / float(offer["cpu_cores"]))


def write_market(path: Path, lines: Iterable[dict[str, Any]]) -> int:
    """Write the lines (compact JSON, gzip with a fixed mtime so reruns are identical)."""
    import json

    rows = list(lines)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        for row in rows:
            out.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
    return len(rows)
