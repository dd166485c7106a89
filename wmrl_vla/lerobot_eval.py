"""lerobot's own evaluation of a policy folder, episode by episode, on WMRL's evaluation seeds.

    python -m wmrl_vla.lerobot_eval --policy EXPORT_DIR --out episodes.json
    python -m wmrl_vla.lerobot_eval --policy PRETRAINED_MODEL --task reach-v3 --episode-length 100 \\
        --episodes 20 --out episodes.csv [--wmrl] [--n-action-steps 1]

The folder is an export of a run (``wmrl export``) or any lerobot ACT/SmolVLA/... ``pretrained_model``
folder. lerobot loads it with its own loaders and processors and runs it with its own
``lerobot.scripts.lerobot_eval.eval_policy`` in lerobot's MetaWorld env rendered **at the policy's own
image size** (its ``config.json``'s image feature), one episode per seed, on the seeds WMRL's
evaluation uses (``1_000_000 + 7919 k``, :data:`wmrl_vla.domain.EVAL_SEEDS`), or ``--seeds``. Written:
per episode its seed, lerobot's success, sum and max reward (and with ``--wmrl`` WMRL's own greedy
success and best progress on the same seed, for ACT/SmolVLA folders), as JSON (with the aggregate) or
CSV by ``--out``'s suffix. ``--n-action-steps`` replaces the folder's number of actions lerobot
executes per chunk (1: closed loop, as WMRL's rollouts run a chunked policy; a WMRL export says 1).

Why not ``lerobot-eval``: lerobot's MetaWorld env config has no image size, so ``lerobot-eval
--env.type=metaworld`` always renders 480 x 480 with shadows (minutes per episode on a CPU) and feeds
those frames to a policy trained at 32 or 64 px without a word (its resize, if any, is the policy's).
``lerobot-eval`` is the right command only for a run at lerobot's own size
(``--domain.image_size=480 --domain.env.episode_length=500``).

From an export, the task, episode length and number of episodes default to the run's
(``wmrl_export.json``'s ``evaluation``); for another folder ``--task`` and ``--episode-length`` are
needed. MuJoCo renders headless as in ``wmrl run`` (``MUJOCO_GL=egl`` unless set).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_EPISODES = 10
FIELDS = ("seed", "success", "sum_reward", "max_reward")


def wmrl_eval_seeds(n: int) -> list[int]:
    """The reset seeds of WMRL's held-out evaluation of one task (``VLADomain.evaluate``)."""
    from wmrl_vla.domain import EVAL_SEEDS

    return [EVAL_SEEDS[0] + 7919 * k for k in range(n)]


def policy_image_size(policy_dir: str | Path) -> int:
    """The square side of the policy's one camera image (``ValueError``: one line)."""
    from wmrl_vla.lerobot_policy import policy_config

    cfg = policy_config(policy_dir)
    shapes = [tuple(f.shape) for f in cfg.image_features.values()]
    if len(shapes) != 1 or len(shapes[0]) != 3 or shapes[0][1] != shapes[0][2]:
        raise ValueError(
            f"--policy {policy_dir}: its image inputs are {shapes}; lerobot's MetaWorld env gives one "
            "square camera image"
        )
    return int(shapes[0][-1])


def export_defaults(policy_dir: str | Path) -> dict[str, Any]:
    """``wmrl_export.json``'s ``evaluation`` (task, episode_length, episodes, image_size) if present."""
    path = Path(policy_dir) / "wmrl_export.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get("evaluation") or {}


def evaluate(
    policy_dir: str | Path,
    task: str,
    episode_length: int,
    seeds: list[int],
    wmrl: bool = False,
    n_action_steps: int | None = None,
) -> dict[str, Any]:
    """lerobot's ``eval_policy`` of ``policy_dir`` on each of ``seeds`` (one episode each) at the
    policy's image size, executing ``n_action_steps`` actions per chunk (``None``: the folder's); with
    ``wmrl``, WMRL's greedy rollouts of the same folder on the same seeds (always 1 per chunk)."""
    from wmrl_vla.lerobot_env import evaluate_with_lerobot
    from wmrl_vla.lerobot_policy import policy_config

    size = policy_image_size(policy_dir)
    config = policy_config(policy_dir)
    t0 = time.perf_counter()
    rows = []
    info = evaluate_with_lerobot(
        str(policy_dir), task, size, episode_length, len(seeds), seeds[0], seeds=seeds,
        n_action_steps=n_action_steps,
    )  # fmt: skip
    for s, ep in zip(seeds, info["per_episode"], strict=True):
        if ep.get("seed") not in (None, s):
            raise RuntimeError(f"lerobot evaluated seed {ep['seed']}, not {s}")
        rows.append({"seed": s, "success": bool(ep["success"]), "sum_reward": float(ep["sum_reward"]),
                     "max_reward": float(ep["max_reward"])})  # fmt: skip
    seconds = time.perf_counter() - t0
    if wmrl:
        for row, (success, progress) in zip(rows, wmrl_rollouts(policy_dir, task, size, episode_length, seeds),
                                            strict=True):  # fmt: skip
            row["wmrl_success"], row["wmrl_max_progress"] = success, progress
    n = len(rows)
    out = {
        "policy": str(policy_dir),
        "env": {"type": "metaworld", "task": task, "image_size": size, "episode_length": episode_length},
        "policy_type": config.type,
        # lerobot runs this many actions of each chunk open-loop; WMRL's rollouts (--wmrl) query every
        # step, so the two agree episode by episode only at 1 (a WMRL export's)
        "n_action_steps": n_action_steps or getattr(config, "n_action_steps", None),
        "evaluator": "lerobot.scripts.lerobot_eval.eval_policy",
        "seeds": "WMRL's evaluation seeds (1000000 + 7919 k)" if seeds == wmrl_eval_seeds(n) else "given",
        "episodes": n,
        "success": sum(r["success"] for r in rows) / n,
        "lerobot_seconds": seconds,
        "per_episode": rows,
    }
    if wmrl:
        out["wmrl_success"] = sum(r["wmrl_success"] for r in rows) / n
        out["agree"] = sum(r["wmrl_success"] == r["success"] for r in rows)
    return out


def wmrl_rollouts(policy_dir, task: str, size: int, episode_length: int, seeds: list[int]):
    """WMRL's own greedy rollouts (its evaluation at temperature 0) of the folder: per seed
    ``(success, max progress)``."""
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task
    from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    policy = PretrainedLeRobotPolicy(policy_dir).eval()
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=task, episode_length=episode_length))
    pool = EnvPool(size)
    try:
        ro = run_episodes(policy_actor(policy, 0.0), [(task_id, s) for s in seeds], pool, "test")
    finally:
        pool.close()
    return [(bool(r.success.max()), float(r.progress.max())) for r in ro]


def write(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        rows = result["per_episode"]
        with out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        out.write_text(json.dumps(result, indent=2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m wmrl_vla.lerobot_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True, help="a lerobot policy folder (an export or pretrained_model)")
    p.add_argument("--out", required=True, help="per-episode results: .json (with the aggregate) or .csv")
    p.add_argument(
        "--task", default=None, help="lerobot MetaWorld task, e.g. reach-v3 (default: the export's)"
    )
    p.add_argument("--episode-length", type=int, default=None, help="time limit (default: the export's)")
    p.add_argument("--episodes", type=int, default=None,
                   help=f"WMRL's first N evaluation seeds (default: the export's, else {DEFAULT_EPISODES})")  # fmt: skip
    p.add_argument("--seeds", default=None, help="comma-separated reset seeds instead of WMRL's")
    p.add_argument("--wmrl", action="store_true", help="also WMRL's own greedy rollouts on the same seeds")
    p.add_argument("--n-action-steps", type=int, default=None,
                   help="actions of each chunk lerobot executes open-loop (default: the folder's; 1: as WMRL)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from sims._gl import select_backend

    select_backend()  # MUJOCO_GL as `wmrl run` sets it, before lerobot's envs import MuJoCo
    args = parse_args(argv)
    try:
        if not Path(args.policy).is_dir():
            raise ValueError(f"--policy {args.policy} is not a folder")
        if Path(args.out).suffix not in (".json", ".csv"):
            raise ValueError(f"--out {args.out}: write .json or .csv")
        defaults = export_defaults(args.policy)
        task = args.task or defaults.get("task")
        length = args.episode_length or defaults.get("episode_length")
        if task is None or length is None:
            raise ValueError(
                f"--policy {args.policy} is not a WMRL export of a lerobot env run: give --task (e.g. "
                "reach-v3) and --episode-length"
            )
        from wmrl_vla.lerobot_env import LeRobotEnvConfig

        LeRobotEnvConfig(type="metaworld", task=task, episode_length=int(length)).check()
        if args.seeds is not None:
            try:
                seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
            except ValueError:
                raise ValueError(f"--seeds {args.seeds!r}: write integers separated by commas") from None
        else:
            seeds = wmrl_eval_seeds(args.episodes or defaults.get("episodes") or DEFAULT_EPISODES)
        if not seeds:
            raise ValueError("no seeds to evaluate")
        size = policy_image_size(args.policy)
        if size != defaults.get("image_size", size):
            raise ValueError(
                f"--policy {args.policy}: config.json says {size} px, the export {defaults['image_size']}"
            )
        result = evaluate(args.policy, task.removeprefix("metaworld-"), int(length), seeds, wmrl=args.wmrl,
                          n_action_steps=args.n_action_steps)  # fmt: skip
    except ValueError as e:
        print(f"error: {e}".replace("domain.env.task=", "--task "), file=sys.stderr)
        return 2
    write(result, Path(args.out))
    summary = {k: result[k] for k in ("episodes", "success", "wmrl_success", "agree") if k in result}
    print(json.dumps({**summary, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
