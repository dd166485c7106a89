"""Inverse-variance denoising: fuse the anchor stream (true rewards) and the WM stream by their variances.

Anchor-group advantages are multiplied by ``w = clip(1 + c * s2, 1, w_max)``, where ``s2`` is an EWMA
of the within-group centred squared residual between (calibrated) WM scores and true rewards,
normalised by the variance of the true rewards in the group. Groups whose true rewards are all equal,
up to ``flat_std`` (their population std is at most that), are skipped: the ratio is meaningless there,
and a single near-flat group (true rewards 0, 0, 2e-4, 0) would otherwise put ``s2`` in the thousands
and pin ``w`` for the rest of training. ``c`` is fixed once, after ``warmup_obs`` observations, so that ``w == w_target`` at
that moment, then frozen: as debiasing removes bias the residual shrinks and ``w`` relaxes toward 1.
"""

from __future__ import annotations

import torch

from wmrl.config import DenoiseConfig, half_life_to_alpha
from wmrl.debias import centred_residual


def normalised_residuals(
    pred: torch.Tensor, true: torch.Tensor, group_ids: torch.Tensor, flat_std: float = 0.0
) -> torch.Tensor:
    """``[K]`` values ``res_g / var_g(r)`` for the anchor groups with ``std_g(r) > flat_std``
    (population statistics; groups with ``var_g(r) <= 1e-12`` are always skipped).

    Args: ``pred``, ``true`` ``[M]`` for the anchor rollouts; ``group_ids`` ``[M]``.
    """
    res = centred_residual(pred, true, group_ids)
    ok = torch.isfinite(true)
    t = torch.where(ok, true, torch.zeros_like(true)).double()
    n = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    cnt = torch.zeros(n, dtype=torch.float64).index_add_(0, group_ids, ok.double())
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, group_ids, t) / cnt.clamp(min=1)
    dev = torch.where(ok, t - mean[group_ids], torch.zeros_like(t))
    var = torch.zeros(n, dtype=torch.float64).index_add_(0, group_ids, dev**2) / cnt.clamp(min=1)
    keep = torch.isfinite(res) & (var > max(flat_std**2, 1e-12))
    return (res[keep] / var[keep]).float()


def anchor_weight(s2: float, c: float, w_max: float) -> float:
    """``w = clip(1 + c * s2, 1, w_max)``."""
    return float(min(max(1.0 + c * s2, 1.0), w_max))


def sample_weights(var: torch.Tensor, var_floor: float, w_max: float) -> torch.Tensor:
    """Per-sample inverse-variance weights within the WM stream, ``[N]``.

    u_i = 1 / (var_i + var_floor),   w_i = clip(u_i / mean(u), 1 / w_max, w_max)
    """
    u = 1.0 / (var.clamp(min=0) + var_floor)
    return (u / u.mean()).clamp(1.0 / w_max, w_max)


def normalise_weights(weights: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Rescale ``[N]`` weights to mean 1 over the used rollouts: the fused update is the
    inverse-variance *weighted mean* of the two streams, so weighting changes how they are mixed,
    never the overall step size."""
    if not used.any():
        return weights
    return weights / weights[used].mean()


class InverseVarianceDenoiser:
    """Tracks ``s2`` (EWMA with half-life ``half_life`` observations) and the anchor weight ``w``."""

    def __init__(self, cfg: DenoiseConfig):
        self.cfg = cfg
        self.alpha = half_life_to_alpha(cfg.half_life)
        self.s2: float | None = None
        self.n_obs = 0
        self.c: float | None = None

    def observe(self, pred: torch.Tensor, true: torch.Tensor, group_ids: torch.Tensor) -> None:
        """Fold in the anchor groups of one step (``[M]`` tensors)."""
        for x in normalised_residuals(pred, true, group_ids, self.cfg.flat_std).tolist():
            self.s2 = x if self.s2 is None else (1 - self.alpha) * self.s2 + self.alpha * x
            self.n_obs += 1
            if self.c is None and self.n_obs >= self.cfg.warmup_obs:
                # c such that w == w_target now; a WM with no residual gets no up-weighting.
                self.c = (self.cfg.w_target - 1.0) / self.s2 if self.s2 > 0 else 0.0

    @property
    def w(self) -> float:
        """The current anchor weight (1 until ``c`` is fixed)."""
        if self.c is None or self.s2 is None:
            return 1.0
        return anchor_weight(self.s2, self.c, self.cfg.w_max)

    def state_dict(self) -> dict:
        return {"s2": self.s2, "n_obs": self.n_obs, "c": self.c}

    def load_state_dict(self, state: dict) -> None:
        self.s2, self.n_obs, self.c = state["s2"], int(state["n_obs"]), state["c"]
