"""Resident memory of `real` steps and evaluations on our own MuJoCo tasks, phase by phase, against
the rollouts a step simulates: where a `real` cell of ``benchmarks/specs/vla_room_pilot4.yaml``
(16 groups of 8 = 128 simulated rollouts a step) holds its memory.

    uv run python benchmarks/vla_step_memory.py --groups 1 2 --steps 2 --eval-episodes 4 \
        --cap-gb 3.0 --out benchmarks/results/vla_step_memory.json

Each ``--groups`` value runs in a fresh process: the pilot spec's domain (its tasks, image size,
policy and world model; ``--method=real``, groups of 8) built small (2 demos a task, 1 SFT epoch, no
DAgger, 5 world-model steps, no offline or policy episodes for it), then ``--steps`` `real` steps,
an evaluation (``--eval-episodes`` a task on the held-out split, ``eval_lockstep`` 64, as the
pilot's), and ``--steps`` more steps. After each phase it records the process's resident memory
(``/proc/self/statm``, after ``gc.collect`` and glibc's ``malloc_trim``), its high-water mark
(``ru_maxrss``; for a step also once its rollouts are done and once its policy update is), the envs its pool holds
(``EnvPool.live``, per task and split) and the world model's replay (episodes and their array
bytes). At the end it closes the pool's envs and records the memory again: the envs' share. A
watchdog stops a process whose resident memory passes ``--cap-gb`` (the machine is shared).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from memory_watch import resident_gb, run_watched  # benchmarks/ is the script's folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
SPEC = Path(__file__).with_name("specs") / "vla_room_pilot4.yaml"


def settled_gb() -> float:
    """Resident GB after a garbage collection and glibc's ``malloc_trim(0)`` (freed heap returned)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return resident_gb()


def overrides(groups: int, eval_episodes: int, out: Path, extra: list[str]) -> list[str]:
    """The pilot spec's domain overrides, its build sized down, ``groups`` simulated groups a step,
    then ``extra``."""
    import yaml

    (dom,) = yaml.safe_load(SPEC.read_text())["domains"]
    return [*dom["overrides"], "--method=real", f"--grpo.tasks_per_step={groups}", "--grpo.group_size=8",
            "--domain.demos_per_task=2", "--domain.sft_epochs=1", "--domain.dagger_rounds=0",
            "--domain.wm_train_steps=5", "--domain.wm_offline_per_task=0",
            "--domain.wm_policy_rollouts_per_task=0", f"--domain.eval_episodes_per_task={eval_episodes}",
            "--domain.eval_sampled=false", f"--domain.cache_dir={out / 'cache'}", f"--out_dir={out / 'run'}",
            "--tracking.progress=false", *extra]  # fmt: skip


def snapshot(domain, phase: str, t0: float) -> dict:
    """Resident memory, the pool's envs and the world model's replay after ``phase``."""
    wm = domain.world_model
    episodes = getattr(wm, "episodes", [])
    replay_bytes = sum(v.nbytes for e in episodes for v in e.values() if isinstance(v, np.ndarray))
    idle = Counter("/".join(k) for k, _ in domain.pool._idle)
    import resource

    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB: the high-water mark
    row = {"phase": phase, "rss_gb": round(settled_gb(), 3), "peak_gb": round(high, 3), "envs": domain.pool.live,
           "envs_by_key": dict(sorted(idle.items())), "replay_episodes": len(episodes),
           "replay_gb": round(replay_bytes / 1e9, 3), "s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def mark_after(obj, name: str, key: str, marks: dict[str, float]) -> None:
    """Wrap ``obj.name`` so that each call records the high-water mark (GB) after it as ``marks[key]``."""
    import resource

    call = getattr(obj, name)

    def marked(*args, **kwargs):
        out = call(*args, **kwargs)
        marks[key] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3)
        return out

    setattr(obj, name, marked)


def child(groups: int, a: argparse.Namespace) -> None:
    """One ``groups`` setting in this process: build, steps, evaluation, steps; a JSON line."""

    import torch

    from wmrl.config import load_config
    from wmrl.trainer import Trainer
    from wmrl_vla.domain import VLADomain

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("vla-rl", overrides(groups, a.eval_episodes, Path(tmp), a.override))
        domain = cfg.domain.build(cfg)
        assert isinstance(domain, VLADomain)
        trainer = Trainer(cfg, domain)
        marks: dict[str, float] = {}  # the high-water mark once a step's rollouts, its update are done
        mark_after(domain, "generate", "peak_after_rollouts_gb", marks)
        mark_after(trainer, "_update", "peak_after_update_gb", marks)
        if a.pool == "keep_all":  # the pool before its default bound: every env it built stays
            domain.pool.capacity = 10**9
        rows = [snapshot(domain, "build", t0)]
        for k in range(a.steps):
            trainer.train_step()
            rows.append(snapshot(domain, f"step{k + 1}", t0) | marks)
        trainer.evaluate()
        rows.append(snapshot(domain, "evaluation", t0))
        for k in range(a.steps, 2 * a.steps):
            trainer.train_step()
            rows.append(snapshot(domain, f"step{k + 1}", t0) | marks)
        domain.pool.close()
        rows.append(snapshot(domain, "pool_closed", t0))
        domain.close()
    print(json.dumps(rows), flush=True)


def measure(groups: int, a: argparse.Namespace) -> dict:
    """One ``groups`` setting in a fresh process, watched: its peak RSS and its phases."""
    cmd = [sys.executable, __file__, "--child", str(groups), "--steps", str(a.steps),
           "--eval-episodes", str(a.eval_episodes), "--pool", a.pool, *(f"--override={o}" for o in a.override)]  # fmt: skip
    usage, lines = run_watched(cmd, a.cap_gb, f"groups {groups}")
    return {"groups": groups, "rollouts_per_step": 8 * groups, "peak_rss_gb": round(usage.ru_maxrss / 1e6, 3),
            "phases": json.loads(lines[-1])}  # fmt: skip


def fit(rows: list[dict]) -> dict:
    """Least-squares slopes over the settings: GB per env (the drop when the pool's envs close, per
    env), the settled memory after the last step and the run's peak against rollouts a step."""
    env_gb = [
        (r["phases"][-2]["rss_gb"] - r["phases"][-1]["rss_gb"]) / max(1, r["phases"][-2]["envs"])
        for r in rows
    ]
    last = [r["phases"][-2] for r in rows]
    out: dict = {"gb_per_env_at_close": [round(g, 4) for g in env_gb]}
    if len(rows) > 1:
        n = [r["rollouts_per_step"] for r in rows]
        slope, base = np.polyfit(n, [p["rss_gb"] for p in last], 1)
        out |= {"gb_per_rollout_of_a_step": round(float(slope), 4), "base_gb": round(float(base), 3)}
        peaks = [max(p["peak_gb"] for p in r["phases"]) for r in rows]
        s1, b1 = np.polyfit(n, peaks, 1)
        out |= {"peak_gb_per_rollout_of_a_step": round(float(s1), 4), "peak_base_gb": round(float(b1), 3)}
        no_envs = [r["phases"][-1]["rss_gb"] for r in rows]
        s2, b2 = np.polyfit(n, no_envs, 1)
        out |= {
            "gb_per_rollout_without_envs": round(float(s2), 4),
            "base_without_envs_gb": round(float(b2), 3),
        }
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r, color in zip(rows, ["C0", "C1", "C2", "C3", "C4"], strict=False):
        ph, n = r["phases"], r["rollouts_per_step"]
        names = [p["phase"] for p in ph]
        ax.plot(names, [p["rss_gb"] for p in ph], "o-", color=color, label=f"{n} rollouts/step: settled")
        ax.plot(names, [p["peak_gb"] for p in ph], "s--", color=color, label=f"{n}: high-water mark")
    ax.set_ylabel("resident GB")
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, nargs="+", default=[2, 4], help="simulated groups of 8 a step")
    p.add_argument("--steps", type=int, default=3, help="real steps before and after the evaluation")
    p.add_argument("--eval-episodes", type=int, default=8, help="evaluation episodes a task")
    p.add_argument(
        "--pool",
        choices=["default", "keep_all"],
        default="default",
        help="keep_all: the pool never closes an env (as before its default bound)",
    )
    p.add_argument("--override", action="append", default=[], help="a config override (repeatable)")
    p.add_argument("--cap-gb", type=float, default=3.0, help="stop a process whose RSS passes this")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("runs/vla_step_memory.json"))
    a = p.parse_args()
    if a.child is not None:
        return child(a.child, a)
    rows = []
    for g in a.groups:
        rows.append(measure(g, a))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "phases"}), flush=True)
    settings = {k: v for k, v in vars(a).items() if k != "child"} | {"out": str(a.out)}
    result = {"command": "uv run python " + " ".join(["benchmarks/vla_step_memory.py", *sys.argv[1:]]),
              "settings": settings, "rows": rows, **fit(rows)}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, default=str))
    plot(rows, a.out.with_suffix(".png"))
    print(json.dumps(fit(rows)), f"-> {a.out}")


if __name__ == "__main__":
    main()
