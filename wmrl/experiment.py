"""Runs: one training run, or a comparison of methods over seeds with a summary table and plot."""

from __future__ import annotations

import copy
import json
import logging
import math
import tempfile
from pathlib import Path
from statistics import mean

from wmrl.config import WM_METHODS, ConfigError, RunConfig, load_config, save_config, to_dict, upgrade_saved
from wmrl.tracking import CHECKPOINT, RunDirError, _diff, prepare_run_dir, read_metrics

log = logging.getLogger("wmrl")


def train_run(cfg: RunConfig, resume: bool = False) -> dict[str, float]:
    """Build the domain and train one run in ``cfg.out_dir``; returns the last step's metrics.

    The run directory is checked before anything is built: a fresh run needs a writable directory
    holding no checkpoint; a resumed one steps left to train, and starts from step 0 where it
    stopped before its first checkpoint."""
    from wmrl.device import check_precision, resolve_device
    from wmrl.distributed import make_accelerator, wants_distributed
    from wmrl.trainer import Trainer

    check_precision(cfg.precision, resolve_device(cfg.device))  # fails here, before any preparation
    acc = make_accelerator(cfg) if wants_distributed(cfg) else None
    main = acc is None or acc.is_main_process
    build_cfg = cfg  # the domain builds its models on this rank's GPU (the saved config keeps cfg's)
    if acc is not None and acc.num_processes > 1 and cfg.device.startswith("cuda"):
        build_cfg = copy.copy(cfg)
        build_cfg.device = str(acc.device)
    out = Path(cfg.out_dir)
    restart = False  # resumed, but it stopped before its first checkpoint: trained from step 0
    if resume:
        _check_resumable(out, cfg)
        restart = not (out / CHECKPOINT).exists()
        resume = not restart
    if not resume and main:
        if comparison_runs(out):
            raise RunDirError(f"{out} holds a comparison ({_runs_brief(out)}); choose another --out-dir")
        writable_dir(out)
        moved = prepare_run_dir(out, resume=False, cfg=cfg)
        save_config(cfg, out / "config.yaml")  # before the build: a run stopped in it can be resumed
        if restart or moved:
            log.warning(
                "%s holds no checkpoint (its run stopped before the first one): training %s from step 0%s",
                out,
                "it" if restart else "the new run",
                f"; moved {moved}" if moved else "",
            )
    if acc is not None:
        acc.wait_for_everyone()
    if acc is None:
        domain = cfg.domain.build(build_cfg)
    else:  # SFT on every rank; then the main process builds first and the others read its caches
        sft = getattr(cfg.domain, "sft_data_parallel", None)
        if sft is not None and acc.num_processes > 1:  # SFT on every process, cached by the main one
            sft(build_cfg, acc)
        with acc.main_process_first():
            domain = cfg.domain.build(build_cfg)
    trainer = Trainer(cfg, domain, resume=resume, accelerator=acc)
    try:
        last = trainer.train()
    finally:
        trainer.caps.close_domain()  # e.g. the VLA domain's simulator pool
    if not main:
        return last
    if not last:  # killed after its last checkpoint but before summary.json: the last row is the summary
        rows = read_metrics(out)
        last = {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
    if last:
        (out / "summary.json").write_text(json.dumps(last, indent=2))
    return last


def resume_run(run_dir: str | Path) -> dict:
    """Continue a killed run (or comparison) from its last checkpoint, with the config it was
    started with. Returns the run's last metrics, or the comparison's summary."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        if comparison_runs(run_dir):
            raise RunDirError(
                f"{run_dir} is the root of a comparison ({_runs_brief(run_dir)}) started before "
                f"comparisons saved their config: rerun the command that started it with --out-dir "
                f"{run_dir} to finish it (finished runs are kept, killed ones resume), or resume one run "
                f"with --resume {comparison_runs(run_dir)[0]}"
            )
        raise RunDirError(f"cannot resume {run_dir}: it holds no run (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml", [f"--out_dir={run_dir}"])
    if cfg.compare.methods:
        return compare(cfg, resume=True)
    return train_run(cfg, resume=True)


def _check_resumable(out: Path, cfg: RunConfig) -> None:
    rows = read_metrics(out) if (out / "metrics.jsonl").exists() else []
    done = rows and rows[-1].get("step", 0) >= cfg.grpo.steps and (out / "summary.json").exists()
    if done:
        raise RunDirError(
            f"{out} already finished its grpo.steps={cfg.grpo.steps} steps (summary.json); nothing to "
            "resume. To train further, start a new run (--out-dir) from a preset"
        )
    if not (out / CHECKPOINT).exists() and not (out / "config.yaml").exists():
        raise RunDirError(f"cannot resume {out}: it holds no checkpoint ({CHECKPOINT})")


def writable_dir(path: Path) -> None:
    """Create ``path`` (with its parents) and check that a file can be written there, or raise one
    RunDirError that names the directory and why."""
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"out_dir={str(path)!r} cannot be created: {parent} is a file")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise RunDirError(
            f"out_dir={str(path)!r} is not a writable directory: {e.strerror} ({e.filename or path})"
        ) from None


def comparison_runs(root: Path) -> list[Path]:
    """The run directories of a comparison rooted at ``root`` (``root/<method>/seed<k>``)."""
    return sorted(p.parent for p in Path(root).glob("*/seed*/config.yaml"))


def _runs_brief(root: Path) -> str:
    runs = comparison_runs(root)
    return f"{len(runs)} runs: {', '.join(str(r.relative_to(root)) for r in runs[:4])}" + (
        ", ..." if len(runs) > 4 else ""
    )


# Fields that do not change a run's results: where it runs, how it reports.
_BOOKKEEPING = (
    "out_dir",
    "executor",
    "torch_threads",
    "distributed",
    "tracking.progress",
    "tracking.wandb",
    "tracking.media_every",
    "tracking.max_ungraded_steps",
)


def _result_fields(cfg: RunConfig | dict) -> dict:
    d = copy.deepcopy(cfg if isinstance(cfg, dict) else to_dict(cfg))
    for key in _BOOKKEEPING:
        section, _, leaf = key.rpartition(".")
        (d.get(section, {}) if section else d).pop(leaf, None)
    return d


def _config_diffs(path: Path, want: RunConfig, extra_ignore: tuple[str, ...] = ()) -> list[str]:
    """``field: there X vs now Y`` for every result-relevant field where the run config saved at
    ``path`` differs from ``want``."""
    import yaml

    got = _result_fields(upgrade_saved(yaml.safe_load(path.read_text()) or {}))
    return [
        f"{k}: {a!r} there vs {b!r} now"
        for k, a, b in _diff(got, _result_fields(want))
        if not k.startswith(extra_ignore)
    ]


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


def compare(cfg: RunConfig, resume: bool = False) -> dict:
    """Train every ``cfg.compare.methods`` x ``cfg.compare.seeds`` run under ``cfg.out_dir/<method>/seed<k>``,
    then write ``summary.json`` (means over seeds, plus per-seed values) and ``comparison.png``.

    The comparison's config is saved as ``config.yaml`` in its root. Running again into the same
    root continues it (finished runs are kept, killed ones resume) if the config is the same, and is
    refused, naming the fields that differ, if it is not."""
    from wmrl.distributed import wants_distributed

    if wants_distributed(cfg):
        raise ConfigError(
            "a data-parallel run (distributed.enabled or WORLD_SIZE > 1) trains one run: pass "
            "--compare.methods=[] with one --method and --seed"
        )
    out = Path(cfg.out_dir)
    seeds = cfg.compare.seeds or [cfg.seed]
    methods = with_control(cfg.compare.methods)
    plan = []
    for method in methods:
        for seed in seeds:
            run = copy.deepcopy(cfg)
            run.method, run.seed, run.out_dir = method, seed, str(out / method / f"seed{seed}")
            run.compare.methods, run.compare.seeds = [], []
            plan.append(run)
    _check_comparison_root(out, cfg, plan, resume)
    writable_dir(out)
    if not (out / "config.yaml").exists():
        save_config(cfg, out / "config.yaml")
    per_seed: dict[str, list[dict]] = {}
    for run in plan:
        run_dir = Path(run.out_dir)
        if not (run_dir / "summary.json").exists():  # finished runs are kept, not redone
            train_run(run, resume=(run_dir / CHECKPOINT).exists())
        per_seed.setdefault(run.method, []).append(
            run_summary(run_dir, cfg.compare.threshold, cfg.compare.threshold_metric)
        )
    summary = {
        "methods": {m: _mean_dicts(v) | {"per_seed": v} for m, v in per_seed.items()},
        "seeds": seeds,
        "threshold": cfg.compare.threshold,
        "threshold_metric": cfg.compare.threshold_metric,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_comparison(out, methods, seeds, cfg.compare.threshold_metric)
    return summary


def with_control(methods: list[str]) -> list[str]:
    """``methods`` plus ``anchors_only`` (right after ``real``, else first) when a WM method is among
    them: GRPO on the same real executions without a WM is the bar every WM method must clear."""
    if "anchors_only" in methods or not any(m in WM_METHODS for m in methods):
        return list(methods)
    at = methods.index("real") + 1 if "real" in methods else 0
    return [*methods[:at], "anchors_only", *methods[at:]]


def _check_comparison_root(out: Path, cfg: RunConfig, plan: list[RunConfig], resume: bool) -> None:
    """Refuse a root that holds a single run or a comparison with another config; refuse to resume a
    comparison that has nothing left to do."""
    if (out / "metrics.jsonl").exists() or (out / CHECKPOINT).exists():
        raise RunDirError(f"{out} holds a single run, not a comparison; choose another --out-dir")
    diffs = _config_diffs(out / "config.yaml", cfg) if (out / "config.yaml").exists() else []
    for run in plan:  # roots written before comparisons saved their config, and hand-made ones
        saved = Path(run.out_dir) / "config.yaml"
        if not diffs and saved.exists():
            diffs = [f"{run.method}/seed{run.seed}: {d}" for d in _config_diffs(saved, run, ("compare",))]
    if diffs:
        raise RunDirError(
            f"{out} holds a comparison run with a different config ({'; '.join(diffs[:6])}"
            f"{'; ...' if len(diffs) > 6 else ''}): choose another --out-dir, or run the same config "
            "to finish it"
        )
    finished = all((Path(r.out_dir) / "summary.json").exists() for r in plan)
    if resume and finished and (out / "summary.json").exists():
        raise RunDirError(f"{out}: the comparison already finished (summary.json); nothing to resume")


def _mean_dicts(rows: list[dict]) -> dict[str, float]:
    """Mean over seeds of each figure; a run that never reached the threshold counts as NaN."""
    keys = rows[0].keys()
    return {k: mean(r[k] for r in rows) for k in keys}


def format_table(summary: dict) -> str:
    cols = ["final_true_reward", "real_executions", "steps_to_threshold", "update_error"]
    head = f"{'method':<13}" + "".join(f"{c:>20}" for c in cols)
    lines = [head, "-" * len(head)]
    for m, s in summary["methods"].items():
        lines.append(f"{m:<13}" + "".join(f"{s[c]:>20.4f}" for c in cols))
    return "\n".join(lines)


def plot_comparison(out: Path, methods: list[str], seeds: list[int], metric: str) -> Path:
    """Mean ``metric`` against training step and against real executions, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    diag = [m for m in methods if m == "ppi"]  # the prediction-powered diagnostics get a panel
    fig, axes = plt.subplots(1, 2 + len(diag), figsize=(5.5 * (2 + len(diag)), 4))
    ax1, ax2 = axes[0], axes[1]
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
    if diag:
        ax3 = axes[2]
        runs = [read_metrics(out / "ppi" / f"seed{s}") for s in seeds]
        for key, label in (
            ("ppi/lambda", "lambda (pooled, earlier steps)"),
            ("ppi/rho", "rho (this step's anchors)"),
        ):
            rows = [[r for r in run if key in r] for run in runs]
            n = min(len(r) for r in rows)
            if n:
                y = np.nanmean(np.array([[r[key] for r in rr[:n]] for rr in rows], dtype=float), axis=0)
                ax3.plot([r["step"] for r in rows[0][:n]], y, label=label)
        ax3.set_xlabel("training step")
        ax3.set_title("ppi diagnostics (mean over seeds)")
        ax3.grid(alpha=0.3)
        ax3.legend()
    fig.tight_layout()
    path = out / "comparison.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
