"""The loop with one rank and one engine in this process (no Ray): resume equivalence,
colocated phases, the KL path, and the metrics sinks."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from runtimekit import in_process_loop, job_config, metrics

from runtime.core.interfaces import WeightBucket
from runtime.rl import metrics as metrics_module
from runtime.rl.metrics import MetricsLogger

# A resumed run must end where the uninterrupted one does: every sample, reward and weight is
# derived from the seed, the rollout index and the checkpointed state, so on one machine the
# numbers are equal; the tolerance only allows for a different summation order.
RESUME_TOLERANCE = 1e-6
COMPARED = ("reward/mean", "response_len/mean", "train/pg_loss", "train/clip_fraction",
            "train/entropy", "train/grad_norm", "weight_version")


def _weights(loop) -> dict[str, torch.Tensor]:
    backend = loop.train.workers[0].backend
    backend.onload()  # a colocated run ends with the actor offloaded
    return {n: p.detach().clone() for n, p in backend.params.items()}


def _run(tmp_path, job, **keys):
    _, _, config = job_config(tmp_path, job, **keys)
    loop = in_process_loop(config)
    loop.restore()
    loop.run()
    return loop, config


def test_a_resumed_run_ends_where_the_uninterrupted_one_does(tmp_path):
    straight, config = _run(tmp_path / "a", "straight", rollout__num_rollout="6",
                            checkpoint__save_interval="3")
    first, _ = _run(tmp_path / "b", "first", rollout__num_rollout="3",
                    checkpoint__save_interval="3")
    resumed, resumed_config = _run(tmp_path / "b", "resumed", rollout__num_rollout="6",
                                   checkpoint__save_interval="3")
    assert resumed.version == straight.version == 7  # 1 initial + one per rollout
    expected = metrics(config.job_dir)
    got = metrics(first.config.job_dir) + metrics(resumed_config.job_dir)
    assert [r["rollout"] for r in got] == list(range(6))
    for want, have in zip(expected, got, strict=True):
        for key in COMPARED:
            assert have[key] == pytest.approx(want[key], abs=RESUME_TOLERANCE), (want["rollout"], key)
    a, b = _weights(straight), _weights(resumed)
    assert max(float((a[n] - b[n]).abs().max()) for n in a) <= RESUME_TOLERANCE
    assert resumed.sampler.state_dict() == straight.sampler.state_dict()
    # and a fresh run of the same experiment finds nothing left to do
    again, _ = _run(tmp_path / "b", "again", rollout__num_rollout="6")
    assert again.next_rollout == 6 and not (again.config.job_dir / "metrics.jsonl").exists()


def test_colocated_phases_free_the_device_of_the_side_that_waits(tmp_path):
    loop, config = _run(tmp_path, "colocated", rollout__num_rollout="2")
    for record in metrics(config.job_dir):
        assert record["memory/engine_bytes_while_training"] == 0
        assert record["memory/actor_bytes_while_generating"] == 0
        assert record["time/offload"] > 0
        # the actor's own share of it: what it held before, and both copies' seconds
        assert record["offload/actor_gb"] > 0
        assert record["offload/actor_out_s"] > 0 and record["offload/actor_in_s"] > 0
    loop, config = _run(tmp_path / "split", "split", rollout__num_rollout="2",
                        cluster__gpus_per_node="2", train__colocate="false",
                        train__num_gpus="1")
    record = metrics(config.job_dir)[-1]
    assert "memory/engine_bytes_while_training" not in record and "time/offload" not in record
    assert loop.rollout.resident_bytes() > 0 and loop.train.resident_bytes() > 0


def test_a_resident_colocated_run_never_offloads_nor_sleeps(tmp_path):
    _, _, config = job_config(tmp_path, "resident", rollout__num_rollout="2",
                              train__offload='"never"')
    assert config.colocate and config.resident and not config.takes_turns
    loop = in_process_loop(config)
    calls = []
    for group, names in ((loop.train, ("offload", "onload")), (loop.rollout, ("sleep", "wake"))):
        for name in names:
            method = getattr(group, name)
            setattr(group, name, lambda *a, _m=method, _n=name: (calls.append(_n), _m(*a))[1])
    loop.restore()
    loop.run()
    assert calls == []
    record = metrics(config.job_dir)[-1]
    assert "time/offload" not in record and record["weight_version"] == 2
    assert loop.rollout.resident_bytes() > 0 and loop.train.resident_bytes() > 0
    # the same spec taking turns calls them every rollout
    _, _, turns = job_config(tmp_path / "turns", "turns", rollout__num_rollout="1",
                             train__offload='"always"')
    assert turns.takes_turns


def test_kl_loss_against_the_reference_and_the_entropy_bonus(tmp_path):
    # The torch backend's reference is its initial weights; V405 (vime/check/batch.py) asks
    # for Megatron's reference checkpoint whatever the backend, hence the placeholder.
    _, config = _run(tmp_path, "kl", rollout__num_rollout="2", algorithm__kl_loss_coef="0.05",
                     algorithm__kl_estimator='"k2"', algorithm__entropy_coef="0.01",
                     model__torch_dist_checkpoint='"unused-by-the-torch-backend"',
                     train__routing_replay="true")
    records = metrics(config.job_dir)
    # R3 on: the engine's routed experts reach the trainer's routers (a shape that does not
    # fit the batch raises); replaying them, the trainer's old log-probs are the engine's
    assert all(r["train/rollout_logprob_abs_diff"] < 1e-5 for r in records)
    # k2 >= 0; the first step of rollout 0 starts at the reference, later ones have moved away
    assert 0 <= records[0]["train/kl"] < records[1]["train/kl"]
    assert all(r["train/entropy"] > 0 for r in records)
    _, config = _run(tmp_path / "nokl", "nokl", rollout__num_rollout="1")
    assert "train/kl" not in metrics(config.job_dir)[0]  # no reference kept without a KL loss


def test_metrics_reach_the_console_jsonl_tensorboard_and_wandb(tmp_path, monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("wandb")

    class Run:
        def log(self, numbers, step):
            calls.append(("log", step, numbers["reward/mean"]))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs["project"], kwargs["group"], kwargs["name"]))
        return Run()

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    lines = []
    logger = MetricsLogger(tmp_path, "job-1", tensorboard_dir=tmp_path / "tb",
                           wandb_project="vime-tests", wandb_group="g", print_fn=lines.append)
    for rollout in range(2):
        logger.log(rollout, {"reward/mean": 0.5 + rollout, "response_len/mean": 3.0,
                             "time/rollout": 0.25, "reward/acc": 1.0})
    logger.close()
    assert lines[1] == "rollout     1 | reward 1.500 | acc 1.00 | len 3.0 | 0.25 s"
    assert [r["reward/mean"] for r in metrics(tmp_path)] == [0.5, 1.5]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert calls == [("init", "vime-tests", "g", "job-1"), ("log", 0, 0.5), ("log", 1, 1.5),
                     ("finish",)]
    assert metrics_module.main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "| 1 | " in table and "1.500" in table


def test_an_engine_that_keeps_stale_weights_shows_in_the_logprob_gap(tmp_path):
    # the same weights on both sides: the torch pair's log-probs agree to rounding
    _, config = _run(tmp_path / "fresh", "fresh", rollout__num_rollout="3")
    assert all(r["rollout/logprob_abs_diff"] < 1e-4 for r in metrics(config.job_dir))
    # the sync's time split: the export's part is there and inside the sync's
    assert all(0 < r["weight_sync/export_s"] <= r["time/weight_sync"]
               for r in metrics(config.job_dir))
    # an engine whose updates report success but keep the old tensors (seen on vLLM's CPU
    # kernels): the version advances, the sampled tensors might even match, the gap does not
    _, _, config = job_config(tmp_path / "stale", "stale", rollout__num_rollout="3")
    lines = []
    loop = in_process_loop(config, log=lines.append)
    engine = loop.rollout.workers[0].backend
    update, first = engine.update_weights, {}

    def keep_the_first_weights(bucket):
        if bucket.version == 1:
            first.update({n: t.clone() for n, t in bucket.tensors.items()})
            return update(bucket)
        # every later update "succeeds" with the first version's tensors
        return update(WeightBucket(bucket.version, {n: first[n] for n in bucket.tensors},
                                   bucket.last))
    engine.update_weights = keep_the_first_weights
    loop.run()
    gaps = [r["rollout/logprob_abs_diff"] for r in metrics(config.job_dir)]
    assert gaps[0] < 1e-4 and gaps[-1] > 10 * max(gaps[0], 1e-6)
    assert all(r["rollout/logprob_abs_diff_max"] >= g
               for r, g in zip(metrics(config.job_dir), gaps, strict=True))


def test_eval_metrics_and_an_exact_resume_with_dynamic_sampling(tmp_path):
    keys = dict(rollout__num_rollout="4", checkpoint__save_interval="2", eval__interval="2",
                rollout__dynamic_sampling="true", rollout__over_sampling_batch_size="4",
                rollout__overlong='"mask"', eval__at_end="true")
    straight, config = _run(tmp_path / "a", "straight", **keys)
    first, _ = _run(tmp_path / "b", "first", **{**keys, "rollout__num_rollout": "2"})
    resumed, resumed_config = _run(tmp_path / "b", "resumed", **keys)
    expected = metrics(config.job_dir)
    got = metrics(first.config.job_dir) + metrics(resumed_config.job_dir)
    # rollouts 0-3, then the final weights' evaluation as rollout 4; the first job ends with
    # its own final evaluation (rollout 2), which the resumed job repeats before rollout 2
    assert [r["rollout"] for r in expected] == [0, 1, 2, 3, 4]
    assert [r["rollout"] for r in got] == [0, 1, 2, 2, 3, 4]
    del got[2]
    evaluated = [r["rollout"] for r in expected if "eval/arith/pass@4" in r]
    assert evaluated == [0, 2, 4]
    assert set(expected[4]) >= {"eval/arith/acc", "eval/arith/pass@1", "eval/arith/pass@2",
                                "eval/arith/reward", "eval/arith/response_len"}
    assert 0 <= expected[0]["eval/arith/pass@1"] <= expected[0]["eval/arith/pass@4"] <= 1
    # 4 prompts per attempt for 8 groups: at least 2 attempts each rollout
    assert all(r["rollout/sampling_attempts"] >= 2 for r in expected[:4])
    compared = (*COMPARED, "rollout/groups_kept", "rollout/groups_filtered",
                "rollout/sampling_attempts", "eval/arith/reward", "eval/arith/pass@2")
    for want, have in zip(expected, got, strict=True):
        for key in compared:
            if key in want:
                assert have[key] == pytest.approx(want[key], abs=RESUME_TOLERANCE), \
                    (want["rollout"], key)
    a, b = _weights(straight), _weights(resumed)
    assert max(float((a[n] - b[n]).abs().max()) for n in a) <= RESUME_TOLERANCE
    assert resumed.sampler.state_dict() == straight.sampler.state_dict()


def test_an_eval_reward_beside_the_spec_is_found_like_the_rollout_reward(tmp_path):
    # the module lives only in the spec's folder (job.json's spec_dir), not on sys.path
    beside = tmp_path / "spec_folder"
    beside.mkdir()
    (beside / "beside_eval_reward.py").write_text(
        "def reward(prompt, response, label):\n    return 0.25\n")
    sys.modules.pop("beside_eval_reward", None)
    datasets = ('[{name = "arith", prompt_data = "data/tiny_arithmetic.jsonl", '
                'n_samples_per_prompt = 2, reward = "beside_eval_reward:reward"}]')
    _, _, config = job_config(tmp_path, rollout__num_rollout="1", eval__datasets=datasets,
                              eval__interval="1", eval__at_end="false")
    (config.job_dir / "job.json").write_text(f'{{"spec_dir": "{beside}"}}')
    try:
        loop = in_process_loop(config)
        loop.run()
    finally:
        sys.modules.pop("beside_eval_reward", None)
    [record] = metrics(config.job_dir)
    assert record["eval/arith/reward"] == pytest.approx(0.25)
