"""A rollout's score from per-step outcomes, and the calibration of the ensemble's variance of it."""

from __future__ import annotations

import numpy as np
import torch


def rollout_score(progress: torch.Tensor, success: torch.Tensor, success_weight: float = 0.5) -> torch.Tensor:
    """The rollout reward, from per-step progress and success (probabilities or 0/1), ``[..., T]`` -> ``[...]``.

    ``r = w * max_t success_t + (1 - w) * max_t progress_t``: the real reward of a rollout applies the
    same function to the simulator's progress and success flags.
    """
    return success_weight * success.amax(-1) + (1.0 - success_weight) * progress.amax(-1)


def expected_rollout_reward(
    progress: torch.Tensor, success: torch.Tensor, success_weight: float = 0.5
) -> torch.Tensor:
    """The rollout reward's expectation when a success brings full progress, ``[..., T]`` -> ``[...]``.

    ``P = max_t success_t`` read as the probability that the rollout succeeds:
    ``r = P * 1 + (1 - P) * (1 - w) * max_t progress_t``. A successful rollout's real reward is exactly
    1 (success and full progress), so a group the WM is sure succeeds scores flat, as its real group
    does (:func:`rollout_score` instead lets the progress heads' noise spread it). With 0/1 success
    flags and full progress on success the two agree. Not what the WM reports: measured as an
    alternative form of its score (``benchmarks/vla_wm_quality.py``, ``twin_rho_by_score_form``), it
    did not lift the twin-group correlation, so the WM keeps :func:`rollout_score`.
    """
    p = success.amax(-1)
    return p + (1.0 - p) * (1.0 - success_weight) * progress.amax(-1)


# ---------------------------------------------------------------------- calibration
def fit_variance_calibration(sq_err, var, min_pairs: int = 4) -> tuple[float, float]:
    """Scale ``a`` and floor ``b`` of the calibrated variance ``v' = a * var + b`` of the rollout score.

    Fitted by the Gaussian negative log-likelihood ``sum_i log v'_i + e_i^2 / v'_i`` over held-out
    pairs (``sq_err`` ``[n]``: squared error of the ensemble's mean score against the real reward,
    ``var`` ``[n]``: the ensemble's variance there; both numpy-like). With the floor at 0 the optimum
    is ``a = mean(e^2 / var)``, i.e. mean z^2 = 1 on the pairs; the floor keeps a rollout the members
    agree on from claiming near-zero error. ``(1, 0)`` (the raw variance) with fewer than
    ``min_pairs`` pairs.
    """
    from scipy.optimize import minimize

    e2 = np.asarray(sq_err, dtype=np.float64).reshape(-1)
    v = np.asarray(var, dtype=np.float64).reshape(-1)
    ok = np.isfinite(e2) & np.isfinite(v) & (v >= 0)
    e2, v = e2[ok], v[ok]
    if len(e2) < min_pairs:
        return 1.0, 0.0
    scale = max(float(e2.mean()), 1e-8)

    def nll(x: np.ndarray) -> float:
        vc = np.exp(x[0]) * v + np.exp(x[1])
        return float(np.mean(np.log(vc) + e2 / vc))

    x0 = np.log([scale / max(float(v.mean()), 1e-12), 0.1 * scale])
    res = minimize(nll, x0, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 400})
    return float(np.exp(res.x[0])), float(np.exp(res.x[1]))


def calibration_stats(sq_err, var, scale: float = 1.0, floor: float = 0.0) -> dict[str, float]:
    """``z2_mean`` = mean e^2 / v' (1 = calibrated, > 1 over-confident), ``z2_median`` and the
    Gaussian NLL of the errors under ``v' = scale * var + floor``, over finite pairs."""
    e2 = np.asarray(sq_err, dtype=np.float64).reshape(-1)
    v = np.asarray(var, dtype=np.float64).reshape(-1)
    ok = np.isfinite(e2) & np.isfinite(v)
    vc = np.maximum(scale * v[ok] + floor, 1e-8)
    z2 = e2[ok] / vc
    if not len(z2):
        return {"z2_mean": float("nan"), "z2_median": float("nan"), "nll": float("nan"), "n": 0}
    return {
        "z2_mean": float(z2.mean()),
        "z2_median": float(np.median(z2)),
        "nll": float(0.5 * np.mean(np.log(2 * np.pi * vc) + z2)),
        "n": int(len(z2)),
    }
