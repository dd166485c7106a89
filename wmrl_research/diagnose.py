"""How good was the outcome WM where GRPO used it? A replay over a finished research run.

GRPO advantages depend on how the WM ranks the rollouts *within* a group, not on its global
Spearman over a log. A run's ``execution_log.jsonl`` holds, after the pretraining records
(``source == "log"``), every anchor execution in step order (applied and graded edits only; the
per-step count is the metric ``wm/update_examples``). This module reloads the cached pretrained WM
of the run's preset and seed, then replays the run's anchors step by step: predict each step's
anchor group with the WM as it stood, record the prediction, refine the WM on that group exactly as
training did (``update_steps`` steps with replay). It reports, per run:

- ``within_spearman``: mean over anchor groups (>= 3 applied edits, true rewards not all equal) of
  the Spearman correlation between WM mean and true reward inside the group;
- ``within_adv_corr``: the same with the Pearson correlation of the centred values (what the
  group advantages compare);
- ``top1``: fraction of those groups whose WM argmax is a true argmax;
- ``wm_group_std`` / ``true_group_std``: mean within-group spread of WM means and of true rewards,
  and ``true_flat_frac``: the fraction of groups whose true rewards spread by less than 0.01;
- ``crash_vs_run``: mean WM score of anchor edits that crashed (true reward = failure score) and of
  those that ran, and the AUC of the WM score for "runs";
- the logged ``wm/residual_before|after``, ``denoise/s2``, ``denoise/w`` averaged over steps.

    uv run python -m wmrl_research.diagnose runs/bench-research-scr-s0/wmrl-seed0 ...

Runs made before the knob surrogate became the preset's WM (and before the random-edit log) replay
with the WM they trained with: add ``--domain.world_model=encoder --domain.log_random_per_task=0
--domain.search_constraint_values=false``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from wmrl_research.tasks import FAILURE_SCORE
from world_models.outcome import OutcomeExample


def _rank(x: list[float]) -> list[float]:
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def _pearson(a: list[float], b: list[float]) -> float | None:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    ca, cb = [x - ma for x in a], [y - mb for y in b]
    na, nb = math.sqrt(sum(x * x for x in ca)), math.sqrt(sum(y * y for y in cb))
    if na == 0 or nb == 0:
        return None
    return sum(x * y for x, y in zip(ca, cb, strict=True)) / (na * nb)


def within_group_stats(groups: list[tuple[list[float], list[float]]]) -> dict[str, float]:
    """``groups``: (WM means, true rewards) per anchor group. Groups with fewer than 3 entries or
    constant true rewards carry no ranking information and are skipped (counted in ``n_skipped``)."""
    sp, pc, top = [], [], []
    skipped = 0
    pstd, tstd, flat = [], [], []
    for pred, true in groups:
        if len(pred) >= 2:
            pstd.append(statistics.pstdev(pred))
            tstd.append(statistics.pstdev(true))
            flat.append(float(tstd[-1] < 0.01))
        if len(pred) < 3 or max(true) == min(true):
            skipped += 1
            continue
        s = _pearson(_rank(pred), _rank(true))
        sp.append(0.0 if s is None else s)
        p = _pearson(pred, true)
        pc.append(0.0 if p is None else p)
        best = max(true)
        top.append(float(true[max(range(len(pred)), key=lambda i: pred[i])] == best))
    mean = lambda v: statistics.mean(v) if v else float("nan")  # noqa: E731
    return {
        "n_groups": float(len(sp)),
        "n_skipped": float(skipped),
        "within_spearman": mean(sp),
        "within_adv_corr": mean(pc),
        "top1": mean(top),
        # Spread inside a group: std-normalised GRPO advantages give a WM group full-size advantages
        # however small its predicted spread; a true group with (nearly) equal rewards gets ~none.
        "wm_group_std": mean(pstd),
        "true_group_std": mean(tstd),
        "true_flat_frac": mean(flat),
    }


def crash_stats(pred: list[float], true: list[float]) -> dict[str, float]:
    """WM scores of edits that crashed (true = failure score) vs ran; AUC of the score for 'runs'."""
    crash = [p for p, t in zip(pred, true, strict=True) if t <= FAILURE_SCORE]
    ran = [p for p, t in zip(pred, true, strict=True) if t > FAILURE_SCORE]
    out = {
        "n_crash": float(len(crash)),
        "n_ran": float(len(ran)),
        "wm_crash_mean": statistics.mean(crash) if crash else float("nan"),
        "wm_ran_mean": statistics.mean(ran) if ran else float("nan"),
    }
    if crash and ran:
        wins = sum((r > c) + 0.5 * (r == c) for r in ran for c in crash)
        out["auc_runs"] = wins / (len(ran) * len(crash))
    else:
        out["auc_runs"] = float("nan")
    return out


def anchor_groups(run_dir: Path) -> list[list[OutcomeExample]]:
    """The run's anchor records split by step (``wm/update_examples`` per step, in order)."""
    recs = [json.loads(line) for line in open(run_dir / "execution_log.jsonl")]
    anchors = [OutcomeExample(**r) for r in recs if r["source"] == "anchor"]
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    groups, i = [], 0
    for r in rows:
        k = int(r.get("wm/update_examples", 0))
        if k:
            groups.append(anchors[i : i + k])
            i += k
    if i != len(anchors):
        raise ValueError(f"{run_dir}: {len(anchors)} anchor records, metrics account for {i}")
    return groups


def load_pretrained_wm(preset: str, seed: int, overrides: list[str]) -> tuple[Any, Any]:
    """The cached pretrained outcome WM (and the domain config) of ``preset`` at ``seed``."""
    from wmrl.config import load_config
    from wmrl_research.execution_logs import log_name
    from wmrl_research.pipeline import (
        _key,
        _policy_fields,
        build_policy,
        build_world_model,
        log_paths,
        pretrain_world_model,
        select_tasks,
    )
    from world_models.outcome import ExecutionLog

    with tempfile.TemporaryDirectory() as tmp:
        run = load_config(preset, [f"--seed={seed}", f"--out_dir={tmp}/run", *overrides])
    cfg = run.domain
    train, heldout = select_tasks(cfg)
    cache = Path(cfg.cache_dir) / _key(_policy_fields(cfg, run, train))
    if not (cache / "policy.pt").exists():
        raise FileNotFoundError(f"no cached SFT policy under {cache}: run the preset once first")
    policy, _ = build_policy(cfg, run, train, heldout, cache)
    log_path, random_path = log_paths(cfg, run, train)
    for p in (log_path, random_path) if cfg.log_random_per_task else (log_path,):
        if not p.exists():
            raise FileNotFoundError(f"no cached execution log {p}")
    random_examples = ExecutionLog(random_path).load()
    examples = ExecutionLog(log_path).load() + random_examples
    wm = build_world_model(cfg, run, policy.tokenizer)
    pretrain_world_model(cfg, run, wm, examples, cache, log_name(log_path, random_examples, random_path))
    return wm, cfg


def replay(wm: Any, groups: list[list[OutcomeExample]], update_steps: int) -> tuple[list, list]:
    """Predict each group with the WM as it stands, then refine it on that group (as training did).
    Returns per-group (WM means, true rewards) and the flat lists."""
    per_group = []
    for g in groups:
        mean, _ = wm.predict([e.task_text for e in g], [e.solution_text for e in g])
        per_group.append(([float(x) for x in mean], [e.reward for e in g]))
        wm.update(g, update_steps)
    return per_group


def logged(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    out = {}
    for k in ("wm/residual_before", "wm/residual_after", "denoise/s2", "denoise/w", "debias/fitted"):
        vals = [r[k] for r in rows if k in r and r[k] == r[k]]
        out[k] = statistics.mean(vals) if vals else float("nan")
        if k == "denoise/w" and vals:
            out["denoise/w_last"] = vals[-1]
    return out


def diagnose(run_dir: Path, preset: str, overrides: list[str]) -> dict[str, Any]:
    cfg_text = (run_dir / "config.yaml").read_text()
    seed = int(next(line.split(":")[1] for line in cfg_text.splitlines() if line.startswith("seed:")))
    torch.manual_seed(seed)
    wm, cfg = load_pretrained_wm(preset, seed, overrides)
    from wmrl_research.domain import wm_example
    from wmrl_research.tasks import list_tasks

    tasks = {t.id: t for t in list_tasks()}
    groups = [[wm_example(tasks[e.task_id], e, cfg.wm_input) for e in g] for g in anchor_groups(run_dir)]
    per_group = replay(wm, groups, cfg.wm_update_steps)
    pred = [p for g in per_group for p in g[0]]
    true = [t for g in per_group for t in g[1]]
    half = len(per_group) // 2
    return {
        "run": str(run_dir),
        "seed": seed,
        "n_anchor_records": len(true),
        **within_group_stats(per_group),
        "within_spearman_first_half": within_group_stats(per_group[:half])["within_spearman"],
        "within_spearman_second_half": within_group_stats(per_group[half:])["within_spearman"],
        **crash_stats(pred, true),
        **logged(run_dir),
    }


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)  # small models; more threads only contend on a shared CPU
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories of wmrl (or real) research runs")
    ap.add_argument("--preset", default="research-tiny")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args, overrides = ap.parse_known_args(argv)  # the runs' extra --a.b=value overrides
    results = [diagnose(Path(r), args.preset, overrides) for r in args.runs]
    keys = [k for k in results[0] if k not in ("run",)]
    for k in keys:
        vals = " ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for r in results)
        print(f"{k:32s} {vals}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
