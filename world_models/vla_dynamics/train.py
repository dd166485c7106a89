"""Training the world model on windows of real episodes (pretraining and online refinement)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from world_models.vla_dynamics.data import sample_windows
from world_models.vla_dynamics.model import VLADynamics


def train_dynamics(
    model: VLADynamics,
    episodes: Sequence[dict],
    steps: int,
    batch_size: int = 32,
    horizon: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    progress: bool = False,
    state_horizon: int = 50,
) -> tuple[torch.optim.Optimizer, list[float]]:
    """``steps`` Adam steps on random windows; each row trains one member (bootstrap). A grounded
    model's heads also train at every step on ``batch_size`` windows of ``state_horizon`` steps
    (:meth:`VLADynamics.grounded_loss`: no frame decoded, so whole episodes are cheap). Returns the
    optimizer (to keep for online refinement) and the loss history. Every draw comes from ``seed``,
    none from the global RNG: the same model, episodes and seed train to the same weights."""
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)  # the windows and members
    gen = torch.Generator().manual_seed(seed)  # the frames decoded, the diffusion noise
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    hist = []
    if model.cfg.state_integrator and model.grounded is not None:  # its clamp covers the data's hands
        states = torch.from_numpy(np.concatenate([e["states"] for e in episodes])).to(model.device)
        for gm in model.grounded:
            gm.widen_range(states)
    it = tqdm(range(steps), desc="world model", disable=not progress)
    k = model.cfg.n_members
    for _ in it:
        batch = {n: v.to(model.device) for n, v in sample_windows(episodes, batch_size, horizon, rng).items()}
        member_ids = torch.from_numpy(rng.integers(k, size=batch_size)) if k > 1 else None
        loss, _ = model.loss(batch, member_ids, gen)
        if model.grounded is not None:
            long = sample_windows(episodes, batch_size, state_horizon, rng, frames=False, from_start=True)
            g_ids = torch.from_numpy(rng.integers(k, size=batch_size)) if k > 1 else None
            loss = loss + model.grounded_loss({n: v.to(model.device) for n, v in long.items()}, g_ids)[0]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        hist.append(float(loss.detach()))
        it.set_postfix(loss=f"{hist[-1]:.4f}")
    model.eval()
    return opt, hist
