"""The torch backend pair in this process: sampling and log-probs agree, weights travel under
HF names, sleep/offload are real state changes, routed experts are captured and replayed,
and a saved actor comes back exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from runtimekit import job_config

from runtime.backends import torch_model
from runtime.backends.torch_rollout import TorchRolloutBackend
from runtime.backends.torch_train import TorchTrainingBackend
from runtime.core import nucleus
from runtime.core.interfaces import GenerationRequest, SamplingParams, TrainBatch, WeightBucket
from runtime.node.driver import load_tokenizer

LOGPROB_TOLERANCE = 1e-4  # batched, left-padded, KV-cached sampling vs one padded forward


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    _, _, config = job_config(tmp_path_factory.mktemp("backends"))
    tokenizer = load_tokenizer(config)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}],
                                         tokenize=False, add_generation_prompt=True)
    prompt = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    # prompts of different lengths, so left padding is exercised
    requests = [GenerationRequest(prompt[:len(prompt) - (i % 3)], seed=100 + i) for i in range(12)]
    params = SamplingParams(1.0, 1.0, 8, (tokenizer.eos_token_id,), return_routed_experts=True)
    return config, requests, params


def _trainer(config, **changes):
    backend = TorchTrainingBackend()
    backend.init(dataclasses.replace(config.train_slice(0, "127.0.0.1", 0, 1), **changes))
    return backend


def _engine(config):
    engine = TorchRolloutBackend()
    engine.start(config.engine_slice(0, 1))
    return engine


def _batch(requests, generations, advantages=None):
    return TrainBatch(tokens=[list(r.prompt_ids) + g.token_ids for r, g in zip(requests, generations, strict=True)],
                      prompt_lens=[len(r.prompt_ids) for r in requests], advantages=advantages,
                      rollout_log_probs=[g.log_probs for g in generations],
                      routed_experts=[g.routed_experts for g in generations])


def _max_diff(a, b):
    return max(abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))


def _push(trainer, engine, version):
    for tensors in trainer.export_weights(1 << 14):
        engine.update_weights(WeightBucket(version, tensors, last=False))
    engine.update_weights(WeightBucket(version, {}, last=True))


def test_sampling_is_seeded_per_request_and_log_probs_match_the_trainer(setup):
    config, requests, params = setup
    trainer, engine = _trainer(config), _engine(config)
    generations = engine.generate(requests, params)
    assert [g.token_ids for g in generations] == [g.token_ids for g in engine.generate(requests, params)]
    alone = engine.generate(requests[5:6], params)[0]  # the same seed alone: the same sample
    assert alone.token_ids == generations[5].token_ids
    assert len({tuple(g.token_ids) for g in generations}) > 6
    for g in generations:
        assert len(g.log_probs) == len(g.token_ids) >= 1
        assert g.finish_reason == ("stop" if g.token_ids[-1] in params.stop_token_ids else "length")
    trained = trainer.log_probs(_batch(requests, generations))
    assert _max_diff(trained, [g.log_probs for g in generations]) < LOGPROB_TOLERANCE


def test_top_p_log_probs_are_the_engines_nucleus_renormalised(setup):
    """With top_p < 1 the engine (as vLLM's processed log-probs) reports log-probs
    of the renormalised nucleus it sampled from, and the actor computes the same ones."""
    config, requests, _params = setup
    params = SamplingParams(0.8, 0.7, 8, _params.stop_token_ids)
    engine = _engine(config)
    generations = engine.generate(requests, params)
    batch = _batch(requests, generations)
    rollout = [g.log_probs for g in generations]
    trained = _trainer(config, temperature=0.8, top_p=0.7).log_probs(batch)
    assert _max_diff(trained, rollout) < LOGPROB_TOLERANCE
    # the whole-vocabulary log-probs are another quantity: the test can tell them apart
    assert _max_diff(_trainer(config, temperature=0.8).log_probs(batch), rollout) > 0.05
    # and the training pass computes the same log-probs as the log-prob pass
    trainer = _trainer(config, temperature=0.8, top_p=0.7)
    log_probs, entropy, mask = trainer._response_terms(batch, list(range(len(batch))))
    assert _max_diff([row[m].tolist() for row, m in zip(log_probs, mask, strict=True)],
                     rollout) < LOGPROB_TOLERANCE
    assert (entropy[mask] > 0).all()  # of the whole softmax: the metric is unchanged


def test_top_p_of_one_never_cuts(setup, monkeypatch):
    """top_p = 1 (and greedy sampling, where vLLM applies no top-p) takes the plain
    log-softmax: no sort, the old numbers."""
    config, requests, params = setup

    def refused(*_args):
        raise AssertionError("the nucleus was cut at top_p = 1")

    monkeypatch.setattr(nucleus, "cut", refused)
    engine = _engine(config)
    generations = engine.generate(requests[:4], params)
    engine.generate(requests[:2], SamplingParams(0.0, 0.7, 4, params.stop_token_ids))
    trainer = _trainer(config)
    batch = _batch(requests[:4], generations, advantages=[1.0, -1.0] * 2)
    batch.old_log_probs = trainer.log_probs(batch)
    batch.step_response_tokens = sum(batch.response_lens())
    trainer.train_step(batch)
    _trainer(config, temperature=0.0, top_p=0.7).log_probs(batch)


def test_weights_travel_under_hf_names_and_arrive_exactly(setup):
    config, requests, params = setup
    trainer, engine = _trainer(config), _engine(config)
    names = {n for bucket in trainer.export_weights(1 << 14) for n in bucket}
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in names
    assert "model.layers.0.mlp.gate.weight" in names
    assert not any("gate_up_proj" in n for n in names)  # transformers' fused layout stays inside
    # per layer: q k v o and the q/k norms, 4 experts × 3 projections, the router, 2 norms;
    # then the embedding, the final norm and the LM head
    assert len(names) == 2 * (6 + 4 * 3 + 1 + 2) + 3
    generations = engine.generate(requests, params)
    batch = _batch(requests, generations, advantages=[1.0, -1.0] * 6)
    batch.old_log_probs = trainer.log_probs(batch)
    batch.step_response_tokens = sum(batch.response_lens())
    trainer.train_step(batch)
    assert not all(torch.equal(p, engine.params[n]) for n, p in trainer.params.items())
    _push(trainer, engine, 2)
    assert engine.weight_version() == 2
    for name, param in trainer.params.items():
        assert torch.equal(param.detach(), engine.params[name].detach()), name


def test_engine_sleep_is_a_real_state_change(setup):
    config, requests, params = setup
    trainer, engine = _trainer(config), _engine(config)
    before = engine.generate(requests[:3], params)
    engine.sleep(1)
    assert engine.resident_bytes() == 0
    with pytest.raises(RuntimeError, match="cannot generate"):
        engine.generate(requests[:3], params)
    engine.wake()  # level 1: the weights come back from the host copy
    assert [g.token_ids for g in engine.generate(requests[:3], params)] == [g.token_ids for g in before]

    engine.sleep(2)  # level 2: the weights are gone; only a full update brings them back
    engine.wake(["weights"])
    with pytest.raises(RuntimeError, match="update them before waking the KV cache"):
        engine.wake(["kv_cache"])
    some = dict(list(next(trainer.export_weights(1 << 30)).items())[:5])
    engine.update_weights(WeightBucket(3, some, last=False))
    with pytest.raises(RuntimeError, match="left .* weights unset"):
        engine.update_weights(WeightBucket(3, {}, last=True))
    _push(trainer, engine, 3)
    engine.wake(["kv_cache"])
    assert [g.token_ids for g in engine.generate(requests[:3], params)] == [g.token_ids for g in before]


def test_actor_offload_frees_the_device_and_changes_nothing(setup):
    config, requests, params = setup
    engine = _engine(config)
    generations = engine.generate(requests, params)
    moved, stayed = _trainer(config), _trainer(config)
    for trainer in (moved, stayed):  # one step so Adam has moments to move
        batch = _batch(requests, generations, advantages=[1.0, -1.0] * 6)
        batch.old_log_probs = trainer.log_probs(batch)
        batch.step_response_tokens = sum(batch.response_lens())
        trainer.train_step(batch)
    exported = [dict(b) for b in moved.export_weights(1 << 30)]
    moved.offload()
    assert moved.resident_bytes() == 0 and stayed.resident_bytes() > 0
    with pytest.raises(RuntimeError, match="offloaded"):
        moved.log_probs(_batch(requests, generations))
    while_offloaded = [dict(b) for b in moved.export_weights(1 << 30)]  # weight sync still works
    assert all(torch.equal(a[k], b[k]) for a, b in zip(exported, while_offloaded, strict=True)
               for k in a)
    moved.onload()
    for trainer in (moved, stayed):
        batch = _batch(requests, generations, advantages=[-1.0, 1.0] * 6)
        batch.old_log_probs = trainer.log_probs(batch)
        batch.step_response_tokens = sum(batch.response_lens())
        trainer.train_step(batch)
    for name, param in moved.params.items():
        assert torch.equal(param, stayed.params[name]), name


def test_routed_experts_are_captured_and_replayed(setup):
    config, requests, params = setup
    engine = _engine(config)
    generations = engine.generate(requests, params)
    experts, top_k = config.model.arch["num_experts"], config.model.arch["num_experts_per_tok"]
    for request, g in zip(requests, generations, strict=True):
        rows = len(request.prompt_ids) + len(g.token_ids) - 1  # every token fed to the model
        assert g.routed_experts.shape == (rows, config.model.arch["num_hidden_layers"], top_k)
        assert g.routed_experts.min() >= 0 and g.routed_experts.max() < experts
        assert (np.sort(g.routed_experts, axis=-1)[..., 1:] != np.sort(g.routed_experts, axis=-1)[..., :-1]).all()
    batch = _batch(requests, generations)
    plain = _trainer(config, routing_replay=False).log_probs(batch)
    replaying = _trainer(config, routing_replay=True)
    # the engine routed as the trainer would: replaying its choice changes nothing
    assert _max_diff(replaying.log_probs(batch), plain) < LOGPROB_TOLERANCE
    # other experts do change the result: the replay is really used
    batch.routed_experts = [(r + 1) % experts for r in batch.routed_experts]
    assert _max_diff(replaying.log_probs(batch), plain) > 1e-3


def test_saved_actor_comes_back_exactly(setup, tmp_path):
    config, requests, params = setup
    engine = _engine(config)
    generations = engine.generate(requests, params)
    first = _trainer(config)

    def step(trainer, sign):
        batch = _batch(requests, generations, advantages=[sign, -sign] * 6)
        batch.old_log_probs = trainer.log_probs(batch)
        batch.step_response_tokens = sum(batch.response_lens())
        return trainer.train_step(batch)

    step(first, 1.0)
    first.save(tmp_path / "train")
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["model_optim.pt",
                                                                      "rng_rank0.pt"]
    second = _trainer(config)
    second.load(tmp_path / "train")
    assert step(first, -1.0) == step(second, -1.0)
    for name, param in first.params.items():
        assert torch.equal(param, second.params[name]), name


def test_model_is_built_from_the_seed_or_refused_without_weights(setup):
    config, _, _ = setup
    one = torch_model.build_model(config.model, torch.device("cpu"))
    two = torch_model.build_model(config.model, torch.device("cpu"))
    other = torch_model.build_model(dataclasses.replace(config.model, seed=5), torch.device("cpu"))
    weights = [dict(m.named_parameters()) for m in (one, two, other)]
    assert all(torch.equal(p, weights[1][n]) for n, p in weights[0].items())
    assert not all(torch.equal(p, weights[2][n]) for n, p in weights[0].items())
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        torch_model.build_model(dataclasses.replace(config.model, random_init=False),
                                torch.device("cpu"))

