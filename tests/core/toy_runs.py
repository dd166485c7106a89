"""What the core's tests that train the toy domain share: its fast settings and the resume check's runs."""

from __future__ import annotations

from pathlib import Path

from wmrl.config import RunConfig, load_config
from wmrl.trainer import Trainer

#: The toy domain, fast: jobs inline, no tracking, SGD at a large step on 8 groups, short warm-ups
#: (the calibration and the denoiser act within a few steps).
FAST = [
    "--executor.type=inline",
    "--tracking.wandb=disabled",
    "--tracking.progress=false",
    "--grpo.optimizer=sgd",
    "--grpo.lr=20",
    "--grpo.tasks_per_step=8",
    "--debias.warmup_pairs=16",
    "--denoise.warmup_obs=4",
]


def reference_and_half(tmp_path: Path, config) -> tuple[Trainer, RunConfig]:
    """Train ``config("ref", 6)`` uninterrupted and ``config("run", 3)``, the first half of the same run
    (``config(out, steps)`` -> RunConfig in ``tmp_path / out``). Returns the reference trainer and
    ``config("run", 6)``, the config that resumes the half to compare with it."""
    ref = Trainer(c := config("ref", 6), c.domain.build(c))
    ref.train()
    half = config("run", 3)
    Trainer(half, half.domain.build(half)).train()
    return ref, config("run", 6)


def toy_config(*args: str) -> RunConfig:
    """The toy run of :data:`FAST` and ``args`` (draccus arguments, later ones win)."""
    return load_config(None, [*FAST, *args])
