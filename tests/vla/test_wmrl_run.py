"""A short WMRL run through the shared trainer improves the policy's reward in the real simulator."""

import numpy as np
import pytest
import torch

from wmrl.config import load_config
from wmrl.trainer import Trainer
from wmrl_vla.rollout import policy_actor, run_episodes


def _real_reward(domain, specs):
    """Mean reward of the sampling policy on fixed (task, seed) pairs, same random stream each time."""
    actor = policy_actor(domain.policy, 1.0, torch.Generator().manual_seed(7))
    return float(np.mean([r.reward for r in run_episodes(actor, specs, domain.pool, "train")]))


@pytest.mark.slow
def test_short_wmrl_run_improves_the_training_reward(vla_debug, tmp_path):
    _, _, root = vla_debug
    cfg = load_config(
        "vla-debug",
        [
            f"--out_dir={tmp_path / 'run'}",
            f"--domain.cache_dir={root / 'cache'}",  # reuse the session's demos, SFT and WM
            "--grpo.steps=12",
            "--grpo.tasks_per_step=4",
            "--grpo.group_size=8",
            "--grpo.lr=0.01",
            "--anchors.fraction=0.5",
            "--domain.temperature=2.0",  # explore: the debug SFT policy saw 3 demos for 1 epoch
            "--domain.record_anchors=false",
        ],
    )
    domain = cfg.domain.build(cfg)
    specs = [("wmrl/ReachColor-v0", s) for s in range(100, 108) for _ in range(8)]
    before = _real_reward(domain, specs)
    params = [p.detach().clone() for p in domain.policy.parameters()]
    trainer = Trainer(cfg, domain)
    last = trainer.train()
    after = _real_reward(domain, specs)
    assert last["exec/real_total"] > 0 and last["anchors/fraction"] > 0
    assert last["domain/sim_steps"] == domain.sim_steps > 0  # real simulator steps, logged per step
    assert any(not torch.equal(a, b) for a, b in zip(params, domain.policy.parameters(), strict=True))
    # measured with seeds 0, 1, 2: +0.074, +0.031, +0.065 on a start of 0.045
    assert after > before + 0.015, (before, after)
    assert last["wm/episodes"] > 0  # the world model was refined on anchor rollouts
    domain.close()


def test_a_resumed_wmrl_run_ends_as_an_uninterrupted_one(vla_debug, tmp_path):
    """4 steps in one go, and 2 steps then a resume to 4 in a fresh domain: the same policy and WM
    (the WM's replay holds the first steps' anchors after the resume too)."""
    _, _, root = vla_debug

    def trainer(out, steps, resume=False):
        cfg = load_config(
            "vla-debug",
            [f"--out_dir={tmp_path / out}", f"--domain.cache_dir={root / 'cache'}", f"--grpo.steps={steps}",
             "--grpo.tasks_per_step=2", "--grpo.group_size=4", "--anchors.fraction=0.5",
             "--domain.record_anchors=false", "--domain.n_videos=0", "--tracking.eval_every=0"],
        )  # fmt: skip
        return Trainer(cfg, cfg.domain.build(cfg), resume=resume)

    ref = trainer("ref", 4)
    ref.train()
    trainer("run", 2).train()
    resumed = trainer("run", 4, resume=True)
    resumed.train()
    wm_ref, wm_run = ref.domain.world_model, resumed.domain.world_model
    assert wm_run.n_updates == wm_ref.n_updates == 4 and len(wm_run.episodes) == len(wm_ref.episodes)
    for a, b in [(ref.policy, resumed.policy), (wm_ref.model, wm_run.model)]:
        for (k, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(x, y), k
    ref.domain.close()
    resumed.domain.close()
