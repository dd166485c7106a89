"""``--domain.policy=small_vla``: :class:`wmrl_vla.policy.SmallVLA` (discretised action tokens), trained
from scratch by behaviour cloning (plus DAgger rounds, ``domain.dagger_rounds``), exported as
``DIR/model.safetensors`` + ``DIR/config.json`` (``SmallVLA.from_pretrained(DIR)``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wmrl_vla.policies.base import PolicyKind, register_policy_kind

if TYPE_CHECKING:
    import torch

    from wmrl_vla.sft import SFTConfig


@register_policy_kind
class SmallVLAKind(PolicyKind):
    name = "small_vla"
    lerobot = False
    reads_latent = True
    sft_data_parallel = True

    def cache_fields(self) -> dict[str, Any]:
        cfg = self.cfg
        fields = super().cache_fields()
        # only non-default extras, which keeps the keys of plain-BC caches
        fields.update({k: getattr(cfg, k) for k in ("sft_shift", "sft_aux_goal") if getattr(cfg, k)})
        if not cfg.locator:
            fields["locator"] = False
        if cfg.dagger_rounds > 0:
            fields.update(dagger_rounds=cfg.dagger_rounds, dagger_episodes_per_task=cfg.dagger_episodes_per_task,
                          dagger_epochs=cfg.dagger_epochs)  # fmt: skip
        return fields

    def build(self):
        from wmrl_vla.demos import task_dims
        from wmrl_vla.policy import SmallVLA, SmallVLAConfig

        cfg = self.cfg
        state_dim, action_dim = task_dims(cfg.tasks)
        return SmallVLA(
            SmallVLAConfig(
                image_size=cfg.image_size, state_dim=state_dim, action_dim=action_dim, n_bins=cfg.n_bins,
                d_model=cfg.d_model, n_layers=cfg.n_layers, locator=cfg.locator,
            )
        )  # fmt: skip

    def sft_config(self, dagger_round: int | None = None) -> SFTConfig:
        """Behaviour cloning's settings; with ``dagger_round`` those of that DAgger round's fine-tuning
        (``dagger_epochs`` at half the learning rate, no image shift)."""
        from wmrl_vla.sft import SFTConfig

        cfg = self.cfg
        if dagger_round is None:
            return SFTConfig(epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr, seed=cfg.demo_seed,
                             shift=cfg.sft_shift, aux_goal=cfg.sft_aux_goal)  # fmt: skip
        return SFTConfig(epochs=cfg.dagger_epochs, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr / 2,
                         seed=cfg.demo_seed + 1 + dagger_round,
                         aux_goal=cfg.sft_aux_goal if cfg.locator else 0.0)  # fmt: skip

    def prepare(self, demos: list[dict], device: torch.device, accelerator=None, progress: bool = True):
        """Behaviour cloning (data-parallel with an ``accelerator``: every process of the run calls
        this, :func:`wmrl_vla.sft.sft`; the main process alone writes the cache), then DAgger."""
        import torch

        from wmrl_vla.demos import DAGGER_SEED0, dagger_records, label_goals, mean_success
        from wmrl_vla.policy import SmallVLA
        from wmrl_vla.sft import sft

        cfg, path = self.cfg, self.cache_path()
        if path.exists():
            return SmallVLA.load(path).to(device)
        torch.manual_seed(cfg.demo_seed)
        policy = self.build().to(device)
        t0 = time.perf_counter()
        if cfg.locator and cfg.sft_aux_goal > 0:
            demos = label_goals(list(demos), split=cfg.demo_split)
        hist = sft(policy, demos, self.sft_config(), progress=progress, accelerator=accelerator)
        relabelled: list[dict] = []
        for r in range(cfg.dagger_rounds):
            new = dagger_records(policy, cfg.tasks, cfg.dagger_episodes_per_task, cfg.image_size,
                                 DAGGER_SEED0 + 1000 * r, max_steps=cfg.max_steps)  # fmt: skip
            hist.setdefault("dagger_success", []).append(float(mean_success(new)))
            relabelled += new
            h = sft(policy, list(demos) + relabelled, self.sft_config(dagger_round=r), progress=progress,
                    accelerator=accelerator)  # fmt: skip
            hist.setdefault("dagger_accuracy", []).append(h["accuracy"][-1])
        if accelerator is None or accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            policy.save(path)
            path.with_suffix(".json").write_text(
                json.dumps({**hist, "seconds": time.perf_counter() - t0, **self.cache_fields()})
            )
        if accelerator is not None:
            accelerator.wait_for_everyone()
        return policy

    def export(self, policy, out: Path) -> tuple[dict[str, Any], list[str]]:
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
        return info, []
