"""The VLA preparation pipeline behind ``VLAConfig.build``: demos -> SFT -> world model, cached.

Each stage is stored under ``cache_dir`` with a name that hashes the config fields it depends on, so
runs of different methods (and seeds) start from the very same SFT checkpoint and world model.
The stages do not depend on the run's seed on purpose.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wmrl.config import ConfigError
from wmrl.device import resolve_device
from wmrl.distributed import writes_run_dir
from wmrl.methods import method_of
from wmrl.tracking import OFFLINE_DATA, policy_fingerprint, stage
from wmrl_vla.chain_config import DenoisingChainConfig
from wmrl_vla.demos import cache_key, demo_fields, label_goals, task_dims
from wmrl_vla.domain import VLADomain, VLAWorldModel
from wmrl_vla.policies import policy_kind
from world_models.vla_dynamics import (
    VLADynamics,
    VLADynamicsConfig,
    episodes_from_records,
    evaluate_dynamics,
    fit_variance_calibration,
    score_episodes,
    train_dynamics,
)

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl_vla.config import VLAConfig

log = logging.getLogger(__name__)
DEMO_REPO = "wmrl/demos"
ROLLOUT_REPO = "wmrl/sft_rollouts"
ROLLOUT_SEED0 = 500_000
# Bump when the world model's architecture changes, so stale caches are not loaded.
WM_ARCH = 4


def prepare_demos(cfg: VLAConfig, progress: bool = True) -> list[dict]:
    """Record (once) and load the expert demonstrations, as LeRobot episodes, or load the user's
    dataset (``domain.dataset_root``); ``progress``: the recording's elapsed time on stderr
    (``tracking.progress``)."""
    if cfg.dataset_root is not None:
        from wmrl_vla.lerobot_env import load_dataset

        return load_dataset(cfg.dataset_root, cfg.env.type)
    from wmrl_vla.data import load_episodes, record_demos

    root = Path(cfg.cache_dir) / f"demos-{cache_key(demo_fields(cfg))}"
    if not (root / "wmrl_done").exists():
        if root.exists():
            import shutil

            shutil.rmtree(root)  # an interrupted recording
        t0 = time.perf_counter()
        what = f"[vla] recording {cfg.demos_per_task} expert demos for each of {len(cfg.tasks)} tasks"
        with stage(what, progress):
            record_demos(
                cfg.tasks,
                cfg.demos_per_task,
                root,
                DEMO_REPO,
                cfg.image_size,
                cfg.demo_seed,
                max_steps=cfg.max_steps,
                split=cfg.demo_split,
            )
        (root / "wmrl_done").write_text(json.dumps({"seconds": time.perf_counter() - t0}))
    return load_episodes(root, DEMO_REPO)


def _policy_fields(cfg: VLAConfig) -> dict[str, Any]:
    """The fields of the SFT stage's cache key (its policy kind's, :mod:`wmrl_vla.policies`)."""
    return policy_kind(cfg).cache_fields()


def prepare_policy(
    cfg: VLAConfig,
    demos: list[dict],
    device: torch.device | str = "cpu",
    accelerator=None,
    progress: bool = True,
):
    """The SFT policy on ``device`` (trained there once, then cached) by its registered kind
    (:mod:`wmrl_vla.policies`). With an ``accelerator`` (every process of a data-parallel run calls
    this; small VLA only) behaviour cloning runs data-parallel (:func:`wmrl_vla.sft.sft`) and the
    main process alone writes the cache."""
    return policy_kind(cfg).prepare(demos, torch.device(device), accelerator, progress)


def sft_data_parallel(cfg: VLAConfig, run: RunConfig, accelerator) -> None:
    """Behaviour cloning on every process of a data-parallel run (``wmrl run`` with N processes
    calls this before the domain is built; the build then reads the cached SFT policy). The lerobot
    bridges train in the main process during the build, as with one process."""
    if not policy_kind(cfg).sft_data_parallel:
        return
    with accelerator.main_process_first():  # the demos are recorded once
        records = prepare_demos(cfg, run.tracking.progress)
    prepare_policy(cfg, records, resolve_device(run.device), accelerator, run.tracking.progress)


def _acting_fields(cfg: VLAConfig) -> dict[str, Any]:
    """The fields of the policy's behaviour, which its recorded rollouts depend on: its SFT's, and how
    a chain policy acts (``domain.chain``, keyed where it is not the default: one clone executed in
    chunks records other rollouts)."""
    chain = {"chain": asdict(cfg.chain)} if cfg.chain != DenoisingChainConfig() else {}
    return {**_policy_fields(cfg), **chain}


def _rollout_fields(cfg: VLAConfig) -> dict[str, Any]:
    return {**_acting_fields(cfg), "wm_policy_rollouts_per_task": cfg.wm_policy_rollouts_per_task,
            "temperature": cfg.temperature}  # fmt: skip


def prepare_policy_rollouts(cfg: VLAConfig, policy, progress: bool = True) -> list[dict]:
    """Real rollouts of the SFT policy (successes *and* failures) for world-model pretraining, recorded
    once as a LeRobot dataset. Expert demos alone never fail, so a WM trained on them alone cannot
    tell a failing trajectory from a succeeding one."""
    from wmrl_vla.data import append_episodes, load_episodes
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes, to_frames

    n = cfg.wm_policy_rollouts_per_task
    if n <= 0:
        return []
    root = Path(cfg.cache_dir) / f"rollouts-{cache_key(_rollout_fields(cfg))}"
    if not (root / "wmrl_done").exists():
        if root.exists():
            import shutil

            shutil.rmtree(root)
        pool = EnvPool(cfg.image_size, cfg.max_steps)
        actor = policy_actor(policy, cfg.temperature, torch.Generator().manual_seed(cfg.demo_seed))
        specs = [(t, ROLLOUT_SEED0 + k) for t in cfg.tasks for k in range(n)]
        t0 = time.perf_counter()
        with stage(f"[vla] {len(specs)} rollouts of {policy_words(cfg)} for WM pretraining", progress):
            ro = run_episodes(actor, specs, pool, "train")
        pool.close()
        append_episodes(
            root, ROLLOUT_REPO, [to_frames(r) for r in ro], [r.task_id for r in ro], [r.seed for r in ro]
        )
        (root / "wmrl_done").write_text(
            json.dumps(
                {
                    "seconds": time.perf_counter() - t0,
                    "sim_steps": int(sum(r.length for r in ro)),
                    "success": float(np.mean([r.success.max() for r in ro])),
                    "reward": float(np.mean([r.reward for r in ro])),
                }
            )
        )
    return load_episodes(root, ROLLOUT_REPO)


def _offline_fields(cfg: VLAConfig) -> dict[str, Any]:
    return {**_acting_fields(cfg), "wm_offline_per_task": cfg.wm_offline_per_task,
            "wm_offline_mix": list(cfg.wm_offline_mix)}  # fmt: skip


def offline_dir(cfg: VLAConfig) -> Path:
    """Where the offline dataset of ``cfg`` is cached (``summary.json`` there once complete)."""
    return Path(cfg.cache_dir) / f"offline-{cache_key(_offline_fields(cfg))}"


def prepare_offline_data(cfg: VLAConfig, policy, progress: bool = True) -> list[dict]:
    """The policy-diverse offline dataset for WM pretraining (:mod:`wmrl_vla.offline_data`), recorded
    once per machine (an interrupted recording is started again) and shared by every seed and method."""
    from wmrl_vla.data import load_episodes
    from wmrl_vla.offline_data import OFFLINE_REPO, record_offline

    if cfg.wm_offline_per_task <= 0:
        return []
    root = offline_dir(cfg)
    if not (root / "summary.json").exists():
        if root.exists():
            import shutil

            shutil.rmtree(root)
        record_offline(policy, list(cfg.tasks), cfg.wm_offline_per_task, cfg.wm_offline_mix, root,
                       cfg.image_size, cfg.max_steps, seed=cfg.demo_seed, progress=progress)  # fmt: skip
    return load_episodes(root, OFFLINE_REPO)


def wm_config(cfg: VLAConfig) -> VLADynamicsConfig:
    """The world model's architecture for a domain config."""
    state_dim, action_dim = task_dims(cfg.tasks)
    return VLADynamicsConfig(
        image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim, latent_dim=cfg.wm_latent_dim,
        n_members=cfg.wm_members, frame_decoder=cfg.world_model, diffusion_steps=cfg.diffusion_steps,
        instruction_buckets=cfg.wm_instruction_buckets, outcome_input=cfg.wm_outcome,
        state_integrator=cfg.wm_integrator, outcome_reads=cfg.wm_outcome_reads,
    )  # fmt: skip


def prepare_world_model(
    cfg: VLAConfig, episodes: list[dict], device: torch.device | str = "cpu", progress: bool = True
) -> tuple[VLADynamics, dict[str, float]]:
    """Pretrain (once) the world model on demos + SFT-policy rollouts, on ``device``; quality on
    held-out episodes."""
    fields = {**_rollout_fields(cfg), "world_model": cfg.world_model, "wm_members": cfg.wm_members,
              "wm_latent_dim": cfg.wm_latent_dim, "wm_train_steps": cfg.wm_train_steps,
              "wm_batch_size": cfg.wm_batch_size, "wm_horizon": cfg.wm_horizon, "wm_lr": cfg.wm_lr,
              "diffusion_steps": cfg.diffusion_steps, "arch": WM_ARCH,
              **({"wm_instruction_buckets": b} if (b := cfg.wm_instruction_buckets) else {}),
              **({"wm_outcome": o, "wm_state_horizon": cfg.wm_state_horizon}
                 if (o := cfg.wm_outcome) != "latent" else {}),
              **({"wm_integrator": True} if cfg.wm_integrator else {}),
              **({"wm_outcome_reads": r} if (r := cfg.wm_outcome_reads) != "scene" else {}),
              **(_offline_fields(cfg) if cfg.wm_offline_per_task else {})}  # fmt: skip
    path = Path(cfg.cache_dir) / f"wm-{cache_key(fields)}.pt"
    qpath = path.with_suffix(".json")
    # hold out every 10th episode to measure quality
    held = [e for i, e in enumerate(episodes) if i % 10 == 9] or episodes[-1:]
    train = [e for i, e in enumerate(episodes) if i % 10 != 9] or episodes
    if path.exists():
        quality = json.loads(qpath.read_text()) if qpath.exists() else {}
        model = VLADynamics.load(path).to(device)
        if "var_scale" not in quality and model.cfg.n_members > 1:  # cached before the calibration
            scores, real, _ = score_episodes(model, held)
            sq, var = ((scores.mean(0) - real) ** 2).numpy(), scores.var(0, unbiased=False).numpy()
            quality["var_scale"], quality["var_floor"] = fit_variance_calibration(sq, var)
        return model, quality
    torch.manual_seed(cfg.demo_seed + 1)
    model = VLADynamics(wm_config(cfg)).to(device)
    t0 = time.perf_counter()
    train_dynamics(model, train, cfg.wm_train_steps, cfg.wm_batch_size, cfg.wm_horizon, cfg.wm_lr,
                   seed=cfg.demo_seed, progress=progress, state_horizon=cfg.wm_state_horizon)  # fmt: skip
    seconds = time.perf_counter() - t0
    quality = evaluate_dynamics(model, held, horizon=min(16, cfg.wm_horizon * 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    qpath.write_text(
        json.dumps({**quality, "train_seconds": seconds, "held_out_episodes": len(held)}, indent=2)
    )
    return model, quality


def build_domain(cfg: VLAConfig, run: RunConfig) -> VLADomain:
    twins = cfg.twin_anchors and method_of(run).uses_twins  # only ppi's update uses them
    if twins and policy_kind(cfg).records_chain:  # refused before anything is built
        raise ConfigError(
            f"domain.policy={cfg.policy} acts by a denoising chain, which cannot share method={run.method}'s "
            "common random numbers (domain.twin_anchors=true); set --domain.twin_anchors=false"
        )
    torch.set_num_threads(run.torch_threads)
    device = resolve_device(run.device)  # policy, SFT, world model, imagination and evaluation run there
    show = run.tracking.progress
    records = prepare_demos(cfg, show)
    policy = prepare_policy(cfg, records, device, progress=show)
    # the named object's position of every episode (from its task's reset), for a grounded WM
    episodes = episodes_from_records(label_goals(records, split=cfg.demo_split)) + episodes_from_records(
        label_goals(prepare_policy_rollouts(cfg, policy, show), split="train")
    )
    episodes += episodes_from_records(label_goals(prepare_offline_data(cfg, policy, show), split="train"))
    model, quality = prepare_world_model(cfg, episodes, device, show)
    out = Path(run.out_dir)
    main = writes_run_dir()  # data-parallel: one writer of the run directory's files
    if quality and main:  # with the pretrained weights' fingerprint: which build of the WM the run used
        out.mkdir(parents=True, exist_ok=True)
        sha1 = policy_fingerprint(model)
        (out / "wm_quality.json").write_text(json.dumps({**quality, "wm_sha1": sha1}, indent=2))
    if cfg.wm_offline_per_task and main:  # the offline data's simulator steps, apart from the RL budget
        out.mkdir(parents=True, exist_ok=True)
        (out / OFFLINE_DATA).write_text((offline_dir(cfg) / "summary.json").read_text())
    wm = VLAWorldModel(
        model,
        episodes,
        refinement=cfg.wm_refinement,
        dataset=(str(out / "anchors"), "wmrl/anchors") if cfg.record_anchors and main else None,
        seed=run.seed,
        calibration=(quality.get("var_scale", 1.0), quality.get("var_floor", 0.0)),
        progress=show,
    )
    domain = VLADomain(
        policy,
        wm,
        cfg.tasks,
        cfg.image_size,
        temperature=cfg.temperature,
        evaluation=cfg.evaluation,
        regrade=cfg.regrade,
        max_steps=cfg.max_steps,
        out_dir=out if main else None,
        seed=run.seed,
        twin_anchors=twins,
        imagine_input=cfg.imagine_input,
        latent_refresh_steps=cfg.latent_refresh_steps,
        # --precision=bf16 (wmrl.device.check_precision)
        bf16_unsupported=cfg.bf16_unsupported(),
        rollout_lockstep=cfg.rollout_lockstep,
    )
    if cfg.imagine_input == "latent":
        with stage(f"[vla] fitting the latent adapter ({cfg.latent_adapter_steps} steps)", show):
            domain.fit_latent_adapter(steps=cfg.latent_adapter_steps)
    return domain


def policy_words(cfg: VLAConfig) -> str:
    """What a run's messages call its starting policy: the SFT policy WMRL cloned from demos, or the
    user's own lerobot policy (``domain.policy_path``), which WMRL never fine-tuned by SFT."""
    return policy_kind(cfg).words()
