"""Seeds a confirmatory comparison needs, planned from pilots before any confirmatory cell runs.

Per domain of the family, from the pilot grids' reports (their seeds' held-out finals, every method
they ran): the *room* ``real − anchors_only`` (paired over seeds: mean, s.e., one-sided 95% bound),
and per WM method the paired standard deviation of ``method − anchors_only``. The seeds each
comparison needs: 80% power for a one-sided paired t test at half the room, at level
``alpha / m`` for a family of ``m`` comparisons (Bonferroni's level: Holm's procedure rejects at
least what Bonferroni's does, so this power is a floor), and never fewer than ``--min-seeds``.
A method the pilot did not run takes the largest paired s.d. the pilot measured (``real``'s
included) and is marked so.

``--start-groups`` names which pilot seeds share a start (seeds built on one machine): the script
then splits the paired variance into the part within a start and the part between starts, which
is what letting each seed draw its own start would add (docs/compare.md, "One start per grid").

    uv run python benchmarks/power_plan.py \\
        --pilot research=benchmarks/results/research_heavy_controls/report.json,benchmarks/results/research_heavy_controls_real_wmrl/report.json,benchmarks/results/research_heavy_controls_fresh/report.json \\
        --pilot vla=runs/grid-vla-room-pilot/report.json --domain-entry vla=vla_lr2 \\
        --out benchmarks/results/power_plan

Not a test: it writes ``power_plan.json`` and ``power_plan.md``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from wmrl.family import one_sided_p, seeds_needed

BASELINE = "anchors_only"


def pilot_finals(reports: list[Path], entry: str | None) -> dict[str, dict[int, float]]:
    """Every method's held-out final per seed over ``reports`` (one domain entry each): seeds
    pooled across reports; a method and seed found in two reports with different finals is an
    error (the same cell merged twice is not)."""
    finals: dict[str, dict[int, float]] = {}
    for path in reports:
        domains = json.loads(path.read_text())["domains"]
        dom = domains[entry] if entry else next(iter(domains.values()))
        for method, m in dom["methods"].items():
            for s, v in m.get("per_seed", {}).items():
                if v.get("heldout_final") is None:
                    continue
                old = finals.setdefault(method, {}).get(int(s))
                if old is not None and abs(old - v["heldout_final"]) > 1e-12:
                    raise SystemExit(f"{path}: {method} seed {s} differs from another pilot report")
                finals[method][int(s)] = v["heldout_final"]
    return finals


def paired(a: dict[int, float], b: dict[int, float]) -> list[tuple[int, float]]:
    return [(s, a[s] - b[s]) for s in sorted(set(a) & set(b))]


def describe(pairs: list[tuple[int, float]]) -> dict | None:
    d = [x for _, x in pairs]
    n = len(d)
    if n < 2:
        return None
    m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    from scipy import stats

    return {"n": n, "seeds": [s for s, _ in pairs], "mean": m, "sd": sd, "se": sd / math.sqrt(n),
            "lb95": m - stats.t.ppf(0.95, n - 1) * sd / math.sqrt(n), "p": one_sided_p(d)}  # fmt: skip


def start_split(pairs: list[tuple[int, float]], groups: list[list[int]]) -> dict | None:
    """The paired variance split by start: ``sd_within`` pools each start's own variance
    (``Σ_g Σ_i (d_gi − mean_g)² / (n − G)``), ``sd_total`` ignores the starts. ``sd_within`` is the
    spread of a grid whose seeds share one start; ``sd_total`` that of seeds drawing their own."""
    by_seed = dict(pairs)
    parts = [[by_seed[s] for s in g if s in by_seed] for g in groups]
    parts = [p for p in parts if p]
    n, k = sum(len(p) for p in parts), len(parts)
    if k < 2 or n - k < 1:
        return None
    within = sum(sum((x - sum(p) / len(p)) ** 2 for x in p) for p in parts) / (n - k)
    allx = [x for p in parts for x in p]
    mu = sum(allx) / n
    total = sum((x - mu) ** 2 for x in allx) / (n - 1)
    return {"starts": k, "seeds": n, "group_means": [sum(p) / len(p) for p in parts],
            "sd_within": math.sqrt(within), "sd_total": math.sqrt(total)}  # fmt: skip


def plan(domains: dict[str, dict[str, dict[int, float]]], methods: list[str], alpha: float, power: float, min_seeds: int,
         start_groups: dict[str, list[list[int]]], family_size: int | None = None) -> dict:  # fmt: skip
    m_family = family_size or len(domains) * len(methods)
    level = alpha / m_family
    out: dict = {"baseline": BASELINE, "alpha": alpha, "family_size": m_family, "level_per_comparison": level,
                 "power": power, "min_seeds": min_seeds, "domains": {}}  # fmt: skip
    for name, finals in domains.items():
        base = finals.get(BASELINE, {})
        room = describe(paired(finals.get("real", {}), base))
        comps = {m: describe(paired(finals[m], base)) for m in methods if m in finals}
        stand_in = max([c["sd"] for c in [room, *comps.values()] if c], default=None)
        dom: dict = {"room": room, "room_is": f"real - {BASELINE}", "methods": {}}
        for m in methods:
            c = comps.get(m)
            sd = c["sd"] if c else stand_in
            row = {"vs": BASELINE, "pilot": c, "sd_used": sd, "sd_is_stand_in": c is None}
            if room and room["mean"] > 0 and sd:
                delta = room["mean"] / 2
                n = seeds_needed(sd, delta, level, power)
                row |= {"delta": delta, "seeds_needed": n, "seeds_fixed": max(n, min_seeds)}
            dom["methods"][m] = row
        if name in start_groups:
            dom["start_split"] = {
                m: start_split(paired(finals[m], base), start_groups[name])
                for m in ["real", *methods]
                if m in finals
            }
        dom["seeds_fixed"] = (
            max((r.get("seeds_fixed", 0) for r in dom["methods"].values()), default=0) or None
        )
        out["domains"][name] = dom
    return out


def markdown(p: dict) -> str:
    lines = [
        "# Seeds for the confirmatory family, planned from pilots",
        "",
        f"Family of {p['family_size']} comparisons at α = {p['alpha']} (one-sided), each planned at "
        f"α/{p['family_size']} = {p['level_per_comparison']:.4f} for {p['power']:.0%} power at half the "
        f"room (`real` − `anchors_only`), at least {p['min_seeds']} seeds.",
        "",
        "| domain | room: `real` − `anchors_only` (pilot seeds) | method | paired s.d. vs `anchors_only` | δ = room/2 | seeds needed | seeds fixed |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, d in p["domains"].items():
        r = d["room"]
        room = "—" if r is None else f"{r['mean']:+.3f} ± {r['se']:.3f} (n {r['n']}, bound {r['lb95']:+.3f})"
        for m, row in d["methods"].items():
            sd = "—" if row["sd_used"] is None else f"{row['sd_used']:.3f}" + (" (stand-in)" if row["sd_is_stand_in"] else f" (n {row['pilot']['n']})")  # fmt: skip
            lines.append(
                f"| {name} | {room} | `{m}` | {sd} | {row.get('delta', float('nan')):.3f} "
                f"| {row.get('seeds_needed', '—')} | {row.get('seeds_fixed', '—')} |"
            )
        for m, s in (d.get("start_split") or {}).items():
            if s:
                lines.append(
                    f"\n{name}, `{m}` − `anchors_only` over {s['starts']} starts ({s['seeds']} seeds): paired s.d. "
                    f"{s['sd_total']:.3f} ignoring the starts, {s['sd_within']:.3f} within a start; start "
                    f"means {', '.join(f'{x:+.3f}' for x in s['group_means'])}."
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pilot", action="append", required=True, metavar="DOMAIN=REPORT[,REPORT...]")
    ap.add_argument("--domain-entry", action="append", default=[], metavar="DOMAIN=ENTRY",
                    help="the domain entry of a pilot report with several (e.g. vla=vla_lr2)")  # fmt: skip
    ap.add_argument("--start-groups", action="append", default=[], metavar="DOMAIN=8,9,10,11/12,13/14,15",
                    help="pilot seeds that share a start, one group per start")  # fmt: skip
    ap.add_argument("--methods", nargs="+", default=["wmrl", "ppi"])
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--power", type=float, default=0.8)
    ap.add_argument("--min-seeds", type=int, default=12)
    ap.add_argument("--family-size", type=int, default=None,
                    help="comparisons in the family (default: pilot domains x methods)")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    entries = dict(e.split("=", 1) for e in a.domain_entry)
    domains = {}
    for spec in a.pilot:
        name, paths = spec.split("=", 1)
        domains[name] = pilot_finals([Path(p) for p in paths.split(",")], entries.get(name))
    groups = {
        name: [[int(s) for s in g.split(",")] for g in spec.split("/")]
        for name, spec in (e.split("=", 1) for e in a.start_groups)
    }
    p = plan(domains, a.methods, a.alpha, a.power, a.min_seeds, groups, a.family_size)
    p["command"] = "uv run python benchmarks/power_plan.py " + " ".join(
        [
            *(f"--pilot {x}" for x in a.pilot),
            *(f"--domain-entry {x}" for x in a.domain_entry),
            *(f"--start-groups {x}" for x in a.start_groups),
            *([f"--family-size {a.family_size}"] if a.family_size else []),
            f"--out {a.out}",
        ]  # fmt: skip
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "power_plan.json").write_text(json.dumps(p, indent=2) + "\n")
    (a.out / "power_plan.md").write_text(markdown(p) + f"\n    {p['command']}\n")
    print(markdown(p))


if __name__ == "__main__":
    main()
