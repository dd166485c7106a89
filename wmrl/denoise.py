"""Inverse-variance denoising: fuse the anchor stream (true rewards) and the WM stream by their variances.

Anchor-group advantages are multiplied by ``w = clip(1 + c * s2, 1, w_max)``. ``s2`` is the WM's
within-group noise-to-signal ratio on the anchor groups: an EWMA of the within-group centred squared
residual between (calibrated) WM scores and true rewards, divided by an EWMA (same weights) of the
variance of the true rewards in those groups. Groups whose true rewards are all equal are skipped.
It is a ratio of averages, not an average of per-group ratios: a near-flat group (true rewards
0, 0, 2e-4, 0) has a per-group ratio in the thousands, which would swamp the average and pin ``w``;
in the ratio of averages it weighs what its variance weighs. ``c`` is fixed once, after
``warmup_obs`` observations, so that ``w == w_target`` at that moment, then frozen: as debiasing
removes bias the residual shrinks and ``w`` relaxes toward 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wmrl.config import half_life_to_alpha
from wmrl.debias import centred_residual
from wmrl.lazy import lazy
from wmrl.method_config import DenoiseConfig

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


def residuals_and_variances(
    pred: torch.Tensor, true: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per anchor group, ``(res_g [K], var_g(r) [K])`` for the groups with ``var_g(r) > 0``.

    ``res_g`` is :func:`~wmrl.debias.centred_residual`; ``var_g(r)`` the population variance of the
    group's finite true rewards. Args: ``pred``, ``true`` ``[M]`` for the anchor rollouts;
    ``group_ids`` ``[M]``.
    """
    res = centred_residual(pred, true, group_ids)
    ok = torch.isfinite(true)
    t = torch.where(ok, true, torch.zeros_like(true)).double()
    n = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    cnt = torch.zeros(n, dtype=torch.float64).index_add_(0, group_ids, ok.double())
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, group_ids, t) / cnt.clamp(min=1)
    dev = torch.where(ok, t - mean[group_ids], torch.zeros_like(t))
    var = torch.zeros(n, dtype=torch.float64).index_add_(0, group_ids, dev**2) / cnt.clamp(min=1)
    keep = torch.isfinite(res) & (var > 1e-12)
    return res[keep], var[keep]


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
    """Tracks ``s2 = res_avg / var_avg`` (EWMAs with half-life ``half_life`` observations, one per
    anchor group) and the anchor weight ``w``."""

    def __init__(self, cfg: DenoiseConfig):
        self.cfg = cfg
        self.alpha = half_life_to_alpha(cfg.half_life)
        self.res_avg: float | None = None
        self.var_avg: float | None = None
        self.n_obs = 0
        self.c: float | None = None

    @property
    def s2(self) -> float | None:
        """The noise-to-signal ratio ``res_avg / var_avg`` (None before the first observation)."""
        return None if self.res_avg is None or self.var_avg is None else self.res_avg / self.var_avg

    def observe(self, pred: torch.Tensor, true: torch.Tensor, group_ids: torch.Tensor) -> None:
        """Fold in the anchor groups of one step (``[M]`` tensors)."""
        res, var = residuals_and_variances(pred, true, group_ids)
        for r, v in zip(res.tolist(), var.tolist(), strict=True):
            if self.res_avg is None or self.var_avg is None:
                self.res_avg, self.var_avg = r, v
            else:
                self.res_avg = (1 - self.alpha) * self.res_avg + self.alpha * r
                self.var_avg = (1 - self.alpha) * self.var_avg + self.alpha * v
            self.n_obs += 1
            s2 = self.s2
            if self.c is None and s2 is not None and self.n_obs >= self.cfg.warmup_obs:
                # c such that w == w_target now; a WM with no residual gets no up-weighting.
                self.c = (self.cfg.w_target - 1.0) / s2 if s2 > 0 else 0.0

    @property
    def w(self) -> float:
        """The current anchor weight (1 until ``c`` is fixed)."""
        if self.c is None or self.s2 is None:
            return 1.0
        return anchor_weight(self.s2, self.c, self.cfg.w_max)

    def state_dict(self) -> dict:
        return {"res_avg": self.res_avg, "var_avg": self.var_avg, "n_obs": self.n_obs, "c": self.c}

    def load_state_dict(self, state: dict) -> None:
        if "res_avg" not in state:  # a checkpoint from before the ratio of averages: same s2, same w
            state = {**state, "res_avg": state["s2"], "var_avg": None if state["s2"] is None else 1.0}
        self.res_avg, self.var_avg = state["res_avg"], state["var_avg"]
        self.n_obs, self.c = int(state["n_obs"]), state["c"]

    def metrics(self) -> dict[str, float]:
        """``denoise/w`` the anchor weight and ``denoise/s2`` the noise-to-signal ratio (NaN before
        the first observation)."""
        return {"denoise/w": self.w, "denoise/s2": float("nan") if self.s2 is None else self.s2}
