"""The VLA preparation pipeline behind ``VLAConfig.build``: demos -> SFT -> world model, cached.

Each stage is stored under ``cache_dir`` with a name that hashes the config fields it depends on, so
runs of different methods (and seeds) start from the very same SFT checkpoint and world model.
The stages do not depend on the run's seed on purpose.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from wmrl.device import DeviceError, resolve_device
from wmrl.distributed import writes_run_dir
from wmrl.methods import method_of
from wmrl.tracking import OFFLINE_DATA, stage
from wmrl_vla.domain import VLADomain, VLAWorldModel
from wmrl_vla.policy import SmallVLA, SmallVLAConfig
from wmrl_vla.sft import SFTConfig, sft
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
# Bump when the world model's or the policy's architecture changes, so stale caches are not loaded.
WM_ARCH = 4
POLICY_ARCH = 4


def _key(d: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def _demo_fields(cfg: VLAConfig) -> dict[str, Any]:
    if cfg.dataset_root is not None:
        from wmrl_vla.lerobot_policy import folder_stamp

        return {"tasks": list(cfg.tasks), "image_size": cfg.image_size, "dataset_root": str(cfg.dataset_root),
                "dataset_stamp": folder_stamp(cfg.dataset_root), "max_steps": cfg.max_steps}  # fmt: skip
    return {
        "tasks": list(cfg.tasks),
        "image_size": cfg.image_size,
        "demos_per_task": cfg.demos_per_task,
        "demo_seed": cfg.demo_seed,
        **({"demo_split": cfg.demo_split} if cfg.demo_split != "all" else {}),
        "max_steps": cfg.max_steps,
    }


def _dims(tasks: list[str]) -> tuple[int, int]:
    import sims

    infos = [sims.task_info(t) for t in tasks]
    dims = {(i["state_dim"], i["action_dim"]) for i in infos}
    if len(dims) != 1:
        raise ValueError(
            f"domain.tasks must share state and action dims; got {dict(zip(tasks, dims, strict=False))}"
        )
    return dims.pop()


def prepare_demos(cfg: VLAConfig, progress: bool = True) -> list[dict]:
    """Record (once) and load the expert demonstrations, as LeRobot episodes, or load the user's
    dataset (``domain.dataset_root``); ``progress``: the recording's elapsed time on stderr
    (``tracking.progress``)."""
    if cfg.dataset_root is not None:
        from wmrl_vla.lerobot_env import load_dataset

        return load_dataset(cfg.dataset_root, cfg.env.type)
    from wmrl_vla.data import load_episodes, record_demos

    root = Path(cfg.cache_dir) / f"demos-{_key(_demo_fields(cfg))}"
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
    if cfg.policy_path is not None:  # a lerobot policy folder, post-trained as is: no SFT fields
        from wmrl_vla.lerobot_policy import folder_stamp

        return {**_demo_fields(cfg), "policy_path": str(cfg.policy_path),
                "policy_stamp": folder_stamp(cfg.policy_path), "arch": POLICY_ARCH}  # fmt: skip
    fields = {**_demo_fields(cfg), "policy": cfg.policy, "n_bins": cfg.n_bins, "d_model": cfg.d_model,
              "n_layers": cfg.n_layers, "sft_epochs": cfg.sft_epochs, "sft_batch_size": cfg.sft_batch_size,
              "sft_lr": cfg.sft_lr, "arch": POLICY_ARCH}  # fmt: skip
    if cfg.policy == "small_vla":  # only non-default extras, which keeps the keys of plain-BC caches
        fields.update({k: getattr(cfg, k) for k in ("sft_shift", "sft_aux_goal") if getattr(cfg, k)})
        if not cfg.locator:
            fields["locator"] = False
    if cfg.dagger_rounds > 0 and cfg.policy == "small_vla":
        fields.update(dagger_rounds=cfg.dagger_rounds, dagger_episodes_per_task=cfg.dagger_episodes_per_task,
                      dagger_epochs=cfg.dagger_epochs)  # fmt: skip
    return fields


def prepare_policy(
    cfg: VLAConfig,
    demos: list[dict],
    device: torch.device | str = "cpu",
    accelerator=None,
    progress: bool = True,
):
    """The SFT policy on ``device`` (trained there once, then cached). With an ``accelerator`` (every
    process of a data-parallel run calls this; small VLA only) behaviour cloning runs data-parallel
    (:func:`wmrl_vla.sft.sft`) and the main process alone writes the cache."""
    device = torch.device(device)
    fields = _policy_fields(cfg)
    path = Path(cfg.cache_dir) / f"sft-{_key(fields)}.pt"
    if cfg.policy_path is not None:
        from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

        if cfg.policy == "lerobot_diffusion":
            from wmrl_vla.diffusion_bridge import DiffusionChainPolicy

            return DiffusionChainPolicy.from_folder(cfg.policy_path).to(device)
        return PretrainedLeRobotPolicy(cfg.policy_path).to(device)
    if cfg.policy == "lerobot_diffusion":
        return _prepare_diffusion(cfg, demos, path, fields, device)
    if cfg.policy == "lerobot_act":
        return _prepare_act(cfg, demos, path, fields, device)
    if cfg.policy == "lerobot_smolvla":
        if device.type != "cpu":
            raise DeviceError(
                f"domain.policy=lerobot_smolvla runs on the CPU only (device={device}); use --device=cpu"
            )
        return _prepare_smolvla(cfg, demos, path, fields)
    if cfg.policy != "small_vla":
        from wmrl_vla.config import POLICIES

        raise ValueError(f"domain.policy={cfg.policy!r} is not one of {', '.join(POLICIES)}")
    if path.exists():
        return SmallVLA.load(path).to(device)
    state_dim, action_dim = _dims(cfg.tasks)
    torch.manual_seed(cfg.demo_seed)
    policy = SmallVLA(
        SmallVLAConfig(
            image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim, n_bins=cfg.n_bins,
            d_model=cfg.d_model, n_layers=cfg.n_layers, locator=cfg.locator,
        )
    ).to(device)  # fmt: skip
    t0 = time.perf_counter()
    if cfg.locator and cfg.sft_aux_goal > 0:
        demos = label_goals(list(demos), split=cfg.demo_split)
    hist = sft(
        policy,
        demos,
        SFTConfig(
            epochs=cfg.sft_epochs,
            batch_size=cfg.sft_batch_size,
            lr=cfg.sft_lr,
            seed=cfg.demo_seed,
            shift=cfg.sft_shift,
            aux_goal=cfg.sft_aux_goal,
        ),  # fmt: skip
        progress=progress,
        accelerator=accelerator,
    )
    relabelled: list[dict] = []
    for r in range(cfg.dagger_rounds):
        new = dagger_records(policy, cfg.tasks, cfg.dagger_episodes_per_task, cfg.image_size,
                             DAGGER_SEED0 + 1000 * r, max_steps=cfg.max_steps)  # fmt: skip
        hist.setdefault("dagger_success", []).append(float(mean_success(new)))
        relabelled += new
        h = sft(
            policy,
            list(demos) + relabelled,
            SFTConfig(epochs=cfg.dagger_epochs, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr / 2,
                      seed=cfg.demo_seed + 1 + r, aux_goal=cfg.sft_aux_goal if cfg.locator else 0.0),
            progress=progress,
            accelerator=accelerator,
        )  # fmt: skip
        hist.setdefault("dagger_accuracy", []).append(h["accuracy"][-1])
    if accelerator is None or accelerator.is_main_process:
        path.parent.mkdir(parents=True, exist_ok=True)
        policy.save(path)
        path.with_suffix(".json").write_text(
            json.dumps({**hist, "seconds": time.perf_counter() - t0, **fields})
        )
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return policy


def sft_data_parallel(cfg: VLAConfig, run: RunConfig, accelerator) -> None:
    """Behaviour cloning on every process of a data-parallel run (``wmrl run`` with N processes
    calls this before the domain is built; the build then reads the cached SFT policy). The lerobot
    bridges train in the main process during the build, as with one process."""
    if cfg.policy != "small_vla":
        return
    with accelerator.main_process_first():  # the demos are recorded once
        records = prepare_demos(cfg, run.tracking.progress)
    prepare_policy(cfg, records, resolve_device(run.device), accelerator, run.tracking.progress)


DAGGER_SEED0 = 900_000


def target_labels(env) -> tuple[np.ndarray, np.ndarray] | None:
    """Auxiliary SFT labels of an env's current episode, from the simulator: the named object's table
    xy (:func:`wmrl_vla.rollout.goal_position`) and where the env's camera sees it (image x, y in [-1, 1]^2, y down; pinhole model of
    the MuJoCo camera). None for envs without our tabletop interface (no labels: SFT falls back to
    the demo's last hand position)."""
    import math

    from wmrl_vla.rollout import goal_position

    u = getattr(env, "unwrapped", env)
    target = goal_position(u)
    if target is None:
        return None
    try:
        cam = u.model.camera(u.camera).id
        pos, mat = u.data.cam_xpos[cam], u.data.cam_xmat[cam].reshape(3, 3)  # columns: camera axes
        tan = math.tan(math.radians(float(u.model.cam_fovy[cam])) / 2)
    except (AttributeError, KeyError):
        return None
    d = target - pos
    depth = -float(d @ mat[:, 2])  # the camera looks along its -z axis
    px = np.array([d @ mat[:, 0] / depth / tan, -(d @ mat[:, 1]) / depth / tan], dtype=np.float32)
    return target[:2].astype(np.float32), px


def label_goals(records: list[dict], split: str = "all") -> list[dict]:
    """Add ``goal`` / ``goal_px`` (see :func:`target_labels`) to records that know their task id and
    reset seed (as :func:`wmrl_vla.data.load_episodes` returns them), by resetting the task's env
    without rendering in ``split`` (the one they were recorded with)."""
    import sims

    envs: dict[str, Any] = {}
    out = []
    try:
        for r in records:
            task, seed = r.get("task_id"), r.get("seed", -1)
            if task is None or seed is None or int(seed) < 0:
                out.append(r)
                continue
            if task not in envs:
                envs[task] = sims.make(task, render=False, split=split)
            envs[task].reset(seed=int(seed))
            lab = target_labels(envs[task])
            out.append(r if lab is None else {**r, "goal": lab[0], "goal_px": lab[1]})
    finally:
        for e in envs.values():
            e.close()
    return out


@torch.no_grad()
def dagger_records(
    policy: SmallVLA,
    tasks: list[str],
    episodes_per_task: int,
    image_size: int,
    seed0: int,
    temperature: float = 0.0,
    max_steps: int | None = None,
) -> list[dict]:
    """DAgger (Ross et al. 2011): roll out ``policy`` in the simulator ("train" combinations) and label
    every visited frame with the scripted expert's action from that state. Behaviour cloning on the
    expert's own states alone compounds small errors (the policy overshoots, then never saw how to
    come back); these records teach the recovery. Records are LeRobot-style, like the demos."""
    import sims

    out = []
    gen = torch.Generator().manual_seed(seed0)
    for task in tasks:
        kwargs = {"split": "train"} if max_steps is None else {"split": "train", "max_steps": max_steps}
        env = sims.make(task, image_size=image_size, **kwargs)
        ex = sims.expert(task)
        try:
            for k in range(episodes_per_task):
                ex.reset()
                o, info = env.reset(seed=seed0 + k)
                lab = target_labels(env)
                instr = policy.tokenizer.encode([info["instruction"]])
                imgs, sts, acts, prog, succ = [], [], [], [], []
                while True:
                    label = np.clip(np.asarray(ex.act(o, info, env), dtype=np.float32), -1, 1)
                    img = np.asarray(o["image"])
                    _, _, a = policy.act(
                        torch.from_numpy(img.transpose(2, 0, 1)[None].copy()),
                        torch.from_numpy(np.asarray(o["state"], np.float32)[None]),
                        instr,
                        temperature=temperature,
                        generator=gen,
                    )
                    imgs.append(img)
                    sts.append(np.asarray(o["state"], np.float32))
                    acts.append(label)
                    o, r, term, trunc, info = env.step(a[0].numpy().astype(np.float32))
                    prog.append(float(r))
                    succ.append(bool(info["success"]))
                    if term or trunc:
                        break
                rec = {
                    "observation.image": np.stack(imgs),
                    "observation.state": np.stack(sts),
                    "action": np.stack(acts),
                    "next.reward": np.array(prog, np.float32),
                    "next.success": np.array(succ),
                    "instruction": info["instruction"],
                    "task": info["instruction"],
                }
                if lab is not None:
                    rec.update(goal=lab[0], goal_px=lab[1])
                out.append(rec)
        finally:
            env.close()
    return out


def _prepare_act(cfg: VLAConfig, demos: list[dict], path: Path, fields: dict, device: torch.device):
    """lerobot ACT with a Gaussian head (see :mod:`wmrl_vla.lerobot_bridge`), cloned by max-likelihood."""
    from wmrl_vla.lerobot_bridge import ACTBridgeConfig, ACTGaussianPolicy

    if path.exists():
        return ACTGaussianPolicy.load(path).to(device)
    state_dim, action_dim = _dims(cfg.tasks)
    torch.manual_seed(cfg.demo_seed)
    policy = ACTGaussianPolicy(
        ACTBridgeConfig(image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim, dim_model=cfg.d_model,
                        n_encoder_layers=cfg.n_layers)
    ).to(device)  # fmt: skip
    return _sft_gaussian_and_save(cfg, policy, demos, path, fields)


def _prepare_diffusion(cfg: VLAConfig, demos: list[dict], path: Path, fields: dict, device: torch.device):
    """A small lerobot DiffusionPolicy (see :mod:`wmrl_vla.diffusion_bridge`), cloned with its own
    diffusion loss for ``sft_epochs`` passes' worth of ``sft_batch_size`` minibatches."""
    from wmrl_vla.diffusion_bridge import DiffusionBridgeConfig, DiffusionChainPolicy, train_bc

    if path.exists():
        return DiffusionChainPolicy.load(path).to(device)
    state_dim, action_dim = _dims(cfg.tasks)
    torch.manual_seed(cfg.demo_seed)
    policy = DiffusionChainPolicy.from_config(
        DiffusionBridgeConfig(image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim)
    )
    t0 = time.perf_counter()
    frames = sum(len(np.asarray(d.get("action", d.get("actions")))) for d in demos)
    steps = cfg.sft_epochs * max(1, -(-frames // cfg.sft_batch_size))
    loss = train_bc(policy, demos, steps, cfg.sft_batch_size, cfg.sft_lr, cfg.demo_seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    policy.save(path)
    path.with_suffix(".json").write_text(
        json.dumps({"loss": loss, "seconds": time.perf_counter() - t0, **fields})
    )
    return policy.to(device)


def _prepare_smolvla(cfg: VLAConfig, demos: list[dict], path: Path, fields: dict):
    """lerobot SmolVLA built offline with a Gaussian head (see :mod:`wmrl_vla.smolvla_bridge`), cloned
    by max-likelihood plus its flow-matching loss. Its local SmolVLM directory lives under cache_dir."""
    from wmrl_vla.smolvla_bridge import SmolVLABridgeConfig, SmolVLAGaussianPolicy, default_instruction_corpus

    vlm_cache = str(Path(cfg.cache_dir) / "smolvlm")
    if path.exists():
        return SmolVLAGaussianPolicy.load(path, vlm_cache_dir=vlm_cache)
    state_dim, action_dim = _dims(cfg.tasks)
    corpus = sorted(set(default_instruction_corpus()) | {d["instruction"] for d in demos})
    torch.manual_seed(cfg.demo_seed)
    policy = SmolVLAGaussianPolicy(
        SmolVLABridgeConfig(image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim,
                            text_hidden=cfg.d_model, text_layers=max(2, cfg.n_layers), corpus=corpus,
                            vlm_cache_dir=vlm_cache)
    )  # fmt: skip
    return _sft_gaussian_and_save(cfg, policy, demos, path, fields)


def _sft_gaussian_and_save(cfg: VLAConfig, policy, demos: list[dict], path: Path, fields: dict):
    """SFT of a lerobot bridge (:func:`wmrl_vla.lerobot_bridge.sft_gaussian`); the checkpoint and its
    per-epoch NLL + seconds are cached at ``path`` / ``path.json``."""
    from wmrl_vla.lerobot_bridge import sft_gaussian

    t0 = time.perf_counter()
    nll = sft_gaussian(policy, demos, cfg.sft_epochs, cfg.sft_batch_size, cfg.sft_lr, cfg.demo_seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    policy.save(path)
    path.with_suffix(".json").write_text(
        json.dumps({"nll": nll, "seconds": time.perf_counter() - t0, **fields})
    )
    return policy


def _rollout_fields(cfg: VLAConfig) -> dict[str, Any]:
    return {**_policy_fields(cfg), "wm_policy_rollouts_per_task": cfg.wm_policy_rollouts_per_task,
            "temperature": cfg.temperature}  # fmt: skip


def prepare_policy_rollouts(cfg: VLAConfig, policy, progress: bool = True) -> list[dict]:
    """Real rollouts of the SFT policy (successes *and* failures) for world-model pretraining, recorded
    once as a LeRobot dataset. Expert demos alone never fail, so a WM trained on them alone cannot
    tell a failing trajectory from a succeeding one."""
    from wmrl_vla.data import append_episodes, load_episodes
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes
    from wmrl_vla.world_model import to_frames

    n = cfg.wm_policy_rollouts_per_task
    if n <= 0:
        return []
    root = Path(cfg.cache_dir) / f"rollouts-{_key(_rollout_fields(cfg))}"
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
    return {**_policy_fields(cfg), "wm_offline_per_task": cfg.wm_offline_per_task,
            "wm_offline_mix": list(cfg.wm_offline_mix)}  # fmt: skip


def offline_dir(cfg: VLAConfig) -> Path:
    """Where the offline dataset of ``cfg`` is cached (``summary.json`` there once complete)."""
    return Path(cfg.cache_dir) / f"offline-{_key(_offline_fields(cfg))}"


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
    state_dim, action_dim = _dims(cfg.tasks)
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
    path = Path(cfg.cache_dir) / f"wm-{_key(fields)}.pt"
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
    if quality and main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "wm_quality.json").write_text(json.dumps(quality, indent=2))
    if cfg.wm_offline_per_task and main:  # the offline data's simulator steps, apart from the RL budget
        out.mkdir(parents=True, exist_ok=True)
        (out / OFFLINE_DATA).write_text((offline_dir(cfg) / "summary.json").read_text())
    wm = VLAWorldModel(
        model,
        episodes,
        update_steps=cfg.wm_update_steps,
        batch_size=cfg.wm_batch_size,
        horizon=cfg.wm_horizon,
        state_horizon=cfg.wm_state_horizon,
        lr=cfg.wm_update_lr,
        dataset=(str(out / "anchors"), "wmrl/anchors") if cfg.record_anchors and main else None,
        seed=run.seed,
        calibration=(quality.get("var_scale", 1.0), quality.get("var_floor", 0.0)),
        calibrate=cfg.wm_calibrate,
        progress=show,
    )
    domain = VLADomain(
        policy,
        wm,
        cfg.tasks,
        cfg.image_size,
        temperature=cfg.temperature,
        eval_temperature=cfg.eval_temperature,
        eval_sampled=cfg.eval_sampled,
        eval_episodes_per_task=cfg.eval_episodes_per_task,
        eval_combos=cfg.eval_combos,
        eval_lockstep=cfg.eval_lockstep,
        n_videos=cfg.n_videos,
        regrade=cfg.regrade,
        max_steps=cfg.max_steps,
        out_dir=out if main else None,
        seed=run.seed,
        twin_anchors=cfg.twin_anchors and method_of(run).uses_twins,  # only ppi's update uses them
        imagine_input=cfg.imagine_input,
        latent_refresh_steps=cfg.latent_refresh_steps,
        # --precision=bf16 (wmrl.device.check_precision)
        bf16_unsupported=cfg.bf16_unsupported(),
    )
    if cfg.imagine_input == "latent":
        with stage(f"[vla] fitting the latent adapter ({cfg.latent_adapter_steps} steps)", show):
            domain.fit_latent_adapter(steps=cfg.latent_adapter_steps)
    return domain


def policy_words(cfg: VLAConfig) -> str:
    """What a run's messages call its starting policy: the SFT policy WMRL cloned from demos, or the
    user's own lerobot policy (``domain.policy_path``), which WMRL never fine-tuned by SFT."""
    if cfg.policy_path is not None:
        return f"your policy ({cfg.policy_path})"
    return "the SFT policy"


def mean_success(records: list[dict]) -> float:
    return float(np.mean([np.asarray(r.get("success", r.get("next.success"))).max() for r in records]))
