"""vime's side of a fallback bucket to a vLLM worker in another process
(runtime/backends/vllm_worker.py): tensors travel as raw bytes with their names, dtypes and
shapes, and come back bit for bit, bf16 included (which numpy cannot hold)."""

from __future__ import annotations

import msgpack
import torch

from runtime.backends.vllm_worker import pack, unpack


def test_a_bucket_survives_msgpack_bit_for_bit():
    torch.manual_seed(0)
    bucket = {"model.layers.0.mlp.experts.3.up_proj.weight": torch.randn(4, 6).bfloat16(),
              "model.norm.weight": torch.randn(6),
              "lm_head.weight": torch.randn(3, 6).half()[:, ::2],  # not contiguous
              "model.layers.0.mlp.gate.e_score_correction_bias": torch.arange(5)}
    # what vLLM's msgpack-based RPC does to the arguments of a collective_rpc
    wire = msgpack.unpackb(msgpack.packb(pack(bucket)))
    back = dict(unpack(wire))
    assert list(back) == list(bucket)
    for name, tensor in bucket.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape
        assert torch.equal(back[name], tensor), name
