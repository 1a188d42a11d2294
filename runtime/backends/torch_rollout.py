"""The torch rollout engine: the same transformers model as the trainer, sampling with
temperature and top-p, one seeded generator per request, returning per-token log-probs and
(when asked) the routed experts. One device per engine (V902).

Top-p is vLLM's rule (runtime/core/nucleus.py) and the log-probs are of the renormalised nucleus,
as vLLM's processed log-probs are; greedy sampling applies no top-p, as vLLM's does not.

sleep/wake are real state changes, as vLLM's sleep mode is: level 1 moves the weights to a
host copy and drops the KV cache; level 2 drops the weights too, so the next update must
bring every weight before the engine may generate again. Generating while asleep raises.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from runtime.backends import torch_model
from runtime.core import nucleus
from runtime.core.interfaces import (
    Generation,
    GenerationRequest,
    RolloutBackend,
    SamplingParams,
    WeightBucket,
)
from runtime.core.slices import EngineSlice


class TorchRolloutBackend(RolloutBackend):
    def __init__(self):
        self.model: torch.nn.Module | None = None
        self.version = 0
        self.weights_state = "absent"  # resident | host | dropped | absent
        self.kv_cache_awake = False
        self._host: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, torch.Size] = {}
        self._filled: set[str] = set()

    # ------------------------------------------------------------------------------ start

    def start(self, slice: EngineSlice) -> None:
        if len(slice.gpus) != 1:
            raise ValueError(f"the torch rollout backend runs one device per engine; engine "
                             f"{slice.engine} has {len(slice.gpus)} (inference.gpus_per_engine)")
        torch_model.set_threads(slice.cpu_threads)
        self.slice = slice
        self.device = torch_model.device_for_this_process()
        self.model = torch_model.build_model(slice.model, self.device).eval()
        self.routers = torch_model.Routers(self.model)
        self.params = dict(self.model.named_parameters())
        self._shapes = {name: p.shape for name, p in self.params.items()}
        self.weights_state, self.kv_cache_awake = "resident", True

    # --------------------------------------------------------------------------- generate

    @torch.no_grad()
    def generate(self, requests: Sequence[GenerationRequest],
                 params: SamplingParams) -> list[Generation]:
        if self.weights_state != "resident" or not self.kv_cache_awake:
            raise RuntimeError(f"engine {self.slice.engine} cannot generate: weights "
                               f"{self.weights_state}, KV cache "
                               f"{'awake' if self.kv_cache_awake else 'asleep'}")
        if params.return_routed_experts and not len(self.routers):
            raise ValueError("routed experts were asked for, but the model has no MoE router")
        if not requests:
            return []
        return self._generate(list(requests), params)

    def _generate(self, requests: list[GenerationRequest], params: SamplingParams):
        device, batch = self.device, len(requests)
        temperature = params.temperature if params.temperature > 0 else 1.0
        top_p = params.top_p if params.temperature > 0 else 1.0
        prompt_lens = [len(r.prompt_ids) for r in requests]
        width = max(prompt_lens)
        ids = torch.zeros(batch, width, dtype=torch.long)
        mask = torch.zeros(batch, width, dtype=torch.long)
        for row, request in enumerate(requests):  # left padding: every prompt ends at `width`
            ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            mask[row, width - len(request.prompt_ids):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator(device=device).manual_seed(r.seed) for r in requests]
        stop = set(params.stop_token_ids)
        tokens: list[list[int]] = [[] for _ in requests]
        log_probs: list[list[float]] = [[] for _ in requests]
        done = [False] * batch
        cache = torch_model.new_cache(self.model)
        capture = self.routers.capturing() if params.return_routed_experts else _nothing()
        with capture as captured:
            logits = torch_model.forward(self.model, ids, mask, positions, cache).logits[:, -1]
            for step in range(params.max_new_tokens):
                scaled = logits.float() / temperature
                if top_p < 1.0:  # the nucleus, renormalised: sampled from and reported
                    scaled = scaled.masked_fill(~nucleus.mask(scaled, top_p), -torch.inf)
                step_log_probs = torch.log_softmax(scaled, dim=-1)
                probs = step_log_probs.exp()
                chosen = torch.zeros(batch, dtype=torch.long)
                for row in range(batch):
                    if done[row]:
                        continue
                    if params.temperature > 0:
                        token = int(torch.multinomial(probs[row], 1, generator=generators[row]))
                    else:
                        token = int(torch.argmax(scaled[row]))
                    tokens[row].append(token)
                    log_probs[row].append(float(step_log_probs[row, token]))
                    chosen[row] = token
                    done[row] = token in stop
                if all(done) or step + 1 == params.max_new_tokens:
                    break
                mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], 1)
                positions = positions[:, -1:] + 1
                logits = torch_model.forward(self.model, chosen.view(-1, 1).to(device), mask,
                                             positions, cache).logits[:, -1]
        results = []
        for row in range(batch):
            reason = "stop" if tokens[row] and tokens[row][-1] in stop else "length"
            routed = (self._routed_rows(captured, row, width, prompt_lens[row], len(tokens[row]))
                      if params.return_routed_experts else None)
            results.append(Generation(tokens[row], log_probs[row], reason, routed))
        return results

    def _routed_rows(self, captured, row: int, width: int, prompt_len: int,
                     response_len: int) -> np.ndarray:
        """[prompt + response - 1, MoE layers, top-k]: the prefill's rows of this prompt's
        real tokens, then one row per decode step that fed one of its response tokens."""
        per_layer = []
        for calls in captured:
            prefill = calls[0].view(-1, width, self.routers.top_k)[row, width - prompt_len:]
            decoded = [call.view(-1, self.routers.top_k)[row] for call in
                       calls[1:response_len]]
            per_layer.append(torch.cat([prefill, *(d.unsqueeze(0) for d in decoded)]))
        return torch.stack(per_layer, dim=1).numpy().astype(np.int32)

    # ---------------------------------------------------------------------------- weights

    def update_weights(self, bucket: WeightBucket) -> None:
        if self.weights_state not in ("resident", "host"):
            raise RuntimeError(f"engine {self.slice.engine}: weights are {self.weights_state}; "
                               "wake(['weights']) before updating them")
        with torch.no_grad():
            for hf_name, tensor in bucket.tensors.items():
                name, target = torch_model.hf_target(self.params, hf_name)
                if target.shape != tensor.shape:
                    raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)}, the engine's is "
                                     f"{tuple(target.shape)}")
                target.copy_(tensor.to(target.device, target.dtype))
                self._filled.add(hf_name)
        if bucket.last:
            missing = set(torch_model.hf_names(self.model)) - self._filled
            if self._needs_every_weight and missing:
                raise RuntimeError(f"weight update {bucket.version} left {len(missing)} weights "
                                   f"unset after a level-2 sleep, e.g. {sorted(missing)[:3]}")
            self._filled.clear()
            self._needs_every_weight = False
            self.version = bucket.version

    def weight_version(self) -> int:
        return self.version

    _needs_every_weight = False

    # ------------------------------------------------------------------------ sleep / wake

    def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level {level}: 1 (weights to host) or 2 (weights dropped)")
        self.kv_cache_awake = False
        if self.weights_state != "resident":
            return
        for name, param in self.params.items():
            if level == 1:
                self._host[name] = param.data.to("cpu", copy=True)
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        self.weights_state = "host" if level == 1 else "dropped"
        torch_model.release_cached_memory(self.device)

    def wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        unknown = set(tags) - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"wake tags {sorted(unknown)}; known: weights, kv_cache")
        if "weights" in tags and self.weights_state in ("host", "dropped"):
            for name, param in self.params.items():
                if self.weights_state == "host":
                    param.data = self._host.pop(name).to(self.device)
                else:  # allocated, not initialised: the update that follows fills them
                    param.data = torch.empty(self._shapes[name], dtype=param.dtype,
                                             device=self.device)
            self._needs_every_weight = self.weights_state == "dropped"
            self._filled.clear()
            self.weights_state = "resident"
        if "kv_cache" in tags:
            if self.weights_state != "resident":
                raise RuntimeError("wake the weights before the KV cache")
            if self._needs_every_weight:
                raise RuntimeError("the weights were dropped (sleep level 2): update them "
                                   "before waking the KV cache")
            self.kv_cache_awake = True

    def resident_bytes(self) -> int:
        """Bytes of weights on the engine's device (0 while asleep)."""
        return sum(p.numel() * p.element_size() for p in self.params.values())

    def stop(self) -> None:
        self.model = None
        self.params = {}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
