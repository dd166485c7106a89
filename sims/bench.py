"""Simulator throughput: ``python -m sims.bench [task_id ...] [--steps N] [--size S] [--batch B]``.

Prints env steps per second with rendering (the policy's view) and without (state only), for a
single env and for a batch of ``B`` envs stepped in one process (``gymnasium.vector.SyncVectorEnv``:
what a rollout worker does; a batch does not share render work, so expect ~1x per core).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import sims


def steps_per_second(task_id: str, steps: int, image_size: int, render: bool, seed: int = 0) -> float:
    env = sims.make(task_id, image_size=image_size, render=render)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, env.action_space.shape))
        if terminated or truncated:
            env.reset()
    dt = time.perf_counter() - t0
    env.close()
    return steps / dt


def batch_steps_per_second(task_id: str, steps: int, image_size: int, batch: int) -> float:
    import gymnasium as gym

    vec = gym.vector.SyncVectorEnv([lambda: sims.make(task_id, image_size=image_size) for _ in range(batch)])
    vec.reset(seed=list(range(batch)))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        vec.step(rng.uniform(-1, 1, vec.action_space.shape))
    dt = time.perf_counter() - t0
    vec.close()
    return steps * batch / dt


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("tasks", nargs="*", default=["wmrl/PushColor-v0", "wmrl/MetaWorld-push-v3"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args(argv)
    for task_id in args.tasks:
        row = {
            "task": task_id,
            "image_size": args.size,
            "steps_per_s_render": round(steps_per_second(task_id, args.steps, args.size, True), 1),
            "steps_per_s_no_render": round(steps_per_second(task_id, args.steps, args.size, False), 1),
            f"batch{args.batch}_steps_per_s_render": round(
                batch_steps_per_second(task_id, max(1, args.steps // args.batch), args.size, args.batch), 1
            ),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
