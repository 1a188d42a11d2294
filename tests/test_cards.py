"""Card facts: bfloat16 (V927) and the GPUs a node of the card's system holds (V928)."""

from __future__ import annotations

import pytest
from specsupport import ROOT, run_text

SPEC = ROOT / "specs" / "qwen3_30b.toml"  # one node of 8 GPUs, megatron + vllm


def _codes(*sets: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for diag in run_text(SPEC.read_text(), list(sets), spec_dir=SPEC.parent).diagnostics:
        found.setdefault(diag.code, []).append(diag)
    return found


@pytest.mark.parametrize(("written", "card", "capability"), [
    ("V100", "V100", "7.0"), ("Tesla-V100-SXM2-32GB", "V100", "7.0"), ("nvidia_t4", "T4", "7.5"),
    ("RTX-2080-Ti", "RTX-2080", "7.5")])
def test_a_card_without_bf16_is_refused_as_people_write_it(written, card, capability):
    [diag] = _codes(f'cluster.gpu="{written}"', "cluster.gpu_memory_gib=32")["V927"]
    assert diag.severity == "error" and diag.key == "cluster.gpu"
    assert f"the {card} has compute capability {capability}" in diag.message


@pytest.mark.parametrize("written", ["A100-80GB", "H100", "L40S", "B200", "V1000", "T40"])
def test_cards_with_bf16_and_unknown_names_pass(written):
    assert "V927" not in _codes(f'cluster.gpu="{written}"', "cluster.gpu_memory_gib=80")


def test_torch_backends_are_not_held_to_bf16():
    tiny = ROOT / "specs" / "tiny_cpu.toml"
    result = run_text(tiny.read_text(), ['cluster.gpu="T4"', "cluster.gpu_memory_gib=16"],
                      spec_dir=tiny.parent)
    assert "V927" not in [d.code for d in result.diagnostics]


def test_a_gb200_node_holds_four_gpus():
    [diag] = _codes('cluster.gpu="GB200"')["V928"]
    assert diag.message == "cluster.gpus_per_node = 8, but a GB200 node holds 4 GPUs"
    assert diag.help == "cluster.gpus_per_node = 4 and cluster.nodes = 2 for the same 8 GPUs"
    assert "V928" not in _codes('cluster.gpu="GB200"', "cluster.gpus_per_node=4",
                                "cluster.nodes=2", "inference.gpus_per_engine=4",
                                "train.parallel.ep=4")
    assert "V928" not in _codes('cluster.gpu="H200"')
