"""The knob surrogates, trained on the random-edit log only, on the SFT policy's own samples.

The distribution GRPO asks the WM to score: ``research-tiny``'s cached SFT policy (built here if
missing) and its execution log of SFT samples (32 per train task, executed in the sandbox; built
here if missing). Each surrogate kind is fitted on the whole random-edit log (96 per task, as
``benchmarks/research_wm.py`` builds it) and predicts every SFT sample; within-group Spearman and
top-1 on random groups of 4 samples of one task, for all samples and for the samples that are not
in the random log (``novel``). Writes ``benchmarks/results/research_wm_sft.json``.

    uv run python benchmarks/research_wm_sft.py [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch


def groups_of(samples: list, rng: random.Random, per_task: int = 25, size: int = 4) -> list[list[int]]:
    by: dict[str, list[int]] = {}
    for i, e in enumerate(samples):
        by.setdefault(e.task_id, []).append(i)
    return [rng.sample(by[t], size) for t in sorted(by) if len(by[t]) >= size for _ in range(per_task)]


def main() -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from wmrl.config import load_config
    from wmrl.executors import make_executor
    from wmrl_research.config import ResearchConfig
    from wmrl_research.diagnose import within_group_stats
    from wmrl_research.execution_logs import build_execution_log, random_log_path
    from wmrl_research.pipeline import (
        _key,
        _policy_fields,
        build_policy,
        build_world_model,
        log_paths,
        select_tasks,
    )
    from world_models.outcome import ExecutionLog

    with tempfile.TemporaryDirectory() as tmp:
        run = load_config("research-tiny", [f"--out_dir={tmp}/run", f"--seed={args.seed}"])
    cfg = run.domain
    train, heldout = select_tasks(cfg)
    cache = Path(cfg.cache_dir) / _key(_policy_fields(cfg, run, train))
    cache.mkdir(parents=True, exist_ok=True)
    policy, _ = build_policy(cfg, run, train, heldout, cache)
    with make_executor(run.executor, 2) as ex:
        sft = build_execution_log(cfg, run, policy, train, ex, log_paths(cfg, run, train)[0]).load()
    rpath = random_log_path(ResearchConfig(log_random_per_task=96, cache_dir=cfg.cache_dir), train)
    if not rpath.exists():
        raise FileNotFoundError(f"{rpath}: run benchmarks/research_wm.py first (it builds the random log)")
    rnd = ExecutionLog(rpath).load()
    seen = {(e.task_id, e.solution_text) for e in rnd}
    subsets = {"all": sft, "novel": [e for e in sft if (e.task_id, e.solution_text) not in seen]}
    out: dict = {"seed": args.seed, "n": {k: len(v) for k, v in subsets.items()}, "kinds": {}}
    for kind in ("surrogate", "surrogate_hgb"):
        wm = build_world_model(ResearchConfig(world_model=kind), run)
        wm.fit(rnd)
        out["kinds"][kind] = {}
        for name, samples in subsets.items():
            m, _ = wm.predict([e.task_text for e in samples], [e.solution_text for e in samples])
            gs = groups_of(samples, random.Random(args.seed))
            per = [([float(m[i]) for i in g], [samples[i].reward for i in g]) for g in gs]
            w = within_group_stats(per)
            chance = [sum(t == max(tr) for t in tr) / len(tr) for _, tr in per if max(tr) != min(tr)]
            w["top1_chance"] = sum(chance) / len(chance)
            out["kinds"][kind][name] = w
            print(f"{kind:14s} {name:6s} n={len(samples):4d} within_spearman={w['within_spearman']:.3f} "
                  f"top1={w['top1']:.3f} chance={w['top1_chance']:.3f} groups={w['n_groups']:.0f}")  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "research_wm_sft.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
