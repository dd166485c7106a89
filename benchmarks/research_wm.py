"""Outcome world models of the research domain side by side: how well does each rank edits of a task?

Data: the random-edit execution log of the TRAIN tasks (``wmrl_research.execution_logs.build_random_log``:
``--per-task`` random 1-3-knob edits of each baseline, executed in the sandbox; built once and cached
under ``--cache-dir``, shared with the research presets' builds of the same size). Held-out tasks
are never touched (they evaluate the policy, not the WM).

Protocol: k-fold cross-validation over the log, folds grouped by (task, solution text) so an edit and
its duplicates never sit on both sides. Each WM kind is trained on the other folds exactly as
``pipeline.pretrain_world_model`` does it (fit on 80%, variance calibrated on the other 20% where the
kind has ``calibrate_variance``, then refined on that 20%) and predicts the held-out fold. Reported
per kind (mean over folds):

- ``within_spearman``: mean Spearman correlation inside random groups of 4 held-out edits of one task
  (``--groups`` per task and fold; groups whose true rewards are all equal are skipped), the quantity
  GRPO advantages depend on (``wmrl_research.diagnose.within_group_stats``);
- ``top1``: fraction of those groups whose WM argmax is a true argmax; ``top1_chance`` what a
  uniform random pick scores on the same groups;
- ``spearman`` (overall), ``mae``, ``nll``, ``cover_1s`` / ``cover_2s`` of the predicted variance
  (``world_models.outcome.outcome_metrics``);
- ``predict_per_s`` and ``fit_s`` (training time per fold, wall-clock on this machine).

A log-size curve (``--curve-kinds``): within-group Spearman against the number of training
executions per task (subsamples of each fold's training part; same held-out folds).

    uv run python benchmarks/research_wm.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _folds(examples: list, k: int, seed: int) -> list[list[int]]:
    """``k`` folds of example indices, grouped by (task, solution text), balanced per task."""
    rng = random.Random(seed)
    by_task: dict[str, dict[str, list[int]]] = {}
    for i, e in enumerate(examples):
        by_task.setdefault(e.task_id, {}).setdefault(e.solution_text, []).append(i)
    folds: list[list[int]] = [[] for _ in range(k)]
    for task in sorted(by_task):
        groups = list(by_task[task].values())
        rng.shuffle(groups)
        for j, g in enumerate(groups):
            folds[j % k].extend(g)
    return folds


def _groups(examples: list, idx: list[int], per_task: int, size: int, rng: random.Random) -> list[list[int]]:
    """Random groups of ``size`` distinct held-out examples of one task, ``per_task`` per task."""
    by_task: dict[str, list[int]] = {}
    for i in idx:
        by_task.setdefault(examples[i].task_id, []).append(i)
    out = []
    for task in sorted(by_task):
        pool = by_task[task]
        if len(pool) >= size:
            out += [rng.sample(pool, size) for _ in range(per_task)]
    return out


def _top1_chance(groups: list[tuple[list[float], list[float]]]) -> float:
    vals = []
    for _, true in groups:
        if len(true) >= 3 and max(true) != min(true):
            vals.append(sum(t == max(true) for t in true) / len(true))
    return statistics.mean(vals) if vals else float("nan")


def make_wm(kind: str, seed: int, tokenizer, args) -> tuple[Any, str]:
    """A fresh WM of ``kind`` (``surrogate``, ``encoder``, ``encoder_edit``, ``lm``) built by the
    pipeline's own ``build_world_model``, and the WM input it reads (``view`` or ``edit``)."""
    from wmrl.config import RunConfig
    from wmrl_research.config import ResearchConfig
    from wmrl_research.pipeline import build_world_model

    wm_kind, wm_input = {"encoder_edit": ("encoder", "edit")}.get(kind, (kind, "view"))
    cfg = ResearchConfig(
        world_model=wm_kind,
        wm_input=wm_input,
        wm_members=args.members,
        wm_pretrain_steps=args.steps,
        tiny_hidden=128,
        tiny_layers=2,
    )
    return build_world_model(cfg, RunConfig(seed=seed), tokenizer), wm_input


def train_wm(wm, fit_examples: list, steps: int, seed: int) -> float:
    """``pipeline.pretrain_world_model``'s procedure without its cache: fit on 80%, calibrate the
    variance on the other 20% (where the kind can), then refine on it. Returns seconds."""
    rng = random.Random(seed)
    order = list(range(len(fit_examples)))
    rng.shuffle(order)
    n_hold = int(round(0.2 * len(order)))
    hold = [fit_examples[i] for i in order[:n_hold]]
    fit = [fit_examples[i] for i in order[n_hold:]]
    t0 = time.perf_counter()
    wm.fit(fit, steps)
    if len(hold) >= 2:
        if hasattr(wm, "calibrate_variance"):
            wm.calibrate_variance(hold)
        wm.update(hold, max(1, steps // 10))
    return time.perf_counter() - t0


def evaluate(wm, examples: list, test_idx: list[int], args, rng: random.Random) -> dict[str, float]:
    from wmrl_research.diagnose import within_group_stats
    from world_models.outcome import outcome_metrics

    test = [examples[i] for i in test_idx]
    t0 = time.perf_counter()
    mean, var = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
    pred_s = time.perf_counter() - t0
    pos = {i: j for j, i in enumerate(test_idx)}
    groups = _groups(examples, test_idx, args.groups, args.group_size, rng)
    per_group = [([float(mean[pos[i]]) for i in g], [examples[i].reward for i in g]) for g in groups]
    w = within_group_stats(per_group)
    m = outcome_metrics(mean, var, torch.tensor([e.reward for e in test]))
    return {
        "within_spearman": w["within_spearman"],
        "top1": w["top1"],
        "top1_chance": _top1_chance(per_group),
        "n_groups": w["n_groups"],
        "spearman": m["spearman"],
        "mae": m["mae"],
        "nll": m["nll"],
        "cover_1s": m["cover_1s"],
        "cover_2s": m["cover_2s"],
        "predict_per_s": len(test) / pred_s,
        "n_test": float(len(test)),
    }


def run_kind(kind: str, examples_view: list, examples_edit: list, folds, fold_ids, tokenizer, args,
             per_task: int | None = None, test_cap: int | None = None) -> list[dict[str, float]]:  # fmt: skip
    out = []
    for f in fold_ids:
        wm, wm_input = make_wm(kind, args.seed + f, tokenizer, args)
        ex = examples_edit if wm_input == "edit" else examples_view
        test_idx = folds[f]
        train_idx = [i for g, fold in enumerate(folds) if g != f for i in fold]
        if per_task is not None:  # the log-size curve: the first `per_task` of each task's shuffle
            rng = random.Random(args.seed + 100 + f)
            rng.shuffle(train_idx)
            seen: dict[str, int] = {}
            keep = []
            for i in train_idx:
                t = ex[i].task_id
                if seen.get(t, 0) < per_task:
                    seen[t] = seen.get(t, 0) + 1
                    keep.append(i)
            train_idx = keep
        if test_cap is not None:
            test_idx = random.Random(args.seed + f).sample(test_idx, min(test_cap, len(test_idx)))
        fit_s = train_wm(wm, [ex[i] for i in train_idx], args.steps, args.seed + f)
        r = evaluate(wm, ex, test_idx, args, random.Random(args.seed * 1000 + f))
        r.update({"fold": float(f), "fit_s": fit_s, "n_train": float(len(train_idx))})
        print(f"  {kind} fold {f}" + (f" n/task={per_task}" if per_task else "") + ": "
              + " ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)  # fmt: skip
        out.append(r)
    return out


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in rows[0] if k != "fold"]
    out = {}
    for k in keys:
        vals = [r[k] for r in rows if r[k] == r[k]]
        out[k] = statistics.mean(vals) if vals else float("nan")
        if k in ("within_spearman", "top1", "spearman") and len(vals) > 1:
            out[k + "_se"] = statistics.stdev(vals) / len(vals) ** 0.5
    out["folds"] = float(len(rows))
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    kinds = list(results["kinds"])
    ax = axes[0]
    xs = range(len(kinds))
    for off, (key, label) in enumerate((("within_spearman", "within-group Spearman"), ("top1", "top-1"),
                                        ("spearman", "overall Spearman"))):  # fmt: skip
        vals = [results["kinds"][k]["summary"][key] for k in kinds]
        ax.bar([x + 0.27 * (off - 1) for x in xs], vals, width=0.27, label=label)
    chance = statistics.mean(results["kinds"][k]["summary"]["top1_chance"] for k in kinds)
    ax.axhline(chance, color="k", ls=":", lw=1, label=f"top-1 chance ({chance:.2f})")
    ax.axhline(0.8, color="r", ls="--", lw=1, label="target 0.8")
    ax.set_xticks(list(xs), kinds)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("held-out executions of the train tasks")
    ax = axes[1]
    for kind, pts in results.get("curve", {}).items():
        ns = sorted(int(n) for n in pts)
        ax.plot(ns, [pts[str(n)]["within_spearman"] for n in ns], marker="o", label=kind)
    ax.axhline(0.8, color="r", ls="--", lw=1)
    ax.set_xlabel("training executions per task")
    ax.set_ylabel("within-group Spearman")
    ax.set_title("log-size curve")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["surrogate", "encoder", "encoder_edit", "lm"])
    ap.add_argument("--per-task", type=int, default=96, help="random-log executions per train task")
    ap.add_argument("--log-seed", type=int, default=0)
    ap.add_argument("--cache-dir", default="runs/cache/research")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--fold-limit", nargs="*", default=["lm=1"],
                    help="KIND=N: evaluate KIND on the first N folds only (slow kinds)")  # fmt: skip
    ap.add_argument("--test-cap", nargs="*", default=["lm=100"],
                    help="KIND=N: at most N held-out executions per fold for KIND (slow kinds)")  # fmt: skip
    ap.add_argument("--groups", type=int, default=25, help="random groups per task and fold")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="pretraining steps (text kinds)")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--curve-kinds", nargs="*", default=["surrogate", "encoder_edit"])
    ap.add_argument("--curve-sizes", nargs="*", type=int, default=[8, 16, 32, 48])
    ap.add_argument("--curve-folds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--merge", nargs="*", default=None,
                    help="merge these research_wm.json files (kinds and curves) into --out instead")  # fmt: skip
    args = ap.parse_args(argv)
    if args.merge:
        merged: dict[str, Any] = {"kinds": {}, "curve": {}, "parts": args.merge}
        for path in args.merge:
            part = json.loads(Path(path).read_text())
            merged.setdefault("log", part["log"])
            merged.setdefault("args", part["args"])
            merged["kinds"].update(part["kinds"])
            merged["curve"].update(part["curve"])
        _write(merged, args)
        print(table(merged))
        return

    from wmrl.config import ExecutorConfig
    from wmrl.executors import make_executor
    from wmrl_research.config import ResearchConfig
    from wmrl_research.domain import wm_example
    from wmrl_research.execution_logs import build_random_log, random_log_path
    from wmrl_research.lm import build_tokenizer
    from wmrl_research.pipeline import select_tasks, tokenizer_corpus
    from wmrl_research.tasks import list_tasks

    cfg = ResearchConfig(log_random_per_task=args.per_task, log_random_seed=args.log_seed,
                         cache_dir=args.cache_dir)  # fmt: skip
    train, _ = select_tasks(cfg)
    path = random_log_path(cfg, train)
    t0 = time.perf_counter()
    with make_executor(ExecutorConfig(type="process", timeout_s=120), 2) as ex:
        examples = build_random_log(cfg, train, ex, path).load()
    log_info = json.loads(path.with_suffix(".json").read_text()) if path.with_suffix(".json").exists() else {}
    print(
        f"random log {path}: {len(examples)} records ({time.perf_counter() - t0:.0f}s to load/build)",
        flush=True,
    )
    tasks = {t.id: t for t in list_tasks()}
    examples_edit = [wm_example(tasks[e.task_id], e, "edit") for e in examples]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(tokenizer_corpus(train, args.seed), 1024, Path(tmp) / "tok", "bytelevel")

        folds = _folds(examples, args.folds, args.seed)
        limits = {k: int(v) for k, v in (s.split("=") for s in args.fold_limit)}
        caps = {k: int(v) for k, v in (s.split("=") for s in args.test_cap)}
        results: dict[str, Any] = {
            "log": {"path": str(path), "records": len(examples), **log_info},
            "args": vars(args),
            "kinds": {},
            "curve": {},
        }
        for kind in args.kinds:
            fold_ids = list(range(min(limits.get(kind, args.folds), args.folds)))
            rows = run_kind(kind, examples, examples_edit, folds, fold_ids, tokenizer, args,
                            test_cap=caps.get(kind))  # fmt: skip
            results["kinds"][kind] = {"folds": rows, "summary": summarise(rows),
                                      "subsampled": kind in limits or kind in caps}  # fmt: skip
            _write(results, args)
        for kind in args.curve_kinds:
            results["curve"][kind] = {}
            for n in args.curve_sizes:
                rows = run_kind(kind, examples, examples_edit, folds, list(range(args.curve_folds)), tokenizer,
                                args, per_task=n)  # fmt: skip
                results["curve"][kind][str(n)] = summarise(rows)
            full = results["kinds"].get(kind)
            if full is not None:  # the whole training part of each fold, as in the table
                n_full = round(full["summary"]["n_train"] / len(train))
                results["curve"][kind][str(n_full)] = full["summary"]
            _write(results, args)
    _write(results, args)
    print(table(results))


def _write(results: dict[str, Any], args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "research_wm.json").write_text(json.dumps(results, indent=2))
    if results["kinds"]:
        plot(results, out / "research_wm.png")


def table(results: dict[str, Any]) -> str:
    cols = ["within_spearman", "top1", "top1_chance", "spearman", "mae", "nll", "cover_1s", "cover_2s",
            "predict_per_s", "fit_s", "folds"]  # fmt: skip
    lines = ["| kind | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for kind, r in results["kinds"].items():
        s = r["summary"]
        cells = []
        for c in cols:
            v = s[c]
            cell = f"{v:.0f}" if c in ("predict_per_s", "fit_s", "folds") else f"{v:.3f}"
            if c + "_se" in s:
                cell += f" ± {s[c + '_se']:.3f}"
            cells.append(cell)
        lines.append(f"| {kind}{' (subsampled)' if r['subsampled'] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
