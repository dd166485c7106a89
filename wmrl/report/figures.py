"""One cell's figures (a run of one method on one seed), read from its metric rows, and the report's
columns that show them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import mean
from typing import TypeGuard

from wmrl.methods import METHODS, wm_methods

# Per-cell figures: key -> (label, what it is). The WM diagnostics are means over training steps.
COLUMNS = {
    "heldout_final": ("held-out final", "re-evaluated score of the final policy"),
    "gain": ("gain over start", "held-out final - held-out score of the starting policy (same episodes)"),
    "share_of_real_gain": (
        "share of real's gain",
        "mean gain / mean gain of `real` (same domain; absent when `real` gained nothing)",
    ),
    "diff_vs_real": ("Δ vs real", "paired over seeds: held-out final - `real`'s"),
    "diff_vs_anchors_only": ("Δ vs anchors_only", "paired over seeds: held-out final - `anchors_only`'s"),
    "real_executions": ("real executions", "rollouts executed for real during training (exec/real_total)"),
    "sim_steps": ("sim steps", "real simulator steps of training rollouts (domain/sim_steps)"),
    "offline_executions": (
        "offline executions",
        "executions (rollouts) of the data the WM pretrained on before training (the run's "
        "offline_data.json, which the domain writes: research's execution log, the VLA's offline "
        "dataset); WM methods only, apart from the RL budget of the two columns before",
    ),
    "offline_sim_steps": ("offline sim steps", "simulator steps of those offline executions"),
    "execs_to_real_final": (
        "executions to real's final",
        "real executions at the first in-run evaluation >= `real`'s final in-run score (its mean over "
        "seeds), averaged over the seeds that reach it: `(k of n)` where only k of n do, — where none does",
    ),
    "sim_steps_to_real_final": (
        "sim steps to real's final",
        "real simulator steps of training at that same evaluation (as the executions before it); a "
        "method reaching `real`'s final with a third of `real`'s sim steps shows a 3x saving",
    ),
    "wall_clock_s": ("wall-clock s", "training time (time/elapsed; domain build and re-evaluation excluded)"),
    "time_generate": ("generate s", "sum of time/generate"),
    "time_execute": ("execute s", "sum of time/execute"),
    "time_wm": ("WM s", "sum of time/wm (predictions) + time/wm_update (refinement, may overlap the update)"),
    "time_update": ("update s", "sum of time/update"),
    "anchor_corr": ("anchor corr", "mean ppi/rho: correlation of WM and true advantages on anchors"),
    "ppi_lambda": ("λ", "mean ppi/lambda"),
    "s2": ("s2", "mean denoise/s2 (normalised anchor residual)"),
    "w": ("w", "mean denoise/w (anchor up-weighting)"),
    "residual_before": ("residual before", "mean wm/residual_before (raw WM scores)"),
    "residual_after": ("residual after", "mean wm/residual_after (calibrated WM scores)"),
    "update_error": (
        "update error",
        "mean update_error: |u/|u| - u_true/|u_true||^2, the update's direction against the one true "
        "rewards give on the same rollouts (domains with oracle rewards: the toy)",
    ),
}
TABLES = {
    "Held-out score and cost": [
        "heldout_final", "gain", "share_of_real_gain", "diff_vs_real", "diff_vs_anchors_only",
        "real_executions", "sim_steps", "offline_executions", "offline_sim_steps", "execs_to_real_final",
        "sim_steps_to_real_final",
    ],
    "Wall-clock and its split": ["wall_clock_s", "time_generate", "time_execute", "time_wm", "time_update"],
    "World-model diagnostics": [
        "anchor_corr", "ppi_lambda", "s2", "w", "residual_before", "residual_after", "update_error",
    ],
}  # fmt: skip
REACH_KEYS = ("execs_to_real_final", "sim_steps_to_real_final")  # against the merged seeds' real
# The paired differences against the comparison's reference and baseline methods (the registry's
# roles, wmrl.methods.base.ROLES: `real` and `anchors_only`), under their JSON field names.
DIFF_KEYS = {"reference": "diff_vs_real", "baseline": "diff_vs_anchors_only"}
TIME_KEYS = ("wall_clock_s", "time_generate", "time_execute", "time_wm", "time_update", "grid_wall_s")


def finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and math.isfinite(v)


def number(v: object) -> float | None:
    return float(v) if finite(v) else None


def _last(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if finite(r.get(key))]
    return float(vals[-1]) if vals else None


def _sum(rows: list[dict], *keys: str) -> float | None:
    vals = [r[k] for r in rows for k in keys if finite(r.get(k))]
    return float(sum(vals)) if vals else None


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if finite(r.get(key))]
    return float(mean(vals)) if vals else None


# The world model's quality as a run logs it at every step, each with the band the issues' targets
# ask of it and its axis scale: (metric key, axis label, (lower, upper or None), scale).
# wm/success_auc: the success AUC of the step's anchors, scored before the WM trains on them;
# ppi/rho: the correlation of the WM's and the real advantages on anchors; wm/z2: the anchors' mean
# z² under the calibrated variance (log axis: one early step's z² of hundreds would flatten the band).
WM_QUALITY = (
    ("wm/success_auc", "success AUC", (0.85, None), "linear"),
    ("ppi/rho", "advantage correlation", (0.6, None), "linear"),
    ("wm/z2", "mean z²", (0.5, 2.0), "log"),
)
# The plot's trend line: a centred rolling mean over this many GRPO steps (a step's figure rests on
# its few anchor groups).
SMOOTH_STEPS = 9


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The centred rolling mean of ``values`` ``[T]`` over ``window`` entries (fewer at the ends):
    ``out[t] = mean(values[max(0, t - h) : t + h + 1])``, ``h = window // 2``."""
    h = window // 2
    return [float(mean(values[max(0, t - h) : t + h + 1])) for t in range(len(values))]


def wm_quality_curve(rows: list[dict]) -> list[list[float | None]]:
    """``[step, *values of WM_QUALITY]`` for every metric row that logs any of them (None where a
    value is absent or not finite: an AUC before the anchors hold a success and a failure)."""
    keys = [k for k, *_ in WM_QUALITY]
    return [
        [float(r.get("step", i)), *(float(r[k]) if finite(r.get(k)) else None for k in keys)]
        for i, r in enumerate(rows)
        if any(finite(r.get(k)) for k in keys)
    ]


def cell_figures(
    rows: list[dict],
    method: str,
    score: str,
    start: float | None,
    final: float | None,
    offline: dict | None = None,
) -> dict:
    """One cell's figures from its metric rows, its held-out scores and its run's ``offline_data.json``
    (``{"executions", "sim_steps"}``, either may be absent; counted for WM methods only); None where
    absent."""
    wm = method in wm_methods()
    offline = (offline or {}) if wm else {}
    denoised = method in METHODS and METHODS[method].denoises  # its anchors weighted by w
    return {
        "heldout_start": start,
        "heldout_final": final,
        "gain": final - start if final is not None and start is not None else None,
        "real_executions": _last(rows, "exec/real_total"),
        "sim_steps": _last(rows, "domain/sim_steps"),
        "offline_executions": number(offline.get("executions")),
        "offline_sim_steps": number(offline.get("sim_steps")),
        "wall_clock_s": _last(rows, "time/elapsed"),
        "time_generate": _sum(rows, "time/generate"),
        "time_execute": _sum(rows, "time/execute"),
        "time_wm": _sum(rows, "time/wm", "time/wm_update") if wm else None,
        "time_update": _sum(rows, "time/update"),
        "anchor_corr": _mean(rows, "ppi/rho") if wm else None,
        "ppi_lambda": _mean(rows, "ppi/lambda") if wm else None,
        "s2": _mean(rows, "denoise/s2") if denoised else None,
        "w": _mean(rows, "denoise/w") if denoised else None,
        "residual_before": _mean(rows, "wm/residual_before") if wm else None,
        "residual_after": _mean(rows, "wm/residual_after") if wm else None,
        "update_error": _mean(rows, "update_error"),
        "final_inrun": _last(rows, f"eval/{score}"),
    }


def cost_to_reach(curve: list[tuple], target: float | None) -> tuple[float | None, float | None]:
    """``(real executions, sim steps)`` at the first in-run evaluation whose score reaches ``target``
    (``(None, None)`` if never; sim steps None where the domain counts none).

    ``curve``: the cell's evaluations in order, ``(real executions, wall-clock s, score, sim steps)``.
    """
    if target is None:
        return None, None
    point = next((p for p in curve if p[2] >= target - 1e-12), None)
    if point is None:
        return None, None
    return float(point[0]), number(point[3]) if len(point) > 3 else None
