"""The world model's quality on held-out real episodes (frames, states, whole-episode scores)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from world_models.vla_dynamics.data import episode_goals, instruction_ids, sample_windows
from world_models.vla_dynamics.model import VLADynamics
from world_models.vla_dynamics.networks import to_unit
from world_models.vla_dynamics.scoring import calibration_stats, fit_variance_calibration, rollout_score


def success_auc(scores, labels) -> float:
    """ROC AUC of ``scores`` ``[n]`` against binary ``labels`` ``[n]`` (> 0.5: positive), ties counted
    half (sklearn's ``roc_auc_score``, the Mann-Whitney U / (n_pos n_neg)); NaN unless both classes occur."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels).reshape(-1) > 0.5
    if labels.all() or not labels.any():
        return float("nan")
    return float(roc_auc_score(labels, np.asarray(scores, dtype=np.float64).reshape(-1)))


@torch.no_grad()
def evaluate_dynamics(
    model: VLADynamics, episodes: Sequence[dict], horizon: int = 16, max_windows: int = 64, seed: int = 0
) -> dict[str, float]:
    """Quality on held-out real episodes.

    - ``next_frame_mse`` / ``next_frame_psnr``: one step from a real frame (pixels in [0, 1]).
    - ``frame_mse_step{k}`` and ``error_growth``: open-loop error at steps 1, 2, 4, 8, ... of the
      horizon, and the ratio last/first.
    - ``state_mse_step1``.
    - ``success_auc``: per-episode predicted score (open-loop from the first frame, real actions) vs
      real success; ``score_mae`` / ``score_corr`` against the real rollout score.
    - ``var_error_corr``: Spearman correlation between ensemble variance and squared score error
      (calibration of the ensemble's own uncertainty); ``z2_mean``: mean squared error / variance
      (1 = calibrated, >1 over-confident).
    """
    model.eval()
    rng = np.random.default_rng(seed)
    w = {n: v.to(model.device) for n, v in sample_windows(episodes, max_windows, horizon, rng).items()}
    z, ctx = model.observe(w["images"][:, 0], w["states"][:, 0], w["instr"])
    ground = model.grounding(z, w["states"][:, 0], w["goal"], w["instr"])
    member = model.members[0]
    mse_steps, state_mse1 = [], None
    targets = to_unit(w["images"][:, 1:])
    fm = w["frame_mask"]
    for t in range(horizon):
        z, _, _ = member.step(z, w["actions"][:, t])  # open loop along member 0
        pred = model.sample_frame(z, ctx).float() / 127.5 - 1.0
        err = (((pred - targets[:, t]) / 2) ** 2).mean((1, 2, 3))  # pixels in [0, 1]
        valid = fm[:, t] > 0
        mse_steps.append(float(err[valid].mean()) if valid.any() else float("nan"))
        if t == 0:
            s1 = (
                model.state_head(z)
                if ground is None
                else model.grounded[0].step(
                    w["states"][:, 0],
                    model.grounded[0].initial_memory(w["states"][:, 0]),
                    w["actions"][:, 0],
                    ground,
                )[0]
            )
            se = ((s1 - w["states"][:, 1]) ** 2).mean(-1)
            state_mse1 = float(se[valid].mean()) if valid.any() else float("nan")
    out: dict[str, float] = {
        "next_frame_mse": mse_steps[0],
        "next_frame_psnr": 10 * math.log10(1.0 / max(mse_steps[0], 1e-10)),
        "state_mse_step1": state_mse1,
    }
    k = 1
    while k <= horizon:
        out[f"frame_mse_step{k}"] = mse_steps[k - 1]
        k *= 2
    finite = [m for m in mse_steps if not math.isnan(m)]
    out["error_growth"] = finite[-1] / max(finite[0], 1e-10) if finite else float("nan")

    # whole-episode scores from the first frame with the real action sequence
    eps = list(episodes)[:max_windows]
    scores, real, label = score_episodes(model, eps)
    mean, var = (
        scores.mean(0),
        scores.var(0, unbiased=False) if scores.shape[0] > 1 else torch.zeros(len(eps)),
    )
    sq = (mean - real) ** 2
    out["success_auc"] = success_auc(mean.numpy(), label)
    out["score_mae"] = float((mean - real).abs().mean())
    out["score_corr"] = (
        float(np.corrcoef(mean.numpy(), real.numpy())[0, 1])
        if len(real) > 1 and float(real.std()) > 0
        else float("nan")
    )
    if scores.shape[0] > 1:
        from scipy.stats import spearmanr

        out["var_error_corr"] = float(spearmanr(var.numpy(), sq.numpy()).statistic)
        out["z2_mean"] = float((sq / var.clamp(min=1e-8)).mean())
        out["ensemble_std_mean"] = float(var.sqrt().mean())
        # the variance calibration fitted on these episodes (VLAWorldModel starts from it)
        out["var_scale"], out["var_floor"] = fit_variance_calibration(sq.numpy(), var.numpy())
        out["z2_mean_calibrated_in_sample"] = calibration_stats(
            sq.numpy(), var.numpy(), out["var_scale"], out["var_floor"]
        )["z2_mean"]
    return out


@torch.no_grad()
def score_episodes(model: VLADynamics, eps: Sequence[dict]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Every member's score of each episode's real action sequence, imagined in latent space from
    its first frame: (scores ``[K, E]``, real rollout scores ``[E]``, real success ``[E]`` in {0, 1})."""
    t_max = max(len(e["actions"]) for e in eps)
    a_dim = eps[0]["actions"].shape[1]
    acts = torch.zeros(len(eps), t_max, a_dim)
    mask = torch.zeros(len(eps), t_max)
    real = torch.zeros(len(eps))
    label = np.zeros(len(eps))
    for i, e in enumerate(eps):
        n = len(e["actions"])
        acts[i, :n] = torch.from_numpy(e["actions"])
        mask[i, :n] = 1
        real[i] = rollout_score(torch.from_numpy(e["progress"]), torch.from_numpy(e["success"]))
        label[i] = float(e["success"].max() > 0.5)
    imgs = torch.from_numpy(np.stack([e["images"][0] for e in eps]))
    sts = torch.from_numpy(np.stack([e["states"][0] for e in eps]))
    instr = instruction_ids([e.get("instruction", "") for e in eps])
    prog, succ = model.score_actions(imgs, sts, acts, mask, instr, episode_goals(eps))
    return rollout_score(prog.cpu(), succ.cpu()), real, label
