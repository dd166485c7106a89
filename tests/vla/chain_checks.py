"""What the chain policies' tests share (tests/vla/test_diffusion_bridge.py, test_smolvla_chain.py):
real simulator rollouts of a chain policy collated into the batch GRPO sees, its re-scoring, and one
GRPO update through the core's loss (:func:`wmrl.learner.grpo_update`)."""

from __future__ import annotations

from dataclasses import replace

import torch

from wmrl.config import GRPOConfig
from wmrl.domain import RolloutBatch
from wmrl.learner import grpo_update, make_optimizer


def sim_chain_batch(
    policy, task_id: str, seeds: list[int], image_size: int, max_steps: int, seed: int = 0
) -> RolloutBatch:
    """Roll ``policy`` out in the real simulator (``task_id`` from each of ``seeds``, at most
    ``max_steps`` steps) through the domain's own actor, and collate the rollouts, one group, into the
    batch the trainer updates on. Every rollout must carry one chain per step it took."""
    from wmrl_vla.batch import collate, sim_payload
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    pool = EnvPool(image_size, max_steps=max_steps)
    try:
        actor = policy_actor(policy, 1.0, torch.Generator().manual_seed(seed))
        rollouts = run_episodes(actor, [(task_id, s) for s in seeds], pool)
    finally:
        pool.close()
    for r in rollouts:
        assert r.chains is not None and len(r.chains) == r.length, "a rollout lost its chains"
    return collate([sim_payload(r) for r in rollouts], [None], len(seeds), image_size, policy.tokenizer)


def rescored_ratio(policy, batch: RolloutBatch) -> torch.Tensor:
    """``[real tokens]`` the ratio ``exp(log p_now - log p_recorded)`` of every real token of ``batch``
    re-scored under ``policy``'s current parameters (padded tokens must score 0)."""
    with torch.no_grad():
        new = policy.log_probs(batch)
    assert torch.all(new[batch.mask == 0] == 0), "a padded token has a log-prob"
    return torch.exp(new - batch.logprobs)[batch.mask > 0]


def rollout_log_probs(policy, batch: RolloutBatch) -> torch.Tensor:
    """``[N]`` each rollout's chains' log-density (its real tokens' log-probs summed), no gradient."""
    with torch.no_grad():
        return (policy.log_probs(batch) * batch.mask).sum(1)


def one_grpo_step(policy, batch: RolloutBatch, advantages: torch.Tensor, lr: float) -> dict[str, float]:
    """One optimizer step of the core's GRPO update (clipped token loss, gradient clipping) on
    ``batch`` with the given per-rollout ``advantages`` ``[N]``: plain SGD at ``lr``, one epoch,
    one minibatch, every rollout used. Returns the update's diagnostics."""
    cfg = replace(GRPOConfig(), optimizer="sgd", lr=lr, epochs=1, minibatches=1)
    params = [p for p in policy.parameters() if p.requires_grad]
    used = torch.ones(len(advantages), dtype=torch.bool)
    return grpo_update(policy, make_optimizer(params, cfg), batch, advantages, used, cfg)
