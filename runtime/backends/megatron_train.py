"""The Megatron training backend: megatron-core's GPTModel (runtime/megatron/model.py), its
DistributedDataParallel and distributed optimizer, the GRPO loss of runtime/algorithm.py, and
rollout routing replay through megatron-core's RouterReplay.

What runs today (docs/gpu-runs.md): one rank per model replica with tp = pp = cp = ep = 1
(data parallel over ranks through the DDP wrapper). Larger layouts need the weights loaded
from a torch_dist checkpoint under the rank's layout and exported by gathering shards; both
are refused here with a clear error until they are written (issue 7).

Batching, log-prob picking and the loss are the torch backend's
(runtime/backends/torch_train.py, through its hooks _forward, _begin_step, _before_backward
and _finish_step); the model, the optimizer and the device memory handling are Megatron's.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from runtime.backends.torch_train import TorchTrainingBackend
from runtime.interfaces import TrainBatch
from runtime.megatron.mapping import hf_to_megatron, megatron_to_hf, unfuse_experts
from runtime.megatron.model import build_gpt, transformer_config
from runtime.routing import ReplayLayout, local_routes, per_layer
from runtime.slices import TrainSlice
from vime.resolve.model import arch_from_config

# megatron-core's default optimizer layout (dp_reshardable since 0.14; the older
# fully_sharded_model_space is refused with "ShardedTensor.flattened_range is not supported")
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MegatronTrainingBackend(TorchTrainingBackend):
    # ------------------------------------------------------------------------------- init

    def init(self, slice: TrainSlice) -> None:
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
        from megatron.core.transformer.module import Float16Module

        sizes = {k: slice.parallel[k] for k in ("tp", "pp", "cp", "ep", "etp")}
        if any(size != 1 for size in sizes.values()):
            raise NotImplementedError(
                f"the Megatron backend runs tp = pp = cp = ep = etp = 1 today; the plan has {sizes}")
        self.slice = slice
        self.device = torch.device("cuda", torch.cuda.current_device())
        if not dist.is_initialized():
            port = slice.master_port or _free_port()  # 0: one in-process rank (tests)
            dist.init_process_group("nccl", init_method=f"tcp://{slice.master_addr}:{port}",
                                    rank=slice.rank, world_size=slice.world_size)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(slice.model.seed)
        torch.manual_seed(slice.model.seed)
        self.arch = arch_from_config(dict(slice.model.arch))
        self.config = transformer_config(self.arch, slice.recompute,
                                         moe_enable_routing_replay=slice.routing_replay
                                         and self.arch.is_moe)
        self.gpt = build_gpt(self.arch, self.config, self.arch.max_position_embeddings).cuda()
        if slice.model.random_init:
            # the same seeded weights the torch rollout backend builds, so that the engines
            # and the actor start from one policy
            from runtime.backends import torch_model

            hf = unfuse_experts(torch_model.build_model(slice.model, torch.device("cpu")).state_dict())
        else:
            from runtime.megatron.convert import read_hf

            hf = read_hf(Path(slice.model.hf_checkpoint))
        weights = hf_to_megatron(hf, self.arch)
        self.gpt.load_state_dict({k: v.to(self.device, torch.bfloat16)
                                  for k, v in weights.items()}, strict=False)
        self.model = DistributedDataParallel(
            self.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                       use_distributed_optimizer=True),
            Float16Module(self.config, self.gpt))
        opt = slice.optimizer
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=opt.lr, weight_decay=opt.weight_decay,
                            adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2,
                            clip_grad=opt.clip_grad or 0.0, bf16=True,
                            params_dtype=torch.bfloat16, use_distributed_optimizer=True),
            [self.model])
        self.params = dict(self.gpt.named_parameters())
        self.ref = ({n: p.detach().to("cpu", copy=True) for n, p in self.params.items()}
                    if slice.needs_ref else None)
        self.temperature = slice.temperature if slice.temperature > 0 else 1.0
        self.offloaded = False
        self._host: dict | None = None

    # --------------------------------------------------------------------------- batching

    def _micro_batches(self, batch: TrainBatch) -> list[list[int]]:
        # replayed routes are laid out per packed sequence: one sample per forward
        if self.slice.routing_replay and batch.routed_experts is not None:
            return [[i] for i in range(len(batch))]
        return super()._micro_batches(batch)

    def _replay(self, batch: TrainBatch, indices: list[int], width: int) -> None:
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        RouterReplay.clear_global_indices()
        if not (self.slice.routing_replay and batch.routed_experts is not None
                and self.arch.is_moe):
            RouterReplay.clear_global_router_replay_action()
            return
        (index,) = indices
        routes = local_routes([batch.routed_experts[index]], [len(batch.tokens[index])],
                              self.arch.num_moe_layers, ReplayLayout())
        routes = routes[:width]
        RouterReplay.set_replay_data([torch.from_numpy(a).to(self.device) for a in per_layer(routes)])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def _forward(self, batch: TrainBatch, indices: list[int], params=None):
        tokens = [batch.tokens[i] for i in indices]
        ids, _attention = self._padded(tokens)  # causal: right padding reaches no real token
        width = ids.shape[1]
        positions = torch.arange(width, device=self.device).unsqueeze(0).expand(len(tokens), -1)
        self._replay(batch, indices, width)
        if params is not None:  # the reference policy: swap its weights in for this forward
            current = {n: p.data.clone() for n, p in self.params.items()}
            with torch.no_grad():
                for name, tensor in params.items():
                    self.params[name].data.copy_(tensor)
            try:
                logits = self.model(ids, positions, None)
            finally:
                with torch.no_grad():
                    for name, tensor in current.items():
                        self.params[name].data.copy_(tensor)
        else:
            logits = self.model(ids, positions, None)
        return self._pick_responses(logits, ids, [batch.prompt_lens[i] for i in indices],
                                    [len(t) for t in tokens])

    # -------------------------------------------------------------------------- training

    def _begin_step(self) -> None:
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
        from megatron.core.transformer.moe.router_replay import RouterReplay

        RouterReplay.clear_global_indices()
        RouterReplay.clear_global_router_replay_action()
        self.model.finish_grad_sync()  # DDP's reduction over the data-parallel ranks
        _ok, grad_norm, _zeros = self.optimizer.step()  # clips by clip_grad, then Adam
        return {"step/grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
                "step/lr": self.slice.optimizer.lr}

    # --------------------------------------------------------------------------- weights

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}

    def _hf_weights(self):
        return megatron_to_hf(self._weights(), self.arch).items()

    # --------------------------------------------------------------------------- offload

    def _storages(self) -> list[torch.UntypedStorage]:
        """Every device storage of the actor: the DDP parameter and gradient buffers, and the
        optimizer's fp32 main parameters and Adam moments (each storage once)."""
        tensors = [p.data for p in self.model.parameters()]
        tensors += [p.main_grad for p in self.model.parameters() if hasattr(p, "main_grad")]
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            inner = optimizer.optimizer
            for group in inner.param_groups:
                tensors += list(group["params"])
            for state in inner.state.values():
                tensors += [v for v in state.values() if torch.is_tensor(v) and v.is_cuda]
        seen, out = set(), []
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.device.type == "cuda" and storage.data_ptr() not in seen and storage.nbytes():
                seen.add(storage.data_ptr())
                out.append(storage)
        return out

    def offload(self) -> None:
        """Copy every device storage to host memory and free it; tensors keep their views
        (what torch_memory_saver does for slime's colocated Megatron)."""
        if self.offloaded:
            return
        self._host = []
        for storage in self._storages():
            view = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
            self._host.append((storage, view.to("cpu", copy=True)))
            storage.resize_(0)
        torch.cuda.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        for storage, host in self._host:
            storage.resize_(host.numel())
            torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage).copy_(host)
        self._host, self.offloaded = None, False

    def resident_bytes(self) -> int:
        return 0 if self.offloaded else sum(s.nbytes() for s in self._storages())

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
        torch.save({"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all()},
                   path / f"rng_rank{self.slice.rank}.pt")

    def load(self, path: Path) -> None:
        from megatron.core import dist_checkpointing

        with self._readable():
            model_state = self.gpt.sharded_state_dict()
            state = dist_checkpointing.load(
                {"model": model_state, "optimizer": self.optimizer.sharded_state_dict(
                    model_state, is_loading=True, metadata=OPTIMIZER_METADATA)},
                str(path / "torch_dist"))
            self.gpt.load_state_dict(state["model"], strict=False)
            self.optimizer.load_state_dict(state["optimizer"])
        rng = torch.load(path / f"rng_rank{self.slice.rank}.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        torch.cuda.set_rng_state_all(rng["cuda"])
