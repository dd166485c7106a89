"""MetaWorld's scripted experts on every MetaWorld v3 task, through our interface (``sims``).

For each task id ``wmrl/MetaWorld-<name>`` (MT10 and every other v3 task, served by configuration):
success rate of MetaWorld's own policy within the task's time limit over ``--episodes`` seeded
resets (no rendering), and the steps it took. Tells which tasks make usable demonstrators.

    uv run python benchmarks/metaworld_experts.py --episodes 8 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import sims
from sims.registry import metaworld_names
from sims.specs import mw_task_id


def run_expert(task_id: str, episodes: int) -> dict:
    """``{"success": rate, "steps": [steps to success, None if it failed], "max_steps", "seconds"}``."""
    env = sims.make(task_id, render=False)
    act = sims.expert_for(env)
    steps: list[int | None] = []
    t0 = time.perf_counter()
    try:
        for seed in range(episodes):
            obs, info = env.reset(seed=seed)
            done = False
            while not done:
                obs, _, term, trunc, info = env.step(act(obs, info))
                done = term or trunc
            steps.append(info["step"] if info["success"] else None)
    finally:
        env.close()
    return {
        "success": float(np.mean([s is not None for s in steps])),
        "steps": steps,
        "max_steps": env.max_steps,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    results = {}
    for name in metaworld_names():
        tid = mw_task_id(name)
        results[tid] = r = run_expert(tid, args.episodes)
        print(f"{tid}\tsuccess {r['success']:.2f}\tsteps {r['steps']}\tlimit {r['max_steps']}", flush=True)
    rates = [r["success"] for r in results.values()]
    summary = {
        "episodes_per_task": args.episodes,
        "tasks": len(results),
        "mean_success": float(np.mean(rates)),
        "tasks_all_successful": int(sum(r == 1.0 for r in rates)),
        "tasks_at_least_75pct": int(sum(r >= 0.75 for r in rates)),
        "per_task": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metaworld_experts.json").write_text(json.dumps(summary, indent=1))
    print(
        f"mean success {summary['mean_success']:.3f}; {summary['tasks_all_successful']} of {len(results)} "
        f"tasks at 100%; {summary['tasks_at_least_75pct']} at >= 75% -> {out / 'metaworld_experts.json'}"
    )


if __name__ == "__main__":
    main()
