"""WMRL as a post-training step of the lerobot workflow, measured end to end (docs/vla.md "Post-training
a lerobot policy"):

1. record a LeRobotDataset with MetaWorld's scripted expert in lerobot's MetaWorld env;
2. train a small ACT on it with lerobot's own training loop (``lerobot.scripts.lerobot_train.train``);
3. evaluate it with lerobot (``eval_policy``) on held-out seeds: the success *before*;
4. post-train it with ``wmrl run`` (each ``--methods``), export with ``wmrl export``;
5. evaluate every exported folder with lerobot on the same seeds: the success *after*.

    uv run python benchmarks/lerobot_posttrain.py --out benchmarks/results/lerobot_posttrain

Writes ``<out>/lerobot_posttrain.json`` (every figure with the settings that produced it). A
benchmark, not a test: the numbers depend on the budget below and carry the binomial interval of
``--eval-episodes`` episodes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from sims._gl import select_backend  # noqa: E402

select_backend()  # MUJOCO_GL as `wmrl run` chooses it (EGL where no display and no choice of yours)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (statsmodels' ``proportion_confint``)."""
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return float(lo), float(hi)


def lerobot_success(folder: Path, a: argparse.Namespace) -> dict:
    from wmrl_vla.lerobot_env import evaluate_with_lerobot

    info = evaluate_with_lerobot(
        str(folder), a.task, a.image_size, a.episode_length, a.eval_episodes, start_seed=a.eval_seed
    )
    k = sum(bool(e["success"]) for e in info["per_episode"])
    return {"success": k / a.eval_episodes, "successes": k, "episodes": a.eval_episodes,
            "ci95": wilson(k, a.eval_episodes), "avg_max_reward": info["aggregated"]["avg_max_reward"]}  # fmt: skip


def user_act(out: Path, a: argparse.Namespace) -> tuple[Path, float, float]:
    """What a lerobot user brings, under ``out`` (reused when there): ``a.demos`` expert demos of
    ``a.task`` recorded in lerobot's MetaWorld env (``out/dataset``) and an ACT trained on them by
    lerobot's own loop (chunk_size 10, n_action_steps 10). Returns (its ``pretrained_model`` folder,
    seconds recording, seconds training)."""
    from wmrl_vla.data import record_demos
    from wmrl_vla.lerobot_env import LeRobotEnvConfig, register_task
    from wmrl_vla.lerobot_policy import train_act

    t0 = time.perf_counter()
    task_id = register_task(LeRobotEnvConfig(type="metaworld", task=a.task, episode_length=a.episode_length))
    data = out / "dataset"
    if not (data / "meta" / "info.json").exists():
        record_demos([task_id], a.demos, data, "user/dataset", image_size=a.image_size, seed=100,
                     max_steps=a.episode_length)  # fmt: skip
    record_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    folder = out / "act" / "checkpoints" / "last" / "pretrained_model"
    if not folder.exists():
        train_act(data, "user/dataset", out / "act", steps=a.act_steps, batch_size=8, dim_model=64,
                  n_heads=4, dim_feedforward=128, n_encoder_layers=2, n_decoder_layers=1,
                  n_vae_encoder_layers=1, latent_dim=16, chunk_size=10, n_action_steps=10,
                  optimizer_lr=a.act_lr, optimizer_lr_backbone=a.act_lr)  # fmt: skip
    return folder, record_seconds, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/lerobot_posttrain")
    p.add_argument("--task", default="reach-v3")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--episode-length", type=int, default=100)
    p.add_argument("--demos", type=int, default=20)
    p.add_argument("--act-steps", type=int, default=300)
    p.add_argument("--act-lr", type=float, default=1e-4)
    p.add_argument("--grpo-steps", type=int, default=10)
    p.add_argument("--methods", default="real,ppi")
    p.add_argument("--eval-episodes", type=int, default=30)
    p.add_argument("--eval-seed", type=int, default=1_000_000)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "control": "anchors_only not run: a check of the lerobot workflow (load, post-train, export, "
        "lerobot eval), not a comparison of methods; no WM claim rests on it",
        "settings": vars(a),
        "command": " ".join([sys.executable, *sys.argv]),
    }

    folder, result["record_seconds"], result["act_train_seconds"] = user_act(out, a)
    result["before"] = lerobot_success(folder, a)
    print("before", result["before"], flush=True)
    for method in a.methods.split(","):
        run, exported = out / f"run-{method}", out / f"export-{method}"
        cmd = ["wmrl", "run", "vla-rl", "--out-dir", str(run), f"--method={method}",
               "--domain.env.type=metaworld", f"--domain.env.task={a.task}",
               f"--domain.env.episode_length={a.episode_length}", "--domain.max_steps=null",
               f"--domain.image_size={a.image_size}", f"--domain.policy_path={folder}",
               f"--domain.dataset_root={out / 'dataset'}", f"--domain.cache_dir={out / 'cache'}",
               f"--grpo.steps={a.grpo_steps}", "--domain.wm_outcome=latent", "--tracking.eval_every=0",
               f"--domain.eval_episodes_per_task={a.eval_episodes}", "--tracking.wandb=disabled",
               *(["--domain.twin_anchors=true"] if method == "ppi" else [])]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        subprocess.run(["wmrl", "export", str(run), "--out", str(exported)], check=True)
        seconds = time.perf_counter() - t0
        evals = [
            m
            for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "eval/success" in m
        ]
        result[method] = {**lerobot_success(exported, a), "wmrl_eval_success": evals[-1]["eval/success"],
                          "run_seconds": seconds, "command": " ".join(cmd)}  # fmt: skip
        print(method, result[method], flush=True)
        (out / "lerobot_posttrain.json").write_text(json.dumps(result, indent=2))
    (out / "lerobot_posttrain.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
