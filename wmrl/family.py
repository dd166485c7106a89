"""A confirmatory family: the comparisons a claim rests on, declared before their grids ran, tested
together with a multiplicity correction, and the seeds each needs, planned from pilots.

A family (``FamilySpec``, a YAML file such as ``benchmarks/specs/families/wm_payoff.yaml``) names its
methods, the baseline they are compared with (``anchors_only``: the same real executions without a
world model) and one grid per domain (the grid's spec and where its merged ``report.json`` lies).
``wmrl family FAMILY.yaml --out-dir DIR`` reads the reports and writes ``family.md`` and
``family.json``:

- per comparison (method x grid) the paired differences ``d_s = final(method, s) − final(baseline, s)``
  over the grid's fresh seeds, their mean, s.e., the one-sided p of ``H0: E[d] <= 0`` (paired t) and
  of ``H0: E[d] <= −margin`` (non-inferiority), each Holm-adjusted over the family's comparisons;
- the controls (placebo WM, ``ppi_lambda0``): a gain counts only where the method also beats each of
  its controls at level ``alpha`` on at least ``min_control_seeds`` seeds (an intersection-union
  test: requiring every one to reject keeps the level without a further correction);
- a combined estimate per method over the family's grids, whose scores have different units: each
  grid's standardised effect ``δ_g = mean_g / sd_g`` pooled by inverse variance, and Stouffer's
  combination of the grids' one-sided p-values weighted by ``sqrt(n_g)``;
- a comparison whose grid has not finished every seed its spec fixed is *interim*: its figures are
  shown, its verdict withheld; one whose grid has no report yet is *not run*: no figures.
- while any comparison is unfinished (interim or not run), Holm counts it at p = 1. Holm's adjusted
  p is non-decreasing in every other p-value (it is the largest Bonferroni p over the intersections
  holding the comparison, ``max_{S ∋ i} |S| min_{j ∈ S} p_j``), so a finished comparison's adjusted p
  then bounds the one it will have at the end: "superior" given now stands whatever the rest give;
  a finished comparison that could still cross is marked *open*, not "not shown".

The math is in the small functions below; nothing here runs a grid.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from wmrl.config import ConfigError

# ---- statistics ----------------------------------------------------------------------------------


def one_sided_p(diffs: list[float], shift: float = 0.0) -> float | None:
    """p-value of the paired t test of ``H0: E[d] <= −shift`` against ``E[d] > −shift``:
    ``P(T_{n−1} >= (mean + shift) / (sd / sqrt(n)))``. ``shift = 0``: superiority; ``shift`` = the
    margin: non-inferiority. None for fewer than 2 differences; 0 or 1 where they do not vary."""
    n = len(diffs)
    if n < 2:
        return None
    m = sum(diffs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in diffs) / (n - 1))
    if sd == 0:
        return 0.0 if m + shift > 0 else 1.0
    return float(stats.t.sf((m + shift) / (sd / math.sqrt(n)), n - 1))


def holm_bound(pvalues: list[float | None], finished: list[bool]) -> list[float | None]:
    """Holm's adjusted p-values while some comparisons are unfinished: each unfinished one counted at
    ``p = 1`` (its own adjusted value withheld, None). For a finished comparison this is the largest
    adjusted p the unfinished ones can give it (Holm's ``p̃_i = max_{S ∋ i} |S| min_{j ∈ S} p_j`` is
    non-decreasing in every ``p_j``); with every comparison finished it is :func:`holm`."""
    if len(pvalues) != len(finished):
        raise ValueError(f"{len(pvalues)} p-values but {len(finished)} finished flags")
    adjusted = holm([p if done else 1.0 for p, done in zip(pvalues, finished, strict=True)])
    return [q if done else None for q, done in zip(adjusted, finished, strict=True)]


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (Holm 1979): with the ``m`` present p-values sorted,
    ``p̃_(i) = max_{j <= i} min(1, (m − j + 1) p_(j))``; reject where ``p̃ <= α`` controls the
    family-wise error at ``α``. A missing p-value (None) stays None and does not count in ``m``."""
    present = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def power(sd: float, delta: float, n: int, alpha: float = 0.05) -> float:
    """Power of the one-sided level-``alpha`` paired t test on ``n`` seeds to reject ``E[d] <= 0``
    when ``E[d] = delta`` and ``sd(d) = sd``: ``P(T' > t_{1−α, n−1})``, ``T'`` noncentral t with
    ``n − 1`` degrees of freedom and noncentrality ``delta sqrt(n) / sd``."""
    if sd <= 0 or n < 2:
        raise ValueError(f"need sd > 0 and n >= 2, got sd={sd}, n={n}")
    crit = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(crit, n - 1, delta * math.sqrt(n) / sd))


def seeds_needed(
    sd: float, delta: float, alpha: float = 0.05, target: float = 0.8, n_max: int = 10_000
) -> int:
    """The fewest seeds ``n >= 2`` whose paired t test has :func:`power` >= ``target`` at ``delta``."""
    if delta <= 0:
        raise ValueError(f"delta={delta} must be > 0: no number of seeds detects a difference <= 0")
    lo, hi = 2, 2
    while power(sd, delta, hi, alpha) < target:
        lo, hi = hi, hi * 2
        if hi > n_max:
            raise ValueError(f"more than {n_max} seeds needed (sd={sd}, delta={delta})")
    while lo < hi:  # power grows with n: the smallest n in (lo, hi] that reaches the target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if power(sd, delta, mid, alpha) < target else (lo, mid)
    return hi


def combined_estimate(groups: list[list[float]], alpha: float = 0.05) -> dict | None:
    """One effect over grids whose scores have different units, from each grid's paired differences.

    Standardised effect per grid ``δ_g = mean_g / sd_g`` with ``Var(δ_g) ≈ 1/n_g + δ_g² / (2 n_g)``
    (Hedges & Olkin 1985), pooled by inverse variance: ``δ = Σ w_g δ_g / Σ w_g``, ``w_g = 1/Var``,
    s.e. ``1/sqrt(Σ w_g)``, one-sided ``1 − alpha`` lower bound ``δ − z_{1−α} s.e.``. Beside it,
    Stouffer's weighted z of the grids' one-sided p-values, ``z = Σ sqrt(n_g) z_g / sqrt(Σ n_g)``
    with ``z_g = Φ⁻¹(1 − p_g)``, and its p. None where no grid has 2 varying differences."""
    effects, weights, zs, ns = [], [], [], []
    for d in groups:
        n = len(d)
        p = one_sided_p(d)
        if p is None:
            continue
        m = sum(d) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
        if sd == 0:
            continue
        delta = m / sd
        effects.append(delta)
        weights.append(1 / (1 / n + delta**2 / (2 * n)))
        zs.append(float(stats.norm.isf(min(max(p, 1e-300), 1 - 1e-16))))
        ns.append(n)
    if not effects:
        return None
    total = sum(weights)
    pooled = sum(w * e for w, e in zip(weights, effects, strict=True)) / total
    se = 1 / math.sqrt(total)
    z = sum(math.sqrt(n) * zg for n, zg in zip(ns, zs, strict=True)) / math.sqrt(sum(ns))
    return {
        "std_effect": pooled,
        "std_effect_se": se,
        "std_effect_lb": pooled - float(stats.norm.ppf(1 - alpha)) * se,
        "stouffer_z": z,
        "stouffer_p": float(stats.norm.sf(z)),
        "grids": len(effects),
    }


# ---- the family's declaration --------------------------------------------------------------------


@dataclass
class FamilyGrid:
    # The grid's spec (benchmarks/specs/*.yaml): its seeds, fixed before any cell ran, are the
    # seeds a comparison must have finished before its verdict is given.
    spec: str = ""
    # The grid's report.json (merged over its parts with `wmrl merge-reports`).
    report: str = ""
    # The domain entry of the grid that holds the comparison ("" where the grid has one).
    domain: str = ""
    # The seeds fixed for this grid where they are not its spec's (a grid run with --seeds=[...]).
    seeds: list[int] = field(default_factory=list)
    # The methods tested in this grid where they are not all of the family's.
    methods: list[str] = field(default_factory=list)


@dataclass
class FamilySpec:
    # What the family claims, in a few words (the report's title).
    name: str = ""
    # The methods tested against the baseline in every grid (the family: methods x grids).
    methods: list[str] = field(default_factory=list)
    # The comparison every method must beat: the same real executions without a world model (""
    # the registry's baseline method, anchors_only: wmrl.methods.base.ROLES).
    baseline: str = ""
    # The family-wise error rate; each test is one-sided at this level after Holm's correction.
    alpha: float = 0.05
    # A gain counts only where the method also beats each of its controls on at least this many seeds.
    min_control_seeds: int = 8
    grids: list[FamilyGrid] = field(default_factory=list)

    def __post_init__(self) -> None:
        from wmrl.methods.base import method_with_role

        self.baseline = self.baseline or method_with_role("baseline") or ""
        if not self.baseline:
            raise ConfigError("family: baseline is empty and no registered method is the baseline")
        if not self.methods:
            raise ConfigError("family: methods is empty (name the methods tested, e.g. [wmrl, ppi])")
        if not self.grids:
            raise ConfigError("family: grids is empty (name each grid's spec and report)")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"family: alpha={self.alpha} must lie in (0, 1)")
        for g in self.grids:
            if not g.spec or not g.report:
                raise ConfigError(f"family: grid entry {g} needs both spec and report")


def load_family(path: str | Path) -> FamilySpec:
    """Parse a family YAML; a missing file or an unknown field is one line naming it."""
    import draccus
    from draccus.utils import DraccusException

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"family spec {path} does not exist")
    try:
        with open(path) as f:
            return draccus.load(FamilySpec, f)
    except DraccusException as e:
        raise ConfigError(f"family spec {path}: {str(e).splitlines()[0]}") from None


# ---- the family's report -------------------------------------------------------------------------


def _finals(dom: dict, method: str) -> dict[int, float]:
    """``method``'s held-out finals per fresh (not exploratory) seed in a report's domain."""
    per_seed = (dom.get("methods", {}).get(method) or {}).get("per_seed", {})
    return {
        int(s): v["heldout_final"]
        for s, v in per_seed.items()
        if v.get("heldout_final") is not None and not v.get("exploratory")
    }


def _diffs(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], list[float]]:
    seeds = sorted(set(a) & set(b))
    return seeds, [a[s] - b[s] for s in seeds]


def payoff(dom: dict, method: str, margin: float, alpha: float) -> dict | None:
    """What a method saves against ``real`` in one grid, in the user's terms: per seed where both
    ran, ``real``'s training budget (simulator steps where the domain counts them, else real
    executions) over what ``method`` spent to first reach ``real``'s final in-run score (None where
    it never did); the median ratio, the seeds at >= 3x, the wall-clock ratio, the offline data spent
    apart (once, shared by every run) and whether ``method``'s final is non-inferior to ``real``'s at
    ``margin`` (one-sided paired t at ``alpha``). None where ``real`` did not run."""
    from wmrl.methods.base import method_with_role

    per = lambda m: (dom.get("methods", {}).get(m) or {}).get("per_seed", {})  # noqa: E731
    real, mine = per(method_with_role("reference") or ""), per(method)  # the reference: `real`
    seeds = sorted(int(s) for s in set(real) & set(mine)
                   if real[s].get("heldout_final") is not None and mine[s].get("heldout_final") is not None)  # fmt: skip
    if not seeds:
        return None
    sim = any(real[str(s)].get("sim_steps") is not None for s in seeds)
    total, reach = (
        ("sim_steps", "sim_steps_to_real_final") if sim else ("real_executions", "execs_to_real_final")
    )
    ratios: list[float | None] = []
    for s in seeds:
        spent = mine[str(s)].get(reach)
        ratios.append(real[str(s)][total] / spent if spent else None)
    saving = sorted(r or 0.0 for r in ratios)  # a seed that never reached real's final: no saving
    walls = [real[str(s)]["wall_clock_s"] / mine[str(s)]["wall_clock_s"] for s in seeds
             if real[str(s)].get("wall_clock_s") and mine[str(s)].get("wall_clock_s")]  # fmt: skip
    d = [mine[str(s)]["heldout_final"] - real[str(s)]["heldout_final"] for s in seeds]
    p_ni = one_sided_p(d, shift=margin)
    offline = [mine[str(s)].get("offline_sim_steps" if sim else "offline_executions") for s in seeds]
    return {
        "unit": "simulator steps" if sim else "real executions", "seeds": seeds,
        "ratio_per_seed": ratios, "median_ratio": float(np.median(saving)),
        "seeds_at_3x": sum(r is not None and r >= 3 for r in ratios),
        "wall_clock_ratio": float(np.median(walls)) if walls else None,
        "offline": next((o for o in offline if o is not None), None),
        "final_vs_real": sum(d) / len(d), "p_noninferior_to_real": p_ni,
        "noninferior_to_real": p_ni is not None and p_ni <= alpha,
    }  # fmt: skip


def _pick_domain(report: dict, g: FamilyGrid, where: str) -> tuple[str, dict]:
    domains = report.get("domains", {})
    if g.domain:
        if g.domain not in domains:
            raise ConfigError(f"{where}: domain {g.domain!r} is not in the report ({', '.join(domains)})")
        return g.domain, domains[g.domain]
    if len(domains) != 1:
        raise ConfigError(f"{where}: the report has domains {', '.join(domains)}: name one with `domain:`")
    return next(iter(domains.items()))


def family_report(spec: FamilySpec, reports: list[dict | None], declared_seeds: list[list[int]]) -> dict:
    """The family's table from its grids' reports (``reports[i]``, None where the grid has none yet,
    and the seeds its spec fixed, ``declared_seeds[i]``, for ``spec.grids[i]``): see the module's
    docstring."""
    from wmrl.grid_spec import controls_of

    rows: list[dict[str, Any]] = []
    for g, report, declared in zip(spec.grids, reports, declared_seeds, strict=True):
        if report is None:  # not run yet: the comparisons count, with no figures
            for method in g.methods or spec.methods:
                rows.append({
                    "grid": g.report, "spec": g.spec, "domain": g.domain or "—", "method": method,
                    "seeds": [], "n": 0, "declared_seeds": len(declared), "declared_done": 0,
                    "complete": False, "not_run": True, "mean": None, "sd": None, "se": None,
                    "margin": None, "p": None, "p_noninferior": None, "controls": {},
                    "clears_controls": False, "diffs": [], "payoff": None,
                })  # fmt: skip
            continue
        name, dom = _pick_domain(report, g, g.report)
        base = _finals(dom, spec.baseline)
        margin = dom.get("margin") or 0.0
        for method in g.methods or spec.methods:
            seeds, d = _diffs(_finals(dom, method), base)
            n = len(d)
            mean = sum(d) / n if n else None
            sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 and mean is not None else None
            controls: dict[str, dict[str, Any]] = {}
            for c in controls_of(method):
                c_seeds, cd = _diffs(_finals(dom, method), _finals(dom, c))
                controls[c] = {"n": len(cd), "mean": sum(cd) / len(cd) if cd else None, "p": one_sided_p(cd)}
            rows.append({
                "grid": g.report, "spec": g.spec, "domain": name, "method": method,
                "seeds": seeds, "n": n, "declared_seeds": len(declared),
                "declared_done": len(set(declared) & set(seeds)),
                "complete": set(declared) <= set(seeds), "not_run": False,
                "mean": mean, "sd": sd, "se": sd / math.sqrt(n) if sd is not None else None,
                "margin": margin, "p": one_sided_p(d), "p_noninferior": one_sided_p(d, shift=margin),
                "controls": controls,
                "clears_controls": bool(controls) and all(
                    c["n"] >= spec.min_control_seeds and c["p"] is not None and c["p"] <= spec.alpha
                    for c in controls.values()
                ),
                "diffs": d,
                "payoff": payoff(dom, method, margin, spec.alpha),
            })  # fmt: skip
    finished = [r["complete"] for r in rows]
    for key, adj in (("p", "p_holm"), ("p_noninferior", "p_noninferior_holm")):
        for row, q in zip(rows, holm_bound([r[key] for r in rows], finished), strict=True):
            row[adj] = q
    unfinished = finished.count(False)
    for r in rows:
        r["verdict"] = _verdict(r, spec, unfinished)
    combined = {
        m: combined_estimate([r["diffs"] for r in rows if r["method"] == m], spec.alpha) for m in spec.methods
    }
    return {"name": spec.name, "alpha": spec.alpha, "baseline": spec.baseline, "methods": spec.methods,
            "min_control_seeds": spec.min_control_seeds, "unfinished": unfinished,
            "comparisons": rows, "combined": combined}  # fmt: skip


def _verdict(r: dict, spec: FamilySpec, unfinished: int) -> str:
    """A finished comparison's verdict; with ``unfinished`` other comparisons still to land, its Holm
    p is a bound (:func:`holm_bound`): a verdict it passes is final, one it could still pass is open."""
    if r["not_run"]:
        return "not run yet (no report): no verdict"
    if not r["complete"]:
        return f"interim ({r['declared_done']} of the {r['declared_seeds']} declared seeds): no verdict"
    a = spec.alpha
    below = lambda p: p is not None and p <= a  # noqa: E731
    wait = f"open: decided when the other {unfinished} comparison(s) finish"
    if below(r["p_holm"]):
        return "superior; gain counts" if r["clears_controls"] else "superior; does not clear its controls"
    if unfinished and below(r["p"]):  # Holm's p can still fall to alpha
        return f"superiority {wait}"
    if below(r["p_noninferior_holm"]):
        return "non-inferior, superiority not shown"
    if unfinished and below(r["p_noninferior"]):
        return f"non-inferiority {wait}"
    return "not shown"


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.3f}"


def _p(v: float | None) -> str:
    return "—" if v is None else f"{v:.1e}" if v < 1e-4 else f"{v:.4f}"


def family_markdown(fam: dict) -> str:
    """The family's table as Markdown."""
    unfinished = [
        f"{n} of the comparisons are unfinished: Holm counts each at p = 1, so a finished comparison's "
        "Holm p is the largest it can end with (a verdict it passes stands).",
        "",
    ] if (n := fam.get("unfinished")) else []  # fmt: skip
    lines = [
        f"# Confirmatory family: {fam['name']}",
        "",
        f"Each comparison: the paired difference of the held-out final to `{fam['baseline']}` over the "
        f"grid's fresh seeds, its one-sided p (paired t) and Holm's adjustment over the family's "
        f"{len(fam['comparisons'])} comparisons at α = {fam['alpha']}; a gain counts only where the "
        f"method also beats each of its controls at α on at least {fam['min_control_seeds']} seeds.",
        "",
        *unfinished,
        "| grid | method | seeds | mean ± s.e. | p | Holm p | p (non-inf., margin) | Holm p | controls | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fam["comparisons"]:
        ctrl = (
            ", ".join(
                f"{c} {_signed(v['mean'])} (p {_p(v['p'])}, n {v['n']})" for c, v in r["controls"].items()
            )
            or "—"
        )
        mean = "—" if r["mean"] is None else f"{r['mean']:+.3f} ± {r['se'] or float('nan'):.3f}"
        margin = "—" if r["margin"] is None else r["margin"]
        lines.append(
            f"| `{Path(r['grid']).parent.name}` ({r['domain']}) | `{r['method']}` | {r['declared_done']} of {r['declared_seeds']} "
            f"| {mean} | {_p(r['p'])} | {_p(r['p_holm'])} | {_p(r['p_noninferior'])} ({margin}) "
            f"| {_p(r['p_noninferior_holm'])} | {ctrl} | {r['verdict']} |"
        )
    lines += ["", "The payoff against `real` (its training budget over what the method spent to first reach "
              "`real`'s final in-run score, per seed; median over seeds, a seed that never reached it "
              "counting as no saving; the offline data, gathered once and shared, apart):", "",
              "| grid | method | unit | median saving | seeds at >= 3x | wall-clock ratio | offline | final − real | "
              "non-inferior to real |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in fam["comparisons"]:
        if (p := r.get("payoff")) is None:
            continue
        med = f"{p['median_ratio']:.1f}x"
        wall = "—" if p["wall_clock_ratio"] is None else f"{p['wall_clock_ratio']:.2f}x"
        lines.append(
            f"| `{Path(r['grid']).parent.name}` | `{r['method']}` | {p['unit']} | {med} | {p['seeds_at_3x']} of "
            f"{len(p['seeds'])} | {wall} | {'—' if p['offline'] is None else f'{p["offline"]:,.0f}'} "
            f"| {p['final_vs_real']:+.3f} | {'yes' if p['noninferior_to_real'] else 'not shown'} (p {_p(p['p_noninferior_to_real'])}) |"
        )
    lines += ["", "Combined over the family's grids (standardised effect mean/sd, inverse-variance pooled; "
              "Stouffer's z of the one-sided p-values weighted by sqrt(n)):", "",
              "| method | grids | std. effect ± s.e. | one-sided 95% bound | Stouffer p |", "|---|---|---|---|---|"]  # fmt: skip
    for m, c in fam["combined"].items():
        if c is None:
            lines.append(f"| `{m}` | 0 | — | — | — |")
        else:
            lines.append(
                f"| `{m}` | {c['grids']} | {c['std_effect']:+.2f} ± {c['std_effect_se']:.2f} "
                f"| {c['std_effect_lb']:+.2f} | {_p(c['stouffer_p'])} |"
            )
    return "\n".join(lines) + "\n"


def write_family(spec_path: str | Path, out_dir: str | Path) -> dict:
    """Read a family's grids and write ``family.md`` and ``family.json`` in ``out_dir``."""
    from wmrl.grid_spec import load_spec

    spec = load_family(spec_path)
    reports, declared = [], []
    for g in spec.grids:
        path = Path(g.report)
        fixed = load_spec(g.spec).seeds  # the grid's declaration must exist, whatever overrides it
        declared.append(list(g.seeds or fixed))
        reports.append(json.loads(path.read_text()) if path.is_file() else None)  # None: not run yet
    fam = family_report(spec, reports, declared)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "family.json").write_text(json.dumps(fam, indent=2) + "\n")
    (out / "family.md").write_text(family_markdown(fam))
    return fam
