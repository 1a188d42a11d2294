"""The Megatron training backend: megatron-core's GPTModel (runtime/megatron/model.py), its
DistributedDataParallel and distributed optimizer, the GRPO loss of runtime/core/algorithm.py, and
rollout routing replay through megatron-core's RouterReplay. Every rank is one Ray actor in
megatron-core's groups with the plan's tp, cp, ep, etp and dp; pp > 1 is refused (V905).

Batching, log-prob picking and the loss are the torch backend's
(runtime/backends/torch_train.py, through its hooks _forward, _vocabulary_group, _begin_step,
_before_backward and _finish_step); the model, the optimizer and the device memory handling
are Megatron's. Layouts, weights, data, the loss head and packed micro-batches:
docs/design.md, "The Megatron training backend".
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from runtime.backends.torch_train import (
    PAD,
    TorchTrainingBackend,
    packed_response_positions,
    response_positions,
    sampling_top_p,
)
from runtime.core import hf_folder
from runtime.core.interfaces import TrainBatch
from runtime.core.slices import TrainSlice
from runtime.megatron import shards, torch_dist
from runtime.megatron.mapping import MegatronView, tensor_to_hf, unfuse_experts
from runtime.megatron.model import (
    agree_on_impl,
    build_gpt,
    choose_dispatcher,
    choose_transformer_impl,
    cp_slots,
    transformer_config,
)
from runtime.megatron.routing import (
    ReplayLayout,
    batch_routes,
    moe_layer_routes,
    packed_routes,
    per_layer,
)
from vime.resolve.model import arch_from_config

# megatron-core's default optimizer layout (dp_reshardable since 0.14; the older
# fully_sharded_model_space is refused with "ShardedTensor.flattened_range is not supported")
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def packing(pack_sequences: bool, cp: int) -> tuple[bool, str]:
    """(whether a micro-batch's samples go forward packed into one row, why): the spec's
    train.pack_sequences, except under context parallelism, where megatron-core's THD
    attention is Transformer Engine's (its rotary and load-balanced chunks are per segment)
    and the local spec's attention gathers whole padded rows (runtime/megatron/model.py)."""
    if not pack_sequences:
        return False, "train.pack_sequences = false"
    if cp > 1:
        return False, f"cp = {cp}: packed sequences under context parallelism are not laid out"
    return True, "train.pack_sequences = true"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _optimizer_options(opt) -> dict:
    """The spec's train.optimizer as megatron-core's OptimizerConfig options beyond lr, betas
    and decay. CPU Adam (cpu_offload): the whole optimizer on the host (HybridDeviceOptimizer,
    torch's AdamW there), fp32 main weights and moments with it; megatron-core needs no
    Transformer Engine for it (OptimizerConfig returns before its FusedAdam check when
    optimizer_cpu_offload is set). precision_aware without CPU Adam is passed on as written:
    megatron-core then runs Transformer Engine's FusedAdam and refuses to start without it
    ("--use-precision-aware-optimizer requires FusedAdam from TransformerEngine"), as V214
    warns. The distributed optimizer is always on (V215)."""
    if opt.cpu_offload:
        return dict(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                    use_precision_aware_optimizer=True, decoupled_weight_decay=True,
                    overlap_cpu_optimizer_d2h_h2d=opt.overlap_cpu_optimizer_d2h_h2d)
    return dict(use_precision_aware_optimizer=True) if opt.precision_aware else {}


def lr_scheduler(optimizer, opt):
    """megatron-core's OptimizerParamScheduler over `optimizer`'s param groups for the spec's
    schedule (train.optimizer: lr, lr_warmup_iters, lr_decay_style, lr_decay_iters, min_lr),
    one scheduler step per optimizer step, warmup from 0 (Megatron's --lr-warmup-init) and the
    weight decay constant. It sets step 0's learning rate at once; runtime/core/lr_schedule.py
    is the same curve for the torch backend."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=opt.lr, min_lr=opt.min_lr,
        lr_warmup_steps=opt.lr_warmup_iters, lr_decay_steps=opt.lr_decay_iters,
        lr_decay_style=opt.lr_decay_style, start_wd=opt.weight_decay, end_wd=opt.weight_decay,
        wd_incr_steps=opt.lr_decay_iters, wd_incr_style="constant")


def _head_inputs(hidden_states, output_layer, output_weight, **_context):
    """GPTModel's output_processor: instead of the logits, the final hidden states [b, s, h] of
    this rank's positions and the weight [V / tp, h] the output layer multiplies them by (the
    embedding's when tied). Under sequence parallelism the output layer gathers its input over
    the tensor group; so does this, with megatron-core's gather (backward: the ranks' parts of
    the gradient summed, reduce-scatter), and without it its input is copied to the group
    (backward: all-reduce), as the output layer's own backward does."""
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    weight = output_layer.weight if output_weight is None else output_weight
    group = output_layer.tp_group
    if output_layer.sequence_parallel:
        hidden_states = gather_from_sequence_parallel_region(
            hidden_states, tensor_parallel_output_grad=True, group=group)
    elif group.size() > 1:
        hidden_states = copy_to_tensor_model_parallel_region(hidden_states, group=group)
    return hidden_states.transpose(0, 1), weight


class MegatronTrainingBackend(TorchTrainingBackend):
    # ------------------------------------------------------------------------------- init

    def init(self, slice: TrainSlice) -> None:
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.module import Float16Module

        tp, cp, ep, etp = (slice.parallel[k] for k in ("tp", "cp", "ep", "etp"))
        if slice.parallel["pp"] != 1:
            raise NotImplementedError(  # also V905 at compile time
                f"the Megatron backend runs pp = 1; the plan has pp = {slice.parallel['pp']}")
        dispatcher = choose_dispatcher(slice.moe_token_dispatcher, slice.moe_flex_backend)
        self.slice = slice
        self.device = torch.device("cuda", torch.cuda.current_device())
        if not dist.is_initialized():
            port = slice.master_port or _free_port()  # 0: one in-process rank (tests)
            dist.init_process_group("nccl", init_method=f"tcp://{slice.master_addr}:{port}",
                                    rank=slice.rank, world_size=slice.world_size)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=tp, context_parallel_size=cp,
                expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.tp_rank, self.tp = parallel_state.get_tensor_model_parallel_rank(), tp
        self.cp_group = parallel_state.get_context_parallel_group()
        self.cp_rank, self.cp = parallel_state.get_context_parallel_rank(), cp
        model_parallel_cuda_manual_seed(slice.model.seed)
        torch.manual_seed(slice.model.seed)
        self.arch = arch_from_config(dict(slice.model.arch))
        self.impl, why = choose_transformer_impl(slice.transformer_impl)
        agree_on_impl(self.impl, why)
        if slice.rank == 0:
            print(f"vime: train.transformer_impl = {slice.transformer_impl}: {self.impl} ({why})",
                  flush=True)
        self.config = transformer_config(
            self.arch, slice.recompute, tensor_model_parallel_size=tp,
            context_parallel_size=cp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
            sequence_parallel=tp > 1, calculate_per_token_loss=True,
            moe_enable_routing_replay=slice.routing_replay and self.arch.is_moe, **dispatcher,
            moe_grouped_gemm=self.impl == "transformer_engine" and self.arch.is_moe)
        self.gpt = build_gpt(self.arch, self.config, self.arch.max_position_embeddings,
                             impl=self.impl).cuda()
        self._load_initial_weights(slice.model)
        self.model = DistributedDataParallel(
            self.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                       use_distributed_optimizer=True),
            Float16Module(self.config, self.gpt))
        opt = slice.optimizer
        # With Transformer Engine installed (whichever layer spec), megatron-core's "adam" is
        # TE's FusedAdam. Without TE or Apex it is torch.optim.AdamW, which megatron-core builds
        # without `fused`: torch's foreach path then, several passes over every parameter and
        # moment (67 ms of a 4-layer Qwen3-30B-A3B slice's 326 ms of GPU work on an H200,
        # docs/gpu-runs.md) and 4 bytes per parameter held during the step (measured: docs/gpu-runs.md,
        # "torch's fused AdamW in the backend").
        # _fuse_adam switches it to torch's fused kernel, one pass.
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=opt.lr, weight_decay=opt.weight_decay,
                            adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2,
                            min_lr=opt.min_lr, clip_grad=opt.clip_grad or 0.0, bf16=True,
                            params_dtype=torch.bfloat16, use_distributed_optimizer=True,
                            **_optimizer_options(opt)),
            [self.model])
        self._fuse_adam()
        self.lr_scheduler = lr_scheduler(self.optimizer, opt)
        self.params = dict(self.gpt.named_parameters())
        self.ref = ({n: p.detach().to("cpu", copy=True) for n, p in self.params.items()}
                    if slice.needs_ref else None)
        self.temperature = slice.temperature if slice.temperature > 0 else 1.0
        self.top_p = sampling_top_p(slice)
        self.packed, why = packing(slice.pack_sequences, cp)
        if slice.rank == 0:
            print(f"vime: micro-batches {'packed into one row' if self.packed else 'padded'} "
                  f"({why})", flush=True)
        self.offloaded = False
        self._host = None  # the HostMirror (runtime/backends/offload.py) of the first offload
        # replayed routes the actor's own routers also pick, counted in the actor log-prob
        # pass (the weights the engine generated with) and reported with the next step
        self._route_counts = torch.zeros(2, dtype=torch.int64, device=self.device)
        self._counting_routes = False
        self._routed_rows: torch.Tensor | None = None  # which replayed rows vLLM routed
        if self.config.moe_enable_routing_replay:
            self._watch_replayed_routes()

    @classmethod
    def over(cls, model, gpt, arch, config, slice, *, packed: bool, temperature: float = 1.0,
             top_p: float = 1.0, device: torch.device | None = None):
        """A backend of one rank (tp = cp = 1) whose log-probs and train step run `model`, a
        callable over `gpt` that this process built itself, with no process group, optimizer
        or checkpoint: benchmarks and oracle tests compare its paths with the bare model.
        `slice` needs the fields the compute paths read (routing_replay, dynamic_batch,
        micro_batch_size, max_tokens_per_gpu, loss, world_size, rank); a subclass gives
        _begin_step and _finish_step."""
        backend = cls()
        backend.slice, backend.model, backend.gpt = slice, model, gpt
        backend.device = device or torch.device("cpu")
        backend.tp = backend.cp = 1
        backend.tp_rank = backend.cp_rank = 0
        backend.arch, backend.config, backend.packed = arch, config, packed
        backend.temperature, backend.top_p = temperature, top_p
        backend.params = dict(gpt.named_parameters())
        backend.ref = None
        backend._route_counts = torch.zeros(2, dtype=torch.int64, device=backend.device)
        backend._counting_routes, backend._routed_rows = False, None
        if slice.routing_replay:
            backend._watch_replayed_routes()  # counts into this backend while it counts
        return backend

    def _watch_replayed_routes(self) -> None:
        """Wrap each router's replayed top-k: while counting, also compute the router's own
        top-k from the same scores and count the replayed experts that are among them."""
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        backend = self
        for replay in RouterReplay.global_router_replay_instances:
            replayed_topk = replay.get_replay_topk

            def counted(scores, topk, num_groups=None, group_topk=None,
                        default_compute_topk=None, _replayed=replayed_topk, _replay=replay):
                probs, indices = _replayed(scores, topk, num_groups, group_topk,
                                           default_compute_topk)
                if backend._counting_routes and \
                        _replay.router_replay_action == RouterReplayAction.REPLAY_FORWARD:
                    _own, natural = default_compute_topk(scores, topk, num_groups=num_groups,
                                                         group_topk=group_topk)
                    hits = (indices.unsqueeze(-1) == natural.unsqueeze(-2)).any(-1)
                    rows = backend._routed_rows  # not the copies on last tokens and padding
                    if rows is None:
                        rows = torch.ones(hits.shape[0], dtype=torch.bool, device=hits.device)
                    rows = rows.unsqueeze(-1)
                    backend._route_counts += torch.stack(
                        [(hits & rows).sum(), rows.sum() * hits.shape[-1]])
                return probs, indices

            replay.get_replay_topk = counted

    def log_probs(self, batch: TrainBatch, model: str = "actor") -> list[list[float]]:
        self._counting_routes = model == "actor"
        try:
            return super().log_probs(batch, model)
        finally:
            self._counting_routes = False

    def _load_initial_weights(self, model) -> None:
        if model.torch_dist_checkpoint and Path(model.torch_dist_checkpoint).is_dir():
            from megatron.core import dist_checkpointing

            # dist-checkpointing reshards the saved layout to this rank's (vime_layout.json
            # says which layout it was saved with; V705 warns at compile time when it differs)
            model_state = self.gpt.sharded_state_dict()
            self._align_keys(model_state, model.torch_dist_checkpoint)
            state = dist_checkpointing.load(model_state, model.torch_dist_checkpoint)
            self.gpt.load_state_dict(state, strict=False)
            return
        if model.random_init:
            # the same seeded weights the torch rollout backend builds, so that the engines
            # and the actor start from one policy
            from runtime.backends import torch_model

            hf = unfuse_experts(torch_model.build_model(model, torch.device("cpu")).state_dict())
        else:  # read lazily: this rank's pieces only (the dense weights and its experts)
            from runtime.megatron.convert import HFCheckpoint

            hf = HFCheckpoint(Path(model.hf_checkpoint))
        shards.fill(self.gpt, MegatronView(hf, self.arch))

    # --------------------------------------------------------------------------- batching

    def _micro_batches(self, batch: TrainBatch) -> list[list[int]]:
        groups = super()._micro_batches(batch)
        if self.slice.world_size > 1:
            # the expert all-to-all is collective: every rank runs as many forwards as the
            # busiest one, the extra ones on a masked repeat (PAD) of a sample
            count = torch.tensor([len(groups)], device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            groups += [[PAD]] * (int(count) - len(groups))
        return groups

    def _replay(self, batch: TrainBatch, indices: list[int], width: int) -> None:
        """The replayed routes of the samples `indices` laid out as this rank's routers see
        them: padded to [n, width] (batch_routes) or packed into one row of `width` tokens
        (packed_routes)."""
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        RouterReplay.clear_global_indices()
        self._routed_rows = None
        if not (self.slice.routing_replay and batch.routed_experts is not None
                and self.arch.is_moe):
            RouterReplay.clear_global_router_replay_action()
            return
        # the samples padded to `width`, then this rank's chunks of them (cp), its slice (sp)
        layout = ReplayLayout(tp=self.tp, cp=self.cp, sequence_parallel=self.tp > 1)
        samples = [moe_layer_routes(batch.routed_experts[i], self.arch.moe_layers)
                   for i in indices]
        lengths = [len(batch.tokens[i]) for i in indices]
        if self.packed:
            routes, routed = packed_routes(samples, lengths, width, self.arch.num_moe_layers,
                                           layout, tp_rank=self.tp_rank)
        else:
            routes, routed = batch_routes(samples, lengths, width, self.arch.num_moe_layers,
                                          layout, tp_rank=self.tp_rank, cp_rank=self.cp_rank)
        if indices == [PAD]:  # a repeat that keeps the collectives in step: not counted
            routed[:] = False
        RouterReplay.set_replay_data([self._to_device(torch.from_numpy(a))
                                      for a in per_layer(routes)])
        self._routed_rows = self._to_device(torch.from_numpy(routed))
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def _inputs(self, batch: TrainBatch, indices: list[int]) -> torch.Tensor:
        """The samples' token ids [n, width], right-padded so that the layout splits them:
        sequence parallel over tp, context parallel into 2 × cp chunks whose pairs then split
        over tp; and the replayed routes for them."""
        ids, _attention = self._padded([batch.tokens[i] for i in indices])
        multiple = self.tp * (2 * self.cp if self.cp > 1 else 1)
        if ids.shape[1] % multiple:  # causal: right padding reaches no real token
            ids = torch.nn.functional.pad(ids, (0, multiple - ids.shape[1] % multiple))
        self._replay(batch, indices, ids.shape[1])
        return ids

    def _packed_inputs(self, batch: TrainBatch, indices: list[int]):
        """The samples' token ids packed into one row [1, T] (T their summed length, rounded up
        to a multiple of tp for sequence parallelism, the rounding a segment of its own), the
        positions [1, T] restarting at 0 in every segment, megatron-core's PackedSeqParams
        for them (THD: attention and rotary positions per segment), and the replayed routes
        in the packed order."""
        from megatron.core.packed_seq_params import PackedSeqParams

        lengths = [len(batch.tokens[i]) for i in indices]
        total = sum(lengths)
        padded = total + -total % self.tp
        segments = lengths + ([padded - total] if padded > total else [])
        ids = torch.zeros(1, padded, dtype=torch.long)
        ids[0, :total] = torch.tensor([t for i in indices for t in batch.tokens[i]])
        positions = torch.cat([torch.arange(n) for n in segments]).unsqueeze(0)
        bounds = torch.tensor([0, *segments], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        bounds = self._to_device(bounds)
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=bounds, cu_seqlens_kv=bounds,
                                 max_seqlen_q=max(segments), max_seqlen_kv=max(segments))
        self._replay(batch, indices, padded)
        return self._to_device(ids), self._to_device(positions), packed

    def _local(self, full: torch.Tensor) -> torch.Tensor:
        """This context-parallel rank's part of [n, width] per-position values: chunks r and
        2·cp − 1 − r of 2·cp (megatron's load-balanced order)."""
        if self.cp == 1:
            return full
        chunks = full.chunk(2 * self.cp, dim=1)
        return torch.cat([chunks[self.cp_rank], chunks[2 * self.cp - 1 - self.cp_rank]], dim=1)

    def _gathered(self, local: torch.Tensor) -> torch.Tensor:
        """[n, width / cp] values of every context-parallel rank, in sequence order [n, width].
        Backward: each rank keeps the gradient of its own positions (every rank computes the
        same loss from the gathered values; DDP sums the ranks' gradients)."""
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

        gathered = gather_from_tensor_model_parallel_region(local.contiguous(), self.cp_group)
        chunks = gathered.chunk(2 * self.cp, dim=1)
        return torch.cat([chunks[i] for i in cp_slots(self.cp)], dim=1)

    def _head(self, ids: torch.Tensor, positions: torch.Tensor | None = None, packed=None):
        """The loss head's inputs at this rank's positions of ids: the final hidden states
        [n, width / cp, h] (every position of the tensor group's sequence) and the output
        weight [V / tp, h], from the model in bf16 (no fp32 copy of its outputs). `packed`:
        ids is one packed row [1, T] with its positions and PackedSeqParams."""
        if packed is not None:
            return self.model(ids, positions, None, packed_seq_params=packed,
                              output_processor=_head_inputs, fp32_output=False)
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0).expand_as(ids)
        ids, positions = self._local(ids), self._local(positions)
        return self.model(ids, positions, None, output_processor=_head_inputs, fp32_output=False)

    @contextlib.contextmanager
    def _weights_of(self, params):
        """The reference policy's weights swapped in (params None: the actor's, nothing to do),
        for a forward and the loss head that follows it."""
        if params is None:
            yield
            return
        current = {n: p.data.clone() for n, p in self.params.items()}
        with torch.no_grad():
            for name, tensor in params.items():
                self.params[name].data.copy_(tensor)
        try:
            yield
        finally:
            with torch.no_grad():
                for name, tensor in current.items():
                    self.params[name].data.copy_(tensor)

    def _forward(self, batch: TrainBatch, indices: list[int], params=None):
        prompt_lens = [batch.prompt_lens[i] for i in indices]
        lengths = [len(batch.tokens[i]) for i in indices]
        if not self.packed:
            ids = self._inputs(batch, indices)
            hidden, weight = self._head(ids)
            return (*self._pick_responses(hidden, ids, prompt_lens, lengths), weight)
        ids, positions, packed = self._packed_inputs(batch, indices)
        hidden, weight = self._head(ids, positions, packed)
        _rows, positions, mask = packed_response_positions(prompt_lens, lengths, ids.shape[1])
        positions = self._to_device(positions)
        targets = ids[0, (positions + 1).clamp(max=ids.shape[1] - 1)]
        return hidden[0, positions], targets, self._to_device(mask), weight

    def _response_terms(self, batch: TrainBatch, indices: list[int], params=None,
                        entropy: bool = True):
        """Under context parallelism a rank holds the hidden states of its own positions only:
        the terms are computed there, for every position, then gathered over the group and the
        responses picked from them."""
        with self._weights_of(params):
            if self.cp == 1:
                return super()._response_terms(batch, indices, None, entropy)
            ids = self._inputs(batch, indices)
            hidden, weight = self._head(ids)
            targets = self._local(ids.roll(-1, dims=1))  # position p predicts token p + 1
            log_probs, entropies = self._head_terms(hidden, weight, targets, entropy)
        rows, positions, mask = response_positions(
            [batch.prompt_lens[i] for i in indices], [len(batch.tokens[i]) for i in indices],
            ids.shape[1])
        positions = self._to_device(positions)
        picked = self._gathered(log_probs)[rows, positions]
        if entropies is not None:
            entropies = self._gathered(entropies)[rows, positions]
        return picked, entropies, self._to_device(mask)

    def _vocabulary_group(self):
        return self.tp_group if self.tp > 1 else None

    # -------------------------------------------------------------------------- training

    def _begin_step(self) -> None:
        if not self.model.training:  # a walk over every module: only when it changes
            self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _before_backward(self) -> None:
        # with recompute, the backward pass runs the routers again: replay the same routes
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        if self.config.recompute_granularity is not None and \
                RouterReplay.global_router_replay_instances:
            RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)

    def _finish_step(self) -> dict[str, float]:
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads
        from megatron.core.transformer.moe.router_replay import RouterReplay

        RouterReplay.clear_global_indices()
        RouterReplay.clear_global_router_replay_action()
        # DDP's reduction over the data-parallel ranks, then the sums over the tensor group of
        # the replicated weights (sequence-parallel norms, q/k norms)
        finalize_model_grads([self.model])
        lr = float(self.optimizer.param_groups[0]["lr"])  # this step's, set by the scheduler
        _ok, grad_norm, _zeros = self.optimizer.step()  # clips by clip_grad, then Adam
        self.lr_scheduler.step(1)
        matched, replayed = self._route_counts.tolist()
        self._route_counts.zero_()
        return {"step/grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
                "step/lr": lr,
                "routes_matched": float(matched), "routes_replayed": float(replayed)}

    # --------------------------------------------------------------------------- weights

    # the gather leaves every full tensor on every rank
    exports_on_every_rank = True

    def export_weights(self, bucket_bytes: int, every_rank: bool = False,
                       on_device: bool = False) -> Iterator[dict]:
        """Full tensors gathered from every rank (a collective: all ranks iterate), under HF
        names, on rank 0 (every_rank: on every rank); host copies, or with on_device the
        gathered tensors themselves (each bucket is gathered into a buffer of its own)."""
        with self._weights_readable():
            for bucket in shards.gather(self.gpt, bucket_bytes):
                if self.slice.rank != 0 and not every_rank:
                    continue
                out = {}
                for name, tensor in bucket.items():
                    out.update({k: (v if on_device else v.to("cpu", copy=True)).contiguous()
                                for k, v in tensor_to_hf(name, tensor, self.arch).items()})
                yield out

    # --------------------------------------------------------------------------- offload

    def _storages(self) -> tuple[list[torch.UntypedStorage], list[torch.UntypedStorage]]:
        """Every device storage of the actor, each once: those whose contents the next phases
        read (the DDP parameter buffers first, then the optimizer's fp32 main parameters and
        Adam moments), and the gradient buffers, which _begin_step zeroes before the backward
        adds to them (DDP's zero_grad_buffer), so they come back without a copy."""
        kept = self._parameter_tensors()
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            inner = optimizer.optimizer
            for group in inner.param_groups:
                kept += list(group["params"])
            for state in inner.state.values():
                kept += [v for v in state.values() if torch.is_tensor(v) and v.is_cuda]
        grads = [p.main_grad for p in self.model.parameters() if hasattr(p, "main_grad")]
        seen: set[int] = set()

        def unique(tensors):
            out = []
            for tensor in tensors:
                storage = tensor.untyped_storage()
                if storage.device.type == "cuda" and storage.data_ptr() not in seen \
                        and storage.nbytes():
                    seen.add(storage.data_ptr())
                    out.append(storage)
            return out

        return unique(kept), unique(grads)

    def _parameter_tensors(self) -> list[torch.Tensor]:
        return [p.data for p in self.model.parameters()]

    def offload(self) -> None:
        """Move the actor's state to pinned host buffers made once (runtime/backends/offload.py)
        and free its device storages; tensors keep their views (what torch_memory_saver does
        for slime's colocated Megatron). Gradients are freed, not copied."""
        if self.offloaded:
            return
        from runtime.backends.offload import HostMirror

        if self._host is None:
            self._host = HostMirror(self.device)
        kept, grads = self._storages()
        self._host.track(kept, grads, {t.untyped_storage().data_ptr()
                                       for t in self._parameter_tensors()})
        self._host.offload()
        torch.cuda.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        self._host.onload()
        self.offloaded = False

    @contextlib.contextmanager
    def _weights_readable(self):
        """The parameters readable while the actor is offloaded, for an export: only their
        storages come back (the bf16 weights, not the fp32 gradients and Adam's state, ~9x
        as much), and they are freed afterwards without a copy back (an export does not change
        them, so the host copy stays right)."""
        if not self.offloaded:
            yield
            return
        self._host.weights_back()
        try:
            yield
        finally:
            self._host.weights_gone()
            torch.cuda.empty_cache()

    def resident_bytes(self) -> int:
        if self.offloaded:
            return 0
        kept, grads = self._storages()
        return sum(s.nbytes() for s in kept + grads)

    # ------------------------------------------------------------------------ checkpoints

    def save(self, path: Path) -> None:
        from megatron.core import dist_checkpointing

        path.mkdir(parents=True, exist_ok=True)
        with self._readable():
            model_state = self.gpt.sharded_state_dict()
            state = {"model": model_state,
                     "optimizer": self.optimizer.sharded_state_dict(
                         model_state, metadata=OPTIMIZER_METADATA)}
            (path / "torch_dist").mkdir(exist_ok=True)
            dist_checkpointing.save(state, str(path / "torch_dist"))
        torch.save({"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all(),
                    "adam_steps": self._adam_steps(),
                    "lr_steps": self.lr_scheduler.num_steps},
                   path / f"rng_rank{self.slice.rank}.pt")

    def begin_save(self, path: Path) -> None:
        """Writes before it returns (the interface's default, not the torch backend's copy):
        dist_checkpointing's save plans and gathers with collectives, which a background
        thread would run beside the next steps' own."""
        self.save(path)

    def finish_save(self) -> float:
        return 0.0

    def save_hf(self, path: Path) -> None:
        """The full tensors gathered from every rank (a collective), written by rank 0 with
        the writer and gather of `vime convert --to hf` (runtime/megatron/convert.py), so the
        weights file is byte for byte the conversion of this step's torch_dist checkpoint."""
        from runtime.megatron.convert import gather_hf

        with self._weights_readable():
            tensors = gather_hf(self.gpt, self.arch, self.slice.rank == 0)
        if self.slice.rank == 0:
            hf_folder.write_weights(tensors, path, dict(self.slice.model.arch))

    def _torch_adams(self) -> list:
        """The inner torch optimizers whose per-parameter state holds Adam's step count: torch's
        Adam/AdamW, megatron-core's fallback without Transformer Engine or Apex. Not the
        HybridDeviceOptimizer of CPU Adam, which megatron-core restores itself, nor TE's or
        Apex's FusedAdam, whose one step count per param group megatron-core saves and loads."""
        inner = [o.optimizer for o in getattr(self.optimizer, "chained_optimizers",
                                              [self.optimizer])]
        return [o for o in inner if type(o) in (torch.optim.Adam, torch.optim.AdamW)]

    def _fuse_adam(self) -> None:
        """torch's fused Adam kernel (`fused=True`, read per param group at every step) for the
        inner torch Adams whose parameters are all fp32 on the GPU, unless VIME_ADAM=foreach.
        Its step counts live on the device: _fresh_adam_state and _restore_adam_steps put them
        there."""
        if os.environ.get("VIME_ADAM", "") == "foreach":
            return
        for inner in self._torch_adams():
            params = [p for group in inner.param_groups for p in group["params"]]
            if params and all(p.is_cuda and p.dtype == torch.float32 for p in params):
                for group in inner.param_groups:
                    group["fused"], group["foreach"] = True, False

    @staticmethod
    def _step_devices(inner) -> dict:
        """Where torch's Adam wants each parameter's step count (by id): its device when the
        parameter's group is fused, else the host."""
        return {id(p): p.device if group.get("fused") else torch.device("cpu")
                for group in inner.param_groups for p in group["params"]}

    def _adam_steps(self) -> list[float | None]:
        steps = []
        for inner in self._torch_adams():
            counts = {float(s["step"]) for s in inner.state.values() if "step" in s}
            steps.append(max(counts) if counts else None)
        return steps

    def _restore_adam_steps(self, steps: list[float | None]) -> None:
        """Adam's step count as saved, one tensor per parameter. megatron-core's
        DistributedOptimizer (without Apex or Transformer Engine) reloads the step through its
        param_groups and gives every parameter the same tensor object; torch's Adam then adds
        1 to that one tensor once per parameter at every step, so the bias corrections of a
        resumed run differ from the uninterrupted run's (docs/gpu-runs.md, "Adam's step counts")."""
        for inner, step in zip(self._torch_adams(), steps, strict=True):
            devices = self._step_devices(inner)
            for param, state in inner.state.items():
                if "step" in state:
                    count = float(state["step"]) if step is None else step
                    state["step"] = torch.tensor(count, dtype=torch.float32,
                                                 device=devices[id(param)])

    def _align_keys(self, model_state: dict, checkpoint) -> None:
        """Read a checkpoint of the other layer spec (runtime/megatron/torch_dist.py)."""
        done = torch_dist.align(model_state, checkpoint)
        if done and self.slice.rank == 0:
            print(f"vime: {checkpoint} was saved by the other layer spec; {len(done)} keys "
                  f"aligned, first {done[0]}", flush=True)

    def _fresh_adam_state(self) -> None:
        """A resumed job loads into an optimizer that has not stepped: give torch's Adam the
        state it would have after a step (zeros, step 0), which the load then overwrites.
        megatron-core's DistributedOptimizer.state_dict reads every state's "step" when
        neither Apex nor Transformer Engine is installed (distrib_optimizer.py, "assert
        len(steps) == 1"), and its init_state_fn leaves "step" out."""
        # not CPU Adam's HybridDeviceOptimizer (megatron-core takes a dummy step for it in
        # load_state_dict), nor a FusedAdam (megatron-core's own state init serves it)
        for inner in self._torch_adams():
            for group in inner.param_groups:
                where = group["params"][0].device if group.get("fused") else "cpu"
                for param in group["params"]:
                    if not inner.state[param]:
                        inner.state[param] = {"step": torch.tensor(0.0, device=where),
                                              "exp_avg": torch.zeros_like(param.data),
                                              "exp_avg_sq": torch.zeros_like(param.data)}

    def load(self, path: Path) -> None:
        from megatron.core import dist_checkpointing

        self._fresh_adam_state()
        with self._readable():
            model_state = self.gpt.sharded_state_dict()
            self._align_keys(model_state, path / "torch_dist")  # before the optimizer's
            state = dist_checkpointing.load(
                {"model": model_state, "optimizer": self.optimizer.sharded_state_dict(
                    model_state, is_loading=True, metadata=OPTIMIZER_METADATA)},
                str(path / "torch_dist"))
            self.gpt.load_state_dict(state["model"], strict=False)
            self.optimizer.load_state_dict(state["optimizer"])
        rng = torch.load(path / f"rng_rank{self.slice.rank}.pt", weights_only=False)
        # without saved counts (a checkpoint from before they were saved) each parameter still
        # gets its own step tensor, where its Adam wants it
        self._restore_adam_steps(rng.get("adam_steps") or [None] * len(self._torch_adams()))
        # the schedule's position; a checkpoint without it: Adam's step count, the same number
        steps = rng.get("lr_steps")
        if steps is None:
            steps = max((s for s in self._adam_steps() if s is not None), default=0)
        self.lr_scheduler.num_steps = int(steps)
        self.lr_scheduler.step(0)
        torch.set_rng_state(rng["torch"])
        torch.cuda.set_rng_state_all(rng["cuda"])
