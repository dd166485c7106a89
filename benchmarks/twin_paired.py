"""Two imagination settings on the same real groups: the difference of their twin correlations,
with a paired bootstrap over the real groups.

``vla_wm_quality.py`` runs of one seed share their real groups whatever the imagination settings
(the real rollouts are drawn before any twin is imagined), so two settings can be compared group
by group. For each advantage form (centred; normalised, as training uses) and each correlation of
:func:`vla_wm_quality.twin_decomposition` (the twin correlation, ``real_vs_wm``; the imagined closed
loop, ``real_vs_twin_replayed``): ``ρ_B − ρ_A``, its 95% percentile interval over groups resampled
with replacement, and the share of resamples where it is ``<= 0``.

    uv run python benchmarks/twin_paired.py --a runs/wmq_twins_s1{1,2,3,4}/vla_wm_quality.json \
        --b runs/wmq_twins_ff_s1{1,2,3,4}/vla_wm_quality.json --out benchmarks/results/wmq_twins_first_frame/paired.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from vla_wm_quality import group_adv, group_adv_normalised, rho

PAIRS = {"twin": ("reward", "twin_score"), "closed_loop": ("reward", "twin_replayed_reward")}


def pooled_rows(paths: list[str]) -> dict[str, np.ndarray]:
    """The runs' ``pooled.rows`` concatenated in the order given (group-major within each run)."""
    rows: dict[str, list[float]] = {}
    for p in paths:
        for k, v in json.loads(Path(p).read_text())["pooled"]["rows"].items():
            rows.setdefault(k, []).extend(v)
    return {k: np.asarray(v, dtype=float) for k, v in rows.items()}


def paired_difference(a: dict, b: dict, g: int, n_boot: int = 4000, seed: int = 0) -> dict:
    """``{form: {pair: {"a", "b", "diff", "ci95", "p_le_0"}}}`` for rows ``a`` and ``b`` of the same
    ``n`` real groups of ``g`` (``[n * g]`` arrays); groups resampled ``n_boot`` times."""
    if not np.array_equal(a["reward"], b["reward"]):
        raise ValueError(
            "the two settings' real rollouts differ: not the same real groups (same seeds, same order?)"
        )
    n = len(a["reward"]) // g
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, n, n) for _ in range(n_boot)]
    out: dict = {}
    for form, adv in (("centred", group_adv), ("normalised", group_adv_normalised)):
        out[form] = {}
        for name, (x, y) in PAIRS.items():
            ax, ay, bx, by = (adv(r[k], g).reshape(n, g) for r, k in ((a, x), (a, y), (b, x), (b, y)))
            ra, rb = rho(ax.ravel(), ay.ravel()), rho(bx.ravel(), by.ravel())
            diffs = np.array(
                [rho(bx[i].ravel(), by[i].ravel()) - rho(ax[i].ravel(), ay[i].ravel()) for i in draws]
            )
            lo, hi = np.percentile(diffs, [2.5, 97.5])
            out[form][name] = {"a": ra, "b": rb, "diff": rb - ra, "ci95": [float(lo), float(hi)],
                               "p_le_0": float(np.mean(diffs <= 0))}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", nargs="+", required=True, help="setting A's vla_wm_quality.json files")
    ap.add_argument("--b", nargs="+", required=True, help="setting B's, the same seeds in the same order")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--boot", type=int, default=4000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {"a": args.a, "b": args.b, "group_size": args.group_size, "boot": args.boot}
    result |= paired_difference(pooled_rows(args.a), pooled_rows(args.b), args.group_size, args.boot)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for form in ("centred", "normalised"):
        for name, r in result[form].items():
            print(f"{form:10s} {name:11s} A {r['a']:.3f}  B {r['b']:.3f}  diff {r['diff']:+.3f}  "
                  f"95% [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]  P(<=0) {r['p_le_0']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
