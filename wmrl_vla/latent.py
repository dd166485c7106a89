"""Imagination on the world model's latent: the policy acts without frames being decoded.

With ``domain.imagine_input=latent`` an imagined rollout never decodes a frame for the policy: a small
:class:`LatentAdapter` maps the WM's latent ``z`` ``[B, D]`` (plus the instruction's mean word
embedding ``[B, d]``, which conditions the policy's image encoder) to an estimate of what the
policy's pixel encoder would take from the decoded frame, its packed visual features ``[B, F]``
(:meth:`wmrl_vla.policy.SmallVLA.visual_features`: the FiLM patch and keypoint tokens and the
locator's table xy). The policy's trunk and action head read those features as they read the
pixel encoder's, so the GRPO update on imagined rollouts (log-probs recomputed on the stored
features) trains the same policy that acts in the simulator.

The adapter is distilled from the pixel encoder on the world model's own rollouts:
``adapter(z, s) ~ encoder(decode(z), s)`` (:func:`distill_loss`, a mean squared error on features
standardised per column, :func:`feature_stats`), first at build time on imagined rollouts of the
SFT policy, then refreshed after each imagined batch on a sample of its latents, decoded for that
purpose only, so it follows the world model's and the encoder's updates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def feature_stats(targets: torch.Tensor, min_std: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column mean and standard deviation (at least ``min_std``) of ``targets`` ``[N, F]``:
    ``[F]`` each."""
    if targets.dim() != 2 or targets.shape[0] < 2:
        raise ValueError(f"targets must be [N >= 2, F], got {tuple(targets.shape)}")
    return targets.mean(0), targets.std(0).clamp(min=min_std)


class LatentAdapter(nn.Module):
    """``adapter(z [B, D], sentence [B, d]) -> features [B, F] = mean + std * MLP([z, sentence])``.

    ``mean`` / ``std`` ``[F]`` (buffers, :meth:`set_normalisation`) standardise the targets, so every
    feature column weighs the same in :func:`distill_loss` whatever its scale (patch tokens vs the
    locator's table xy)."""

    def __init__(self, latent_dim: int, cond_dim: int, feature_dim: int, hidden: int = 256) -> None:
        super().__init__()
        if min(latent_dim, cond_dim, feature_dim, hidden) < 1:
            raise ValueError(
                f"latent_dim={latent_dim}, cond_dim={cond_dim}, feature_dim={feature_dim} and "
                f"hidden={hidden} must all be >= 1"
            )
        self.latent_dim, self.cond_dim, self.feature_dim = latent_dim, cond_dim, feature_dim
        self.net = nn.Sequential(
            nn.Linear(latent_dim + cond_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, feature_dim),
        )
        self.register_buffer("mean", torch.zeros(feature_dim))
        self.register_buffer("std", torch.ones(feature_dim))

    def set_normalisation(self, targets: torch.Tensor) -> None:
        mean, std = feature_stats(targets)
        self.mean.copy_(mean.to(self.mean.device))
        self.std.copy_(std.to(self.std.device))

    def standardised(self, z: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
        """``[B, F]`` prediction of ``(features - mean) / std``."""
        if z.dim() != 2 or z.shape[1] != self.latent_dim:
            raise ValueError(f"z has shape {tuple(z.shape)}, expected [B, {self.latent_dim}]")
        if sentence.shape != (z.shape[0], self.cond_dim):
            raise ValueError(
                f"sentence has shape {tuple(sentence.shape)}, expected ({z.shape[0]}, {self.cond_dim})"
            )
        return self.net(torch.cat([z.float(), sentence.float()], -1))

    def forward(self, z: torch.Tensor, sentence: torch.Tensor) -> torch.Tensor:
        return self.mean + self.std * self.standardised(z, sentence)


def distill_loss(
    adapter: LatentAdapter, z: torch.Tensor, sentence: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """``mean((adapter.standardised(z, s) - (targets - mean) / std)^2)`` over rows and columns:
    ``z`` ``[B, D]``, ``sentence`` ``[B, d]``, ``targets`` ``[B, F]`` (the pixel encoder's features of
    the frames decoded from ``z``)."""
    target = (targets - adapter.mean) / adapter.std
    return F.mse_loss(adapter.standardised(z, sentence), target)


def distill(
    adapter: LatentAdapter,
    optimizer: torch.optim.Optimizer,
    z: torch.Tensor,
    sentence: torch.Tensor,
    targets: torch.Tensor,
    steps: int,
    batch_size: int = 256,
    generator: torch.Generator | None = None,
) -> list[float]:
    """``steps`` optimizer steps of :func:`distill_loss` on minibatches of ``batch_size`` rows drawn
    with replacement from ``z`` ``[N, D]``, ``sentence`` ``[N, d]``, ``targets`` ``[N, F]`` (on the
    adapter's device). Gradients are enabled here (a caller may run under ``torch.no_grad``).
    Returns the losses."""
    n = z.shape[0]
    if sentence.shape[0] != n or targets.shape[0] != n:
        raise ValueError(f"z, sentence and targets have {n}, {sentence.shape[0]}, {targets.shape[0]} rows")
    adapter.train()
    losses = []
    with torch.enable_grad():
        for _ in range(steps):
            j = torch.randint(n, (min(batch_size, n),), generator=generator).to(z.device)
            loss = distill_loss(adapter, z[j].detach(), sentence[j].detach(), targets[j].detach())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    adapter.eval()
    return losses


@torch.no_grad()
def encoder_targets(
    policy, wm, init_images: torch.Tensor, z: torch.Tensor, instr: torch.Tensor, chunk: int = 256
):
    """The pixel encoder's features of the frames the world model decodes from latents: ``z``
    ``[M, D]`` of rollouts whose first frames are ``init_images`` ``[M, 3, H, W]`` uint8 (the
    decoder's context), instruction ids ``instr`` ``[M, L]`` -> ``[M, F]`` on the policy's device."""
    dev = policy.centers.device
    out = []
    for s in range(0, z.shape[0], chunk):
        sl = slice(s, s + chunk)
        frames = wm.frames_from_latents(init_images[sl], z[sl])
        out.append(policy.visual_features(frames.to(dev), instr[sl].to(dev)))
    return torch.cat(out)
