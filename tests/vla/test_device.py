"""`--device` in the VLA domain: the policy (after SFT), the KL reference, the world model and the
optimizer state live on the configured device, and every batch the learner sees is there too."""

import torch

import wmrl.trainer as trainer_mod
from wmrl.config import load_config
from wmrl.device import resolve_device
from wmrl.trainer import Trainer


def record_update_devices(monkeypatch) -> list[set]:
    """Wrap the trainer's grpo_update (the real one still runs) to record its tensors' devices."""
    seen: list[set] = []
    real = trainer_mod.grpo_update

    def recording(policy, optimizer, batch, adv, used, *args, **kwargs):
        tensors = [
            batch.tokens,
            batch.logprobs,
            batch.mask,
            batch.group_ids,
            adv,
            used,
            *batch.extras.values(),
        ]
        seen.append({t.device for t in tensors})
        return real(policy, optimizer, batch, adv, used, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "grpo_update", recording)
    return seen


def assert_on(device: torch.device, *modules: torch.nn.Module) -> None:
    for m in modules:
        assert {p.device for p in m.parameters()} | {b.device for b in m.buffers()} == {device}, type(m)


def test_models_and_update_batches_are_on_the_configured_device(vla_debug, tmp_path, monkeypatch):
    _, _, root = vla_debug
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={tmp_path / 'run'}", f"--domain.cache_dir={root / 'cache'}", "--device=auto",
         "--grpo.steps=1", "--grpo.kl_coef=0.1", "--domain.record_anchors=false", "--tracking.eval_every=1"],
    )  # fmt: skip
    want = resolve_device(cfg.device)
    domain = cfg.domain.build(cfg)
    try:
        seen = record_update_devices(monkeypatch)
        trainer = Trainer(cfg, domain)
        last = trainer.train()
        assert seen and all(s == {want} for s in seen)
        assert_on(want, domain.policy, trainer.reference, domain.world_model.model)
        states = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        assert states and {v.device for v in states if v.dim() > 0} == {want}
        assert "eval/success" in last  # evaluation ran the policy on that device
    finally:
        domain.close()
