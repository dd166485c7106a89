"""Peak memory of a `real` step (and an evaluation after it) on lerobot's MetaWorld, against
``domain.rollout_lockstep`` (simulated training rollouts at once, each with its env and renderer).

    uv run python benchmarks/vla_rollout_memory.py --policy-path ACT_FOLDER --dataset-root DATA \
        --groups 1 --group-size 4 --bounds 0 2 1 --eval-episodes 4 --cap-gb 2.7 \
        --out benchmarks/results/vla_rollout_memory.json

The run is ``benchmarks/specs/user_folders/act_room_pilot.yaml``'s domain (its overrides, the user's
ACT folder and dataset given here) with ``--method=real``, ``--groups`` anchor groups of
``--group-size`` and one
evaluation, at a small ``--eval-episodes``; the world model pretrains for a few steps only and no
policy rollouts are recorded for it (neither touches the envs a step holds). Each bound (0: none,
every rollout of the step at once, and evaluation's default 64) runs in a fresh process: its peak resident memory is the
``ru_maxrss`` ``os.wait4`` reports, and the process records its own high-water mark after the build,
the step and the evaluation, with the envs its pool holds. A watchdog stops a process whose resident
memory passes ``--cap-gb`` (the machine is shared). The step's peak is fitted as ``base + per_env *
envs`` (least squares over the bounds, envs = the pool's after the step) and extrapolated to
``--extrapolate`` envs at once: the envs' share only (a step of more rollouts also holds their
frames and its update's activations, not measured here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from memory_watch import run_watched  # benchmarks/ is the script's folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SPEC = Path(__file__).with_name("specs") / "user_folders" / "act_room_pilot.yaml"


def overrides(a: argparse.Namespace, bound: int, out: Path) -> list[str]:
    """The pilot spec's domain overrides (its folders replaced by ``a``'s), sized down."""
    import yaml

    (dom,) = yaml.safe_load(SPEC.read_text())["domains"]
    keep = [
        o for o in dom["overrides"] if not o.startswith(("--domain.policy_path", "--domain.dataset_root"))
    ]
    return [*keep, f"--domain.policy_path={a.policy_path}", f"--domain.dataset_root={a.dataset_root}",
            "--method=real", f"--grpo.tasks_per_step={a.groups}", f"--grpo.group_size={a.group_size}", "--grpo.steps=1",
            f"--domain.rollout_lockstep={bound or 'null'}", f"--domain.eval_lockstep={bound or 64}",
            f"--domain.eval_episodes_per_task={a.eval_episodes}", "--domain.eval_sampled=false",
            "--domain.wm_train_steps=20", "--domain.wm_policy_rollouts_per_task=0",
            f"--domain.cache_dir={out / 'cache'}", f"--out_dir={out / 'run'}",
            "--tracking.progress=false"]  # fmt: skip


def child(a: argparse.Namespace) -> None:
    """One bound in this process: build, a `real` step, an evaluation; prints a JSON line."""
    import resource

    import torch

    from wmrl.config import load_config
    from wmrl.trainer import Trainer
    from wmrl_vla.domain import VLADomain

    torch.set_num_threads(1)
    high = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # noqa: E731  (kB)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("vla-rl", overrides(a, a.child, Path(tmp)))
        domain = cfg.domain.build(cfg)
        assert isinstance(domain, VLADomain)
        phases = {"build": {"peak_gb": high(), "envs": domain.pool.live}}
        print(f"built: {phases['build']}", file=sys.stderr, flush=True)
        trainer = Trainer(cfg, domain)
        t0 = time.perf_counter()
        metrics = trainer.train_step()
        phases["step"] = {"peak_gb": high(), "envs": domain.pool.live, "s": time.perf_counter() - t0,
                          "sim_rollouts": metrics["exec/real_total"]}  # fmt: skip
        print(f"step: {phases['step']}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        ev = trainer.evaluate()
        phases["evaluation"] = {"peak_gb": high(), "envs": domain.pool.live, "s": time.perf_counter() - t0,
                                "success": ev["eval/success"]}  # fmt: skip
        domain.close()
    print(json.dumps(phases), flush=True)


def measure(a: argparse.Namespace, bound: int) -> dict:
    """One bound in a fresh process, watched: its peak RSS and its phases."""
    cmd = [sys.executable, __file__, "--child", str(bound), "--policy-path", a.policy_path,
           "--dataset-root", a.dataset_root, "--groups", str(a.groups), "--group-size", str(a.group_size), "--eval-episodes", str(a.eval_episodes)]  # fmt: skip
    t0 = time.perf_counter()
    usage, lines = run_watched(cmd, a.cap_gb, f"bound {bound}")
    return {"rollout_lockstep": bound or None, "peak_rss_gb": round(usage.ru_maxrss / 1e6, 3),
            "wall_s": round(time.perf_counter() - t0, 1), "phases": json.loads(lines[-1])}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy-path", required=True)
    p.add_argument("--dataset-root", required=True)
    p.add_argument("--groups", type=int, default=2, help="anchor groups in the step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--bounds", type=int, nargs="+", default=[0, 4], help="rollout_lockstep (0: none)")
    p.add_argument("--eval-episodes", type=int, default=8)
    p.add_argument("--extrapolate", type=int, nargs="+", default=[16, 64], help="envs held at once")
    p.add_argument("--cap-gb", type=float, default=4.0, help="stop a process whose RSS passes this")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("runs/vla_rollout_memory.json"))
    a = p.parse_args()
    if a.child is not None:
        return child(a)
    rows = []
    for bound in a.bounds:
        rows.append(measure(a, bound))
        print(json.dumps(rows[-1]), flush=True)
    n = a.group_size * a.groups
    envs = [r["phases"]["step"]["envs"] for r in rows]
    peaks = [r["phases"]["step"]["peak_gb"] for r in rows]
    extra = {}
    if len(set(envs)) > 1:  # step peak = base + per_env * envs, least squares over the bounds
        per_env, base = np.polyfit(envs, peaks, 1)
        extra = {"per_env_gb": round(float(per_env), 4), "base_gb": round(float(base), 3),
                 "extrapolated_step_peak_gb": {str(k): round(float(base + per_env * k), 2) for k in a.extrapolate}}  # fmt: skip
    result = {"settings": {k: v for k, v in vars(a).items() if k != "child"} | {"out": str(a.out), "rollouts": n},
              "rows": rows, **extra}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(extra), f"-> {a.out}")


if __name__ == "__main__":
    main()
