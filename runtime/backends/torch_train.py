"""The torch training backend: the transformers model on one device per rank, data parallel
over ranks through torch.distributed (gloo on CPU, NCCL on GPUs), AdamW, the GRPO loss of
runtime/core/algorithm.py. No tensor, pipeline, context or expert parallelism (V902).

Every rank builds the same initial weights (the same checkpoint or seed), sums its
gradients with the others after each step and so stays an exact replica; rank 0 therefore
alone exports weights and writes the model and optimizer to checkpoints (every rank writes
its RNG state).

offload() is a real state change, as torch_memory_saver's pause is for Megatron: weights,
gradients and optimizer moments are copied to host memory and the device tensors freed;
computing while offloaded raises.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from runtime.backends import torch_model
from runtime.backends.offload import HostSnapshot
from runtime.core import algorithm, hf_folder, loss_head, lr_schedule
from runtime.core.interfaces import TrainBatch, TrainingBackend
from runtime.core.slices import TrainSlice

# A micro-batch [PAD] runs sample 0 again with its mask cleared: backends whose ranks share
# collectives inside the forward (Megatron's expert all-to-all) pad to the same count.
PAD = -1

SUM_STATS = ("pg_loss", "clipped_tokens", "ppo_kl", "kl", "entropy", "tis_weight",
             "tis_truncated_tokens", "rollout_abs_diff")


def response_positions(prompt_lens: list[int], lengths: list[int], width: int):
    """Where each sample's response is predicted in a [n, width] batch: (rows [n, 1],
    positions [n, R], mask [n, R]), R the longest response; the logit at position p predicts
    token p + 1, so a response starting at token p is read from position p - 1."""
    responses = [n - p for n, p in zip(lengths, prompt_lens, strict=True)]
    rows = torch.arange(len(lengths)).unsqueeze(1)
    starts = torch.tensor([p - 1 for p in prompt_lens]).unsqueeze(1)
    offsets = torch.arange(max(responses)).unsqueeze(0)
    mask = offsets < torch.tensor(responses).unsqueeze(1)
    return rows, (starts + offsets).clamp(max=width - 1), mask


def packed_response_positions(prompt_lens: list[int], lengths: list[int], width: int):
    """response_positions for the samples packed one after another into one row of `width`
    tokens (sample i starts at the sum of the lengths before it): rows [n, 1] all 0,
    positions [n, R] in that row, mask [n, R]."""
    offsets = [0]
    for length in lengths[:-1]:
        offsets.append(offsets[-1] + length)
    rows, positions, mask = response_positions(
        [o + p for o, p in zip(offsets, prompt_lens, strict=True)],
        [o + n for o, n in zip(offsets, lengths, strict=True)], width)
    return torch.zeros_like(rows), positions, mask


def _write_files(files: dict[str, dict], folder: Path) -> None:
    """torch.save of each file, without the zip writer's CRC32 of every record: the
    checkpoint's state.json holds every file's sha256 (runtime/rl/checkpoint.py), and the
    CRC32 costs about 0.5 s per GB of CPU, as much as writing to a 2 GB/s disk
    (docs/runtime.md, "Saves in the background")."""
    from torch.utils.serialization import config

    config.save.compute_crc32 = False
    try:
        for name, content in files.items():
            torch.save(content, folder / name)
    finally:
        config.save.compute_crc32 = True


class BackgroundWrite:
    """`write` run in a thread of its own, started at once; wait() joins it, returns its
    seconds and raises what it raised."""

    def __init__(self, write):
        self._error: BaseException | None = None
        self.seconds = 0.0

        def run() -> None:
            began = time.perf_counter()
            try:
                write()
            except BaseException as err:  # re-raised by wait() in the caller's thread
                self._error = err
            finally:
                self.seconds = time.perf_counter() - began

        self._thread = threading.Thread(target=run, name="vime-checkpoint-write", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> float:
        """Raises:
            Exception: what the write raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.seconds


def sampling_top_p(slice: TrainSlice) -> float:
    """The top-p the rollout sampled with; 1 for greedy sampling, where vLLM applies none
    (its SamplingParams sets top_p = 1 at temperature 0)."""
    return slice.top_p if slice.temperature > 0 else 1.0


class TorchTrainingBackend(TrainingBackend):
    # every sample of a micro-batch in one row of their summed length (the Megatron backend's
    # packed sequences); here each sample is a row of the micro-batch's longest
    packed = False

    def __init__(self):
        self.offloaded = False
        self._host: dict | None = None

    # ------------------------------------------------------------------------------- init

    def init(self, slice: TrainSlice) -> None:
        layout = slice.parallel
        model_parallel = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep,
                          "etp": layout.etp}
        if any(size != 1 for size in model_parallel.values()):
            raise ValueError(f"the torch training backend is data parallel only; the plan has "
                             f"{model_parallel} (V902)")
        torch_model.set_threads(slice.cpu_threads)
        self.slice = slice
        self.device = torch_model.device_for_this_process()
        if slice.world_size > 1 and not dist.is_initialized():  # torchrun may have made it
            dist.init_process_group(
                "nccl" if self.device.type == "cuda" else "gloo",
                init_method=f"tcp://{slice.master_addr}:{slice.master_port}",
                rank=slice.rank, world_size=slice.world_size)
        self.model = torch_model.build_model(slice.model, self.device)
        self.routers = torch_model.Routers(self.model)
        self.params = dict(self.model.named_parameters())
        # the reference policy of the KL loss: the initial weights, used through
        # functional_call rather than a second module
        self.ref = ({n: p.detach().clone() for n, p in self.params.items()}
                    if slice.needs_ref else None)
        opt = slice.optimizer
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=opt.lr, betas=(opt.adam_beta1, opt.adam_beta2),
            weight_decay=opt.weight_decay, eps=1e-8)
        self.optimizer_steps = 0  # the learning-rate schedule's position
        self.temperature = slice.temperature if slice.temperature > 0 else 1.0
        self.top_p = sampling_top_p(slice)

    # --------------------------------------------------------------------------- batching

    def _micro_batches(self, batch: TrainBatch) -> list[list[int]]:
        """Consecutive samples: at most micro_batch_size of them, or with dynamic_batch as
        many as fit max_tokens_per_gpu tokens (a longer sample goes alone): the tokens the
        forward runs, the sum of the lengths when packed, else n × the longest."""
        groups, current, longest, total = [], [], 0, 0
        for index, tokens in enumerate(batch.tokens):
            if self.slice.dynamic_batch:
                grown = (total + len(tokens) if self.packed
                         else max(longest, len(tokens)) * (len(current) + 1))
                full = current and grown > self.slice.max_tokens_per_gpu
            else:
                full = len(current) == self.slice.micro_batch_size
            if full:
                groups.append(current)
                current, longest, total = [], 0, 0
            current.append(index)
            longest = max(longest, len(tokens))
            total += len(tokens)
        if current:
            groups.append(current)
        return groups

    def _forward(self, batch: TrainBatch, indices: list[int], params=None):
        """The loss head's inputs at the positions that predict each sample's response tokens:
        (hidden [n, R, h], targets [n, R], mask [n, R], the output weight [V, h]) with R the
        longest response. No logits: runtime/core/loss_head.py makes them a chunk at a time."""
        tokens = [batch.tokens[i] for i in indices]
        ids, attention = self._padded(tokens)
        width = ids.shape[1]
        replay = None
        if self.slice.routing_replay and batch.routed_experts is not None:
            replay = self.routers.replay_for_batch([batch.routed_experts[i] for i in indices],
                                                   width)
        with self.routers.replaying(replay):
            hidden = torch_model.hidden_states(self.model, ids, attention, params)
        return (*self._pick_responses(hidden, ids, [batch.prompt_lens[i] for i in indices],
                                      [len(t) for t in tokens]),
                torch_model.output_weight(self.model, params))

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on the backend's device without waiting for the GPU (a copy from
        pageable memory waits for the work queued before it; pinned memory does not)."""
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _padded(self, tokens: list[list[int]]):
        """Right-padded token ids [n, longest] and their attention mask, on the device."""
        width = max(len(t) for t in tokens)
        ids = torch.zeros(len(tokens), width, dtype=torch.long)
        attention = torch.zeros(len(tokens), width, dtype=torch.long)
        for row, seq in enumerate(tokens):
            ids[row, :len(seq)] = torch.tensor(seq)
            attention[row, :len(seq)] = 1
        return self._to_device(ids), self._to_device(attention)

    def _pick_responses(self, values, ids, prompt_lens: list[int], lengths: list[int]):
        """Per-position values [n, width, ...] at the positions that predict each sample's
        response tokens: (values [n, R, ...], targets [n, R], mask [n, R]) with R the longest
        response."""
        rows, positions, mask = response_positions(prompt_lens, lengths, ids.shape[1])
        if len(lengths) == 1:  # one sample: its responses are a slice, not a gathered copy
            picked = values[:, prompt_lens[0] - 1:prompt_lens[0] - 1 + mask.shape[1]]
        else:
            picked = values[rows, self._to_device(positions)]
        targets = ids[rows, self._to_device((positions + 1).clamp(max=ids.shape[1] - 1))]
        return picked, targets, self._to_device(mask)

    def _response_terms(self, batch: TrainBatch, indices: list[int], params=None,
                        entropy: bool = True):
        """(log-probs [n, R], entropy [n, R] or None, mask [n, R]) of the response tokens of
        the samples `indices`: one forward, then the loss head on the picked hidden states."""
        hidden, targets, mask, weight = self._forward(batch, indices, params)
        return (*self._head_terms(hidden, weight, targets, entropy), mask)

    # ------------------------------------------------------------------------- log-probs

    def log_probs(self, batch: TrainBatch, model: str = "actor") -> list[list[float]]:
        self._require_onloaded("log_probs")
        if model == "ref" and self.ref is None:
            raise ValueError("reference log-probs asked for, but the backend keeps no "
                             "reference (needs_ref is false)")
        out: list[list[float]] = [[] for _ in range(len(batch))]
        self.model.eval()
        with torch.no_grad():
            for indices in self._micro_batches(batch):
                params = self.ref if model == "ref" else None
                if indices == [PAD]:  # only keeps the ranks' collectives in step
                    self._response_terms(batch, [0], params, entropy=False)
                    continue
                values, _entropy, mask = self._response_terms(batch, indices, params,
                                                              entropy=False)
                for row, index in enumerate(indices):
                    out[index] = values[row][mask[row]].tolist()
        return out

    # -------------------------------------------------------------------------- training

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        self._require_onloaded("train_step")
        if batch.step_response_tokens is None or batch.advantages is None \
                or batch.old_log_probs is None:
            raise ValueError("train_step needs advantages, old_log_probs and "
                             "step_response_tokens")
        self._begin_step()
        # the sums stay on the device until the step's end: reading one waits for the GPU
        sums: dict = dict.fromkeys(SUM_STATS, 0.0)
        sums["response_tokens"] = 0.0

        def padded(column, indices, width):
            out = torch.zeros(len(indices), width)
            for row, index in enumerate(indices):
                values = column[index]
                out[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
            return self._to_device(out)

        for indices in self._micro_batches(batch):
            padding = indices == [PAD]  # sample 0 again, its loss masked out
            indices = [0] if padding else indices
            # the host's tensors first, so that nothing waits on the GPU mid-step
            width = max(len(batch.tokens[i]) - batch.prompt_lens[i] for i in indices)
            old = padded(batch.old_log_probs, indices, width)
            advantages = self._to_device(torch.tensor(
                [batch.advantages[i] for i in indices])).unsqueeze(1).expand(-1, width)
            ref = padded(batch.ref_log_probs, indices, width) if batch.ref_log_probs else None
            rollout = (padded(batch.rollout_log_probs, indices, width)
                       if batch.rollout_log_probs else None)
            log_probs, entropy, mask = self._response_terms(batch, indices)
            if padding:
                mask = torch.zeros_like(mask)
            elif batch.loss_mask is not None:  # tool and environment tokens are context
                mask = mask & (padded(batch.loss_mask, indices, width) > 0)
            loss, stats = algorithm.policy_loss(
                log_probs, old, advantages, mask, batch.step_response_tokens, self.slice.loss,
                ref_log_probs=ref, rollout_log_probs=rollout, entropy=entropy,
                step_samples=batch.step_samples)
            self._before_backward()
            loss.backward()
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
            if rollout is not None:
                sums["rollout_abs_diff"] += ((old - rollout).abs() * mask).sum()
            sums["response_tokens"] += mask.sum()
        stepped = self._finish_step()
        return {**{key: float(value) for key, value in sums.items()}, **stepped}

    def _head_terms(self, hidden, weight, targets, entropy: bool):
        """(log-probs, entropy or None) of the targets under softmax(hidden @ weight.T / T), in
        chunks of tokens without a [tokens, vocab] tensor (runtime/core/loss_head.py).
        With top_p < 1 the log-probs are under the nucleus the engine sampled from, renormalised
        (runtime/core/nucleus.py), as vLLM's processed log-probs are; the entropy stays
        that of the whole softmax: the policy the entropy bonus spreads is the model's, and the
        nucleus's entropy would jump as tokens cross its boundary. The entropy carries gradients
        only when it is part of the loss (entropy_coef), otherwise it is a metric."""
        log_probs, entropies = loss_head.token_terms(
            hidden, weight, targets, temperature=self.temperature, top_p=self.top_p,
            entropy=entropy, group=self._vocabulary_group())
        in_loss = torch.is_grad_enabled() and bool(self.slice.loss.entropy_coef)
        if entropies is not None and not in_loss:
            entropies = entropies.detach()
        return log_probs, entropies

    def _vocabulary_group(self):
        """The process group the output weight's vocabulary is split over (None: not split)."""
        return None

    def _begin_step(self) -> None:
        if not self.model.training:  # a walk over every module: only when it changes
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)

    def _before_backward(self) -> None:
        """A hook for backends that must switch state between forward and backward."""

    def _finish_step(self) -> dict[str, float]:
        """Reduce the gradients over the ranks, clip, step; the step's scalars."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.slice.world_size > 1:
            # one flat all-reduce: the loss is already divided by the step's tokens on every
            # rank, so the SUM is the step's mean gradient
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              self.slice.optimizer.clip_grad or math.inf)
        lr = lr_schedule.learning_rate(self.optimizer_steps, self.slice.optimizer)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer_steps += 1
        return {"step/grad_norm": float(norm), "step/lr": lr}

    # --------------------------------------------------------------------------- weights

    # data parallel only: every rank holds every weight
    exports_on_every_rank = True

    def export_weights(self, bucket_bytes: int, every_rank: bool = False,
                       on_device: bool = False) -> Iterator[dict]:
        if self.slice.rank != 0 and not every_rank:
            return  # every rank holds the same weights; rank 0 sends them
        with self._readable():
            bucket, size = {}, 0
            for name, tensor in self._hf_weights():
                bucket[name] = (tensor.detach().clone() if on_device
                                else tensor.to("cpu", copy=True)).contiguous()
                size += tensor.numel() * tensor.element_size()
                if size >= bucket_bytes:
                    yield bucket
                    bucket, size = {}, 0
            if bucket:
                yield bucket

    def _hf_weights(self):
        """(HF checkpoint name, tensor) pairs of the current weights."""
        return torch_model.to_hf((n, p.detach()) for n, p in self.params.items())

    # --------------------------------------------------------------------------- offload

    def offload(self) -> None:
        if self.offloaded:
            return
        host = {"params": {}, "state": {}}
        for name, param in self.params.items():
            host["params"][name] = param.data.to("cpu", copy=True)
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
            param.grad = None
            for key, value in self.optimizer.state.get(param, {}).items():
                if torch.is_tensor(value) and value.dim() > 0:
                    host["state"][(name, key)] = value.to("cpu", copy=True)
                    self.optimizer.state[param][key] = torch.empty(0, dtype=value.dtype,
                                                                   device=value.device)
        self._host, self.offloaded = host, True
        torch_model.release_cached_memory(self.device)

    def onload(self) -> None:
        if not self.offloaded:
            return
        for name, param in self.params.items():
            param.data = self._host["params"][name].to(self.device)
        for (name, key), value in self._host["state"].items():
            self.optimizer.state[self.params[name]][key] = value.to(self.device)
        self._host, self.offloaded = None, False

    def resident_bytes(self) -> int:
        """Bytes of weights, gradients and optimizer moments on the device (0 while
        offloaded; Adam's step counters are scalars and not counted)."""
        total = 0
        for param in self.params.values():
            tensors = [param.data, param.grad, *self.optimizer.state.get(param, {}).values()]
            total += sum(t.numel() * t.element_size() for t in tensors
                         if torch.is_tensor(t) and t.dim() > 0)
        return total

    @contextlib.contextmanager
    def _readable(self):
        """Weights readable in either state (export and save run while offloaded)."""
        was = self.offloaded
        self.onload()
        try:
            yield
        finally:
            if was:
                self.offload()

    def _require_onloaded(self, what: str) -> None:
        if self.offloaded:
            raise RuntimeError(f"{what} while the actor is offloaded: onload() first")

    # ------------------------------------------------------------------------ checkpoints

    # the write of begin_save in progress, and the host copy it writes from (made once)
    _writing: BackgroundWrite | None = None
    _snapshot: HostSnapshot | None = None

    def _checkpoint_files(self) -> dict[str, dict]:
        """{file name: what torch.save writes to it} of this rank, holding the live tensors."""
        files = {}
        if self.slice.rank == 0:
            files["model_optim.pt"] = {"model": self.model.state_dict(),
                                       "optimizer": self.optimizer.state_dict(),
                                       "optimizer_steps": self.optimizer_steps}
        files[f"rng_rank{self.slice.rank}.pt"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
        return files

    def save(self, path: Path) -> None:
        self.finish_save()
        path.mkdir(parents=True, exist_ok=True)
        with self._readable():
            _write_files(self._checkpoint_files(), path)

    def begin_save(self, path: Path) -> None:
        """The state copied to host buffers reused across saves (offload.HostSnapshot), then
        torch.save from that copy in a thread of this process until finish_save."""
        self.finish_save()
        path.mkdir(parents=True, exist_ok=True)
        if self._snapshot is None:
            self._snapshot = HostSnapshot()
        with self._readable():
            files = self._snapshot.copy(self._checkpoint_files())

        self._writing = BackgroundWrite(lambda: _write_files(files, path))

    def finish_save(self) -> float:
        writing, self._writing = self._writing, None
        return writing.wait() if writing is not None else 0.0

    def save_hf(self, path: Path) -> None:
        """Rank 0 writes the weights under HF names, in the actor's dtype, and the model's
        transformers config (every rank holds the same weights)."""
        if self.slice.rank != 0:
            return
        with self._readable():
            tensors = {name: tensor.to("cpu", copy=True).contiguous()
                       for name, tensor in self._hf_weights()}
        config = self.model.config.to_dict()
        config["use_cache"] = True  # off in training only; generation from the folder uses it
        hf_folder.write_weights(tensors, path, config)

    def load(self, path: Path) -> None:
        with self._readable():
            state = torch.load(path / "model_optim.pt", map_location=self.device,
                               weights_only=True)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            # a checkpoint without the count: Adam's own step count is the same number
            self.optimizer_steps = int(state.get("optimizer_steps", max(
                (float(s["step"]) for s in self.optimizer.state.values() if "step" in s),
                default=0)))
        rng_file = path / f"rng_rank{self.slice.rank}.pt"
        if rng_file.exists():
            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["torch"])
            if rng["cuda"] and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])

    def stop(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
