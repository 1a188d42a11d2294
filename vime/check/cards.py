"""V927-V928: what the card named in cluster.gpu can do and how many of it a node holds."""

from __future__ import annotations

import re

from vime.check.registry import Finding, rule
from vime.resolve import gpu_name
from vime.resolve.spec import Spec

# Cards of compute capability below 8.0 (NVIDIA's CUDA GPUs table): no bfloat16.
NO_BF16 = {"V100": "7.0", "TITAN-V": "7.0", "T4": "7.5", "RTX-2080": "7.5",
           "QUADRO-RTX": "7.5", "P100": "6.0", "P40": "6.1", "P4": "6.1", "K80": "3.7",
           "M60": "5.2"}

# GPUs per node of the systems the cards come in: an HGX or DGX board holds 8; a GB200 or
# GB300 compute tray of an NVL72 rack holds 4 (2 Grace CPUs, 4 Blackwell GPUs).
GPUS_PER_NODE = {"H100": 8, "H800": 8, "H20": 8, "H200": 8, "A100-80GB": 8, "A100-40GB": 8,
                 "A800": 8, "B200": 8, "GB200": 4, "GB300": 4}


def _older_card(written: str) -> tuple[str, str] | None:
    """(card, compute capability) for a card without bfloat16, as people write it
    ("V100", "Tesla V100-SXM2-32GB", "NVIDIA T4")."""
    name = re.sub(r"^(NVIDIA|TESLA)-", "", written.strip().upper().replace("_", "-")
                  .replace(" ", "-"))
    name = re.sub(r"^(NVIDIA|TESLA)-", "", name)
    for card, capability in NO_BF16.items():
        if name == card or name.startswith(card + "-") or (
                card.startswith(("RTX", "QUADRO")) and name.startswith(card)):
            return card, capability
    return None


def _trains_in_bf16(spec: Spec) -> bool:
    return spec.train.backend == "megatron" or spec.inference.backend == "vllm"


@rule("V927", "card-supports-bf16", enforced_by="vllm")
def card_supports_bf16(spec: Spec):
    """cluster.gpu names a card without bfloat16 (compute capability below 8.0).

    vime runs the Megatron actor with --bf16 and vLLM with --dtype bfloat16 (megatron.args,
    vllm.args). A V100, T4 or older card has no bfloat16 arithmetic: vLLM stops when the
    engine starts, "Bfloat16 is only supported on GPUs with compute capability of at least
    8.0. Your Tesla V100-SXM2-32GB GPU has compute capability 7.0.", after the queue wait.
    Not checked for the torch backends, which run where they are put.
    Fix: a card of compute capability 8.0 or newer (A100, H100, L40S, ...) in cluster.gpu
    and in the partition (cluster.slurm.partition or constraint) the job runs on."""
    if not _trains_in_bf16(spec):
        return
    older = _older_card(spec.cluster.gpu)
    if older:
        card, capability = older
        yield Finding("cluster.gpu", f"cluster.gpu = {spec.cluster.gpu!r}: the {card} has "
                      f"compute capability {capability}, and bfloat16, which vime trains and "
                      "generates in, needs 8.0 or newer: vLLM stops at start",
                      help="a partition of A100, H100, H200, B200 or L40S cards, and its name "
                      "in cluster.gpu", related=("cluster.slurm.partition",))


@rule("V928", "gpus-per-node-of-card-system", severity="warning", enforced_by="slurm")
def gpus_per_node_of_card_system(spec: Spec):
    """cluster.gpus_per_node is more than a node of cluster.gpu's system holds.

    The cards come in systems of a fixed size: an HGX or DGX board of H100, H200, H800, H20,
    A100, A800 or B200 holds 8 GPUs, and a GB200 or GB300 node (a compute tray of an NVL72
    rack) holds 4. Slurm refuses a job asking for more GPUs per node than any node has
    ("sbatch: error: Requested node configuration is not available"), and the plan's layout
    (tp and engines within a node, the memory per node) is for nodes that do not exist. A
    warning: a system vime does not know may hold more.
    Fix: cluster.gpus_per_node = the GPUs of one node (the help line says how many), and
    cluster.nodes for the rest."""
    card = gpu_name(spec.cluster.gpu)
    most = GPUS_PER_NODE.get(card or "")
    if most is not None and spec.cluster.gpus_per_node > most:
        world = spec.cluster.nodes * spec.cluster.gpus_per_node
        yield Finding("cluster.gpus_per_node",
                      f"cluster.gpus_per_node = {spec.cluster.gpus_per_node}, but a "
                      f"{card} node holds {most} GPUs", related=("cluster.gpu",),
                      help=f"cluster.gpus_per_node = {most}" + (
                          f" and cluster.nodes = {world // most} for the same {world} GPUs"
                          if world % most == 0 else ""))
