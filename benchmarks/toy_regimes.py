"""The toy in four world-model regimes: does `ppi` clear `anchors_only` whatever the WM?

    uv run python benchmarks/toy_regimes.py [--seeds 0 1 2 3 4] [--runs runs/toy-regimes]

Each regime is the `toy` preset with overrides; every method of the preset runs over the seeds
(finished runs are kept, so a killed benchmark resumes). Writes ``benchmarks/results/toy_regimes.json``
(per method mean and s.e. of the final true reward; paired differences `ppi - anchors_only` and
`ppi - wmrl` with their s.e.; the share of the `anchors_only` -> `real` gap that `ppi` closes; the
anchors' mean correlation rho of true and WM advantages and the mean lambda) and ``toy_regimes.png``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from statistics import mean, stdev

from wmrl.config import load_config
from wmrl.experiment import compare
from wmrl.tracking import read_metrics

REGIMES = {
    "current": [],
    "useless": ["--domain.noise=4.0"],
    "adversarial": ["--domain.rank_error_frac=0.8"],
    "good": ["--domain.noise=0.05", "--domain.rank_error_frac=0"],
}


def mean_se(xs: list[float]) -> tuple[float, float]:
    return mean(xs), (stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan)


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    d = [x - y for x, y in zip(a, b, strict=True)]
    m, se = mean_se(d)
    return {"mean": m, "se": se, "wins": sum(x > 0 for x in d), "n": len(d)}


def regime_summary(out: Path, summary: dict) -> dict:
    finals = {m: [r["final_true_reward"] for r in s["per_seed"]] for m, s in summary["methods"].items()}
    res = {"methods": {m: dict(zip(("mean", "se"), mean_se(v), strict=True)) for m, v in finals.items()}}
    if {"ppi", "anchors_only"} <= finals.keys():
        res["ppi_minus_anchors_only"] = paired(finals["ppi"], finals["anchors_only"])
    if {"ppi", "wmrl"} <= finals.keys():
        res["ppi_minus_wmrl"] = paired(finals["ppi"], finals["wmrl"])
    if {"ppi", "anchors_only", "real"} <= finals.keys():
        gap = mean(finals["real"]) - mean(finals["anchors_only"])
        res["ppi_gap_closed"] = (mean(finals["ppi"]) - mean(finals["anchors_only"])) / gap
    if "ppi" in finals:
        rows = [r for s in summary["seeds"] for r in read_metrics(out / "ppi" / f"seed{s}")]
        for key in ("ppi/rho", "ppi/lambda"):
            vals = [r[key] for r in rows if math.isfinite(r.get(key, math.nan))]
            res[f"mean_{key.split('/')[1]}"] = mean(vals) if vals else math.nan
    return res


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(results)
    methods = list(results[regimes[0]]["methods"])
    fig, axes = plt.subplots(1, len(regimes), figsize=(4 * len(regimes), 3.6), sharey=True)
    for ax, regime in zip(axes, regimes, strict=True):
        ms = results[regime]["methods"]
        ax.bar(range(len(methods)), [ms[m]["mean"] for m in methods], yerr=[ms[m]["se"] for m in methods])
        ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right")
        ax.axhline(ms["anchors_only"]["mean"], color="k", lw=0.8, ls="--")
        ax.set_title(f"{regime} (rho {results[regime].get('mean_rho', math.nan):.2f})")
        ax.set_ylim(0.6, 0.87)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("final true reward (mean +- s.e.)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--runs", type=Path, default=Path("runs/toy-regimes"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    results = {}
    for regime in args.regimes:
        out = args.runs / regime
        seeds = ",".join(map(str, args.seeds))
        cfg = load_config("toy", [*REGIMES[regime], f"--out_dir={out}", f"--compare.seeds=[{seeds}]"])
        results[regime] = regime_summary(out, compare(cfg)) | {"overrides": REGIMES[regime]}
        r = results[regime]
        print(
            f"{regime:12s} ppi - anchors_only {r['ppi_minus_anchors_only']['mean']:+.4f} "
            f"+- {r['ppi_minus_anchors_only']['se']:.4f}; ppi - wmrl {r['ppi_minus_wmrl']['mean']:+.4f}; "
            f"gap closed {r['ppi_gap_closed']:.0%}; rho {r['mean_rho']:.2f}, lambda {r['mean_lambda']:.2f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "toy_regimes.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "toy_regimes.png")


if __name__ == "__main__":
    main()
