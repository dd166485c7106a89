"""Runs: one training run, or a comparison of methods over seeds with a summary table and plot."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from statistics import mean

from wmrl.config import RunConfig, load_config
from wmrl.tracking import read_metrics


def train_run(cfg: RunConfig, resume: bool = False) -> dict[str, float]:
    """Build the domain and train one run in ``cfg.out_dir``; returns the last step's metrics."""
    from wmrl.device import resolve_device
    from wmrl.trainer import Trainer

    resolve_device(cfg.device)  # an unavailable device fails here, before any preparation
    domain = cfg.domain.build(cfg)
    trainer = Trainer(cfg, domain, resume=resume)
    last = trainer.train()
    (Path(cfg.out_dir) / "summary.json").write_text(json.dumps(last, indent=2))
    return last


def resume_run(run_dir: str | Path) -> dict[str, float]:
    """Continue a killed run from its last checkpoint, with the config it was started with."""
    cfg = load_config(Path(run_dir) / "config.yaml", [f"--out_dir={run_dir}"])
    return train_run(cfg, resume=True)


def run_summary(run_dir: Path, threshold: float | None, metric: str) -> dict[str, float]:
    """Figures of one finished run, read back from its ``metrics.jsonl``."""
    rows = read_metrics(run_dir)
    final = [r for r in rows if metric in r]
    errs = [r["update_error"] for r in rows if math.isfinite(r.get("update_error", math.nan))]
    reached = [r["step"] for r in final if threshold is not None and r[metric] >= threshold]
    return {
        "final_true_reward": final[-1][metric] if final else math.nan,
        "real_executions": rows[-1]["exec/real_total"] if rows else 0.0,
        "steps_to_threshold": float(reached[0]) if reached else math.nan,
        "update_error": mean(errs) if errs else math.nan,
        "optimum": final[-1].get("eval/optimum", math.nan) if final else math.nan,
        "wm_residual_before": _mean_key(rows, "wm/residual_before"),
        "wm_residual_after": _mean_key(rows, "wm/residual_after"),
        "wall_clock_s": rows[-1].get("time/elapsed", math.nan) if rows else 0.0,
    }


def _mean_key(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if math.isfinite(r.get(key, math.nan))]
    return mean(vals) if vals else math.nan


def compare(cfg: RunConfig) -> dict:
    """Train every ``cfg.compare.methods`` x ``cfg.compare.seeds`` run under ``cfg.out_dir/<method>/seed<k>``,
    then write ``summary.json`` (means over seeds, plus per-seed values) and ``comparison.png``."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seeds = cfg.compare.seeds or [cfg.seed]
    per_seed: dict[str, list[dict]] = {}
    for method in cfg.compare.methods:
        for seed in seeds:
            run = copy.deepcopy(cfg)
            run.method, run.seed, run.out_dir = method, seed, str(out / method / f"seed{seed}")
            run.compare.methods, run.compare.seeds = [], []
            if not (Path(run.out_dir) / "summary.json").exists():  # finished runs are kept, not redone
                resume = (Path(run.out_dir) / "checkpoints" / "latest.pt").exists()
                train_run(run, resume=resume)
            per_seed.setdefault(method, []).append(
                run_summary(Path(run.out_dir), cfg.compare.threshold, cfg.compare.threshold_metric)
            )
    summary = {
        "methods": {m: _mean_dicts(v) | {"per_seed": v} for m, v in per_seed.items()},
        "seeds": seeds,
        "threshold": cfg.compare.threshold,
        "threshold_metric": cfg.compare.threshold_metric,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_comparison(out, cfg.compare.methods, seeds, cfg.compare.threshold_metric)
    return summary


def _mean_dicts(rows: list[dict]) -> dict[str, float]:
    """Mean over seeds of each figure; a run that never reached the threshold counts as NaN."""
    keys = rows[0].keys()
    return {k: mean(r[k] for r in rows) for k in keys}


def format_table(summary: dict) -> str:
    cols = ["final_true_reward", "real_executions", "steps_to_threshold", "update_error"]
    head = f"{'method':<9}" + "".join(f"{c:>20}" for c in cols)
    lines = [head, "-" * len(head)]
    for m, s in summary["methods"].items():
        lines.append(f"{m:<9}" + "".join(f"{s[c]:>20.4f}" for c in cols))
    return "\n".join(lines)


def plot_comparison(out: Path, methods: list[str], seeds: list[int], metric: str) -> Path:
    """Mean ``metric`` against training step and against real executions, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for method in methods:
        curves = [read_metrics(out / method / f"seed{s}") for s in seeds]
        curves = [[r for r in rows if metric in r] for rows in curves]
        n = min(len(c) for c in curves)
        if n == 0:
            continue
        y = np.array([[r[metric] for r in c[:n]] for c in curves]).mean(0)
        step = [r["step"] for r in curves[0][:n]]
        execs = np.array([[r.get("exec/real_total", 0.0) for r in c[:n]] for c in curves]).mean(0)
        ax1.plot(step, y, label=method)
        ax2.plot(execs, y, label=method)
    ax1.set_xlabel("training step")
    ax2.set_xlabel("real executions")
    for ax in (ax1, ax2):
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    ax1.legend()
    fig.tight_layout()
    path = out / "comparison.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
