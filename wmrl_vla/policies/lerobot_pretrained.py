"""``--domain.policy_path=DIR``: a policy the user trained with lerobot (ACT or SmolVLA), post-trained as
is (no SFT) through its own saved processors (:class:`wmrl_vla.lerobot_policy.PretrainedLeRobotPolicy`),
exported as a lerobot policy folder ``lerobot-eval`` runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from wmrl_vla.policies.base import POLICY_ARCH, PolicyKind

if TYPE_CHECKING:
    import torch


class LeRobotPretrained(PolicyKind):
    """Not a ``domain.policy`` choice: ``domain.policy_path`` selects it (see the package docstring)."""

    name = "lerobot_pretrained"

    @property
    def path(self) -> str:
        """The user's policy folder (or hub id): ``domain.policy_path``."""
        if self.cfg.policy_path is None:
            raise ValueError("the lerobot_pretrained policy kind needs domain.policy_path")
        return self.cfg.policy_path

    def cache_fields(self) -> dict[str, Any]:
        """No SFT fields: the folder (and its modification stamp) is the policy."""
        from wmrl_vla.demos import demo_fields
        from wmrl_vla.lerobot_policy import folder_stamp

        return {**demo_fields(self.cfg), "policy_path": str(self.path), "policy_stamp": folder_stamp(self.path),
                "arch": POLICY_ARCH}  # fmt: skip

    def build(self):
        from wmrl_vla.lerobot_policy import PretrainedLeRobotPolicy

        return PretrainedLeRobotPolicy(self.path)

    def prepare(self, demos: list[dict], device: torch.device, accelerator=None, progress: bool = True):
        return self.build().to(device)

    def words(self) -> str:
        """The user's own lerobot policy, which WMRL never fine-tuned by SFT."""
        return f"your policy ({self.path})"

    def lerobot_eval_command(self) -> str:
        """How ``lerobot-eval`` (or, at an image size its env does not render, WMRL's own evaluation
        through lerobot, :mod:`wmrl_vla.lerobot_eval`) runs the exported folder ``DIR``."""
        cfg, env = self.cfg, self.cfg.env
        if env.type is None:
            return "lerobot-eval --policy.path=DIR --env.type=... --env.task=..."
        from wmrl_vla.lerobot_env import lerobot_image_size

        if cfg.image_size != lerobot_image_size():  # lerobot-eval's MetaWorld env renders only that size
            return (
                "# lerobot-eval renders MetaWorld at its own size, not the "
                f"{cfg.image_size} px this policy saw: lerobot's eval_policy at {cfg.image_size} px, "
                "episode by episode on the run's evaluation seeds\n"
                "python -m wmrl_vla.lerobot_eval --policy DIR --out episodes.json"
            )
        return f"lerobot-eval --policy.path=DIR --env.type={env.type} --env.task={env.task_name}"

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
        """A post-trained lerobot policy folder (:meth:`PretrainedLeRobotPolicy.save_pretrained`)."""
        files = policy.save_pretrained(out)
        kind = policy.lerobot_policy.config.type
        info = {
            "format": "lerobot policy folder (config.json + model.safetensors + its processors)",
            "library": "lerobot",
            "class": f"lerobot.policies.{kind} ({type(policy.lerobot_policy).__name__})",
            "files": files,
            "load": f"{self.lerobot_eval_command()}\n"
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
