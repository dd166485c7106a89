"""Is WMRL's starting point the user's ACT? The chunk change, measured (issue 55 item 1).

A user's ACT trained by ``lerobot-train`` with ``chunk_size=10, n_action_steps=10`` executes 10
actions of each predicted chunk open-loop. WMRL post-trains it closed loop: every step executes the
first action of a fresh chunk (``n_action_steps=1``, :func:`wmrl_vla.lerobot_policy.load_lerobot_folder`),
and its export says 1. A gain "before -> after" measured with lerobot's ``eval_policy`` would mix the
post-training with that change. So, for one ACT folder trained as ``benchmarks/lerobot_posttrain.py``
trains it, on the same held-out seeds (WMRL's evaluation seeds ``1_000_000 + 7919 k``):

a. lerobot's ``eval_policy`` of the folder as saved (``n_action_steps=10``);
b. lerobot's ``eval_policy`` with ``n_action_steps=1`` (what WMRL runs and exports);
c. WMRL's own greedy rollouts of the folder (``--wmrl``; the same policy as b, stepped by WMRL).

Per episode: the seed and each arm's success and best shaped reward (MetaWorld's, 0-10); per task:
each arm's success with its Wilson 95% interval and mean best reward, the paired difference a - b with its discordant pairs and McNemar's
exact test (statsmodels), and the b/c agreement.

    uv run python benchmarks/act_chunk_start.py --out runs/act_chunk --tasks reach-v3 --episodes 50 --wmrl

Writes ``<out>/act_chunk_start.json`` after each arm; each task's demos and ACT under ``<out>/<task>``
(reused when there). One thread per process (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
from lerobot_posttrain import user_act, wilson  # noqa: E402  (benchmarks/ is the script's folder)

from sims._gl import select_backend  # noqa: E402

select_backend()  # MUJOCO_GL as `wmrl run` chooses it

#: arm -> lerobot's n_action_steps (None: the folder's own, 10)
ARMS = {"as_saved": None, "closed_loop": 1}


def paired(x: list[bool], y: list[bool]) -> dict:
    """The paired comparison of two arms' per-seed successes ``x``, ``y`` (same seeds, same order):
    difference of rates ``mean(x) - mean(y)``, discordant pairs ``n10 = #(x & ~y)``,
    ``n01 = #(~x & y)``, and McNemar's exact p-value (two-sided binomial test of ``n10`` in
    ``n10 + n01`` at 1/2; 1.0 with no discordant pair)."""
    from statsmodels.stats.contingency_tables import mcnemar

    if len(x) != len(y) or not x:
        raise ValueError(f"paired arms need the same seeds: {len(x)} and {len(y)} episodes")
    n11 = sum(a and b for a, b in zip(x, y, strict=True))
    n10 = sum(a and not b for a, b in zip(x, y, strict=True))
    n01 = sum(b and not a for a, b in zip(x, y, strict=True))
    n00 = len(x) - n11 - n10 - n01
    p = float(mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue) if n10 + n01 else 1.0
    return {"difference": (n10 - n01) / len(x), "n10": n10, "n01": n01, "both": n11, "neither": n00,
            "mcnemar_exact_p": p}  # fmt: skip


def summary(successes: list[bool]) -> dict:
    k, n = sum(successes), len(successes)
    return {"success": k / n, "successes": k, "episodes": n, "ci95_wilson": wilson(k, n)}


# What the JSON says of the comparison standard (no WM method runs, so there is no anchors_only control).
CONTROL = (
    "anchors_only not run: no world-model method is compared here; the arms are one starting policy "
    "evaluated three ways (lerobot as saved, lerobot at n_action_steps 1, WMRL's greedy rollouts)"
)


def run_task(task: str, a: argparse.Namespace, result: dict, write) -> None:
    from wmrl_vla.lerobot_eval import evaluate, wmrl_eval_seeds

    t = argparse.Namespace(**{**vars(a), "task": task})
    folder, record_s, train_s = user_act(Path(a.out) / task, t)
    seeds = wmrl_eval_seeds(a.episodes)
    r = result["tasks"][task] = {"policy": str(folder), "record_seconds": record_s, "act_train_seconds": train_s,
                                 "seeds": seeds, "arms": {}}  # fmt: skip
    for arm, n in ARMS.items():
        t0 = time.perf_counter()
        wmrl = a.wmrl and n == 1
        got = evaluate(folder, task, a.episode_length, seeds, wmrl=wmrl, n_action_steps=n)
        rows = got["per_episode"]
        r["arms"][arm] = {"n_action_steps": got["n_action_steps"], **summary([e["success"] for e in rows]),
                          "mean_max_reward": sum(e["max_reward"] for e in rows) / len(rows),
                          "seconds": time.perf_counter() - t0, "per_episode": rows}  # fmt: skip
        if wmrl:
            r["arms"]["wmrl_greedy"] = {"n_action_steps": 1, **summary([e["wmrl_success"] for e in rows]),
                                        "agree_with_closed_loop": got["agree"]}  # fmt: skip
        print(task, arm, {k: v for k, v in r["arms"][arm].items() if k != "per_episode"}, flush=True)
        write()
    success = {arm: [e["success"] for e in r["arms"][arm]["per_episode"]] for arm in ARMS}
    r["as_saved_minus_closed_loop"] = paired(success["as_saved"], success["closed_loop"])
    print(task, "a - b", r["as_saved_minus_closed_loop"], flush=True)
    write()


def main() -> None:
    import torch

    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/act_chunk")
    p.add_argument("--tasks", default="reach-v3", help="comma-separated lerobot MetaWorld tasks")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--episode-length", type=int, default=100)
    p.add_argument("--demos", type=int, default=20)
    p.add_argument("--act-steps", type=int, default=300)
    p.add_argument("--act-lr", type=float, default=1e-4)
    p.add_argument(
        "--episodes", type=int, default=50, help="evaluation episodes per arm (WMRL's first N seeds)"
    )
    p.add_argument("--wmrl", action="store_true", help="also WMRL's own greedy rollouts (arm c)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "control": CONTROL,
        "settings": vars(a),
        "command": " ".join(["python", *sys.argv]),
        "tasks": {},
    }
    path = out / "act_chunk_start.json"

    def write() -> None:
        path.write_text(json.dumps(result, indent=2))

    for task in a.tasks.split(","):
        run_task(task, a, result, write)


if __name__ == "__main__":
    main()
