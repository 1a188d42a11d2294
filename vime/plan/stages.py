"""The pipeline's stages: the decoder layers each of pp stages builds and the micro-batches
each holds at the 1F1B schedule's peak. Pure arithmetic on the spec.

The split is megatron-core's (transformer/transformer_block.py, get_num_layers_to_build, and
transformer_layer.py, get_transformer_layer_offset; 0.19.2): layers ÷ pp on every stage, or
with --decoder-first/last-pipeline-num-layers the given counts on the first and last stage
and the rest split evenly over the stages between. vime/check/layout.py judges a split (V205,
V209), vime/plan/memory.py charges each stage its own layers, vime/plan/__init__.py and the
renderers name the busiest.
"""

from __future__ import annotations

from dataclasses import dataclass

from vime.resolve.spec import Spec


@dataclass(frozen=True)
class LayerSplit:
    """Decoder layers per stage, or why megatron-core refuses the split."""

    layers: tuple[int, ...]  # empty when refused
    problem: str | None = None


def split_layers(num_layers: int, pp: int, first: int | None = None,
                 last: int | None = None) -> LayerSplit:
    """The layers of each of pp stages, as get_num_layers_to_build builds them.

    Without first and last every stage holds num_layers ÷ pp ("Number of layers should be
    divisible by the pipeline-model-parallel size", validate_args). With either, those stages
    hold what is given and the middle stages the rest, evenly: TransformerConfig raises
    "Mismatch: N middle layers remaining but M middle PP stages available" when one side is
    zero and "number of layers at middle stage: N must be divisible by the middle pipeline
    model parallel size M" otherwise. A negative rest that megatron-core's modulo lets
    through (94 − 97 = −3 over 3 middle stages) builds no model: refused here too. pp = 1
    with first or last is V209's to refuse.
    """
    if first is None and last is None:
        if num_layers % pp:
            return LayerSplit((), f"{num_layers} layers do not split evenly over {pp} stages")
        return LayerSplit((num_layers // pp,) * pp)
    given = [count for count in (first, last) if count is not None]
    middle_stages = pp - len(given)
    middle_layers = num_layers - sum(given)
    if pp < 2 or middle_stages < 0:
        return LayerSplit((), f"an uneven first or last stage needs pp ≥ 2 (pp = {pp})")
    if min(given) < 1:  # the schema's minimum; TransformerConfig: "must be larger than 0"
        return LayerSplit((), "a stage needs at least 1 layer")
    if middle_stages == 0:
        if middle_layers:
            return LayerSplit((), f"first + last stage = {sum(given)} layers, but the model has "
                              f"{num_layers} and pp = {pp} leaves no stage between them")
        return LayerSplit((first, last))
    if middle_layers < middle_stages or middle_layers % middle_stages:
        other = "middle stage" if middle_stages == 1 else f"{middle_stages} middle stages"
        return LayerSplit((), f"{num_layers} layers − {' − '.join(map(str, given))} = "
                          f"{middle_layers} layers do not split evenly over the {other}")
    each = middle_layers // middle_stages
    layers = [each] * pp
    if first is not None:
        layers[0] = first
    if last is not None:
        layers[-1] = last
    return LayerSplit(tuple(layers))


def describe_split(layers: tuple[int, ...]) -> str:
    """A stage split as plan lines and help lines write it: 24 + 24 + 24 + 22, or a long one
    6 + 6 × 6 + 6 (the middle stages hold the same)."""
    if len(layers) <= 6:
        return " + ".join(map(str, layers))
    middle = layers[1:-1]
    return f"{layers[0]} + {middle[0]} × {len(middle)} + {layers[-1]}"


def spec_split(spec: Spec) -> LayerSplit:
    """split_layers of the spec's model and train.parallel (needs spec.arch)."""
    par = spec.train.parallel
    return split_layers(spec.arch.num_layers, par.pp, par.first_stage_layers,
                        par.last_stage_layers)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage as the memory plan charges it."""

    index: int
    first_layer: int  # the index of its first decoder layer
    num_layers: int
    num_moe_layers: int
    embedding: bool  # the word embeddings (the first stage)
    output: bool  # the final norm, the output layer and the loss head (the last stage)
    in_flight: int  # micro-batches whose activations it holds at the schedule's peak

    @property
    def last_layer(self) -> int:
        return self.first_layer + self.num_layers - 1


def micro_batches_per_step(spec: Spec) -> int | None:
    """Micro-batches per optimizer step on each data-parallel rank: global batch ÷
    (micro_batch_size × dp); None with dynamic_batch, where each step packs its own number."""
    train, dp = spec.train, spec.derived.dp
    if train.dynamic_batch or dp < 1:
        return None
    return train.global_batch_size // (train.micro_batch_size * dp)


def most_micro_batches(spec: Spec) -> int:
    """The most micro-batches a step can have on one data-parallel rank: the static count, or
    with dynamic_batch one a sample (a micro-batch holds at least one)."""
    static = micro_batches_per_step(spec)
    if static is not None:
        return max(static, 1)
    return max(spec.train.global_batch_size // max(spec.derived.dp, 1), 1)


def in_flight(stage: int, pp: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage `stage` of pp holds at 1F1B's peak: its warm-up
    forwards, min(pp − stage − 1, m), and the steady state's first forward when micro-batches
    are left for it (megatron/core/pipeline_parallel/schedules.py,
    forward_backward_pipelining_without_interleaving: num_warmup_microbatches)."""
    return min(pp - stage, micro_batches)


def stages(spec: Spec) -> tuple[Stage, ...] | None:
    """Every stage of the spec's pipeline; None without an architecture or when the split is
    refused (V205, V209 say why). One stage, the whole model, at pp = 1."""
    if spec.arch is None:
        return None
    split = spec_split(spec)
    if split.problem:
        return None
    pp = len(split.layers)
    micro_batches = most_micro_batches(spec)
    moe = spec.arch.moe_layers
    out, start = [], 0
    for index, count in enumerate(split.layers):
        out.append(Stage(index, start, count, sum(moe[start:start + count]),
                         embedding=index == 0, output=index == pp - 1,
                         in_flight=in_flight(index, pp, micro_batches)))
        start += count
    return tuple(out)


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """The share of a step a 1F1B stage waits: (pp − 1) ÷ (m + pp − 1) for m micro-batches."""
    return (pp - 1) / (micro_batches + pp - 1)


@dataclass(frozen=True)
class Pipeline:
    """The pipeline's stages and the micro-batch arithmetic of one optimizer step."""

    stages: tuple[Stage, ...]
    micro_batches: int | None  # per step on each dp rank; None with dynamic_batch
    most_micro_batches: int  # the static count, or with dynamic_batch one a sample
    full_length_micro_batches: int | None  # dynamic_batch: when every sample is max length

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def bubble(self) -> float | None:
        """The idle share of a step with the static count; None with dynamic_batch."""
        return None if self.micro_batches is None else bubble_fraction(self.pp, self.micro_batches)


def pipeline(spec: Spec) -> Pipeline | None:
    """The spec's pipeline (pp > 1 only); None at pp = 1 or where stages() is None."""
    if spec.train.parallel.pp < 2:
        return None
    found = stages(spec)
    if found is None:
        return None
    full = None
    if spec.train.dynamic_batch:
        # a micro-batch takes samples while their tokens fit max_tokens_per_gpu
        # (runtime/backends/torch_train.py, _micro_batches): max-length ones fit this many
        length = spec.rollout.max_prompt_len + spec.rollout.sample_tokens
        per_micro = max(spec.train.max_tokens_per_gpu // length, 1)
        full = -(-most_micro_batches(spec) // per_micro)
    return Pipeline(found, micro_batches_per_step(spec), most_micro_batches(spec), full)
