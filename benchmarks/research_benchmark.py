"""Research domain: `real` vs `wmrl` (and optional ablations) under the same step budget, several seeds.

Every run starts from the same cached SFT policy, execution log and pretrained WM (the preset's
``build``), trains ``grpo.steps`` steps and evaluates on the held-out tasks by real execution every
``--eval-every`` steps. Writes ``<out>/research_benchmark.json`` (per run: the metric rows; summary:
final held-out score, real executions, wall-clock per phase, WM predictions per second) and
``<out>/research_benchmark.png`` (held-out normalised score against wall-clock and against real
executions).

    uv run python benchmarks/research_benchmark.py --preset research-tiny --seeds 0 1 --out runs/bench-research

Comparing methods (across domains, resumable, on local processes or a Ray cluster, with a cached
held-out re-evaluation) is ``wmrl compare SPEC`` (wmrl/grid.py; README "Comparing methods across
domains"). What stays here is what a grid does not do: the WM's predictions per second on a fresh
batch and the build information of each run, and reading back the JSON files already committed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from merge_spec import split_merge_arg  # benchmarks/merge_spec.py


def run_one(preset: str, method: str, seed: int, out: Path, overrides: list[str]) -> dict:
    from wmrl.config import load_config
    from wmrl.trainer import Trainer

    run_dir = out / f"{method}-seed{seed}"
    cfg = load_config(preset, [f"--method={method}", f"--seed={seed}", f"--out_dir={run_dir}", *overrides])
    t0 = time.perf_counter()
    domain = cfg.domain.build(cfg)
    build_s = time.perf_counter() - t0
    trainer = Trainer(cfg, domain)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    # WM throughput on a fresh batch (predictions per second, applied edits only are modelled).
    tasks = domain.sample_tasks(8, "train", torch.Generator().manual_seed(seed))
    batch = domain.generate(tasks, 8, torch.zeros(8, dtype=torch.bool))
    t0 = time.perf_counter()
    domain.world_model.predict(batch)
    wm_per_s = batch.n_rollouts / (time.perf_counter() - t0)
    evals = [r for r in rows if "eval/score_mean" in r]
    phases = {}
    for k in ("time/generate", "time/execute", "time/wm", "time/update", "time/wm_update", "time/step"):
        vals = [r[k] for r in rows if k in r]
        phases[k] = statistics.mean(vals) if vals else 0.0
    return {
        "method": method,
        "seed": seed,
        "build_s": build_s,
        "train_s": train_s,
        "final_score": evals[-1]["eval/score_mean"] if evals else float("nan"),
        "final_runnable": evals[-1]["eval/runnable_frac"] if evals else float("nan"),
        "sft_score": domain.reference_scores.get("sft_score_mean", float("nan")),
        "real_executions": rows[-1]["exec/real_total"] if rows else 0.0,
        "wm_predictions_per_s": wm_per_s,
        "phase_mean_s": phases,
        "curve": [
            {
                "step": r["step"],
                "wall_s": r.get("time/elapsed", float("nan")),
                "real_total": r.get("exec/real_total", 0.0),  # the step-0 evaluation precedes any
                "score": r["eval/score_mean"],
            }
            for r in evals
        ],
        "build_info": domain.build_info,
        "rows": rows,
    }


def cumulative_wall(rows: list[dict]) -> dict[int, float]:
    total, out = 0.0, {}
    for r in rows:
        total += r.get("time/step", 0.0)
        out[r["step"]] = total
    return out


def plot(results: list[dict], path: Path) -> None:
    """Held-out score against training wall-clock and against real executions: per method, the mean
    over seeds (+- one standard error, shaded) over thin per-seed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {
        "real": "tab:blue",
        "wmrl": "tab:red",
        "real_quarter": "tab:brown",
        "mix": "tab:gray",
        "debias": "tab:olive",
        "denoise": "tab:orange",
        "ppi": "tab:green",
        "anchors_only": "tab:purple",
    }
    methods = sorted({r["method"] for r in results}, key=[r["method"] for r in results].index)
    for m in methods:
        rs = [r for r in results if r["method"] == m]
        c = colors.get(m)
        xs_w, xs_e, ys = [], [], []
        for res in rs:
            wall = cumulative_wall(res["rows"])
            xs_w.append([0.0] + [wall.get(p["step"], float("nan")) for p in res["curve"][1:]])
            xs_e.append([0.0] + [p["real_total"] for p in res["curve"][1:]])
            ys.append([res["sft_score"]] + [p["score"] for p in res["curve"][1:]])
            axes[0].plot(xs_w[-1], ys[-1], color=c, lw=0.6, alpha=0.35)
            axes[1].plot(xs_e[-1], ys[-1], color=c, lw=0.6, alpha=0.35)
        n = min(len(y) for y in ys)
        y = np.array([v[:n] for v in ys])
        mean = y.mean(0)
        se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros(n)
        for ax, xs in zip(axes, (xs_w, xs_e), strict=True):
            x = np.nanmean(np.array([v[:n] for v in xs]), 0)
            ax.plot(x, mean, marker="o", color=c, lw=2, label=f"{m} ({len(rs)} seeds)")
            ax.fill_between(x, mean - se, mean + se, color=c, alpha=0.15)
    axes[0].set_xlabel("training wall-clock (s, excluding evaluation)")
    axes[1].set_xlabel("real executions")
    for ax in axes:
        ax.set_ylabel("held-out normalised score")
        ax.axhline(0.0, color="k", lw=0.5, ls="--")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("AutoResearch: held-out score (real execution) vs cost; mean +- s.e. over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def replot(out: Path) -> None:
    """Redraw the plot from an existing JSON."""
    data = json.loads((out / "research_benchmark.json").read_text())
    plot(data["runs"], out / "research_benchmark.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="research-tiny")
    ap.add_argument("--methods", nargs="+", default=["real", "wmrl"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--out", default="runs/bench-research")
    ap.add_argument(
        "--replot", action="store_true", help="only redraw the plot from <out>/research_benchmark.json"
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR[:METHODS]",
        help="only combine the research_benchmark.json of these output folders (e.g. one per seed, "
        "run in parallel) into <out>; `DIR:real,wmrl` takes only those methods from DIR",
    )
    ap.add_argument(
        "--label",
        help="report the (single) method under this name, e.g. `real_quarter` for `--methods real "
        "--grpo.tasks_per_step=1`: GRPO on as many real executions as wmrl's anchors",
    )
    ap.add_argument("overrides", nargs="*", help="extra --a.b=value config overrides")
    args, extra = ap.parse_known_args()  # --a.b=value overrides pass through to the run config
    if args.label and len(args.methods) != 1:
        ap.error(f"--label names one method; got --methods {' '.join(args.methods)}")
    out = Path(args.out)
    if args.replot:
        replot(out)
        return
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        results: list[dict] = []
        for spec in args.merge:
            d, keep = split_merge_arg(spec)
            for r in json.loads((d / "research_benchmark.json").read_text())["runs"]:
                if keep is not None and r["method"] not in keep:
                    continue
                if any((q["method"], q["seed"]) == (r["method"], r["seed"]) for q in results):
                    raise SystemExit(f"{d}: {r['method']} seed {r['seed']} is already in an earlier folder")
                results.append(r)
        write(results, sorted({r["method"] for r in results}, key=[r["method"] for r in results].index), out)
        return
    overrides = [
        f"--tracking.eval_every={args.eval_every}",
        "--tracking.wandb=disabled",
        *args.overrides,
        *extra,
    ]
    results = []
    for seed in args.seeds:
        for method in args.methods:
            print(f"== {method} seed {seed}", flush=True)
            res = run_one(args.preset, method, seed, out, overrides)
            res["method"] = args.label or method
            print(
                f"   final held-out {res['final_score']:.3f} (SFT {res['sft_score']:.3f}), "
                f"real executions {res['real_executions']:.0f}, train {res['train_s']:.0f}s",
                flush=True,
            )
            results.append(res)
    write(results, [args.label] if args.label else args.methods, out)


def standard_error(xs: list[float]) -> float:
    """``std(xs, ddof=1) / sqrt(n)``; NaN for fewer than 2 values."""
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")


def paired_differences(per_seed: dict[str, dict], methods: list[str]) -> dict[str, dict]:
    """For every ordered pair ``a-b`` of methods: over the seeds that ran both, the mean of the
    per-seed differences of final held-out scores, its standard error, and the seeds where a > b."""
    out = {}
    for a in methods:
        for b in methods:
            if a == b:
                continue
            diffs = [v[a] - v[b] for v in per_seed.values() if a in v and b in v]
            if diffs:
                out[f"{a}-{b}"] = {
                    "mean": statistics.mean(diffs),
                    "se": standard_error(diffs),
                    "seeds": len(diffs),
                    "a_ahead": sum(d > 0 for d in diffs),
                }
    return out


def write(results: list[dict], methods: list[str], out: Path) -> None:
    """The summary (per method: means over seeds; per seed: SFT and final held-out score), JSON, plot."""
    summary: dict = {}
    for m in methods:
        rs = [r for r in results if r["method"] == m]
        summary[m] = {
            "seeds": len(rs),
            "final_score_mean": statistics.mean(r["final_score"] for r in rs),
            "final_score_se": standard_error([r["final_score"] for r in rs]),
            "final_runnable_mean": statistics.mean(r["final_runnable"] for r in rs),
            "real_executions_mean": statistics.mean(r["real_executions"] for r in rs),
            "train_s_mean": statistics.mean(r["train_s"] for r in rs),
            "wm_predictions_per_s": statistics.mean(r["wm_predictions_per_s"] for r in rs),
            "phase_mean_s": {
                k: statistics.mean(r["phase_mean_s"][k] for r in rs) for k in rs[0]["phase_mean_s"]
            },
        }
    summary["sft_score"] = results[0]["sft_score"]
    summary["per_seed"] = {
        str(seed): {
            "sft_score": next(r["sft_score"] for r in results if r["seed"] == seed),
            "sft_validity": {
                k: next(r for r in results if r["seed"] == seed)["build_info"]["sft"][f"validity_{k}"][
                    "apply_fraction"
                ]
                for k in ("train", "heldout")
            },
            # SFT policy on held-out tasks (real execution): edits that apply and run
            "sft_heldout_runnable": next(r for r in results if r["seed"] == seed)["build_info"]["sft_eval"][
                "runnable_frac"
            ],
            **{r["method"]: r["final_score"] for r in results if r["seed"] == seed},
        }
        for seed in sorted({r["seed"] for r in results})
    }
    summary["sft_score_mean"] = statistics.mean(v["sft_score"] for v in summary["per_seed"].values())
    summary["paired_differences"] = paired_differences(summary["per_seed"], methods)
    path = out / "research_benchmark.json"
    path.write_text(json.dumps({"summary": summary, "runs": results}, indent=2, default=float))
    plot(results, out / "research_benchmark.png")
    print(json.dumps(summary, indent=2))
    print(f"wrote {path} and {out / 'research_benchmark.png'}")


if __name__ == "__main__":
    main()
