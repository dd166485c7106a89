"""A grid's figures per domain and method, from its cells: read back from the run directories
(:func:`summarise`) or from the cells' figures of reports (:func:`aggregate_domain`, which
wmrl/report/merge.py also calls), with the evidence against ``anchors_only`` (:func:`domain_evidence`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from wmrl.config import load_config
from wmrl.grid_spec import (
    LEDGER,
    base_method,
    cell_status,
    controls_of,
    domain_margin,
    grid_controls,
    read_json,
    reeval_current,
)
from wmrl.methods import wm_methods
from wmrl.methods.base import method_with_role
from wmrl.report.figures import COLUMNS, DIFF_KEYS, cell_figures, cost_to_reach, finite, wm_quality_curve
from wmrl.report.stats import MULTIPLICITY, VERDICTS, clears, mean_se, paired, paired_evidence, verdict
from wmrl.tracking import OFFLINE_DATA, START_POLICY, read_metrics

if TYPE_CHECKING:
    from wmrl.grid_spec import Cell, GridSpec


def domain_evidence(per_cell: dict, methods: list[str], seeds: list[int], margin: float | None) -> dict:
    """Per WM method or control ``m`` of one domain (``per_cell[(m, seed)]``: ``heldout_final``,
    ``exploratory``): ``vs_anchors_only`` (:func:`paired_evidence` over ``m``'s fresh seeds), the
    ``verdict`` at ``margin``, ``exploratory_seeds`` (left out) and, for a method that is not itself
    a control, ``vs_controls``, ``clears_controls`` (:func:`clears`) and ``gain_counts`` (superior
    and clears every control: without controls run it does not count). Empty without
    ``anchors_only``: the registry's baseline, :func:`wmrl.methods.base.method_with_role`."""
    baseline = method_with_role("baseline")
    if baseline is None or baseline not in methods:
        return {}

    def final(m: str) -> dict[int, float | None]:
        return {s: per_cell[(m, s)]["heldout_final"] for s in seeds}

    out = {}
    for m in methods:
        if base_method(m) not in wm_methods():
            continue
        exploratory = [s for s in seeds if per_cell[(m, s)].get("exploratory")]
        fresh = [s for s in seeds if s not in exploratory]
        vs = paired_evidence(final(m), final(baseline), fresh)
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
    ledger = (read_json(out / LEDGER) or {}).get("cells", {})
    domains: dict = {}
    for d in spec.domains:
        dcells = [c for c in cells if c.domain == d.name]
        cfg = load_config(dcells[0].preset, dcells[0].overrides)
        score = d.score or type(cfg.domain).HELDOUT_SCORE
        per_cell, curves, wm_curves = {}, {}, {}
        for c in dcells:
            start = _score((read_json(Path(c.start_path)) or {}).get("eval", {}), score)
            status = cell_status(c)
            reeval = reeval_current(c) if status == "finished" else None
            rows = read_metrics(c.run_dir) if status in ("finished", "trained") else []
            final = _score((reeval or {}).get("eval", {}), score)
            seen = (ledger.get(c.name) or {}).get("seen_seeds") or []
            per_cell[(c.method, c.seed)] = (
                {"status": status}
                | cell_figures(
                    rows,
                    base_method(c.method),
                    score,
                    start,
                    final,
                    read_json(Path(c.run_dir) / OFFLINE_DATA),
                )
                | {
                    "exploratory": is_tested(c.method) and (c.seed in seen or c.seed in spec.seen_seeds),
                    "start_policy": (read_json(Path(c.run_dir) / START_POLICY) or {}).get("policy_sha1"),
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
                if finite(r.get(f"eval/{score}"))
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


def is_tested(method: str) -> bool:
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
    the paired differences against ``real`` and ``anchors_only`` (the registry's reference and
    baseline, :data:`wmrl.methods.base.ROLES`) and the share of ``real``'s gain,
    the curves keyed ``"<method>/seed<seed>"``, and the ``evidence`` (:func:`domain_evidence` at
    ``margin``). ``wm_curves[(method, seed)]``: that cell's :func:`wm_quality_curve`, kept as
    ``wm_curves`` keyed as the curves. ``start_mismatch``: :func:`start_mismatches`.
    """
    reference = method_with_role("reference")  # `real`: every group executed
    real_final = mean_se([v["final_inrun"] for (m, _), v in per_cell.items() if m == reference])
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
        for role, key in DIFF_KEYS.items():
            ref = method_with_role(role)
            figs[key] = (
                paired(
                    {s: v["heldout_final"] for s, v in by_seed.items()},
                    {s: per_cell[(ref, s)]["heldout_final"] for s in seeds},
                )
                if ref is not None and ref != m and ref in methods
                else None
            )
        out_methods[m] = {"figures": figs, "per_seed": {str(s): v for s, v in by_seed.items()}}
    real_gain = (out_methods.get(reference or "") or {}).get("figures", {}).get("gain")
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
    return float(v) if finite(v) else None


def _plain_spec(spec: GridSpec) -> dict:
    from dataclasses import asdict

    return asdict(spec)
