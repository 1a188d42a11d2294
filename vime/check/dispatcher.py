"""V309-V311: the MoE token dispatcher (train.moe_token_dispatcher) and its flex backend's
kernels: expert parallelism to dispatch over, a card they run on, the package on the nodes."""

from __future__ import annotations

from vime import doctor
from vime.check.registry import Finding, rule
from vime.resolve import gpu_name
from vime.resolve.spec import Spec

# Cards whose GPUs of a node have no NVLink between them: DeepEP's intranode buffer needs
# "NVLink with full directed CUDA peer access between every pair of participating intranode
# GPUs" (deepseek-ai/DeepEP README.md, Requirements; docs/legacy.md for the Buffer
# megatron-core uses), and validates the peer matrix when it allocates the buffer.
NO_NVLINK = {"L40S": "PCIe only, no NVLink"}


def _flex(spec: Spec) -> bool:
    return spec.train.moe_token_dispatcher == "flex"


def _setting(spec: Spec) -> str:
    return (f'moe_token_dispatcher = "flex" (moe_flex_backend = '
            f'"{spec.train.moe_flex_backend}")')


@rule("V309", "flex-dispatcher-needs-expert-parallelism", enforced_by="megatron")
def flex_dispatcher_needs_expert_parallelism(spec: Spec):
    """The flex token dispatcher with DeepEP needs an MoE model spread over several ranks.

    megatron-core's flex dispatcher sends each token over one group of the expert
    tensor-parallel and expert-parallel ranks. With the DeepEP backend it asserts, when the
    first MoE layer is built, "DeepEP dispatcher requires TPxEP > 1"
    (megatron/core/transformer/moe/token_dispatcher.py, MoEFlexTokenDispatcher; TP there is
    the expert tensor-parallel group): with etp × ep = 1 there is no rank to send tokens to,
    and the job stops when the actors start. A dense model builds no dispatcher, so the
    setting does nothing there (vime reports it rather than ignore it).
    Fix: moe_token_dispatcher = "alltoall", or an ep (or etp) above 1."""
    if not _flex(spec):
        return
    par = spec.train.parallel
    if spec.arch is not None and not spec.arch.is_moe:
        yield Finding("train.moe_token_dispatcher", f"{_setting(spec)}, but the model "
                      f"({spec.arch.model_type}) has no experts to dispatch tokens to",
                      help='moe_token_dispatcher = "alltoall"')
    elif spec.train.moe_flex_backend == "deepep" and par.ep * par.etp == 1:
        yield Finding("train.moe_token_dispatcher", f"{_setting(spec)} with ep = {par.ep} "
                      f"and etp = {par.etp}: megatron-core stops the job at start, \"DeepEP "
                      "dispatcher requires TPxEP > 1\"",
                      help='moe_token_dispatcher = "alltoall", or train.parallel.ep > 1',
                      related=("train.parallel.ep", "train.parallel.etp"))


@rule("V310", "flex-dispatcher-card", enforced_by="deepep")
def flex_dispatcher_card(spec: Spec):
    """cluster.gpu names a card the flex dispatcher's kernels do not run on.

    DeepEP (and HybridEP, from its hybrid-ep branch) runs on Ampere (SM80) and Hopper
    (SM90) GPUs, or architectures with SM90 PTX support, connected by NVLink within a
    node: "NVLink with full directed CUDA peer access between every pair of participating
    intranode GPUs" (deepseek-ai/DeepEP README.md and docs/legacy.md, Requirements). An
    L40S node has its GPUs on PCIe alone, and DeepEP refuses the partial peer topology
    when it allocates its buffer, after the queue wait.
    Fix: moe_token_dispatcher = "alltoall" (NCCL, any card), or a partition of NVLink
    cards (A100, H100, H200, H800, H20)."""
    if not _flex(spec):
        return
    card = gpu_name(spec.cluster.gpu)
    if card in NO_NVLINK:
        yield Finding("train.moe_token_dispatcher", f"{_setting(spec)} on {card} cards "
                      f"({NO_NVLINK[card]}): DeepEP needs NVLink between a node's GPUs",
                      help='moe_token_dispatcher = "alltoall"', related=("cluster.gpu",))


@rule("V311", "deep-ep-installed", severity="warning", enforced_by="vime")
def deep_ep_installed(spec: Spec):
    """The flex dispatcher's package, deep_ep, is not installed where vime runs.

    megatron-core imports DeepEP's Buffer (HybridEPBuffer for hybridep) from the deep_ep
    package when the flex dispatcher builds its first MoE layer, and stops without it
    ("DeepEP is not installed."). vime's Megatron backend looks for it first, on every
    training rank, and stops the job at start naming train.moe_token_dispatcher
    (runtime/megatron/model.py, choose_dispatcher). vime looks for the package in the
    Python it runs in, which `vime submit` runs on every node, without importing it (it
    needs CUDA); `vime doctor SPEC` imports it. A warning: a job on a Ray cluster of its
    own (--ray-address) runs that cluster's Python.
    Fix: build and install DeepEP (github.com/deepseek-ai/DeepEP) against this torch and
    CUDA in the job's environment, or moe_token_dispatcher = "alltoall"."""
    if not _flex(spec):
        return
    package = doctor.BY_MODULE["deep_ep"]
    [found] = doctor.installed([package])
    if found.version is None:
        yield Finding("train.moe_token_dispatcher", f"{_setting(spec)}, but deep_ep is not "
                      "installed in this Python, which the job runs on every node: the "
                      "training ranks would stop at start",
                      help=f'{package.install}; or moe_token_dispatcher = "alltoall"')
