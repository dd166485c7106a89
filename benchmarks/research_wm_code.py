"""The code-reading outcome WM against the knob surrogate, on free-form code edits and on knob edits.

Data (train tasks of ``research-tiny`` by default; held-out tasks never touched):

- the **code log**: ``--code-per-task`` random free-form edits of each baseline
  (``wmrl_research.code_edits``: code mutations outside the knobs block, half of them with a knob
  edit too), executed in the sandbox, cached under ``--cache-dir`` (resumable);
- the **knob log**: the random knob-edit log of ``benchmarks/research_wm.py``
  (``execution_logs.build_random_log``, ``--knob-per-task`` per task), the data of today's table.

Protocol: ``research_wm.py``'s, on each log apart: k folds grouped by (task, solution text), each
kind trained as the pipeline trains it (fit on 80%, variance calibrated on 20%, refined on it),
within-group Spearman / top-1 over random groups of 4 held-out edits of one task, plus overall
Spearman, MAE, NLL, coverage and ``z2`` (mean squared standardised error, 1 when calibrated).

    uv run python benchmarks/research_wm_code.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from research_wm import _folds, evaluate, summarise, train_wm  # noqa: E402

TINY_TRAIN = ["co2_forecast", "diabetes_reg", "digits_cnn", "imbalanced_synth", "iris_cls", "penguins_species",
              "seattle_weather", "seq_motif_rnn", "shapes_ts_cls", "wine_cls"]  # fmt: skip
TARGET = 0.7


def make_wm(kind: str, seed: int, cache_dir: str):
    from wmrl.config import RunConfig
    from wmrl_research.config import ResearchConfig
    from wmrl_research.pipeline import build_world_model

    return build_world_model(ResearchConfig(world_model=kind, cache_dir=cache_dir), RunConfig(seed=seed))


def run(kind: str, examples: list, folds: list[list[int]], args) -> list[dict[str, float]]:
    from world_models.outcome import outcome_metrics

    rows = []
    for f in range(args.folds):
        wm = make_wm(kind, args.seed + f, args.cache_dir)
        if kind == "code" and args.code_max_features is not None:
            wm.max_features = args.code_max_features
        train_idx = [i for g, fold in enumerate(folds) if g != f for i in fold]
        fit_s = train_wm(wm, [examples[i] for i in train_idx], 0, args.seed + f)
        r = evaluate(wm, examples, folds[f], args, random.Random(args.seed * 1000 + f))
        test = [examples[i] for i in folds[f]]
        mean, var = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
        r["z2"] = outcome_metrics(mean, var, torch.tensor([e.reward for e in test]))["z2"]
        r.update({"fold": float(f), "fit_s": fit_s, "n_train": float(len(train_idx))})
        print(f"  {kind} fold {f}: " + " ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
        rows.append(r)
    return rows


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["surrogate", "code"])
    ap.add_argument("--train-tasks", nargs="+", default=TINY_TRAIN)
    ap.add_argument("--code-per-task", type=int, default=160)
    ap.add_argument("--knob-per-task", type=int, default=96)
    ap.add_argument("--cache-dir", default="runs/cache/research")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--groups", type=int, default=25)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--sets", nargs="+", default=["code_edits", "knob_edits"])
    ap.add_argument("--code-max-features", type=float, default=None,
                    help="the code WM's extra-trees max_features (default: the model's)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)

    from wmrl.config import ExecutorConfig
    from wmrl.executors import make_executor
    from wmrl_research.code_edits import build_code_log, code_log_path
    from wmrl_research.config import ResearchConfig
    from wmrl_research.execution_logs import build_random_log, random_log_path
    from wmrl_research.pipeline import select_tasks

    cfg = ResearchConfig(log_random_per_task=args.knob_per_task, log_random_seed=0, cache_dir=args.cache_dir,
                         train_tasks=args.train_tasks)  # fmt: skip
    train, _ = select_tasks(cfg)
    code_path = code_log_path(args.cache_dir, train, args.code_per_task, 0, cfg.sandbox_timeout_s)
    knob_path = random_log_path(cfg, train)
    with make_executor(ExecutorConfig(type="inline", timeout_s=120), 1) as ex:
        logs = {
            "code_edits": build_code_log(
                train, args.code_per_task, 0, cfg.sandbox_timeout_s, ex, code_path
            ).load(),
            "knob_edits": build_random_log(cfg, train, ex, knob_path).load(),
        }
    results: dict[str, Any] = {"args": vars(args), "target_within_spearman": TARGET, "logs": {}, "sets": {}}
    for name, path in (("code_edits", code_path), ("knob_edits", knob_path)):
        info = path.with_suffix(".json")
        results["logs"][name] = {"path": str(path), "records": len(logs[name]),
                                 **(json.loads(info.read_text()) if info.exists() else {})}  # fmt: skip
    for name, examples in logs.items():
        if name not in args.sets:
            continue
        folds = _folds(examples, args.folds, args.seed)
        results["sets"][name] = {}
        for kind in args.kinds:
            t0 = time.perf_counter()
            rows = run(kind, examples, folds, args)
            results["sets"][name][kind] = {"folds": rows, "summary": summarise(rows),
                                           "seconds": time.perf_counter() - t0}  # fmt: skip
            _write(results, Path(args.out))
    print(table(results))


def _write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "research_wm_code.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "research_wm_code.png")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(results["sets"])
    kinds = sorted({k for s in sets for k in results["sets"][s]})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(kinds))
    for j, kind in enumerate(kinds):
        xs, ys, es = [], [], []
        for i, s in enumerate(sets):
            r = results["sets"][s].get(kind)
            if r:
                xs.append(i + width * (j - (len(kinds) - 1) / 2))
                ys.append(r["summary"]["within_spearman"])
                es.append(r["summary"].get("within_spearman_se", 0.0))
        ax.bar(xs, ys, width=width, yerr=es, label=kind, capsize=3)
    ax.axhline(results["target_within_spearman"], color="r", ls="--", lw=1, label="target (code edits)")
    ax.set_xticks(range(len(sets)), [s.replace("_", " ") for s in sets])
    ax.set_ylabel("within-group Spearman (held-out edits)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("outcome WMs on the train tasks' held-out edits")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results: dict[str, Any]) -> str:
    cols = ["within_spearman", "top1", "top1_chance", "spearman", "mae", "nll", "cover_1s", "cover_2s", "z2",
            "fit_s"]  # fmt: skip
    lines = ["| edits | kind | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for s, kinds in results["sets"].items():
        for kind, r in kinds.items():
            sm = r["summary"]
            cells = [f"{sm[c]:.3f}" + (f" ± {sm[c + '_se']:.3f}" if c + "_se" in sm else "") for c in cols]
            lines.append(f"| {s} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
