"""Helpers shared by the compiler tests (imported as `specsupport`; a module named
`conftest` would collide with the conftest.py files of test subfolders)."""

from __future__ import annotations

import json
from pathlib import Path

from vime import pipeline, schema
from vime.parse import Source
from vime.resolve.model import PRESETS

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.toml"))


def largest(path: str) -> int:
    """The schema's maximum of an integer key."""
    return schema.node(tuple(path.split(".")))["maximum"]


# --set arguments of specs/qwen3_30b.toml at the schema's maxima that check accepts:
# the largest cluster (4096 nodes × 64 GPUs) with the seed's layout (32,768 engines of 8 GPUs),
# and with every parallel size 1 and one-GPU engines (the most ranks per group kind, groups and
# engines: 262,144 each), with the largest admitted counts elsewhere
_CLUSTER = [f"cluster.nodes={largest('cluster.nodes')}",
            f"cluster.gpus_per_node={largest('cluster.gpus_per_node')}",
            f"rollout.num_rollout={largest('rollout.num_rollout')}",
            f"checkpoint.save_interval={largest('checkpoint.save_interval')}",
            f"experiment.seed={largest('experiment.seed')}",
            f"cluster.host_memory_gib={largest('cluster.host_memory_gib')}",
            f"inference.eplb.window_size={largest('inference.eplb.window_size')}"]
LARGEST = {
    "seed-layout": _CLUSTER + ["rollout.batch_size=32768", "train.global_batch_size=65536"],
    "one-gpu-engines": _CLUSTER + [
        f"cluster.gpu_memory_gib={largest('cluster.gpu_memory_gib')}",
        "rollout.batch_size=131072", "train.global_batch_size=262144", "train.parallel.tp=1",
        "train.parallel.ep=1", "train.parallel.sequence_parallel=false",
        "inference.gpus_per_engine=1", "inference.expert_parallel=false"],
}



def largest_argv(case: str, sets=()) -> list[str]:
    """`vime plan` of specs/qwen3_30b.toml at LARGEST[case], with these --set items after it."""
    return ["plan", str(ROOT / "specs" / "qwen3_30b.toml"),
            *(arg for item in [*LARGEST[case], *sets] for arg in ("--set", item))]

def run_text(text: str, sets=(), name: str = "spec.toml", spec_dir: Path = ROOT / "specs",
             strict: bool = False) -> pipeline.Result:
    return pipeline.run(Source(name, text), list(sets), spec_dir, strict)


def run_spec(path: Path, sets=(), strict: bool = False) -> pipeline.Result:
    return run_text(path.read_text(), sets, f"specs/{path.name}", path.parent, strict)


def codes(result: pipeline.Result) -> set[str]:
    return {d.code for d in result.diagnostics}


def _preset_checkpoint(tmp_path):
    """A folder with the config.json of a preset, as an HF checkpoint would have."""

    def make(preset: str) -> Path:
        folder = tmp_path / preset
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(PRESETS[preset]))
        return folder

    return make


def read_report(path: Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The curves of a `vime report` page read back into numbers: panel title -> metric key ->
    [(rollout, value)], inverted from each polyline's pixels through its SVG's axis ranges;
    a panel without a chart maps to {}."""
    from html.parser import HTMLParser

    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}

    class Reader(HTMLParser):
        panel = ""
        axes: dict[str, float] = {}

        def handle_starttag(self, tag, attrs):
            found = dict(attrs)
            if tag == "section":
                self.panel = found["data-panel"]
                panels[self.panel] = {}
            elif tag == "svg":
                self.axes = {k[5:]: float(v) for k, v in found.items() if k.startswith("data-")}
            elif tag == "polyline":
                a = self.axes
                pairs = [tuple(map(float, p.split(","))) for p in found["points"].split()]
                panels[self.panel][found["data-key"]] = [
                    (a["x-min"] + (x - a["left"]) / a["plot-width"] * (a["x-max"] - a["x-min"]),
                     a["y-max"] - (y - a["top"]) / a["plot-height"] * (a["y-max"] - a["y-min"]))
                    for x, y in pairs]

    Reader().feed(path.read_text(encoding="utf-8"))
    return panels


def assert_report_matches(panels: dict, records: list[dict]) -> int:
    """Every curve of the report is its key's values in records, within the pixel rounding
    (1/100 px of the plot's height, a 1/1000 of the panel's largest value allowed); returns
    how many curves were compared."""
    compared = 0
    for curves in panels.values():
        # the curves of a panel share its y axis: the rounding is a fraction of its range
        span = max((abs(r[key]) for key in curves for r in records if r.get(key) is not None),
                   default=0.0) or 1.0
        for key, points in curves.items():
            logged = [(r["rollout"], r[key]) for r in records if r.get(key) is not None]
            assert len(points) == len(logged), key
            for (x, y), (rollout, value) in zip(points, logged, strict=True):
                assert abs(x - rollout) < 0.01, (key, x, rollout)
                assert abs(y - value) <= 1e-3 * span + 1e-12, (key, y, value)
            compared += 1
    return compared
