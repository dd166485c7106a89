"""What a grid of ``n`` seeds can show: the paired spread of each method's held-out final to
``anchors_only`` (and of each WM method's to its controls, the placebo WM and for ``ppi`` λ = 0) and
the smallest mean difference ``n`` seeds would detect.

For the regime grid's seeds, greedy (the grid's metric, each seed's ``reeval.json``) and sampled at
T = 1 (``benchmarks/reeval_run.py ... --domain.eval_temperature=1.0`` outputs named
``seedK_METHOD.json``): every method's finals (``anchors_only``'s too), and per comparison the paired
differences in points, their standard deviation and :func:`min_detectable_difference` at ``--n``
seeds:

    uv run python benchmarks/seed_power.py --seeds 0 1 2 3 4 5 6 7 --out benchmarks/results/vla_regime_sampled/power.json

Not a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import optimize, stats

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = "anchors_only"  # the same real executions without a WM: the bar every comparison includes
METHODS = ("real", "wmrl", "wmrl_placebo", "ppi", "ppi_placebo", "ppi_lambda0")
READS = ("greedy", "sampled")


def min_detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The mean paired difference ``δ`` a one-sided level-``alpha`` paired t test on ``n`` seeds
    rejects ``δ = 0`` with probability ``power``, for differences of standard deviation ``sd``:
    ``P(T > t_{1−α, n−1}) = power`` with ``T`` noncentral t of ``n − 1`` degrees of freedom and
    noncentrality ``δ √n / sd``."""
    if sd <= 0 or n < 2:
        raise ValueError(f"need sd > 0 and n >= 2, got sd={sd}, n={n}")
    crit = stats.t.ppf(1 - alpha, n - 1)
    return optimize.brentq(lambda d: stats.nct.sf(crit, n - 1, d * np.sqrt(n) / sd) - power, 1e-9, 1e3 * sd)


def greedy(seed: int, method: str) -> float:
    path = RESULTS / f"vla_regime_seed{seed}/vla/{method}/seed{seed}/reeval.json"
    return 100 * json.loads(path.read_text())["eval"]["success"]


def sampled(seed: int, method: str) -> float:
    path = RESULTS / f"vla_regime_sampled/seed{seed}_{method}.json"
    return 100 * json.loads(path.read_text())["final"]["eval"]["success"]


def paired(
    finals: dict[str, dict[str, list[float]]], seeds: list[int], method: str, against: str, n: int
) -> dict:
    """Per read-out, ``method``'s finals minus ``against``'s over ``seeds``: the report's paired
    evidence (:func:`wmrl.report.paired_evidence`: mean, s.e., one-sided 95% bounds, seeds ahead),
    the differences, their standard deviation and the difference ``n`` seeds would detect."""
    from wmrl.report import paired_evidence

    out = {}
    for read in READS:
        a, b = (dict(zip(seeds, finals[m][read], strict=True)) for m in (method, against))
        diffs = np.subtract(finals[method][read], finals[against][read])
        sd = float(diffs.std(ddof=1))
        out[read] = (paired_evidence(a, b, seeds) or {}) | {
            "differences": diffs.tolist(),
            "sd": sd,
            "min_detectable": min_detectable_difference(sd, n),
        }
    return out


def main(argv: list[str] | None = None) -> None:
    from wmrl.grid_spec import controls_of

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", required=True, help="seeds with both read-outs")
    p.add_argument("--n", type=int, default=8, help="the seeds of the grid whose power is asked")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    reads = {"greedy": greedy, "sampled": sampled}
    finals = {m: {r: [reads[r](s, m) for s in a.seeds] for r in READS} for m in (BASELINE, *METHODS)}
    report: dict = {"seeds": a.seeds, "n": a.n, "alpha": 0.05, "power": 0.8, "baseline": BASELINE,
                    "finals": finals, "vs_anchors_only": {}, "vs_controls": {}}  # fmt: skip
    for m in METHODS:
        row = report["vs_anchors_only"][m] = paired(finals, a.seeds, m, BASELINE, a.n)
        g, s = row["greedy"], row["sampled"]
        print(f"{m:14s} - {BASELINE}: sd greedy {g['sd']:5.1f} sampled {s['sd']:5.1f}  "
              f"detectable at n={a.n}: {g['min_detectable']:5.1f} / {s['min_detectable']:5.1f} points")  # fmt: skip
        for c in controls_of(m):
            report["vs_controls"][f"{m} - {c}"] = paired(finals, a.seeds, m, c, a.n)
    a.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
