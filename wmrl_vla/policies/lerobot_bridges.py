"""``--domain.policy=lerobot_act`` and ``lerobot_smolvla``: lerobot's ACT and SmolVLA, built offline from
the domain config with a learnable Gaussian head (:mod:`wmrl_vla.lerobot_bridge`,
:mod:`wmrl_vla.smolvla_bridge`) and cloned from the demos by max-likelihood. Exported as lerobot's own
policy folder (the Gaussian's mean network) plus ``gaussian_head.safetensors`` (its ``log_std``) and
``wmrl_bridge.json`` (the bridge's config); SmolVLA's folder also holds the local SmolVLM it was built
around (``DIR/vlm``)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from wmrl_vla.policies.base import PolicyKind, register_policy_kind

if TYPE_CHECKING:
    import torch

BRIDGE_NOTE = (
    "This policy was post-trained through WMRL's lerobot bridge: lerobot's network is the mean "
    "of a diagonal Gaussian whose learnable `log_std` (`gaussian_head.safetensors`) set the "
    "exploration; inputs were unnormalised (images in [0, 1], states and actions as the env gives "
    "them), and actions are sampled as `mean + exp(log_std) * noise`."
)


def save_gaussian_head(policy, out: Path) -> list[str]:
    """The bridge's ``log_std`` and config beside lerobot's folder; the files written."""
    from safetensors.torch import save_file

    save_file(
        {"log_std": policy.log_std.detach().clone().contiguous()}, str(out / "gaussian_head.safetensors")
    )
    bridge = {k: v for k, v in asdict(policy.cfg).items() if k != "corpus"}
    (out / "wmrl_bridge.json").write_text(json.dumps({"type": type(policy).__name__, **bridge}, indent=2))
    return ["gaussian_head.safetensors", "wmrl_bridge.json"]


class LeRobotBridge(PolicyKind):
    """What the two bridges share: max-likelihood SFT, lerobot's folder + the Gaussian head."""

    # lerobot's module and class of the mean network
    lerobot_module: ClassVar[str]
    lerobot_class: ClassVar[str]

    def sft_and_save(self, policy, demos: list[dict]):
        """SFT of a lerobot bridge (:func:`wmrl_vla.lerobot_bridge.sft_gaussian`); the checkpoint and its
        per-epoch NLL + seconds are cached at :meth:`cache_path` (``.json`` beside it)."""
        from wmrl_vla.lerobot_bridge import sft_gaussian

        cfg, path = self.cfg, self.cache_path()
        t0 = time.perf_counter()
        nll = sft_gaussian(policy, demos, cfg.sft_epochs, cfg.sft_batch_size, cfg.sft_lr, cfg.demo_seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        policy.save(path)
        path.with_suffix(".json").write_text(
            json.dumps({"nll": nll, "seconds": time.perf_counter() - t0, **self.cache_fields()})
        )
        return policy

    def save_lerobot_folder(self, policy, out: Path) -> None:
        """lerobot's ``save_pretrained`` of the mean network (SmolVLA adds its VLM)."""
        policy.lerobot_policy.save_pretrained(out)

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
        self.save_lerobot_folder(policy, out)
        files = sorted(
            p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != "README.md"
        )
        files += save_gaussian_head(policy, out)
        mod, cls = self.lerobot_module, self.lerobot_class
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
        return info, [BRIDGE_NOTE]


@register_policy_kind
class LeRobotACT(LeRobotBridge):
    """lerobot ACT, random init, with a Gaussian head (see :mod:`wmrl_vla.lerobot_bridge`)."""

    name = "lerobot_act"
    lerobot_module, lerobot_class = "act.modeling_act", "ACTPolicy"

    def build(self):
        from wmrl_vla.demos import task_dims
        from wmrl_vla.lerobot_bridge import ACTBridgeConfig, ACTGaussianPolicy

        cfg = self.cfg
        state_dim, action_dim = task_dims(cfg.tasks)
        return ACTGaussianPolicy(
            ACTBridgeConfig(image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim,
                            dim_model=cfg.d_model, n_encoder_layers=cfg.n_layers)
        )  # fmt: skip

    def prepare(self, demos: list[dict], device: torch.device, accelerator=None, progress: bool = True):
        import torch

        from wmrl_vla.lerobot_bridge import ACTGaussianPolicy

        if self.cache_path().exists():
            return ACTGaussianPolicy.load(self.cache_path()).to(device)
        torch.manual_seed(self.cfg.demo_seed)
        return self.sft_and_save(self.build().to(device), demos)


@register_policy_kind
class LeRobotSmolVLA(LeRobotBridge):
    """lerobot SmolVLA built offline around a tiny random SmolVLM, the instruction fed in, with a
    Gaussian head (see :mod:`wmrl_vla.smolvla_bridge`); cloned by max-likelihood plus its
    flow-matching loss. Its local SmolVLM directory lives under ``cache_dir``. CPU only."""

    name = "lerobot_smolvla"
    lerobot_module, lerobot_class = "smolvla.modeling_smolvla", "SmolVLAPolicy"

    @staticmethod
    def policy_class():
        """The bridge class this kind post-trains."""
        from wmrl_vla.smolvla_bridge import SmolVLAGaussianPolicy

        return SmolVLAGaussianPolicy

    @property
    def vlm_cache(self) -> str:
        return str(Path(self.cfg.cache_dir) / "smolvlm")

    def build(self):
        """The SFT stage's checkpoint: its tokenizer (trained on the demos' instructions) lives there."""
        path = self.cache_path()
        if not path.exists():
            raise FileNotFoundError(
                f"the SmolVLA bridge's tokenizer is in its SFT checkpoint {path}, which is missing; "
                "export on the machine (domain.cache_dir) the run was trained with"
            )
        return self.policy_class().load(path, vlm_cache_dir=self.vlm_cache)

    def prepare(self, demos: list[dict], device: torch.device, accelerator=None, progress: bool = True):
        import torch

        from wmrl.device import DeviceError
        from wmrl_vla.demos import task_dims
        from wmrl_vla.smolvla_bridge import SmolVLABridgeConfig, default_instruction_corpus

        if device.type != "cpu":
            raise DeviceError(
                f"domain.policy={self.name} runs on the CPU only (device={device}); use --device=cpu"
            )
        cfg = self.cfg
        if self.cache_path().exists():
            return self.policy_class().load(self.cache_path(), vlm_cache_dir=self.vlm_cache)
        state_dim, action_dim = task_dims(cfg.tasks)
        corpus = sorted(set(default_instruction_corpus()) | {d["instruction"] for d in demos})
        torch.manual_seed(cfg.demo_seed)
        policy = self.policy_class()(
            SmolVLABridgeConfig(image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim,
                                text_hidden=cfg.d_model, text_layers=max(2, cfg.n_layers), corpus=corpus,
                                vlm_cache_dir=self.vlm_cache)
        )  # fmt: skip
        return self.sft_and_save(policy, demos)

    def save_lerobot_folder(self, policy, out: Path) -> None:
        lr = policy.lerobot_policy
        vlm = Path(lr.config.vlm_model_name)
        shutil.copytree(vlm, out / "vlm", ignore=shutil.ignore_patterns("wmrl_done"))
        lr.config.vlm_model_name = str((out / "vlm").resolve())
        lr.save_pretrained(out)

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
        info, notes = super().export(policy, out)
        notes.append(
            "`config.json`'s `vlm_model_name` is the absolute path of `vlm/` at export time; after "
            "moving the folder, point it at the new `vlm/`."
        )
        return info, notes
