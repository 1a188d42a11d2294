"""The vLLM rollout backend (vLLM 0.26 to 0.33; runtime/backends/vllm_compat.py holds what
differs): one engine = one `vllm.LLM` with the engine arguments vime compiled (`vllm.args`,
checked against vLLM's own parser in tests/oracle/test_vllm.py). `launch` places an engine's
workers on its placement-group bundles; `VllmRolloutBackend` generates, syncs weights (vLLM's
weight-transfer engine, or `update_weights` through runtime/backends/vllm_worker.py) and
sleeps and wakes.

Launch, generation, the two weight paths and the engine core's process: docs/design.md,
"The vLLM rollout backend"; what has run, on which version and machine: docs/vllm.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime.core.interfaces import (
    Generation,
    GenerationRequest,
    RolloutBackend,
    SamplingParams,
    WeightBucket,
)
from runtime.core.slices import EngineSlice

# colocated, an engine's Ray workers take this share of each GPU, as the engine actor does
# (runtime/workers/build.py, slime's numbers)
COLOCATED_WORKER_GPU_SHARE = 0.2


@dataclass(frozen=True)
class RankLaunch:
    """How to start the `LLM` of one vLLM data-parallel rank of an engine."""

    dp_rank: int
    bundles: tuple[int, ...]  # placement-group bundles of its TP workers, in rank order
    nodes: tuple[int, ...]  # the plan's nodes of those bundles
    kwargs: Mapping = field(default_factory=dict)  # over engine_kwargs(vllm.args)
    env: Mapping = field(default_factory=dict)  # set before vllm is imported
    host_gpus: float = 0.0  # GPU share of the actor that holds the LLM object


def launch(slice: EngineSlice, dp_master: tuple[str, int] | None = None,
           worker_share: float = COLOCATED_WORKER_GPU_SHARE) -> list[RankLaunch]:
    """Per vLLM DP rank of the engine: its bundles, LLM keyword arguments and environment.

    A rank's world is its TP workers (vLLM's world_size = TP x PP; vime plans PP = 1), so
    rank i takes the engine's bundles [i*tp, (i+1)*tp). When that is more than one bundle the
    workers are Ray actors placed by VLLM_RAY_BUNDLE_INDICES (the host actor, in the same
    placement group with child-task capture, holds no GPU); one bundle keeps vLLM's
    in-process executor and the host takes the GPU share itself. dp > 1 adds vLLM's offline
    DP variables (vllm/config/parallel.py reads VLLM_DP_* when data_parallel_size is 1);
    `dp_master` is rank 0's address, known only at run time. The slice of one DP rank
    (EngineSlice.for_dp_rank, what each rank's host starts with) gives that rank alone, with
    the slice's own dp_master."""
    share = worker_share if slice.colocated else 1.0
    if slice.dp_rank is not None:
        if len(slice.gpus) != slice.tp:
            raise ValueError(f"engine {slice.engine}, DP rank {slice.dp_rank}: "
                             f"{len(slice.gpus)} GPUs for tp {slice.tp}")
        ranks = [slice]
    else:
        if slice.bundles and len(slice.bundles) != slice.tp * slice.dp:
            raise ValueError(f"engine {slice.engine}: {len(slice.bundles)} bundles for tp "
                             f"{slice.tp} x dp {slice.dp}")
        ranks = [slice.for_dp_rank(r, dp_master) for r in range(slice.dp)]
    return [_rank_launch(rank, share) for rank in ranks]


def _rank_launch(rank: EngineSlice, share: float) -> RankLaunch:
    bundles, dp_rank = rank.bundles, rank.dp_rank
    kwargs: dict = {"tensor_parallel_size": rank.tp}
    env: dict[str, str] = {}
    host_gpus = share
    if len(bundles) > 1:
        kwargs["distributed_executor_backend"] = "ray"
        env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, bundles))
        if share != 1.0:
            env["VLLM_RAY_PER_WORKER_GPUS"] = repr(share)
        host_gpus = 0.0
    if rank.dp > 1:
        kwargs["data_parallel_size"] = 1  # LLM refuses more; the DP size travels in env
        env.update(VLLM_DP_RANK=str(dp_rank), VLLM_DP_RANK_LOCAL="0",
                   VLLM_DP_SIZE=str(rank.dp))
        if rank.dp_master is not None:
            env.update(VLLM_DP_MASTER_IP=rank.dp_master[0],
                       VLLM_DP_MASTER_PORT=str(rank.dp_master[1]))
    nodes = tuple(sorted({node for node, _ in rank.gpus}))
    return RankLaunch(dp_rank or 0, bundles, nodes, kwargs, env, host_gpus)


def weight_transfer_backend(slice: EngineSlice, kwargs: Mapping) -> str:
    """The weight-transfer backend the engine starts with: the user's
    (--weight-transfer-config in inference.extra_args), else "ipc" when the engine shares its
    GPUs with the actor, "nccl" when it does not."""
    configured = kwargs.get("weight_transfer_config")
    if configured is not None:
        return configured["backend"] if isinstance(configured, dict) else configured.backend
    return "ipc" if slice.colocated else "nccl"


def weight_path(backend: str, actor_on_cuda: bool, every_rank_holds_all: bool,
                same_process: bool = False) -> str:
    """"ipc" / "nccl" (vLLM's transfer engine) or "collective_rpc" (the fallback): vLLM's
    trainer engines need the actor's tensors on a CUDA device, IPC needs every actor rank to
    hold every tensor (each rank shares its copies with the worker on its GPU) and the engine
    in another process (CUDA IPC cannot open a handle in the process that made it; in one
    process the fallback hands the tensors over as they are)."""
    if not actor_on_cuda or backend not in ("ipc", "nccl"):
        return "collective_rpc"
    if backend == "ipc" and (not every_rank_holds_all or same_process):
        return "collective_rpc"
    return backend


def engine_kwargs(args: Sequence[str]) -> dict:
    """vime's vllm.args -> the keyword arguments of `vllm.LLM`, through vLLM's own parser."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(list(args)))
    defaults = EngineArgs(model=engine_args.model)
    return {name: value for name, value in vars(engine_args).items()
            if value != getattr(defaults, name, object()) or name == "model"}


def sampling_params(params: SamplingParams, request: GenerationRequest):
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams(
        n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids), seed=request.seed, logprobs=0,
        detokenize=False, skip_special_tokens=False)


def to_generation(completion, want_routes: bool) -> Generation:
    """A vLLM CompletionOutput -> vime's Generation (sampled tokens, their log-probs, routes)."""
    tokens = list(completion.token_ids)
    if completion.logprobs is None:
        raise ValueError("vLLM returned no log-probs: SamplingParams(logprobs=0) was not honoured")
    log_probs = [float(completion.logprobs[i][token].logprob) for i, token in enumerate(tokens)]
    routes = None
    if want_routes:
        if completion.routed_experts is None:
            raise ValueError("routed experts asked for but not returned: the engine needs "
                             "--enable-return-routed-experts")
        routes = np.asarray(completion.routed_experts).astype(np.int32)
    finish = "length" if completion.finish_reason == "length" else "stop"
    return Generation(token_ids=tokens, log_probs=log_probs, finish_reason=finish,
                      routed_experts=routes)


WORKER_EXTENSION = "runtime.backends.vllm_worker.VimeWorkerExtension"


class VllmRolloutBackend(RolloutBackend):
    def __init__(self):
        self.llm = None
        self.version = 0
        self.asleep = False
        self.slept_since_generate = False  # vLLM's sleep dropped the prefix cache since
        self.updating = False  # a fallback round is open on the workers
        self.transfer_backend: str | None = None
        self.mode = ""

    def start(self, slice: EngineSlice) -> None:
        """One `LLM`: the whole engine when dp is 1, else the DP rank of `slice.dp_rank`
        (each rank has its own host, runtime/workers/dp_engine.py)."""
        ranks = launch(slice)
        if len(ranks) > 1:
            raise ValueError(
                f"engine {slice.engine}: vLLM data parallelism ({slice.dp} ranks) needs one "
                "LLM per DP rank (LLM(data_parallel_size > 1) raises outside "
                "external_launcher); start each rank from its slice "
                "(EngineSlice.for_dp_rank), as runtime/workers/dp_engine.py does")
        rank = ranks[0]
        os.environ.update(rank.env)
        if rank.kwargs.get("distributed_executor_backend") == "ray":
            # the workers get their GPUs from their bundles; the host's own mask would hide them
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        kwargs = {**engine_kwargs(slice.args), **rank.kwargs}
        from runtime.backends import vllm_compat

        if kwargs.get("enable_return_routed_experts"):
            # 0.32+ capture them in the V2 model runner only; 0.26 in the V1 runner only (its
            # V2 refuses: "Model Runner V2 does not yet support: routed experts capture")
            os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER",
                                  "1" if vllm_compat.routed_experts_need_v2_runner() else "0")
        from vllm import LLM
        from vllm.config import WeightTransferConfig

        self.slice = slice
        backend = weight_transfer_backend(slice, kwargs)
        if backend in vllm_compat.transfer_backends():
            self.transfer_backend = backend
            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=backend)
        else:  # no trainer side vime drives on this vLLM: the fallback (vllm_compat)
            self.transfer_backend = None
            kwargs.pop("weight_transfer_config", None)
        if kwargs.get("worker_extension_cls", WORKER_EXTENSION) != WORKER_EXTENSION:
            raise ValueError(
                f"inference.extra_args sets --worker-extension-cls "
                f"{kwargs['worker_extension_cls']!r}; vime's engines need their own "
                f"({WORKER_EXTENSION}) for weight updates: remove it from extra_args")
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
        self.multiprocess = vllm_compat.multiprocess_engine()
        self.mode = (f"vLLM {vllm_compat.version()}, engine core "
                     + ("in its own process" if self.multiprocess else "in-process")
                     + f", weight transfer {self.transfer_backend or 'collective_rpc'}")
        print(f"vime: engine {slice.engine}: {self.mode}", flush=True)
        self.llm = LLM(**kwargs)

    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        if self.asleep:
            raise RuntimeError("generate() while the engine sleeps: wake() first")
        self.slept_since_generate = False
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        outputs = self.llm.generate(prompts, [sampling_params(params, r) for r in requests],
                                    use_tqdm=False)
        return [to_generation(out.outputs[0], params.return_routed_experts) for out in outputs]

    def update_weights(self, bucket: WeightBucket) -> None:
        """The fallback path, bucket by bucket: one layerwise-reload round per version on
        every worker (runtime/backends/vllm_worker.py), closed by the last bucket."""
        from runtime.backends import vllm_compat, vllm_worker

        if bucket.tensors:
            if not self.updating:
                self.llm.collective_rpc("vime_start_update")
                self.updating = True
            payload = (vllm_worker.pack(bucket.tensors) if self.multiprocess
                       else dict(bucket.tensors))
            self.llm.collective_rpc("vime_load", args=(payload,))
        if bucket.last:
            if self.updating:
                self.llm.collective_rpc("vime_finish_update")
                self.updating = False
            vllm_compat.set_weight_version(self.llm, str(bucket.version))
            self.version = bucket.version
            self._forget_cached_prefixes()

    def weight_version(self) -> int:
        return self.version

    # vLLM's weight-transfer engine, driven by the actor's side (vllm_weights.EngineClient)

    def world_size(self) -> int:
        """Workers of this engine (TP x PP x DP): its ranks in an NCCL transfer group."""
        return self.llm.get_world_size(include_dp=True)

    def init_weight_transfer(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def receive_weights(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, version: int | None = None) -> None:
        from runtime.backends import vllm_compat

        vllm_compat.finish_weight_update(self.llm, None if version is None else str(version))
        if version is not None:
            self.version = version
        self._forget_cached_prefixes()

    def _forget_cached_prefixes(self) -> None:
        """Drop vLLM's prefix cache after new weights when the engine has not slept since it
        last generated: the cache keeps the KV of prompts' full blocks computed with the
        weights before, and a prompt seen again would start from them (vLLM's sleep drops the
        cache itself). Seen on an H200 with the engine resident: the actor/engine log-prob gap
        went from 0.004 to 0.13-0.20 per token after the first push, and stayed at 0.003-0.004
        where the engine slept between (docs/gpu-runs.md)."""
        if not self.slept_since_generate:
            self.llm.reset_prefix_cache()

    def shutdown_weight_transfer(self) -> None:
        """Release the trainer connection (before a new rendezvous, after an engine of the
        group was replaced)."""
        from runtime.backends import vllm_compat

        vllm_compat.shutdown_weight_transfer(self.llm)

    def set_weight_version(self, version: int) -> None:
        from runtime.backends import vllm_compat

        vllm_compat.set_weight_version(self.llm, str(version))
        self.version = version

    def fingerprints(self, names: Sequence[str]) -> list[dict]:
        """Per worker, {name: (dtype, sha256)} of those parameters (runtime/core/weights.py)."""
        return self.llm.collective_rpc("vime_fingerprints", args=(list(names),))

    def sleep(self, level: int = 1) -> None:
        self.llm.sleep(level=level)
        self.asleep = self.slept_since_generate = True

    def wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        self.llm.wake_up(tags=list(tags))
        self.asleep = False

    def stop(self) -> None:
        self.llm = None

