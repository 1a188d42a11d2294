"""The port plan of a job's Ray cluster: every port Ray opens is explicit, so two jobs on one
node never collide (ray-project/ray#10154; shared/reference/slurm-ray.md §3.6, §5.1).

`vime submit` (vime/launch/submit.py) describes it and the job's nodes (runtime/node/job.py,
runtime/node/ray_bootstrap.py) open its ports. The blocks, the per-node slots and when the
head keeps the spec's ports: docs/design.md, "The ports of a job's Ray cluster".
"""

from __future__ import annotations

import socket
import zlib
from dataclasses import asdict, dataclass

FIRST_BLOCK = 20000
BLOCK = 100
BLOCKS = 120  # 20000 + 120 × 100 = 32000: below the ephemeral range
NODE_SLOTS = 15
NODE_PORTS = ("node_manager_port", "object_manager_port", "runtime_env_agent_port",
              "dashboard_agent_grpc_port", "dashboard_agent_listen_port", "metrics_export_port")


@dataclass(frozen=True)
class NodePorts:
    node_manager_port: int
    object_manager_port: int
    runtime_env_agent_port: int
    dashboard_agent_grpc_port: int
    dashboard_agent_listen_port: int
    metrics_export_port: int

    def ray_start_args(self) -> list[str]:
        return [f"--{name.replace('_', '-')}={port}" for name, port in asdict(self).items()]


@dataclass(frozen=True)
class PortPlan:
    base: int
    gcs_port: int
    client_server_port: int
    dashboard_port: int
    fixed_head_ports: bool  # the spec's port / dashboard_port, kept on exclusive nodes

    def node(self, index: int) -> NodePorts:
        first = self.base + 10 + 6 * (index % NODE_SLOTS)
        return NodePorts(*range(first, first + len(NODE_PORTS)))


def job_number(job_id: str) -> int:
    """Slurm ids are numbers; local and --ray-address runs have names, hashed stably."""
    return int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())


def block_in_use(base: int) -> bool:
    """Whether a process of this machine listens on the head's ports of the block at base
    (GCS, Ray client, dashboard): a job of another id hashed into the same block."""
    for port in (base, base + 1, base + 2):
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                return True
    return False


def plan(job_id: str, ray_port: int, dashboard_port: int, fixed_head_ports: bool) -> PortPlan:
    base = FIRST_BLOCK + (job_number(job_id) % BLOCKS) * BLOCK
    if fixed_head_ports:
        return PortPlan(base, ray_port, base + 1, dashboard_port, True)
    return PortPlan(base, base, base + 1, base + 2, False)


def describe(nodes: int, ray_port: int, dashboard_port: int, fixed_head_ports: bool) -> str:
    """The port plan as `vime submit --dry-run` prints it, before the job id is known."""
    lines = ["Ray port plan (per job; base = 20000 + (job id mod 120) × 100)"]
    if fixed_head_ports:
        lines.append(f"  head: GCS {ray_port}, dashboard {dashboard_port} (cluster.ray; the "
                     "nodes are the job's alone: cluster.slurm.exclusive), Ray client base+1")
    else:
        lines.append("  head: GCS base+0, Ray client base+1, dashboard base+2 (nodes may be "
                     "shared: cluster.ray.port and dashboard_port are not used)")
    for index in range(min(nodes, NODE_SLOTS)):
        first = 10 + 6 * index
        names = ", ".join(f"{n.removesuffix('_port').replace('_', '-')} base+{first + k}"
                          for k, n in enumerate(NODE_PORTS))
        lines.append(f"  node {index}: {names}")
    if nodes > NODE_SLOTS:
        lines.append(f"  node i ≥ {NODE_SLOTS}: the ports of node i mod {NODE_SLOTS} "
                     "(nodes are separate hosts)")
    lines.append("  worker ports: chosen by the OS (ephemeral range, outside every block)")
    return "\n".join(lines) + "\n"
