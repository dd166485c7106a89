"""One report from the reports of one grid run in parts (``wmrl merge-reports``): the parts are
checked to be one grid, their cells put together and every figure recomputed over the union of
their seeds."""

from __future__ import annotations

from wmrl.config import ConfigError, load_config
from wmrl.domain import check_domain_config
from wmrl.report.aggregate import aggregate_domain, is_tested
from wmrl.report.figures import REACH_KEYS
from wmrl.report.stats import MULTIPLICITY

DOMAIN_FIELDS = ("preset", "score", "heldout_size_field", "reeval_overrides")
Sources = dict[str, tuple[dict, str]]  # method -> (the report its cells come from, its name)


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
    method_from = method_from or {}
    seen = _check_parts(reports, names, method_from)
    seeds = sorted(seen)
    first = reports[0]
    methods = list(first["domains"][next(iter(first["domains"]))]["methods"])
    methods += [m for m in method_from if m not in methods]
    domains = {
        dname: _merge_domain(dname, dom, reports, method_from, methods, seeds)
        for dname, dom in first["domains"].items()
    }
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


def _check_parts(reports: list[dict], names: list[str], method_from: Sources) -> dict[int, str]:
    """Check that ``reports`` (named ``names``) and the ``method_from`` reports are parts of one grid
    (:func:`merge_reports`); returns each merged seed's part name."""
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
    return seen


def _merge_domain(
    dname: str, dom: dict, reports: list[dict], method_from: Sources, methods: list[str], seeds: list[int]
) -> dict:
    """Domain ``dname`` (``dom``: the first part's) over ``seeds``: the cells of each part's own
    methods and of the ``method_from`` reports' methods, aggregated again (:func:`aggregate_domain`)."""
    per_cell: dict = {}
    curves: dict = {}
    wm_curves: dict = {}
    sources = [(r, [m for m in r["domains"][dname]["methods"] if m not in method_from]) for r in reports]
    sources += [(r, [m]) for m, (r, _) in method_from.items()]
    for r, taken in sources:
        _take_cells(r, dname, taken, set(seeds), per_cell, curves, wm_curves)
    template = next(iter(per_cell.values()))
    for m in methods:  # a part that ran fewer methods: its seeds count as not run for the others
        for s in seeds:
            per_cell.setdefault((m, s), {k: None for k in template} | {"status": "not run"})
    margin = dom["margin"] if dom.get("margin") is not None else _default_margin(dom["preset"])
    return (
        {f: dom[f] for f in DOMAIN_FIELDS}
        | {"margin": margin}
        | aggregate_domain(per_cell, curves, methods, seeds, margin, wm_curves)
    )


def _take_cells(
    r: dict, dname: str, taken: list[str], seeds: set[int], per_cell: dict, curves: dict, wm_curves: dict
) -> None:
    """Add to ``per_cell``, ``curves`` and ``wm_curves`` (keyed ``(method, seed)``) the cells of
    report ``r``'s domain ``dname`` of the methods ``taken`` on ``seeds``; their reach figures are
    dropped (recomputed against the merged seeds' ``real``)."""
    seen_before = set(r["spec"].get("seen_seeds", []))  # a report from before the ledger: its spec's
    for m in taken:
        for s, v in r["domains"][dname]["methods"][m]["per_seed"].items():
            if int(s) in seeds:
                per_cell[(m, int(s))] = {k: x for k, x in v.items() if k not in REACH_KEYS} | {
                    "exploratory": bool(v.get("exploratory")) or (is_tested(m) and int(s) in seen_before)
                }
    for key, curve in r["domains"][dname]["curves"].items():
        m, s = key.split("/seed")
        if m in taken and int(s) in seeds:
            curves[(m, int(s))] = [tuple(p) for p in curve]
    for key, curve in r["domains"][dname].get("wm_curves", {}).items():  # absent before them
        m, s = key.split("/seed")
        if m in taken and int(s) in seeds:
            wm_curves[(m, int(s))] = curve


def _default_margin(preset: str) -> float | None:
    """The default non-inferiority margin the preset's domain config declares (a report from before
    margins were recorded); None for a domain without one."""
    try:
        domain = load_config(preset).domain
    except ConfigError:
        return None
    return check_domain_config(domain).margin


def _check_same_evaluation(r: dict, name: str, first: dict, first_name: str) -> None:
    """``r``'s domains are ``first``'s, on the same preset, score and held-out re-evaluation."""
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
