"""Record demonstrations as a LeRobotDataset, from the command line.

    python -m wmrl_vla.record_demos --task reach-v3 --episodes 20 --root DATA
    python -m wmrl_vla.record_demos --task wmrl/PushColor-v0 --episodes 10 --root DATA --image-size 64

``--task`` is a lerobot MetaWorld task as lerobot spells it (``reach-v3``: lerobot's own MetaWorld env,
as ``--domain.env.type=metaworld --domain.env.task=reach-v3`` runs it) or any WMRL task id (``wmrl tasks
vla``). Each episode is the task's scripted expert (MetaWorld's own policy for MetaWorld tasks) from reset
seed ``--seed + i``. The dataset (lerobot's format: ``observation.image``, ``observation.state``,
``action``, ``next.reward``, ``next.success``, ``next.done``, ``task``, plus WMRL's ``wmrl.final`` and
``env.seed``, see :mod:`wmrl_vla.data`) is what ``lerobot-train --dataset.root=DATA`` trains on and
``--domain.dataset_root=DATA`` pretrains the world model on. MuJoCo renders headless as in ``wmrl run``
(``MUJOCO_GL=egl`` unless set). Appends if ``--root`` already holds a dataset.
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m wmrl_vla.record_demos", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="lerobot MetaWorld task (reach-v3) or a WMRL task id")
    p.add_argument("--episodes", type=int, required=True, help="episodes to record")
    p.add_argument("--root", required=True, help="the dataset folder (created, or appended to)")
    p.add_argument("--repo-id", default="user/demos", help="the dataset's repo id (local only)")
    p.add_argument("--image-size", type=int, default=64, help="side of the square camera image")
    p.add_argument(
        "--episode-length", type=int, default=None,
        help="time limit (env steps); default: lerobot MetaWorld 200, a WMRL task its own",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="reset seed of the first episode")
    p.add_argument("--only-success", action="store_true", help="drop failed episodes (tries up to 3x)")
    return p.parse_args(argv)


def task_id_of(task: str, episode_length: int | None) -> str:
    """A WMRL task id as is; else a lerobot MetaWorld task name, registered (``ValueError``: one line)."""
    from sims.registry import TASKS

    if "/" in task:
        if task not in TASKS:
            from sims.registry import unknown_task_message

            msg = unknown_task_message(task)
            if msg is not None:
                raise ValueError(f"--task {task}: {msg}")
        return task
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task

    env = LeRobotEnvConfig(type="metaworld", task=task)
    if episode_length is not None:
        env.episode_length = episode_length
    try:
        return register_task(env)
    except ValueError as e:
        raise ValueError(str(e).replace("domain.env.task=", "--task ")) from None


def main(argv: list[str] | None = None) -> int:
    from sims._gl import select_backend

    select_backend()  # MUJOCO_GL as `wmrl run` sets it, before anything imports MuJoCo
    args = parse_args(argv)
    from wmrl_vla.data import DemoError, _read_index, record_demos

    try:
        if args.episodes < 1:
            raise ValueError(f"--episodes {args.episodes} must be >= 1")
        if args.image_size < 8:
            raise ValueError(f"--image-size {args.image_size} must be >= 8")
        task_id = task_id_of(args.task, args.episode_length)
        ds = record_demos(
            [task_id], args.episodes, args.root, args.repo_id, image_size=args.image_size, seed=args.seed,
            only_success=args.only_success, max_steps=args.episode_length,
        )  # fmt: skip
    except (ValueError, DemoError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = list(_read_index(ds.root).values())
    summary = {
        "root": str(ds.root),
        "repo_id": args.repo_id,
        "task_id": task_id,
        "episodes": ds.meta.total_episodes,
        "frames": ds.meta.total_frames,
        "success": sum(bool(r["success"]) for r in rows) / max(1, len(rows)),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
