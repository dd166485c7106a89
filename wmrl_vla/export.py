"""Export a VLA run (``wmrl export``; the core's hook is :meth:`wmrl_vla.plugin.VLAPlugin.export`).

The policy and the world model are rebuilt from the run's config (the architectures the pipeline
builds: the policy's registered kind, :mod:`wmrl_vla.policies`, and :func:`wmrl_vla.pipeline.wm_config`) and filled from the run's last checkpoint, strictly: a key
missing or left over is an error, never a silently random weight. Written:

- ``small_vla``: ``DIR/model.safetensors`` + ``DIR/config.json``; ``SmallVLA.from_pretrained(DIR)``.
- ``lerobot_act``: ``DIR`` is lerobot's own policy folder (``ACTPolicy.from_pretrained(DIR)``: ACT's
  deterministic action, the Gaussian's mean), and ``DIR/gaussian_head.safetensors`` holds the
  learnable ``log_std`` of the bridge's Gaussian; ``DIR/wmrl_bridge.json`` its config.
- ``lerobot_smolvla``: ``DIR`` is lerobot's SmolVLA policy folder with the local SmolVLM
  directory it was built around copied to ``DIR/vlm`` (``vlm_model_name`` points there), plus the
  Gaussian head as above.
- ``lerobot_diffusion``: refused (its weights are the checkpoint's ``state['policy']``).
- the world model: ``DIR/world_model/{model.safetensors,config.json}``; ``VLADynamics.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from wmrl_vla.policies import policy_kind

if TYPE_CHECKING:
    from wmrl.config import RunConfig
    from wmrl_vla.config import VLAConfig


def build_world_model(cfg: VLAConfig):
    from wmrl_vla.pipeline import wm_config
    from world_models.vla_dynamics import VLADynamics

    return VLADynamics(wm_config(cfg))


def export_vla(
    cfg: VLAConfig, run: RunConfig, state: dict, out: Path, adapter: bool = False
) -> dict[str, Any]:
    if adapter:
        raise ValueError("--adapter applies to LoRA research agents; a VLA run has no adapter")
    kind = policy_kind(cfg)  # its module says what it writes (wmrl_vla/policies/)
    if kind.export_refused is not None:
        raise ValueError(kind.export_refused)
    policy = kind.build()
    policy.load_state_dict(state["policy"], strict=True)
    policy.eval()
    info, notes = kind.export(policy, out)
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
        "policy": {"type": kind.export_type, **info},
        "world_model": world_model,
        "tags": [
            "robotics",
            "vision-language-action",
            "mujoco",
            *(["lerobot"] if kind.lerobot else []),
        ],
        "notes": notes,
        "tasks": list(cfg.tasks),
    }
