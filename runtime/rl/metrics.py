"""Per-rollout metrics: one console line, one JSON line in <job folder>/metrics.jsonl, and
TensorBoard (logging.tensorboard_dir) and Weights & Biases (logging.wandb_project) when
configured. Both are optional imports: a configured logger whose package is missing is
reported once and skipped, never fatal.

    python -m runtime.rl.metrics <job folder> [<job folder> ...]   # the reward curve as a table
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from vime.launch.progress import eval_parts, sampling_parts

CONSOLE = (("reward/mean", "reward {:.3f}"), ("reward/acc", "acc {:.2f}"),
           ("response_len/mean", "len {:.1f}"), ("train/clip_fraction", "clip {:.3f}"),
           ("train/kl", "kl {:.4f}"), ("train/entropy", "ent {:.3f}"),
           ("throughput/generate_tokens_per_s", "gen {:.0f} tok/s"),
           ("throughput/train_tokens_per_s", "train {:.0f} tok/s"),
           ("time/rollout", "{:.2f} s"))


class MetricsLogger:
    def __init__(self, job_dir: Path, run_name: str, tensorboard_dir: Path | None = None,
                 wandb_project: str | None = None, wandb_group: str | None = None,
                 config: dict | None = None, print_fn=None):
        self.path = Path(job_dir) / "metrics.jsonl"
        self.print = print_fn or (lambda line: print(line, flush=True))
        self.tensorboard = self.wandb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tensorboard = SummaryWriter(log_dir=str(tensorboard_dir))
            except ImportError as err:
                self.print(f"vime: logging.tensorboard_dir is set but TensorBoard cannot be "
                           f"imported ({err}); pip install tensorboard")
        if wandb_project:
            try:
                import wandb

                self.wandb = wandb.init(project=wandb_project, group=wandb_group, name=run_name,
                                        dir=str(job_dir), config=config or {}, resume="allow")
            except Exception as err:  # an import error, or no login: metrics go on elsewhere
                self.print(f"vime: Weights & Biases disabled: {type(err).__name__}: {err}")
        self._attached: list = []  # callables whose numbers join the next record

    def attach(self, numbers) -> None:
        """numbers() merged into the next record, once: what is known only by then (the
        start-up's phases, runtime/core/startup.py, end with the first weight push)."""
        self._attached.append(numbers)

    def log(self, rollout_id: int, numbers: dict[str, float]) -> None:
        attached, self._attached = self._attached, []
        for extra in attached:
            numbers = {**numbers, **extra()}
        record = {"rollout": rollout_id, **{k: _plain(v) for k, v in numbers.items()}}
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())  # on disk before the checkpoint that covers it
        parts = [fmt.format(numbers[key]) for key, fmt in CONSOLE if key in numbers]
        parts += sampling_parts(numbers) + eval_parts(numbers)
        self.print(f"rollout {rollout_id:5d} | " + " | ".join(parts))
        if self.tensorboard is not None:
            for key, value in numbers.items():
                self.tensorboard.add_scalar(key, value, rollout_id)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(numbers, step=rollout_id)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def _plain(value):
    value = float(value)
    return value if math.isfinite(value) else None


def read(job_dirs: list[Path]) -> list[dict]:
    """Records of several jobs (a run and its resumptions), one per rollout, the latest job's
    record winning when a rollout was repeated."""
    by_rollout: dict[int, dict] = {}
    for job_dir in sorted(job_dirs, key=_started):
        path = Path(job_dir) / "metrics.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    by_rollout[record["rollout"]] = {**record, "job": Path(job_dir).name}
    return [by_rollout[k] for k in sorted(by_rollout)]


def _started(job_dir: Path) -> float:
    """When a job wrote its first metrics (jobs listed in any order, e.g. by a glob)."""
    path = Path(job_dir) / "metrics.jsonl"
    try:
        return path.stat().st_mtime if not (Path(job_dir) / "job.json").exists() else \
            (Path(job_dir) / "job.json").stat().st_mtime
    except OSError:
        return 0.0


def table(records: list[dict]) -> str:
    evals = sorted({k for r in records for k in r
                    if k.startswith("eval/") and (k.endswith("/acc") or "/pass@" in k)})
    lines = ["| rollout | job | reward | acc | response len | clip frac | time (s) |"
             + "".join(f" {k[len('eval/'):]} |" for k in evals),
             "|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(evals)]

    def cell(record: dict, key: str, fmt: str) -> str:
        value = record.get(key)
        return "" if value is None else format(value, fmt)

    for r in records:  # the final evaluation's record has eval numbers only
        lines.append(f"| {r['rollout']} | {r['job']} | {cell(r, 'reward/mean', '.3f')} | "
                     f"{cell(r, 'reward/acc', '.2f')} | {cell(r, 'response_len/mean', '.1f')} | "
                     f"{cell(r, 'train/clip_fraction', '.3f')} | {cell(r, 'time/rollout', '.2f')} |"
                     + "".join(f" {cell(r, k, '.3f')} |" for k in evals))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    folders = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not folders:
        print("usage: python -m runtime.rl.metrics <job folder> [<job folder> ...]",
              file=sys.stderr)
        return 2
    records = read(folders)
    if not records:
        print(f"no metrics.jsonl in {', '.join(map(str, folders))}", file=sys.stderr)
        return 1
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
