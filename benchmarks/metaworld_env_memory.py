"""Resident memory of lerobot MetaWorld envs held at once, as a VLA run holds them (one env and
renderer per rollout of a step, ``domain.eval_lockstep`` per evaluation chunk).

    uv run python benchmarks/metaworld_env_memory.py --task reach-v3 --image-size 32 --counts 1 4 8 16 \
        --out benchmarks/results/metaworld_env_memory.json

Builds the envs one by one in this process (``wmrl_vla.lerobot_env.lerobot_metaworld_env``, each reset
and stepped once) and records the process's resident memory over its size before the first, at each
count; the per-env figure is the slope between the first and the last count (the first env also pays
for importing MetaWorld and MuJoCo). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from memory_watch import resident_gb  # benchmarks/ is the script's folder

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="reach-v3")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--out", type=Path, default=Path("runs/metaworld_env_memory.json"))
    args = ap.parse_args()
    from wmrl_vla.lerobot_env import lerobot_metaworld_env

    base, envs, rows = resident_gb(), [], []
    for i in range(max(args.counts)):
        env = lerobot_metaworld_env(args.task, args.image_size, 100)
        env.reset(seed=i)
        env.step(env.action_space.sample())
        envs.append(env)
        if i + 1 in args.counts:
            rows.append({"envs": i + 1, "resident_over_start_gb": round(resident_gb() - base, 3)})
            print(rows[-1], flush=True)
    first, last = rows[0], rows[-1]
    per_env = (last["resident_over_start_gb"] - first["resident_over_start_gb"]) / (
        last["envs"] - first["envs"]
    )
    result = {
        "settings": vars(args) | {"out": str(args.out)},
        "start_resident_gb": round(base, 3),
        "rows": rows,
        "per_env_gb": round(per_env, 4),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"per env: {per_env:.3f} GB -> {args.out}")


if __name__ == "__main__":
    main()
