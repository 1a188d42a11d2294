"""The spec's paths made absolute for a submitted job.

`vime compile` writes the paths as the user wrote them, so that a build folder (and the
goldens in tests/golden/) is the same on every machine. A submitted job runs elsewhere, so
`vime submit` writes its job folder's resolved.toml, megatron.args and vllm.args with every
relative path made absolute, from the folder it was relative to (the spec's folder for data
and model paths, the folder vime runs in for experiment.output_dir). Which path is taken
from where: docs/design.md, "The spec's paths in a submitted job".
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from vime.resolve.spec import Spec


def _from_spec(value: str | None, spec_dir: Path, cwd: Path) -> str | None:
    if value is None:
        return None
    path = Path(os.path.expanduser(value))
    if path.is_absolute():
        return str(path)
    if (spec_dir / path).exists() or not (cwd / path).exists():
        return os.path.normpath(spec_dir / path)
    return os.path.normpath(cwd / path)


def absolute(spec: Spec, spec_dir: Path, cwd: Path) -> Spec:
    """spec with the paths above absolute; everything else, and the input, unchanged."""
    model, data, experiment = spec.model, spec.data, spec.experiment
    hf = _from_spec(model.hf_checkpoint, spec_dir, cwd)
    model = dataclasses.replace(
        model, hf_checkpoint=hf if Path(hf).exists() else model.hf_checkpoint,
        **{key: _from_spec(getattr(model, key), spec_dir, cwd)
           for key in ("torch_dist_checkpoint", "load", "save")})
    data = dataclasses.replace(data, prompt_data=_from_spec(data.prompt_data, spec_dir, cwd))
    evaluation = dataclasses.replace(spec.eval, datasets=tuple(
        dataclasses.replace(d, prompt_data=_from_spec(d.prompt_data, spec_dir, cwd))
        for d in spec.eval.datasets))
    output_dir = os.path.normpath(cwd / os.path.expanduser(experiment.output_dir))
    experiment = dataclasses.replace(experiment, output_dir=output_dir)
    return dataclasses.replace(spec, model=model, data=data, experiment=experiment,
                               eval=evaluation)
