"""The report of a comparison grid: the domains side by side with the same columns.

``report.json`` (every figure per cell and as mean +- standard error over seeds), ``report.md`` and
a self-contained ``report.html`` (tables, and ``report.png`` embedded as base64): per domain and
method, the final held-out score and its gain over the starting policy, the share of ``real``'s gain
kept, paired differences against ``real`` and ``anchors_only``, real executions (and simulator
steps), executions to reach ``real``'s final score, wall-clock and its split, and the WM
diagnostics. A figure that a domain or method does not produce is absent (``None`` in JSON, ``—`` in
the tables), never zero. ``report_wm.png``, where runs log it: the world model's quality against the
GRPO step (:data:`WM_QUALITY`: success AUC, advantage correlation, z²) beside its target bands.

**Evidence** (docs/design.md section 7; ``evidence`` per domain in JSON, the first table of the report):
per WM method and control, the paired difference of held-out scores to ``anchors_only`` over the
seeds, with a one-sided 95% lower bound (:func:`lower_bound_t`, scipy's one-sample t test on the
paired differences; a BCa bootstrap bound beside it), a non-inferiority verdict at the domain's
margin (:func:`verdict`), the same bound against each of the method's controls (its placebo, and
``ppi_lambda0`` for ppi), and whether its gain counts: superior to ``anchors_only`` and above every
control. Cells marked exploratory (their method chosen after their seed's results were seen:
wmrl/grid.py) are left out and named.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import mean, stdev
from typing import TYPE_CHECKING, TypeGuard

from wmrl.config import load_config
from wmrl.grid_spec import (
    DEFAULT_MARGINS,
    LEDGER,
    base_method,
    cell_status,
    controls_of,
    domain_margin,
    grid_controls,
    reeval_current,
)
from wmrl.methods import METHODS, wm_methods
from wmrl.tracking import OFFLINE_DATA, START_POLICY, read_metrics

if TYPE_CHECKING:
    from wmrl.grid_spec import Cell, GridSpec

ABSENT = "—"

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
TIME_KEYS = ("wall_clock_s", "time_generate", "time_execute", "time_wm", "time_update", "grid_wall_s")


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _number(v: object) -> float | None:
    return float(v) if _finite(v) else None


def _last(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if _finite(r.get(key))]
    return float(vals[-1]) if vals else None


def _sum(rows: list[dict], *keys: str) -> float | None:
    vals = [r[k] for r in rows for k in keys if _finite(r.get(k))]
    return float(sum(vals)) if vals else None


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if _finite(r.get(key))]
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
        [float(r.get("step", i)), *(float(r[k]) if _finite(r.get(k)) else None for k in keys)]
        for i, r in enumerate(rows)
        if any(_finite(r.get(k)) for k in keys)
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
        "offline_executions": _number(offline.get("executions")),
        "offline_sim_steps": _number(offline.get("sim_steps")),
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
    return float(point[0]), _number(point[3]) if len(point) > 3 else None


def mean_se(values: Sequence[float | None]) -> dict | None:
    """``{"mean", "se", "n"}`` over the present values (se: sample std / sqrt(n), None for n < 2)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    se = stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else None
    return {"mean": float(mean(vals)), "se": se, "n": len(vals)}


def paired(a: dict[int, float | None], b: dict[int, float | None]) -> dict | None:
    """Mean +- s.e. of ``a[seed] - b[seed]`` over the seeds where both are present."""
    return mean_se([x - y for s, x in a.items() if x is not None and (y := b.get(s)) is not None])


# ---- the evidence standard -----------------------------------------------------------------------

CONFIDENCE = 0.95  # one-sided
VERDICTS = ("superior", "non-inferior", "not shown")
MULTIPLICITY = (
    "each verdict is one comparison at 95%, with no correction for the other comparisons beside it: "
    "exploratory, unless a confirmatory family declared before the grid ran confirms it after Holm's "
    "correction (`wmrl family`, docs/compare.md)"
)


def lower_bound_t(diffs: list[float], confidence: float = CONFIDENCE) -> float | None:
    """One-sided lower confidence bound of the mean of paired differences ``d`` (``[n]``):

        LB = mean(d) − t_{confidence, n−1} · sd(d) / √n

    from scipy's one-sample t test (``alternative="greater"``). The mean itself when every
    difference is equal (no spread); None for ``n < 2``."""
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return None
    if np.ptp(d) == 0:
        return float(d[0])
    return float(stats.ttest_1samp(d, 0.0, alternative="greater").confidence_interval(confidence).low)


def lower_bound_bootstrap(diffs: list[float], confidence: float = CONFIDENCE) -> float | None:
    """One-sided BCa bootstrap lower bound of the mean of ``d`` (scipy.stats.bootstrap, 9,999
    resamples, a fixed generator so a report is reproducible). Few seeds make it narrower than the
    t bound (it ignores the t tail); None for ``n < 3`` or no spread."""
    import numpy as np
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if d.size < 3 or np.ptp(d) == 0:
        return None
    res = stats.bootstrap(
        (d,), np.mean, confidence_level=confidence, alternative="greater", method="BCa",
        n_resamples=9999, rng=np.random.default_rng(0),
    )  # fmt: skip
    low = float(res.confidence_interval.low)
    return low if math.isfinite(low) else None


def verdict(lower_bound: float | None, margin: float | None) -> str | None:
    """``superior`` (LB > 0), ``non-inferior`` (−margin < LB <= 0) or ``not shown`` (LB <= −margin)
    for the lower bound of a method minus ``anchors_only``; None without a bound or a margin."""
    if lower_bound is None or margin is None:
        return None
    return VERDICTS[0] if lower_bound > 0 else VERDICTS[1] if lower_bound > -margin else VERDICTS[2]


def paired_evidence(a: dict[int, float | None], b: dict[int, float | None], seeds: list[int]) -> dict | None:
    """``a[s] − b[s]`` over those of ``seeds`` where both are present: the seeds, mean, s.e., n,
    the one-sided 95% lower bounds (t and BCa bootstrap) and the seeds where ``a`` is ahead."""
    pairs = [(s, x - y) for s in seeds if (x := a.get(s)) is not None and (y := b.get(s)) is not None]
    if not pairs:
        return None
    d = [x for _, x in pairs]
    return (mean_se(d) or {}) | {
        "seeds": [s for s, _ in pairs],
        "lb_t": lower_bound_t(d),
        "lb_bootstrap": lower_bound_bootstrap(d),
        "wins": int(sum(x > 0 for x in d)),
    }


def clears(controls: list[dict | None]) -> bool | None:
    """Whether a method clears its controls: False where a control was not run on its seeds or a
    lower bound of the method minus a control is <= 0, None where a bound is undetermined (n < 2)
    and none failed, True where every bound is > 0; None without controls."""
    if not controls:
        return None
    if any(c is None or (c["lb_t"] is not None and c["lb_t"] <= 0) for c in controls):
        return False
    return None if any(c is not None and c["lb_t"] is None for c in controls) else True


def domain_evidence(per_cell: dict, methods: list[str], seeds: list[int], margin: float | None) -> dict:
    """Per WM method or control ``m`` of one domain (``per_cell[(m, seed)]``: ``heldout_final``,
    ``exploratory``): ``vs_anchors_only`` (:func:`paired_evidence` over ``m``'s fresh seeds), the
    ``verdict`` at ``margin``, ``exploratory_seeds`` (left out) and, for a method that is not itself
    a control, ``vs_controls``, ``clears_controls`` (:func:`clears`) and ``gain_counts`` (superior
    and clears every control: without controls run it does not count). Empty without
    ``anchors_only``."""
    if "anchors_only" not in methods:
        return {}

    def final(m: str) -> dict[int, float | None]:
        return {s: per_cell[(m, s)]["heldout_final"] for s in seeds}

    out = {}
    for m in methods:
        if base_method(m) not in wm_methods():
            continue
        exploratory = [s for s in seeds if per_cell[(m, s)].get("exploratory")]
        fresh = [s for s in seeds if s not in exploratory]
        vs = paired_evidence(final(m), final("anchors_only"), fresh)
        entry = {
            "exploratory_seeds": exploratory,
            "vs_anchors_only": vs,
            "margin": margin,
            "verdict": verdict(vs["lb_t"] if vs else None, margin),
        }
        if m not in grid_controls():
            ctl = {c: paired_evidence(final(m), final(c), fresh) for c in controls_of(m) if c in methods}
            entry["vs_controls"] = ctl
            entry["clears_controls"] = clears(list(ctl.values()))
            entry["gain_counts"] = (
                None if entry["verdict"] is None
                else entry["verdict"] == VERDICTS[0] and entry["clears_controls"] is True
            )  # fmt: skip
        out[m] = entry
    return out


def summarise(out: Path, spec: GridSpec, cells: list[Cell]) -> dict:
    """Every figure per cell and per (domain, method), read back from the run directories."""
    ledger = (_json(out / LEDGER) or {}).get("cells", {})
    domains: dict = {}
    for d in spec.domains:
        dcells = [c for c in cells if c.domain == d.name]
        cfg = load_config(dcells[0].preset, dcells[0].overrides)
        score = d.score or type(cfg.domain).HELDOUT_SCORE
        per_cell, curves, wm_curves = {}, {}, {}
        for c in dcells:
            start = _score((_json(Path(c.start_path)) or {}).get("eval", {}), score)
            status = cell_status(c)
            reeval = reeval_current(c) if status == "finished" else None
            rows = read_metrics(c.run_dir) if status in ("finished", "trained") else []
            final = _score((reeval or {}).get("eval", {}), score)
            seen = (ledger.get(c.name) or {}).get("seen_seeds") or []
            per_cell[(c.method, c.seed)] = (
                {"status": status}
                | cell_figures(
                    rows, base_method(c.method), score, start, final, _json(Path(c.run_dir) / OFFLINE_DATA)
                )
                | {
                    "exploratory": _is_tested(c.method) and (c.seed in seen or c.seed in spec.seen_seeds),
                    "start_policy": (_json(Path(c.run_dir) / START_POLICY) or {}).get("policy_sha1"),
                }
            )
            curves[(c.method, c.seed)] = [
                (
                    r.get("exec/real_total", 0.0),
                    r.get("time/elapsed", 0.0),
                    r[f"eval/{score}"],
                    r.get("domain/sim_steps", 0.0),  # 0 where the domain has no simulator
                )
                for r in rows
                if _finite(r.get(f"eval/{score}"))
            ]
            if wm_curve := wm_quality_curve(rows):
                wm_curves[(c.method, c.seed)] = wm_curve
        template = next(iter(per_cell.values()))
        for m in spec.all_methods:  # a method run on some seeds only (spec.method_seeds): not planned
            for s in spec.seeds:
                per_cell.setdefault((m, s), {k: None for k in template} | {"status": "not planned"})
        sizes = {c.reeval_overrides and " ".join(c.reeval_overrides) or "(the preset's)" for c in dcells}
        margin = domain_margin(d, cfg)
        domains[d.name] = {
            "preset": d.preset,
            "score": score,
            "heldout_size_field": type(cfg.domain).HELDOUT_SIZE,
            "reeval_overrides": sorted(sizes),
            "margin": margin,
        } | aggregate_domain(per_cell, curves, spec.all_methods, spec.seeds, margin, wm_curves)
    fixed = {str(s): min((e["planned_at"] for c in cells if c.seed == s and (e := ledger.get(c.name))
                          and e.get("planned_at")), default=None) for s in spec.seeds}  # fmt: skip
    return {"grid": _shown_path(out), "spec": _plain_spec(spec), "seeds_fixed_at": fixed,
            "columns": {k: v[0] for k, v in COLUMNS.items()},
            "column_notes": {k: v[1] for k, v in COLUMNS.items()}, "multiplicity": MULTIPLICITY,
            "domains": domains}  # fmt: skip


def _is_tested(method: str) -> bool:
    """A method whose figures are a claim (a WM method), not a control or a reference."""
    return method in wm_methods()


def start_mismatches(per_cell: dict) -> dict[str, dict[str, str]]:
    """The seeds whose cells started from more than one policy: ``{seed: {method: sha1[:12]}}`` over
    the cells that recorded their start (``start_policy``, :func:`wmrl.tracking.policy_fingerprint`).
    Their paired differences compare different starts."""
    by_seed: dict[int, dict[str, str]] = {}
    for (m, s), v in per_cell.items():
        if v.get("start_policy"):
            by_seed.setdefault(s, {})[m] = v["start_policy"][:12]
    return {str(s): ms for s, ms in sorted(by_seed.items()) if len(set(ms.values())) > 1}


def starts_by_policy(per_cell: dict) -> dict[str, list[int]]:
    """The seeds that started from each policy, ``{sha1[:12]: [seeds]}``, over the cells that
    recorded their start: one key where the grid's seeds share one start (its conclusions hold for
    that start), several where they drew their own (or were built on different machines)."""
    out: dict[str, set[int]] = {}
    for (_, s), v in per_cell.items():
        if v.get("start_policy"):
            out.setdefault(v["start_policy"][:12], set()).add(int(s))
    return {sha: sorted(seeds) for sha, seeds in sorted(out.items(), key=lambda kv: min(kv[1]))}


def aggregate_domain(
    per_cell: dict,
    curves: dict,
    methods: list[str],
    seeds: list[int],
    margin: float | None = None,
    wm_curves: dict | None = None,
) -> dict:
    """One domain's figures over seeds from its cells' figures.

    ``per_cell[(method, seed)]``: ``{"status", **cell_figures(...)}``; ``curves[(method, seed)]``: that
    cell's in-run evaluations (``cost_to_reach``). Returns ``heldout_start`` and
    ``real_final_inrun`` (mean +- s.e. over seeds), ``methods[m]`` = ``{"figures", "per_seed"}`` with
    the paired differences against ``real`` and ``anchors_only`` and the share of ``real``'s gain,
    the curves keyed ``"<method>/seed<seed>"``, and the ``evidence`` (:func:`domain_evidence` at
    ``margin``). ``wm_curves[(method, seed)]``: that cell's :func:`wm_quality_curve`, kept as
    ``wm_curves`` keyed as the curves. ``start_mismatch``: :func:`start_mismatches`.
    """
    real_final = mean_se([v["final_inrun"] for (m, _), v in per_cell.items() if m == "real"])
    target = real_final["mean"] if real_final else None
    for key, v in per_cell.items():
        execs, sim_steps = cost_to_reach(curves.get(key, []), target)
        v["execs_to_real_final"] = execs
        v["sim_steps_to_real_final"] = sim_steps if v.get("sim_steps") is not None else None
    out_methods: dict = {}
    for m in methods:
        by_seed = {s: per_cell[(m, s)] for s in seeds}
        figs = {k: mean_se([v[k] for v in by_seed.values()]) for k in by_seed[seeds[0]]
                if k not in ("status", "exploratory", "start_policy")}  # fmt: skip
        for ref in ("real", "anchors_only"):
            figs[f"diff_vs_{ref}"] = (
                paired(
                    {s: v["heldout_final"] for s, v in by_seed.items()},
                    {s: per_cell[(ref, s)]["heldout_final"] for s in seeds},
                )
                if ref != m and ref in methods
                else None
            )
        out_methods[m] = {"figures": figs, "per_seed": {str(s): v for s, v in by_seed.items()}}
    real_gain = (out_methods.get("real") or {}).get("figures", {}).get("gain")
    for entry in out_methods.values():
        gain = entry["figures"]["gain"]
        ok = gain is not None and real_gain is not None and real_gain["mean"] > 0  # else no gain to keep
        entry["figures"]["share_of_real_gain"] = (
            {"mean": gain["mean"] / real_gain["mean"], "se": None, "n": gain["n"]} if ok else None
        )
    return {
        "heldout_start": mean_se([per_cell[(methods[0], s)]["heldout_start"] for s in seeds]),
        "real_final_inrun": real_final,
        "methods": out_methods,
        "evidence": domain_evidence(per_cell, methods, seeds, margin),
        "start_mismatch": start_mismatches(per_cell),
        "starts": starts_by_policy(per_cell),
        "curves": {f"{m}/seed{s}": v for (m, s), v in curves.items()},
        "wm_curves": {f"{m}/seed{s}": v for (m, s), v in (wm_curves or {}).items()},
    }


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (as a user typed it)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _score(scores: dict, key: str) -> float | None:
    v = scores.get(key)
    return float(v) if _finite(v) else None


def _plain_spec(spec: GridSpec) -> dict:
    from dataclasses import asdict

    return asdict(spec)


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


# ---- formatting ----------------------------------------------------------------------------------


def fmt_value(v: float | None) -> str:
    if v is None:
        return ABSENT
    a = abs(v)
    if a == 0:
        return "0"
    return f"{v:.0f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def fmt_cell(f: dict | None, seeds: int | None = None) -> str:
    """``mean ± se`` (``mean`` alone for one seed), ``(k of n)`` appended where the figure covers
    ``k`` of the row's ``n = seeds`` finished seeds, or the absent mark."""
    if f is None:
        return ABSENT
    text = fmt_value(f["mean"]) + (f" ± {fmt_value(f['se'])}" if f.get("se") is not None else "")
    return text + (f" ({f['n']} of {seeds})" if seeds is not None and f["n"] < seeds else "")


def table_rows(report: dict, keys: list[str]) -> tuple[list[str], list[list[str]]]:
    head = ["domain", "method", "seeds", *[COLUMNS[k][0] for k in keys]]
    rows = []
    for dname, dom in report["domains"].items():
        for m, entry in dom["methods"].items():
            n = sum(1 for v in entry["per_seed"].values() if v["status"] == "finished")
            rows.append(
                [
                    dname,
                    m,
                    f"{n}/{len(entry['per_seed'])}",
                    *[fmt_cell(entry["figures"].get(k), n) for k in keys],
                ]
            )
    return head, rows


EVIDENCE_HEAD = [
    "domain", "method", "seeds", "Δ vs anchors_only", "95% LB (t)", "95% LB (BCa)", "ahead on",
    "margin", "verdict", "LB vs placebo", "LB vs λ=0", "clears controls", "gain counts",
]  # fmt: skip
EVIDENCE_NOTES = [
    "Paired over seeds: the method's held-out final minus `anchors_only`'s (the same real executions, "
    "no WM). **95% LB**: one-sided 95% lower bound of the mean difference (t: scipy's one-sample t "
    "test; BCa: bootstrap, narrower than t with few seeds).",
    "**verdict** at the domain's margin: superior (LB > 0), non-inferior (-margin < LB <= 0), "
    "not shown (LB <= -margin).",
    "**LB vs placebo / λ=0**: the same bound for the method minus its controls (`<method>_placebo`: "
    "its WM's scores permuted within each group; `ppi_lambda0`: ppi with λ = 0). **clears controls**: "
    "every control's bound > 0. **gain counts**: superior and clears its controls.",
    "**seeds** are the method's fresh seeds; seeds whose results were seen before the method was "
    "chosen (ledger.json, the spec's seen_seeds) are named and left out. Each verdict is one "
    "comparison at 95%; no correction for the number of comparisons in the table.",
]


def seed_list(seeds: list[int]) -> str:
    """``0-3, 6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    run: list[int] = []
    for s in sorted(seeds):
        if run and s != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
            run = []
        run.append(s)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


def evidence_rows(report: dict) -> list[list[str]]:
    """One row per domain and WM method or control (the evidence table, EVIDENCE_HEAD)."""
    rows = []
    for dname, dom in report["domains"].items():
        for m, e in (dom.get("evidence") or {}).items():
            vs = e["vs_anchors_only"]
            ctl = e.get("vs_controls", {})
            seeds = seed_list(vs["seeds"]) if vs else ABSENT
            if e["exploratory_seeds"]:
                seeds += f" ({seed_list(e['exploratory_seeds'])} exploratory, left out)"

            def lb(x: dict | None, key: str = "lb_t") -> str:
                return fmt_value(x[key]) if x and x.get(key) is not None else ABSENT

            placebo = ctl.get(f"{base_method(m)}_placebo") if m not in grid_controls() else None
            yes_no = {True: "yes", False: "no", None: ABSENT}
            rows.append([
                dname, m, seeds, fmt_cell(vs), lb(vs), lb(vs, "lb_bootstrap"),
                f"{vs['wins']} of {vs['n']}" if vs else ABSENT,
                fmt_value(e["margin"]), e["verdict"] or ABSENT, lb(placebo), lb(ctl.get("ppi_lambda0")),
                "(a control)" if m in grid_controls() else yes_no[e["clears_controls"]] if ctl else "not run",
                yes_no[e.get("gain_counts")] if m not in grid_controls() else ABSENT,
            ])  # fmt: skip
    return rows


def markdown(report: dict, command: str | None = None) -> str:
    lines = ["# Comparison report", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += _preamble(report) + [""]
    rows = evidence_rows(report)
    if rows:
        lines += ["## Evidence against anchors_only", "", "| " + " | ".join(EVIDENCE_HEAD) + " |"]
        lines += ["|" + "---|" * len(EVIDENCE_HEAD)] + ["| " + " | ".join(r) + " |" for r in rows] + [""]
        lines += [f"- {x}" for x in EVIDENCE_NOTES] + [""]
    for title, keys in TABLES.items():
        head, rows = table_rows(report, keys)
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    lines += ["## Columns", ""] + [f"- **{lab}**: {note}" for lab, note in COLUMNS.values()]
    lines += [
        "",
        "Mean ± standard error over seeds; — marks a figure the domain or method does not produce.",
        "",
    ]
    lines += ["![score against real executions and wall-clock](report.png)", ""]
    if any(dom.get("wm_curves") for dom in report["domains"].values()):
        lines += ["The world model's quality during the runs, against its targets (shaded):", "",
                  "![world-model quality against the GRPO step](report_wm.png)", ""]  # fmt: skip
    return "\n".join(lines)


def _preamble(report: dict) -> list[str]:
    out = [f"- verdicts: {report.get('multiplicity', MULTIPLICITY)}"]
    fixed = report.get("seeds_fixed_at") or {}
    seeds = report["spec"]["seeds"]
    times = sorted({t for t in fixed.values() if t})
    unknown = [int(s) for s, t in fixed.items() if not t]
    text = f"- seeds {seed_list(seeds)}"
    if times:
        text += f", fixed before their cells ran (ledger.json: {', '.join(times)} UTC)"
    if unknown:
        text += f"; seeds {seed_list(unknown)} ran before the ledger was kept (when fixed: unknown)"
    if report["spec"].get("seen_seeds"):
        text += f"; seen before this variant was chosen: {seed_list(report['spec']['seen_seeds'])}"
    out.append(text)
    for dname, dom in report["domains"].items():
        start = fmt_cell(dom["heldout_start"])
        out.append(
            f"- **{dname}** (preset `{dom['preset']}`): score `{dom['score']}`, held-out re-evaluation "
            f"{', '.join(dom['reeval_overrides'])}; starting policy {start}"
            + (
                f"; non-inferiority margin {fmt_value(dom['margin'])}"
                if dom.get("margin") is not None
                else ""
            )
        )
    for dname, dom in report["domains"].items():
        starts = dom.get("starts") or {}
        if len(starts) == 1:
            out.append(
                f"- **{dname}**: every seed starts from policy {next(iter(starts))} (SHA-1 of its weights): "
                "the comparisons hold for this start"
            )
        elif starts:
            given = "; ".join(f"{sha}: seeds {seed_list(seeds)}" for sha, seeds in starts.items())
            out.append(
                f"- **{dname}: its seeds started from {len(starts)} policies** ({given}): the spread "
                "between starts adds to every paired difference"
            )
        for seed, starts_of in (dom.get("start_mismatch") or {}).items():
            given = ", ".join(f"`{m}` {sha}" for m, sha in starts_of.items())
            out.append(
                f"- **{dname} seed {seed}: its cells started from different policies** ({given}): its "
                "paired differences compare different starts; re-run them from one start"
            )
    if report.get("grid_wall_s") is not None:
        out.append(
            f"- wall-clock of the grid's stages (start-up excluded) in the run that finished it: "
            f"{report['grid_wall_s']:.0f} s"
        )
    for part in report.get("merged_from", []):
        wall = f", its stages' wall-clock {part['grid_wall_s']:.0f} s" if part.get("grid_wall_s") else ""
        seeds = ", ".join(map(str, part["seeds"]))
        out.append(f"- merged: seeds {seeds} from `{part['report']}`{wall}")
    for m, src in report.get("method_sources", {}).items():
        given = "; ".join(f"{d}: {' '.join(o) or 'none'}" for d, o in src["overrides"].items())
        out.append(f"- `{m}`: every cell from `{src['report']}` (that grid's overrides: {given})")
    return out


def html_report(report: dict, png: bytes | None, command: str | None = None) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Comparison report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:nth-child(-n+3),th{text-align:left}th{background:#f3f3f3}</style></head><body>",
        "<h1>Comparison report</h1>",
    ]
    if command:
        parts.append(f"<p>Command: <code>{esc(command)}</code></p>")
    parts.append("<ul>" + "".join(f"<li>{_inline_html(x[2:])}</li>" for x in _preamble(report)) + "</ul>")
    rows = evidence_rows(report)
    if rows:
        parts.append(
            "<h2>Evidence against anchors_only</h2><table><tr>"
            + "".join(f"<th>{esc(h)}</th>" for h in EVIDENCE_HEAD)
            + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append(
            "</table><ul>" + "".join(f"<li>{_inline_html(x)}</li>" for x in EVIDENCE_NOTES) + "</ul>"
        )
    for title, keys in TABLES.items():
        head, rows = table_rows(report, keys)
        parts.append(
            f"<h2>{esc(title)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append("</table>")
    parts.append(
        "<h2>Columns</h2><ul>" + "".join(f"<li><b>{esc(a)}</b>: {esc(b)}</li>" for a, b in COLUMNS.values())
    )
    parts.append(
        "</ul><p>Mean ± standard error over seeds; — marks a figure the domain or method does not produce.</p>"
    )
    if png:
        parts.append(
            f"<img alt='score against real executions and wall-clock' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def _inline_html(text: str) -> str:
    """Escape ``text`` and turn its markdown ``**bold**`` and ```code``` into HTML."""
    import re

    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _offline_note(dom: dict) -> dict[int, str]:
    """The plot's x-label notes, per curve index (0: executions, 3: simulator steps): the offline data
    the WM methods pretrained on, which the curves (the RL budget) leave out."""
    notes = {}
    for x, key, unit in ((0, "offline_executions", "executions"), (3, "offline_sim_steps", "sim steps")):
        vals = [f[key]["mean"] for e in dom["methods"].values() if (f := e.get("figures", {})).get(key)]
        if vals:
            notes[x] = f"\n(WM methods: + {max(vals):,.0f} offline {unit} before training)"
    return notes


def plot(report: dict, path: Path) -> Path:
    """Per domain (a row): mean in-run held-out score against real executions, against wall-clock
    and, for a domain with a simulator, against its training simulator steps; one line per method
    (points aligned by evaluation index over seeds). The offline data the WM methods pretrained on is
    named under the x-axes it would add to."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    doms = report["domains"]
    has_sim = {
        d: any(len(p) > 3 and p[3] > 0 for v in dom["curves"].values() for p in v) for d, dom in doms.items()
    }
    cols = 3 if any(has_sim.values()) else 2
    fig, axes = plt.subplots(len(doms), cols, figsize=(5.5 * cols, 3.6 * len(doms)), squeeze=False)
    for (dname, dom), row in zip(doms.items(), axes, strict=True):
        panels = [(0, "real executions"), (1, "wall-clock s (training)")]
        panels += [(3, "simulator steps (training)")] if has_sim[dname] else []
        for m in dom["methods"]:
            curves = [v for k, v in dom["curves"].items() if k.split("/")[0] == m and v]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            arr = np.array([c[:n] for c in curves], dtype=float).mean(0)
            for ax, (x, _) in zip(row, panels, strict=False):
                ax.plot(arr[:, x], arr[:, 2], marker=".", label=m)
        offline = _offline_note(dom)
        for ax, (x, xl) in zip(row, panels, strict=False):
            ax.set_xlabel(xl + (offline.get(x, "")))
            ax.set_ylabel(f"eval/{dom['score']}")
            ax.set_title(dname)
            ax.grid(alpha=0.3)
        for ax in row[len(panels) :]:
            ax.axis("off")
        row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_wm_quality(report: dict, path: Path) -> Path | None:
    """Per domain whose runs log it (a row), the world model's quality against the GRPO step, one panel
    per :data:`WM_QUALITY` metric, one line per method (mean over its seeds at each step, faint; its
    :data:`SMOOTH_STEPS`-step rolling mean, bold), the target band shaded: where a line leaves the
    band, the WM stopped knowing the policy. None (nothing written) when no run logged any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    doms = {d: dom for d, dom in report["domains"].items() if dom.get("wm_curves")}
    if not doms:
        return None
    cols = len(WM_QUALITY)
    fig, axes = plt.subplots(len(doms), cols, figsize=(5.0 * cols, 3.4 * len(doms)), squeeze=False)
    for (dname, dom), row in zip(doms.items(), axes, strict=True):
        for j, (ax, (key, label, (lo, hi), scale)) in enumerate(zip(row, WM_QUALITY, strict=True)):
            for m in dom["methods"]:
                by_step: dict[float, list[float]] = {}
                for k, curve in dom["wm_curves"].items():
                    if k.split("/seed")[0] == m:
                        for p in curve:
                            if p[1 + j] is not None:
                                by_step.setdefault(p[0], []).append(p[1 + j])
                if by_step:
                    steps = sorted(by_step)
                    per_step = [float(np.mean(by_step[x])) for x in steps]
                    (faint,) = ax.plot(steps, per_step, lw=0.8, alpha=0.3)
                    ax.plot(
                        steps, rolling_mean(per_step, SMOOTH_STEPS), lw=1.8, color=faint.get_color(), label=m
                    )
            ax.axhspan(lo, hi if hi is not None else max(1.0, lo), color="tab:green", alpha=0.08)
            ax.set_yscale(scale)
            ax.set_title(f"{dname}: {key} (bold: {SMOOTH_STEPS}-step rolling mean)", fontsize=9)
            ax.set_xlabel("GRPO step")
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: Path, spec: GridSpec, cells: list[Cell], grid_wall_s: float | None = None,
                 command: str | None = None) -> dict:  # fmt: skip
    """Write report.json, report.md, report.png and report.html into ``out``; returns the report."""
    report = summarise(out, spec, cells)
    previous = _json(out / "report.json") or {}
    # the wall-clock of the run that finished the grid is kept when a later call only rewrites the report
    report["grid_wall_s"] = grid_wall_s if grid_wall_s is not None else previous.get("grid_wall_s")
    return write_report_files(out, report, command)


def write_report_files(out: Path, report: dict, command: str | None = None) -> dict:
    """``report`` as report.json, report.md, report.png and report.html in ``out``; returns it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    png = plot(report, out / "report.png").read_bytes()
    plot_wm_quality(report, out / "report_wm.png")
    (out / "report.md").write_text(markdown(report, command))
    (out / "report.html").write_text(html_report(report, png, command))
    return report


# ---- merging the reports of one grid run in parts ------------------------------------------------

DOMAIN_FIELDS = ("preset", "score", "heldout_size_field", "reeval_overrides")


def merge_reports(reports: list[dict], names: list[str], method_from: dict[str, tuple[dict, str]] | None = None) -> dict:  # fmt: skip
    """One report over the union of the seeds of ``reports``: the same grid (spec, domains,
    methods) run in parts, e.g. seeds 0-1 on one machine and 2-3 on another, whose run directories
    are not all in one place. Every figure is recomputed from the cells' figures and curves, as
    ``summarise`` computes it from run directories (``cost_to_reach`` against the mean of all
    seeds' ``real``). ``names`` label the parts (their paths) in ``merged_from``.

    A part may have run a subset of the first part's methods (``--methods=[real,wmrl]``); the
    methods it lacks are reported over the seeds that have them.

    ``method_from[m] = (report, name)``: every cell of method ``m`` comes from that report instead,
    a grid that ran ``m`` on the same preset and held-out re-evaluation with other overrides (e.g.
    ``--ppi.moments=gradient``), so that one report pairs it seed by seed with the parts' methods.
    Its overrides are recorded in ``method_sources``; a merged seed it lacks counts as not run.

    Raises ``ConfigError`` naming the first difference when the parts are not one grid (a spec field
    other than ``seeds``, ``methods`` and ``executor``, a method the first part lacks, a domain's
    preset, score or re-evaluation), when a seed is in two parts, or when a ``method_from`` report
    lacks its method or evaluates differently.
    """
    from wmrl.config import ConfigError

    method_from = method_from or {}
    if len(reports) + len(method_from) < 2:
        raise ConfigError("merging needs at least two reports (parts, or a part and a --method-from)")
    for r, name in [*zip(reports, names, strict=True), *method_from.values()]:
        if not isinstance(r, dict) or not {"spec", "domains"} <= r.keys():
            raise ConfigError(f"{name} is not the report.json of `wmrl compare` (no spec and domains)")
    first, first_name = reports[0], names[0]

    def grid_fields(r: dict) -> dict:
        return {k: v for k, v in r["spec"].items() if k not in ("seeds", "methods", "executor", "seen_seeds")}

    seen: dict[int, str] = {}
    for r, name in zip(reports, names, strict=True):
        if grid_fields(r) != grid_fields(first):
            diff = sorted(k for k in grid_fields(r) | grid_fields(first)
                          if grid_fields(r).get(k) != grid_fields(first).get(k))  # fmt: skip
            raise ConfigError(
                f"{name} is not the grid of {first_name}: its spec differs in {', '.join(diff)}"
            )
        extra = [m for m in r["spec"]["methods"] if m not in first["spec"]["methods"]]
        if extra:
            raise ConfigError(
                f"{name} is not the grid of {first_name}: its methods {extra} are not among "
                f"{first['spec']['methods']} (list the part with every method first)"
            )
        _check_same_evaluation(r, name, first, first_name)
        for s in r["spec"]["seeds"]:
            if s in seen:
                raise ConfigError(
                    f"seed {s} is in both {seen[s]} and {name}: merge parts with disjoint seeds"
                )
            seen[s] = name
    for m, (r, name) in method_from.items():
        _check_same_evaluation(r, name, first, first_name)
        lacking = [d for d, dom in r["domains"].items() if m not in dom["methods"]]
        if lacking:
            raise ConfigError(f"--method-from {m}={name}: that report has no {m} cells (domain {lacking[0]})")
    seeds = sorted(seen)
    methods = list(first["domains"][next(iter(first["domains"]))]["methods"])
    methods += [m for m in method_from if m not in methods]
    domains: dict = {}
    for dname, dom in first["domains"].items():
        per_cell, curves, wm_curves = {}, {}, {}
        sources = [(r, [m for m in r["domains"][dname]["methods"] if m not in method_from]) for r in reports]
        sources += [(r, [m]) for m, (r, _) in method_from.items()]
        for r, taken in sources:
            seen_before = set(r["spec"].get("seen_seeds", []))  # a report from before the ledger: its spec's
            for m in taken:
                for s, v in r["domains"][dname]["methods"][m]["per_seed"].items():
                    if int(s) in seen:
                        per_cell[(m, int(s))] = {k: x for k, x in v.items() if k not in REACH_KEYS} | {
                            "exploratory": bool(v.get("exploratory"))
                            or (_is_tested(m) and int(s) in seen_before)
                        }
            for key, curve in r["domains"][dname]["curves"].items():
                m, s = key.split("/seed")
                if m in taken and int(s) in seen:
                    curves[(m, int(s))] = [tuple(p) for p in curve]
            for key, curve in r["domains"][dname].get("wm_curves", {}).items():  # absent before them
                m, s = key.split("/seed")
                if m in taken and int(s) in seen:
                    wm_curves[(m, int(s))] = curve
        template = next(iter(per_cell.values()))
        for m in methods:  # a part that ran fewer methods: its seeds count as not run for the others
            for s in seeds:
                per_cell.setdefault((m, s), {k: None for k in template} | {"status": "not run"})
        margin = dom["margin"] if dom.get("margin") is not None else _default_margin(dom["preset"])
        domains[dname] = (
            {f: dom[f] for f in DOMAIN_FIELDS}
            | {"margin": margin}
            | aggregate_domain(per_cell, curves, methods, seeds, margin, wm_curves)
        )
    parts = [{"report": n, "seeds": r["spec"]["seeds"], "grid_wall_s": r.get("grid_wall_s")}
             for r, n in zip(reports, names, strict=True)]  # fmt: skip
    spec_methods = [*first["spec"]["methods"], *(m for m in method_from if m not in first["spec"]["methods"])]
    method_sources = {
        m: {"report": name, "overrides": {d["name"]: d.get("overrides", []) for d in r["spec"]["domains"]}}
        for m, (r, name) in method_from.items()
    }
    seen_seeds = sorted({s for r, _ in [*zip(reports, names, strict=True), *method_from.values()]
                         for s in r["spec"].get("seen_seeds", [])})  # fmt: skip
    fixed = {k: t for r in reports for k, t in (r.get("seeds_fixed_at") or {}).items() if int(k) in seen}
    return {
        "grid": None,
        "merged_from": parts,
        "method_sources": method_sources,
        "spec": first["spec"] | {"seeds": seeds, "methods": spec_methods, "seen_seeds": seen_seeds},
        "seeds_fixed_at": {str(s): fixed.get(str(s)) for s in seeds},
        "columns": first["columns"],
        "column_notes": first["column_notes"],
        "multiplicity": MULTIPLICITY,
        "domains": domains,
        "grid_wall_s": None,
    }


def _default_margin(preset: str) -> float | None:
    """The default non-inferiority margin of the preset's domain type (a report from before
    margins were recorded); None for a type without one."""
    from wmrl.config import ConfigError, DomainConfig

    try:
        kind = DomainConfig.get_choice_name(type(load_config(preset).domain))
    except ConfigError:
        return None
    return DEFAULT_MARGINS.get(kind)


def _check_same_evaluation(r: dict, name: str, first: dict, first_name: str) -> None:
    """``r``'s domains are ``first``'s, on the same preset, score and held-out re-evaluation."""
    from wmrl.config import ConfigError

    for dname, dom in first["domains"].items():
        if dname not in r["domains"]:
            raise ConfigError(
                f"{name} has no domain {dname} (domains of {first_name}: {sorted(first['domains'])})"
            )
        for f in DOMAIN_FIELDS:
            if r["domains"][dname].get(f) != dom.get(f):
                raise ConfigError(
                    f"{name}: domain {dname}'s {f} is {r['domains'][dname].get(f)!r}, {first_name}'s {dom.get(f)!r}"
                )
