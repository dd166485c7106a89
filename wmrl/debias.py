"""Online debiasing: a monotone (isotonic) calibration of world-model scores, fitted on anchor pairs.

Anchor rollouts are scored by both the WM (``r_hat``) and real execution (``r``). The map
``f = argmin_{f nondecreasing} sum (f(r_hat_j) - r_j)^2`` over the buffered pairs is refitted as
pairs arrive, and every WM score goes through ``f`` before advantages. GRPO standardises rewards
within a group, so an affine map would cancel; only a non-affine ``f`` changes advantages.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from wmrl.lazy import lazy
from wmrl.method_config import DebiasConfig

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


class OnlineDebiaser:
    """Identity until ``warmup_pairs`` pairs; then refitted every ``refit_every`` new pairs from a FIFO
    of at most ``buffer_size`` pairs. Works for any reward range: outside the fitted range ``f`` is
    clipped to its end values (as isotonic regression extrapolates)."""

    def __init__(self, cfg: DebiasConfig):
        self.cfg = cfg
        self.pairs: deque[tuple[float, float]] = deque(maxlen=cfg.buffer_size)
        self.seen = 0
        self.since_fit = 0
        self.x_knots: np.ndarray | None = None
        self.y_knots: np.ndarray | None = None

    @property
    def fitted(self) -> bool:
        return self.x_knots is not None

    def observe(self, r_hat: torch.Tensor, r: torch.Tensor) -> bool:
        """Add anchor pairs (``[M]`` each; non-finite entries are ignored). Returns True if it refitted."""
        ok = torch.isfinite(r_hat) & torch.isfinite(r)
        self.pairs.extend(zip(r_hat[ok].tolist(), r[ok].tolist(), strict=True))
        n_new = int(ok.sum())
        self.seen += n_new
        self.since_fit += n_new
        if self.seen >= self.cfg.warmup_pairs and (not self.fitted or self.since_fit >= self.cfg.refit_every):
            self._fit()
            return True
        return False

    def _fit(self) -> None:
        x, y = np.array(self.pairs, dtype=np.float64).T
        from sklearn.isotonic import IsotonicRegression  # seconds to import: on first use

        iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(x, y)
        self.x_knots, self.y_knots = iso.X_thresholds_.copy(), iso.y_thresholds_.copy()
        self.since_fit = 0

    def __call__(self, r_hat: torch.Tensor) -> torch.Tensor:
        """``f(r_hat)`` elementwise (``[N]``); the identity before the first fit. NaN stays NaN."""
        if not self.fitted:
            return r_hat.clone()
        assert self.x_knots is not None and self.y_knots is not None  # fitted
        mapped = np.interp(r_hat.detach().double().numpy(), self.x_knots, self.y_knots)
        out = torch.from_numpy(mapped).to(r_hat.dtype)
        return torch.where(torch.isfinite(r_hat), out, r_hat)

    def state_dict(self) -> dict:
        return {
            "pairs": list(self.pairs),
            "seen": self.seen,
            "since_fit": self.since_fit,
            "x_knots": None if self.x_knots is None else self.x_knots.tolist(),
            "y_knots": None if self.y_knots is None else self.y_knots.tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.pairs = deque((tuple(p) for p in state["pairs"]), maxlen=self.cfg.buffer_size)
        self.seen, self.since_fit = int(state["seen"]), int(state["since_fit"])
        self.x_knots = None if state["x_knots"] is None else np.asarray(state["x_knots"], dtype=np.float64)
        self.y_knots = None if state["y_knots"] is None else np.asarray(state["y_knots"], dtype=np.float64)

    def metrics(self) -> dict[str, float]:
        """``debias/fitted``: 1 once the map is fitted (before, the identity)."""
        return {"debias/fitted": float(self.fitted)}


def centred_residual(pred: torch.Tensor, true: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per-group within-group centred squared residual, ``[n_groups]`` (NaN for groups with < 2 pairs).

        res_g = mean_{i in g} ((p_i - mean_g p) - (r_i - mean_g r))^2

    over rollouts of group g where both ``pred`` and ``true`` are finite. This is the part of a WM's
    error that GRPO sees: a per-group offset cancels in the advantages.
    """
    ok = torch.isfinite(pred) & torch.isfinite(true)
    p = torch.where(ok, pred, torch.zeros_like(pred)).double()
    t = torch.where(ok, true, torch.zeros_like(true)).double()
    n_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    cnt = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_ids, ok.double())
    d = p - t
    mean_d = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_ids, d) / cnt.clamp(min=1)
    e = torch.where(ok, d - mean_d[group_ids], torch.zeros_like(d))
    res = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_ids, e**2) / cnt.clamp(min=1)
    return torch.where(cnt >= 2, res, torch.full_like(res, float("nan")))
