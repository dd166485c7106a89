"""Export a VLA run (``wmrl export``; the core's hook is :meth:`wmrl_vla.plugin.VLAPlugin.export`).

The policy and the world model are rebuilt from the run's config (the architectures the pipeline
builds, see :mod:`wmrl_vla.pipeline`) and filled from the run's last checkpoint, strictly: a key
missing or left over is an error, never a silently random weight. Written:

- ``small_vla``: ``DIR/model.safetensors`` + ``DIR/config.json``; ``SmallVLA.from_pretrained(DIR)``.
- ``lerobot_act``: ``DIR`` is lerobot's own policy folder (``ACTPolicy.from_pretrained(DIR)``: ACT's
  deterministic action, the Gaussian's mean), and ``DIR/gaussian_head.safetensors`` holds the
  learnable ``log_std`` of the bridge's Gaussian; ``DIR/wmrl_bridge.json`` its config.
- ``lerobot_smolvla``: ``DIR`` is lerobot's SmolVLA policy folder with the local SmolVLM
  directory it was built around copied to ``DIR/vlm`` (``vlm_model_name`` points there), plus the
  Gaussian head as above.
- the world model: ``DIR/world_model/{model.safetensors,config.json}``; ``VLADynamics.from_pretrained``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl_vla.config import VLAConfig


def build_policy(cfg: VLAConfig):
    """The run's policy architecture, untrained (the same constructor arguments as the pipeline's)."""
    from wmrl_vla.pipeline import _dims

    if cfg.policy == "lerobot_diffusion":
        raise ValueError(
            "wmrl export does not write a post-trained diffusion policy yet; its weights are the "
            "checkpoint's state['policy'] (DiffusionChainPolicy.load_state_dict)"
        )
    if cfg.policy_path is not None:
        from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

        return PretrainedLeRobotPolicy(cfg.policy_path)
    state_dim, action_dim = _dims(cfg.tasks)
    if cfg.policy == "small_vla":
        from wmrl_vla.policy import SmallVLA, SmallVLAConfig

        return SmallVLA(
            SmallVLAConfig(
                image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim, n_bins=cfg.n_bins,
                d_model=cfg.d_model, n_layers=cfg.n_layers, locator=cfg.locator,
            )
        )  # fmt: skip
    if cfg.policy == "lerobot_act":
        from wmrl_vla.lerobot_bridge import ACTBridgeConfig, ACTGaussianPolicy

        return ACTGaussianPolicy(
            ACTBridgeConfig(image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim,
                            dim_model=cfg.d_model, n_encoder_layers=cfg.n_layers)
        )  # fmt: skip
    if cfg.policy == "lerobot_smolvla":
        from wmrl_vla.pipeline import _key, _policy_fields
        from wmrl_vla.smolvla_bridge import SmolVLAGaussianPolicy

        # Its tokenizer (trained on the demos' instructions) lives in the SFT stage's cached checkpoint.
        path = Path(cfg.cache_dir) / f"sft-{_key(_policy_fields(cfg))}.pt"
        if not path.exists():
            raise FileNotFoundError(
                f"the SmolVLA bridge's tokenizer is in its SFT checkpoint {path}, which is missing; "
                "export on the machine (domain.cache_dir) the run was trained with"
            )
        return SmolVLAGaussianPolicy.load(path, vlm_cache_dir=str(Path(cfg.cache_dir) / "smolvlm"))
    raise ValueError(f"cannot export domain.policy={cfg.policy!r}")


def build_world_model(cfg: VLAConfig):
    from wmrl_vla.pipeline import wm_config
    from world_models.vla_dynamics import VLADynamics

    return VLADynamics(wm_config(cfg))


def _save_gaussian_head(policy, out: Path) -> list[str]:
    from safetensors.torch import save_file

    save_file(
        {"log_std": policy.log_std.detach().clone().contiguous()}, str(out / "gaussian_head.safetensors")
    )
    bridge = {k: v for k, v in asdict(policy.cfg).items() if k != "corpus"}
    (out / "wmrl_bridge.json").write_text(json.dumps({"type": type(policy).__name__, **bridge}, indent=2))
    return ["gaussian_head.safetensors", "wmrl_bridge.json"]


def _export_pretrained(cfg: VLAConfig, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
    """A post-trained lerobot policy folder (:meth:`PretrainedLeRobotPolicy.save_pretrained`)."""
    files = policy.save_pretrained(out)
    kind = policy.lerobot_policy.config.type
    env = cfg.env
    evaluate = (
        f"lerobot-eval --policy.path=DIR --env.type={env.type} --env.task={env.task_name}"
        if env.type is not None
        else "lerobot-eval --policy.path=DIR --env.type=... --env.task=..."
    )
    if env.type is not None:
        from wmrl_vla.lerobot_env import lerobot_image_size

        if cfg.image_size != lerobot_image_size():  # lerobot-eval's MetaWorld env renders only that size
            evaluate = (
                "# lerobot-eval renders MetaWorld at its own size, not the "
                f"{cfg.image_size} px this policy saw: lerobot's eval_policy at {cfg.image_size} px, "
                "episode by episode on the run's evaluation seeds\n"
                "python -m wmrl_vla.lerobot_eval --policy DIR --out episodes.json"
            )
    info = {
        "format": "lerobot policy folder (config.json + model.safetensors + its processors)",
        "library": "lerobot",
        "class": f"lerobot.policies.{kind} ({type(policy.lerobot_policy).__name__})",
        "files": files,
        "load": f"{evaluate}\n"
        "# or: from lerobot.policies.factory import get_policy_class, make_pre_post_processors\n"
        f"policy = get_policy_class('{kind}').from_pretrained(DIR)\n"
        "pre, post = make_pre_post_processors(policy.config, pretrained_path=DIR)",
    }
    notes = [
        f"Post-trained by WMRL from the lerobot policy {policy.path}: its network is the mean of a "
        "diagonal Gaussian (learnable `log_std` in `gaussian_head.safetensors`, ignored by lerobot); "
        "inputs go through the policy's own saved processors. `n_action_steps` is 1: WMRL queried the "
        "policy at every step and executed the first action of each chunk, and so does lerobot with "
        "this folder."
    ]
    if kind == "smolvla":
        notes.append(
            "SmolVLA: WMRL's mean was its flow integrated from noise 0; lerobot samples that noise at "
            "random (pass `noise=torch.zeros(B, chunk_size, max_action_dim)` to `select_action` for "
            "WMRL's mean)."
        )
    return info, notes


def export_vla(
    cfg: VLAConfig, run: RunConfig, state: dict, out: Path, adapter: bool = False
) -> dict[str, Any]:
    if adapter:
        raise ValueError("--adapter applies to LoRA research agents; a VLA run has no adapter")
    policy = build_policy(cfg)
    policy.load_state_dict(state["policy"], strict=True)
    policy.eval()
    notes: list[str] = []
    if cfg.policy_path is not None:
        info, notes = _export_pretrained(cfg, policy, out)
    elif cfg.policy == "small_vla":
        policy.save_pretrained(out)
        info = {
            "format": "safetensors + config.json (huggingface_hub PyTorchModelHubMixin)",
            "library": "wmrl",
            "class": "wmrl_vla.policy.SmallVLA",
            "files": ["model.safetensors", "config.json"],
            "load": "from wmrl_vla.policy import SmallVLA\n"
            "policy = SmallVLA.from_pretrained(DIR).eval()\n"
            "ids = policy.tokenizer.encode([instruction])              # [1, L]\n"
            "bins, logp, action = policy.act(image_chw_uint8[None], state[None], ids, temperature=0)",
        }
    else:
        lr = policy.lerobot_policy
        if cfg.policy == "lerobot_smolvla":
            vlm = Path(lr.config.vlm_model_name)
            shutil.copytree(vlm, out / "vlm", ignore=shutil.ignore_patterns("wmrl_done"))
            lr.config.vlm_model_name = str((out / "vlm").resolve())
        lr.save_pretrained(out)
        files = sorted(
            p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != "README.md"
        )
        files += _save_gaussian_head(policy, out)
        cls = "ACTPolicy" if cfg.policy == "lerobot_act" else "SmolVLAPolicy"
        mod = "act.modeling_act" if cfg.policy == "lerobot_act" else "smolvla.modeling_smolvla"
        info = {
            "format": "lerobot policy folder (config.json + model.safetensors)",
            "library": "lerobot",
            "class": f"lerobot.policies.{mod}.{cls}",
            "files": files,
            "load": f"from lerobot.policies.{mod} import {cls}\n"
            f"policy = {cls}.from_pretrained(DIR)   # the Gaussian's mean network\n"
            "from safetensors.torch import load_file\n"
            "log_std = load_file(f'{DIR}/gaussian_head.safetensors')['log_std']  # the bridge's exploration",
        }
        notes.append(
            "This policy was post-trained through WMRL's lerobot bridge: lerobot's network is the mean "
            "of a diagonal Gaussian whose learnable `log_std` (`gaussian_head.safetensors`) set the "
            "exploration; inputs were unnormalised (images in [0, 1], states and actions as the env gives "
            "them), and actions are sampled as `mean + exp(log_std) * noise`."
        )
        if cfg.policy == "lerobot_smolvla":
            notes.append(
                "`config.json`'s `vlm_model_name` is the absolute path of `vlm/` at export time; after "
                "moving the folder, point it at the new `vlm/`."
            )
    wm = build_world_model(cfg)
    wm.load_state_dict(state["domain"]["world_model"]["model"], strict=True)
    wm.save_pretrained(out / "world_model")
    (out / "world_model" / "README.md").unlink(missing_ok=True)  # the folder's card is DIR/README.md
    world_model = {
        "format": "safetensors + config.json (huggingface_hub PyTorchModelHubMixin)",
        "class": "world_models.vla_dynamics.VLADynamics",
        "files": ["world_model/model.safetensors", "world_model/config.json"],
        "load": "from world_models.vla_dynamics import VLADynamics, instruction_ids\n"
        "wm = VLADynamics.from_pretrained(f'{DIR}/world_model').eval()\n"
        "progress, success = wm.score_actions(init_images, init_states, actions, step_mask,\n"
        "                                     instruction_ids(instructions)"
        + (
            ", goals)  # goals [N, 2]: the named object's table xy at reset"
            if wm.grounded is not None
            else ")"
        )
        + "  # [K, N, T]",
    }
    evaluation = {}
    if cfg.env.type is not None:  # what `python -m wmrl_vla.lerobot_eval --policy DIR` reads
        evaluation = {"evaluation": {
            "env_type": cfg.env.type, "task": cfg.env.task_name, "image_size": cfg.image_size,
            "episode_length": cfg.max_steps or cfg.env.episode_length,
            "episodes": cfg.eval_episodes_per_task, "seeds": "1000000 + 7919 k (WMRL's evaluation)",
        }}  # fmt: skip
    return {
        **evaluation,
        "policy": {"type": cfg.policy if cfg.policy_path is None else "lerobot_pretrained", **info},
        "world_model": world_model,
        "tags": [
            "robotics",
            "vision-language-action",
            "mujoco",
            *(["lerobot"] if cfg.policy != "small_vla" or cfg.policy_path is not None else []),
        ],
        "notes": notes,
        "tasks": list(cfg.tasks),
    }
