"""V9xx: what the runtime's backends (runtime/backends/) and its loss can run."""

from __future__ import annotations

from vime.check.registry import Finding, rule
from vime.resolve.spec import Spec


def _uses_torch(spec: Spec) -> bool:
    return "torch" in (spec.train.backend, spec.inference.backend)


@rule("V901", "torch-backend-one-node", enforced_by="vime")
def torch_backend_one_node(spec: Spec):
    """The torch backends run on one node.

    The torch pair (train.backend / inference.backend = "torch") is the small pair for
    toy runs and tests (runtime/backends/): one process per rank and per engine, gloo
    between the ranks on CPU, the tokenizer it builds written where the driver runs. It
    has only ever run on one node; across nodes nothing of it is tested, so vime refuses
    the plan rather than let a job find out after the queue wait.
    Fix: cluster.nodes = 1 (more GPUs per node are fine), or the megatron / vllm backends."""
    if _uses_torch(spec) and spec.cluster.nodes > 1:
        yield Finding("cluster.nodes",
                      f"the torch backend runs on one node; the cluster has {spec.cluster.nodes}",
                      help="cluster.nodes = 1, or train.backend = \"megatron\" and "
                      "inference.backend = \"vllm\"",
                      related=("train.backend", "inference.backend"))


@rule("V902", "torch-backend-data-parallel-only", enforced_by="vime")
def torch_backend_data_parallel_only(spec: Spec):
    """The torch backends have no model parallelism: one device per rank and per engine.

    The torch training backend keeps a whole model replica per rank and averages
    gradients over the ranks (data parallelism); it does not split layers (tp, sequence
    parallelism), stages (pp), sequences (cp) or experts (ep, etp). The torch rollout
    engine runs on one device. runtime/backends/torch_train.py refuses such a plan at
    start-up ("the torch training backend is data parallel only").
    Fix: train.parallel tp = pp = cp = ep = etp = 1 and inference.gpus_per_engine = 1, or
    the megatron / vllm backends."""
    if spec.train.backend == "torch":
        par = spec.train.parallel
        for name in ("tp", "pp", "cp", "ep", "etp"):
            size = getattr(par, name)
            if size != 1:
                yield Finding(f"train.parallel.{name}",
                              f"the torch training backend is data parallel only; {name} = {size}",
                              help=f"train.parallel.{name} = 1", related=("train.backend",))
                break
    if spec.inference.backend == "torch" and spec.inference.gpus_per_engine != 1:
        yield Finding("inference.gpus_per_engine",
                      f"a torch rollout engine runs on one device; gpus_per_engine = "
                      f"{spec.inference.gpus_per_engine}",
                      help="inference.gpus_per_engine = 1 (more engines instead)",
                      related=("inference.backend",))


@rule("V903", "random-init-needs-torch-rollout", enforced_by="vime")
def random_init_needs_torch_backends(spec: Spec):
    """model.random_init is implemented by the torch rollout backend and the training backends.

    With random_init the torch backends build the model from its architecture with
    experiment.seed instead of loading weights (the Megatron training backend maps those same
    seeded weights into its GPTModel, so both sides start from one policy), and the driver
    builds a tokenizer from the prompts. vLLM loads model.hf_checkpoint and cannot start from
    random weights.
    Fix: set random_init = false and point model.hf_checkpoint at real weights, or use
    inference.backend = "torch"."""
    if not spec.model.random_init:
        return
    for key, value in (("inference.backend", spec.inference.backend),):
        if value != "torch":
            yield Finding("model.random_init",
                          f"random_init is implemented by the torch backends; {key} = {value!r}",
                          help=f"model.random_init = false, or {key} = \"torch\"",
                          related=(key,))
            return


@rule("V904", "tis-clip-order", enforced_by="vime")
def tis_clip_order(spec: Spec):
    """Truncated importance sampling needs tis_clip_low below tis_clip.

    Each token's TIS weight pi_train / pi_rollout is truncated to [tis_clip_low, tis_clip]
    (runtime/core/algorithm.py); an empty interval would give every token the same constant
    weight, silently turning the correction off.
    Fix: tis_clip_low < tis_clip (slime's defaults are 0 and 2)."""
    algo = spec.algorithm
    if algo.tis and algo.tis_clip_low >= algo.tis_clip:
        yield Finding("algorithm.tis_clip_low",
                      f"tis_clip_low = {algo.tis_clip_low} is not below tis_clip = {algo.tis_clip}",
                      help="tis_clip_low = 0 and tis_clip = 2", related=("algorithm.tis_clip",))


@rule("V905", "megatron-backend-no-pp-cp", severity="warning", enforced_by="vime")
def megatron_backend_no_pp_cp(spec: Spec):
    """The Megatron training backend runs without pipeline parallelism.

    vime's Megatron backend (runtime/backends/megatron_train.py) splits the model by tensor
    parallelism with sequence parallelism (tp), experts (ep, etp), sequences (cp, with the
    keys and values all-gathered over the context-parallel group) and data parallelism; it
    has no pipeline schedule, so a plan with pp > 1 fails when the actors start ("the
    Megatron backend runs pp = 1"). (The backend runs context parallelism; the rule's name
    still says cp because rule names are fixed once published.)
    A warning, not an error: the layout is valid for megatron-core, and the plan, the
    arguments and the memory are still right; it is vime's runtime that cannot run it yet.
    Fix: train.parallel.pp = 1; use tp (with sequence_parallel), cp, ep and etp, or more
    data parallel ranks, to fit the model."""
    if spec.train.backend != "megatron":
        return
    size = spec.train.parallel.pp
    if size != 1:
        yield Finding("train.parallel.pp",
                      f"vime's Megatron backend has no pipeline parallelism (pp = {size}): "
                      "the job would stop when its training actors start",
                      help="train.parallel.pp = 1 (tp, cp, ep and etp split the model)",
                      related=("train.backend",))
