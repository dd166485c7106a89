"""``ppi``: prediction-powered advantages, unbiased whatever the world model's errors
(docs/design.md section 6; the estimator's maths is wmrl/ppi.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from wmrl.config import ConfigError
from wmrl.domain import PriorGroups
from wmrl.lazy import lazy
from wmrl.learner import score_directions
from wmrl.method_config import Calibrates, PPIConfig
from wmrl.methods.base import Advantages, Control, Method, MethodState, Step, TrainerView, register_method
from wmrl.ppi import PowerTuner, anchor_moments, gradient_row_products, ppi_rows, variance_ratio

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl.domain import RolloutBatch

log = logging.getLogger(__name__)


@dataclass
class PPIMethodConfig(Calibrates):
    """ppi's settings: the calibration's (``debias``) and its λ tuner's (``ppi``)."""

    # lambda's tuner: its window, warm-up, shrinkage, or a fixed lambda (wmrl/ppi.py).
    ppi: PPIConfig = field(default_factory=PPIConfig)


def ppi_settings(run: RunConfig) -> PPIConfig:
    """The λ tuner's settings of a ppi run."""
    return cast(PPIMethodConfig, run.method_config).ppi


@register_method
class PPI(Method):
    """Per row, WM-only ``λ Â`` and anchor ``λ Â + (N/n)(A − λ Â)``, with ``λ`` pooled from the
    anchors of earlier steps (its run state's ``tuner``) and ``Â`` from the WM's scores under the calibration
    fitted *before* the step, so that a step's ``λ`` and correction are independent of its anchors."""

    name = "ppi"
    summary = (
        "prediction-powered advantages: the world model's advantages corrected by the anchor groups' "
        "real outcomes (unbiased whatever the world model's errors)"
    )
    calibrates = True
    uses_twins = True
    config_sections = ("anchors",)
    config = PPIMethodConfig

    def controls(self) -> list[Control]:
        from wmrl.methods.ppi_lambda0 import PPILambda0

        return [PPILambda0(self)]

    def wants_execution_log(self, run: RunConfig) -> bool:
        return ppi_settings(run).prior_from_log

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"lam": f"{metrics['ppi/lambda']:.2f}", "rho": f"{metrics['ppi/rho']:.2f}"}

    def new_state(self, run: RunConfig) -> MethodState:
        """The calibration and λ's tuner (:class:`wmrl.ppi.PowerTuner`)."""
        state = super().new_state(run)
        state.components["tuner"] = PowerTuner(ppi_settings(run), run.grpo.advantage, run.grpo.std_eps)
        return state

    def start_from_log(self, trainer: TrainerView, prior_groups: PriorGroups | None) -> None:
        """Start ``λ``'s window with the domain's prior anchor groups ``(raw WM scores, true
        rewards)`` (``ppi.prior_from_log``), as the run's method sees them (the placebo: permuted)."""
        if prior_groups is None:
            raise ConfigError(
                f"ppi.prior_from_log: {type(trainer.domain).__name__} built no prior_anchor_groups"
            )
        groups = trainer.method.prior_groups(prior_groups, trainer.cfg.seed)
        tuner = trainer.method_state.tuner
        for r_hat, r_true in groups:
            n = len(r_hat)
            tuner.observe(torch.tensor(r_hat), torch.tensor(r_true), torch.zeros(n, dtype=torch.long))
        c, h, t = tuner.moments(calibrate=False)
        log.info(
            "ppi: lambda's window starts with %d groups from the execution log (their rho %.2f)",
            len(groups),
            correlation(c, h, t),
        )

    def wm_scores(self, trainer: TrainerView, step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        """The WM's scores under the calibration fitted before this step's anchors (its correction
        must not see them); then the anchors are observed and the map refitted for later steps."""
        r_cal = trainer.method_state.debiaser(step.r_hat)
        return r_cal, self.observe_anchors(trainer, step)

    def advantages(self, trainer: TrainerView, step: Step) -> Advantages:
        assert step.pred is not None and step.r_wm is not None, "ppi uses the world model"
        adv, used, counted, metrics = prediction_powered_advantages(
            trainer,
            step.batch,
            step.r_hat,
            step.pred.var,
            step.r_wm,
            step.r_true,
            step.group_anchor,
            step.n_tasks,
        )
        return Advantages(adv, used, counted, metrics)


def prediction_powered_advantages(
    trainer: TrainerView,
    batch: RolloutBatch,
    r_hat: torch.Tensor,
    var: torch.Tensor | None,
    r_cal: torch.Tensor,
    r_true: torch.Tensor,
    group_anchor: torch.Tensor,
    n_tasks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """Prediction-powered advantages (wmrl/ppi.py) with the λ pooled from earlier steps, then
    this step's anchor moments folded into the tuner for the steps after it. Returns the
    advantages, the rows in the loss, the rows its denominator counts (:func:`ppi_rows`) and metrics.

    ``r_hat`` ``[R]``: raw WM scores, ``var`` their reported variances or None; ``r_cal`` ``[R]``:
    the same under the calibration fitted before this step; ``r_true`` ``[R]`` true rewards (NaN
    off executed rows); ``group_anchor`` ``[n_groups]`` the executed groups.
    """
    g, state = trainer.cfg.grpo, trainer.method_state
    tuner: PowerTuner = state.tuner
    calibrate = trainer.method.calibrates and state.debiaser.fitted
    lam = tuner.lam(calibrate, var)
    n_anchors = int(group_anchor.sum())
    p = ppi_rows(
        r_true, r_cal, batch.group_ids, group_anchor, batch.real_row, n_tasks, lam, g.advantage, g.std_eps
    )
    gid, pair, adv_true, adv_wm = batch.group_ids, p.pair, p.adv_true, p.adv_wm

    lam_mean = float(torch.as_tensor(lam, dtype=torch.float64).mean())
    out = {
        "ppi/lambda": lam_mean,
        "ppi/rho": float("nan"),
        "ppi/shrink": tuner.shrink_factor(calibrate),
    }
    ratio = variance_ratio(*tuner.moments(calibrate), lam_mean, n_anchors / n_tasks)
    wm_rows = p.paired.nonzero().squeeze(-1)
    if wm_rows.numel():  # this step's anchors: their correlation, then into the window for later steps
        anchor_gid = torch.unique(gid[wm_rows], return_inverse=True)[1]
        cross, wm_sq, true_sq = anchor_moments(adv_true[pair[wm_rows]], adv_wm[wm_rows], anchor_gid)
        out["ppi/rho"] = correlation(cross.sum(), wm_sq.sum(), true_sq.sum())
        gram = None
        if ppi_settings(trainer.cfg).moments == "gradient":
            t0 = time.perf_counter()
            s = score_directions(trainer.policy, batch, torch.cat([pair[wm_rows], wm_rows]), g.loss_agg)
            gram = s @ s.T
            out["time/ppi_directions"] = time.perf_counter() - t0
            on_grad = gradient_row_products(adv_true[pair[wm_rows]], adv_wm[wm_rows], gram).sum(0)
            out["ppi/rho_grad"] = correlation(*on_grad)
        tuner.observe(
            r_hat[wm_rows], r_true[pair[wm_rows]], anchor_gid, None if var is None else var[wm_rows], gram
        )
    out["ppi/var_ratio"] = ratio
    out["ppi/eff_groups"] = n_anchors / ratio if ratio > 0 else float("nan")
    return p.adv, p.used, p.counted, out


def correlation(
    cross: torch.Tensor | float, wm_sq: torch.Tensor | float, true_sq: torch.Tensor | float
) -> float:
    """``c / sqrt(σ̂² σ²)`` from summed moments (NaN when either variance is 0)."""
    denom = float(wm_sq * true_sq) ** 0.5
    return float(cross) / denom if denom > 0 else float("nan")
