"""grpo_update's clipping diagnostics: ratio clipping on anchor rows and on WM rows apart, and how
often the gradient norm was clipped (issue: ppi's anchor rows carry advantages up to N/n larger)."""

import math

import torch

from wmrl.config import GRPOConfig
from wmrl.domain import RolloutBatch
from wmrl.learner import grpo_update
from wmrl.toy import SoftmaxPolicy


def _batch(n_groups=4, g=4):
    ctx = torch.arange(n_groups).repeat_interleave(g)
    tokens = torch.randint(3, (n_groups * g, 1), generator=torch.Generator().manual_seed(0))
    return RolloutBatch(
        tokens=tokens,
        logprobs=torch.full((n_groups * g, 1), math.log(1 / 3)),
        mask=torch.ones(n_groups * g, 1),
        group_ids=ctx.clone(),
        tasks=list(range(n_groups)),
        extras={"context": ctx},
    )


def test_clip_fractions_of_anchor_and_wm_rows_and_the_share_of_clipped_gradients():
    """Anchor rows sampled by an older policy (ratio 2) are all clipped, the others (ratio 1) never:
    the two fractions are 1 and 0 and the overall one is their token-weighted mix."""
    batch = _batch()
    anchor = batch.group_ids < 1  # one anchor group of four
    batch.logprobs = torch.where(anchor[:, None], batch.logprobs - math.log(2.0), batch.logprobs)
    adv = torch.linspace(-1, 1, 16)
    used = torch.ones(16, dtype=torch.bool)
    cfg = GRPOConfig(group_size=4, tasks_per_step=4, optimizer="sgd", lr=1e-9, max_grad_norm=1e-6)
    policy = SoftmaxPolicy(4, 3)
    out = grpo_update(
        policy, torch.optim.SGD(policy.parameters(), lr=cfg.lr), batch, adv, used, cfg, anchor=anchor
    )
    assert out["loss/clip_frac_anchor"] == 1.0 and out["loss/clip_frac_wm"] == 0.0
    assert out["loss/clip_frac"] == 0.25 and out["loss/grad_clipped"] == 1.0
    cfg.max_grad_norm = 1e6
    out = grpo_update(policy, torch.optim.SGD(policy.parameters(), lr=cfg.lr), batch, adv, used, cfg)
    assert out["loss/grad_clipped"] == 0.0 and "loss/clip_frac_anchor" not in out
