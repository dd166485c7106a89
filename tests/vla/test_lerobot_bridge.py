import numpy as np
import pytest
import torch

from wmrl.domain import RolloutBatch
from wmrl_vla.lerobot_bridge import ACTBridgeConfig, ACTGaussianPolicy, sft_gaussian

CFG = ACTBridgeConfig(image_size=32, state_dim=7, action_dim=4, dim_model=32, n_heads=2, dim_feedforward=64)


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return ACTGaussianPolicy(CFG)


def _batch(n=2, t=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, t, 3, 32, 32), generator=g, dtype=torch.uint8)
    states = torch.randn(n, t, 7, generator=g)
    actions = torch.randn(n, t, 4, generator=g).clamp(-1, 1)
    mask = torch.ones(n, t * 4)
    if n > 1:
        mask[1, 8:] = 0  # rollout 1 has 2 steps
    return RolloutBatch(
        tokens=torch.zeros(n, t * 4, dtype=torch.long),
        logprobs=torch.zeros(n, t * 4),
        mask=mask,
        group_ids=torch.zeros(n, dtype=torch.long),
        tasks=[None],
        extras={"images": images, "states": states, "actions": actions},
    )


def test_uses_lerobot_act(policy):
    from lerobot.policies.act.modeling_act import ACTPolicy

    assert isinstance(policy.lerobot_policy, ACTPolicy)
    assert policy.lerobot_policy.config.pretrained_backbone_weights is None


def test_log_probs_match_torch_normal(policy):
    batch = _batch()
    lp = policy.log_probs(batch)
    assert lp.shape == (2, 12)
    ex = batch.extras
    for i in range(2):
        for s in range(3):
            if batch.mask[i, s * 4] == 0:
                assert (lp[i, s * 4 : s * 4 + 4] == 0).all()
                continue
            mu = policy.mean(ex["images"][i, s : s + 1], ex["states"][i, s : s + 1])[0]
            dist = torch.distributions.Normal(mu, policy.log_std.exp())
            assert torch.allclose(lp[i, s * 4 : s * 4 + 4], dist.log_prob(ex["actions"][i, s]), atol=1e-5)
    # differentiable in both the ACT mean network and the log std
    lp[batch.mask.bool()].sum().backward()
    assert policy.log_std.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.lerobot_policy.parameters())
    policy.zero_grad()


def test_act_samples_with_temperature(policy):
    batch = _batch(n=1, t=1)
    img = batch.extras["images"][0].expand(500, -1, -1, -1)
    st = batch.extras["states"][0].expand(500, -1)
    instr = policy.tokenizer.encode(["reach the red target"] * 500)
    tokens, lp, a = policy.act(img, st, instr, 1.0, torch.Generator().manual_seed(0))
    mu = policy.mean(img[:1], st[:1])[0].detach()
    assert tokens.dtype == torch.long and (tokens == 0).all()
    assert torch.allclose(
        lp, torch.distributions.Normal(mu, policy.log_std.exp().detach()).log_prob(a), atol=1e-5
    )
    std1 = (a - mu).std(0)
    _, _, a2 = policy.act(img, st, instr, 0.5, torch.Generator().manual_seed(0))
    assert torch.allclose((a2 - mu).std(0), 0.5 * std1, rtol=1e-3)
    _, _, a0 = policy.act(img[:2], st[:2], instr[:2], 0.0)
    assert torch.allclose(a0, mu.expand(2, -1), atol=1e-5)


def test_sft_gaussian_lowers_nll():
    torch.manual_seed(0)
    pol = ACTGaussianPolicy(CFG)
    g = np.random.default_rng(0)
    recs = [
        {
            "observation.image": g.integers(0, 255, (6, 32, 32, 3), dtype=np.uint8),
            "observation.state": g.normal(size=(6, 7)).astype(np.float32),
            "action": np.tile([[0.5, -0.5, 0.2, -1.0]], (6, 1)).astype(np.float32),
            "next.reward": np.zeros(6, np.float32),
            "next.success": np.zeros(6, bool),
            "instruction": "reach the red target",
        }
        for _ in range(2)
    ]
    hist = sft_gaussian(pol, recs, epochs=6, batch_size=12, lr=3e-3)
    assert hist[-1] < hist[0] - 0.5
