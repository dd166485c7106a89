"""``--domain.policy=lerobot_diffusion``: lerobot's DiffusionPolicy, post-trained by GRPO through the
log-probability of its denoising chain (:class:`wmrl_vla.diffusion_bridge.DiffusionChainPolicy`).

Either small, random init, built from the domain config and cloned from the demos with its own
diffusion loss (:func:`wmrl_vla.diffusion_bridge.train_bc`), or the user's lerobot diffusion folder
(``domain.policy_path``, whose ``type`` is ``diffusion``: the config sets ``domain.policy`` to this
kind), post-trained as is through its saved processors. ``wmrl export`` does not write it yet."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wmrl.config import ConfigError
from wmrl_vla.policies.base import PolicyKind, register_policy_kind

if TYPE_CHECKING:
    import torch


@register_policy_kind
class LeRobotDiffusion(PolicyKind):
    name = "lerobot_diffusion"
    folder_type = "diffusion"
    records_chain = True
    export_refused = (
        "wmrl export does not write a post-trained diffusion policy yet; its weights are the "
        "checkpoint's state['policy'] (DiffusionChainPolicy.load_state_dict)"
    )

    @classmethod
    def check_folder(cls, config, path) -> None:
        """WMRL feeds one observation per step: a folder conditioned on more is refused."""
        from wmrl_vla.lerobot_policy import PolicyPathError

        if config.n_obs_steps != 1:
            raise PolicyPathError(
                f"domain.policy_path={path} is a diffusion policy conditioned on "
                f"n_obs_steps={config.n_obs_steps} observations; WMRL feeds one per step (train it with "
                "--policy.n_obs_steps=1)"
            )

    def cache_fields(self) -> dict[str, Any]:
        """A folder's fields are the pretrained kind's (the folder and its stamp); else the SFT's."""
        if self.cfg.policy_path is not None:
            from wmrl_vla.policies.lerobot_pretrained import LeRobotPretrained

            return LeRobotPretrained(self.cfg).cache_fields()
        return super().cache_fields()

    def build(self):
        """The user's folder (``domain.policy_path``), or the small policy of the domain config."""
        from wmrl_vla.demos import task_dims
        from wmrl_vla.diffusion_bridge import DiffusionBridgeConfig, DiffusionChainPolicy

        cfg = self.cfg
        chain = cfg.chain.bridge_fields()  # how the chain is executed and scored (domain.chain)
        with _as_config_error():
            if cfg.policy_path is not None:
                return DiffusionChainPolicy.from_folder(cfg.policy_path, **chain)
            state_dim, action_dim = task_dims(cfg.tasks)
            return DiffusionChainPolicy.from_config(
                DiffusionBridgeConfig(
                    image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim, **chain
                )
            )

    def prepare(self, demos: list[dict], device: torch.device, accelerator=None, progress: bool = True):
        """A folder as is; else cloned with its diffusion loss for ``sft_epochs`` passes' worth of
        ``sft_batch_size`` minibatches, cached at :meth:`cache_path` (its loss and seconds beside it)."""
        import numpy as np
        import torch

        from wmrl_vla.diffusion_bridge import DiffusionChainPolicy, train_bc

        cfg, path = self.cfg, self.cache_path()
        if cfg.policy_path is None and path.exists():  # the clone, executed and scored as domain.chain says
            with _as_config_error():
                return DiffusionChainPolicy.load(path, **cfg.chain.bridge_fields()).to(device)
        torch.manual_seed(cfg.demo_seed)
        policy = self.build()
        if cfg.policy_path is not None:
            return policy.to(device)
        t0 = time.perf_counter()
        frames = sum(len(np.asarray(d.get("action", d.get("actions")))) for d in demos)
        steps = cfg.sft_epochs * max(1, -(-frames // cfg.sft_batch_size))
        loss = train_bc(policy, demos, steps, cfg.sft_batch_size, cfg.sft_lr, cfg.demo_seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        policy.save(path)
        path.with_suffix(".json").write_text(
            json.dumps({"loss": loss, "seconds": time.perf_counter() - t0, **self.cache_fields()})
        )
        return policy.to(device)

    def words(self) -> str:
        if self.cfg.policy_path is not None:
            return f"your policy ({self.cfg.policy_path})"
        return super().words()

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
        raise ValueError(self.export_refused)


@contextmanager
def _as_config_error():
    """A ``domain.chain`` setting the policy cannot take (``act_steps`` beyond its chunk horizon,
    ``ft_denoising_steps`` beyond its denoising steps) as one line naming the setting."""
    try:
        yield
    except ValueError as e:
        if str(e).startswith(("act_steps=", "ft_denoising_steps=")):
            raise ConfigError(f"domain.chain.{e}") from None
        raise
