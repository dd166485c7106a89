"""A policy-diverse offline dataset for the world model, recorded once per machine.

Expert demos never fail and the SFT policy's own rollouts cover one behaviour, so a world model
pretrained on them has seen few of the ways a policy halfway through RL succeeds or fails. This
module records, in the simulator, episodes from a mix of *sources* around the task's expert and the
SFT policy, and writes them as one LeRobot dataset under ``cache_dir`` (keyed by the fields it
depends on: the SFT policy's and this recipe's, never the run's seed or method), so every seed and
method of a grid pretrains its WM on the same data. Its simulator steps are reported apart from
the RL budget (``summary.json`` beside it, copied to the run directory as ``offline_data.json``).

A source is written ``kind:level``:

- ``expert:σ``: the task's scripted expert with Gaussian noise of std ``σ`` added to every action
  (then clipped to [-1, 1]); the action recorded is the one executed;
- ``policy:T``: the SFT policy sampled at temperature ``T``;
- ``perturbed:α``: the SFT policy with every weight tensor ``w`` moved by ``α * std(w) * ε``,
  ``ε ~ N(0, 1)`` (a seeded copy, one per source), sampled at temperature 1 (an "earlier" or
  "different" policy near the SFT one).

Episodes of a task are dealt to the sources round-robin, each on its own reset seed
(``OFFLINE_SEED0 + k``, apart from the demos', DAgger's, the SFT rollouts' and evaluation's).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and numpy are imported where used: the config checks a mix with parse_mix
    import torch

OFFLINE_REPO = "wmrl/offline"
OFFLINE_SEED0 = 700_000
KINDS = ("expert", "policy", "perturbed")


@dataclass(frozen=True)
class Source:
    kind: str
    level: float

    def __str__(self) -> str:
        return f"{self.kind}:{self.level:g}"


def parse_mix(mix: list[str] | tuple[str, ...]) -> list[Source]:
    """``["expert:0.3", "policy:1.5", ...]`` -> sources; ``ValueError`` naming the bad entry."""
    out = []
    for entry in mix:
        kind, sep, level = str(entry).partition(":")
        try:
            value = float(level)
        except ValueError:
            value = math.nan
        if not sep or kind not in KINDS or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{entry!r} is not a source: write kind:level with kind one of {', '.join(KINDS)} and "
                "level >= 0 (expert:0.3 = the expert with action noise of std 0.3, policy:1.5 = the starting "
                "policy (SFT or domain.policy_path) at temperature 1.5, perturbed:0.1 = its weights moved by 0.1 of their std)"
            )
        out.append(Source(kind, value))
    if not out:
        raise ValueError("the offline mix names no source")
    return out


def perturbed_copy(policy: torch.nn.Module, alpha: float, seed: int) -> torch.nn.Module:
    """A copy of ``policy`` with each floating weight tensor ``w`` replaced by
    ``w + alpha * std(w) * eps``, ``eps ~ N(0, 1)`` drawn from ``seed`` (scalars and 1-element tensors
    are left as they are: their std is undefined)."""
    import torch

    out = copy.deepcopy(policy)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.is_floating_point() and p.numel() > 1:
                eps = torch.randn(p.shape, generator=gen).to(p.device, p.dtype)
                p.add_(alpha * p.std() * eps)
    return out


def deal_seeds(tasks: list[str], per_task: int, n_sources: int) -> list[list[tuple[str, int]]]:
    """Each source's ``(task, reset seed)`` specs: episode k of a task goes to source ``k % n_sources``
    with seed ``OFFLINE_SEED0 + k``."""
    specs: list[list[tuple[str, int]]] = [[] for _ in range(n_sources)]
    for t in tasks:
        for k in range(per_task):
            specs[k % n_sources].append((t, OFFLINE_SEED0 + k))
    return specs


def record_offline(
    policy: Any,
    tasks: list[str],
    per_task: int,
    mix: list[str] | tuple[str, ...],
    root: Path,
    image_size: int,
    max_steps: int | None,
    seed: int,
    progress: bool = True,
) -> dict[str, Any]:
    """Record ``per_task`` episodes of each task from the sources of ``mix`` into a LeRobot dataset at
    ``root`` (``OFFLINE_REPO``); returns the summary written to ``root / "summary.json"``: executions
    (episodes), simulator steps, seconds, success rate, and per source its episodes, success rate, mean
    reward and simulator steps."""
    import numpy as np
    import torch

    from wmrl.tracking import stage
    from wmrl_vla.data import append_episodes
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes, run_expert_episodes, to_frames

    sources = parse_mix(mix)
    pool = EnvPool(image_size, max_steps)
    t0 = time.perf_counter()
    per_source: dict[str, dict[str, float]] = {}
    rollouts = []
    try:
        for i, (src, specs) in enumerate(
            zip(sources, deal_seeds(tasks, per_task, len(sources)), strict=True)
        ):
            if not specs:
                continue
            with stage(f"[vla] offline data: {len(specs)} episodes from {src}", progress):
                if src.kind == "expert":
                    ro = run_expert_episodes(specs, pool, "train", action_noise=src.level,
                                             rng=np.random.default_rng(seed + i))  # fmt: skip
                else:
                    actor_policy = (
                        policy if src.kind == "policy" else perturbed_copy(policy, src.level, seed + i)
                    )
                    temperature = src.level if src.kind == "policy" else 1.0
                    gen = torch.Generator().manual_seed(seed + i)
                    ro = run_episodes(policy_actor(actor_policy, temperature, gen), specs, pool, "train")
            per_source[str(src)] = {
                "episodes": len(ro),
                "success": float(np.mean([r.success.max() for r in ro])),
                "reward": float(np.mean([r.reward for r in ro])),
                "sim_steps": int(sum(r.length for r in ro)),
            }
            rollouts.extend(ro)
    finally:
        pool.close()
    append_episodes(
        root, OFFLINE_REPO, [to_frames(r) for r in rollouts], [r.task_id for r in rollouts],
        [r.seed for r in rollouts],
    )  # fmt: skip
    summary = {
        "executions": len(rollouts),  # episodes: the keys a comparison report reads (wmrl.report)
        "sim_steps": int(sum(r.length for r in rollouts)),
        "seconds": time.perf_counter() - t0,
        "success": float(np.mean([r.success.max() for r in rollouts])),
        "sources": per_source,
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
