"""SmolVLA's flow-matching chain with an exact log-probability (wmrl_vla.smolvla_bridge.
SmolVLAFlowChainPolicy), built offline around the tiny local SmolVLM, checked against an independent
step-by-step computation with lerobot's own ``denoise_step`` and ``torch.distributions.Normal``."""

import math

import pytest
import torch
from torch.distributions import Normal

from wmrl.domain import RolloutBatch
from wmrl_vla.smolvla_bridge import SmolVLABridgeConfig, SmolVLAFlowChainPolicy

INSTR = ["reach the red target", "touch the blue spot"]
S, A, K = 7, 4, 3


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    torch.manual_seed(0)
    cfg = SmolVLABridgeConfig(
        image_size=32, state_dim=S, action_dim=A, text_hidden=32, vision_hidden=16, patch_size=8,
        corpus=INSTR, tokenizer_vocab=96, vlm_cache_dir=str(tmp_path_factory.mktemp("smolvlm")), num_steps=K,
        flow_sigma=0.4,
    )  # fmt: skip
    return SmolVLAFlowChainPolicy(cfg).eval()


def _obs(policy, b, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (b, 3, 32, 32), generator=g, dtype=torch.uint8)
    return images, torch.randn(b, S, generator=g), policy.tokenizer.encode([INSTR[i % 2] for i in range(b)])


def test_chain_log_prob_equals_step_by_step_normals(policy):
    """(a) The recorded chain's log-prob equals the sum of per-step Normals whose means come from
    lerobot's ``sample_actions`` machinery (``embed_prefix`` + ``denoise_step``) run here directly."""
    from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

    images, states, instr = _obs(policy, 3)
    _, logp, action, chain = policy.act_with_chain(
        images, states, instr, 1.0, torch.Generator().manual_seed(1)
    )
    assert chain.shape == (3, K + 1, 1, A)
    torch.testing.assert_close(action, chain[:, -1, 0])
    m = policy.lerobot_policy.model
    with torch.no_grad():
        imgs, img_masks, lang, lang_masks, state = policy._inputs(images, states, instr)
        embs, pad, att = m.embed_prefix(imgs, img_masks, lang, lang_masks, state=state)
        _, cache = m.vlm_with_expert.forward(
            attention_mask=make_att_2d_masks(pad, att), position_ids=torch.cumsum(pad, 1) - 1,
            past_key_values=None, inputs_embeds=[embs, None], use_cache=m.config.use_cache,
        )  # fmt: skip
        want = Normal(0.0, 1.0).log_prob(chain[:, 0])
        dt = -1.0 / K
        for k in range(K):
            v = m.denoise_step(pad, cache, chain[:, k], torch.full((3,), 1.0 + k * dt))
            want = want + Normal(chain[:, k] + dt * v, 0.4 * math.sqrt(1.0 / K)).log_prob(chain[:, k + 1])
    torch.testing.assert_close(logp, want.sum(1), rtol=1e-5, atol=1e-4)


def test_temperature_zero_is_smolvla_from_zero_noise(policy):
    """The chain of means from zero noise is SmolVLA's own deterministic sample (the Gaussian bridge's mean)."""
    images, states, instr = _obs(policy, 2, seed=2)
    a = policy.act(images, states, instr, 0.0)[2]
    with torch.no_grad():
        torch.testing.assert_close(a, policy.mean(images, states, instr), rtol=1e-5, atol=1e-5)


def test_rescored_chain_gives_ratio_one_and_gradient_raises_it(policy):
    """(b) ratio 1 under unchanged parameters; (c) one SGD step on the advantage-weighted log-prob
    raises it and changes SmolVLA's parameters."""
    n, t = 2, 2
    images, states, instr = _obs(policy, n * t, seed=3)
    instr = instr.view(n, t, -1)[:, 0].repeat_interleave(t, 0)  # one instruction per rollout
    _, logp, _, chains = policy.act_with_chain(images, states, instr, 1.0, torch.Generator().manual_seed(4))
    batch = RolloutBatch(
        tokens=torch.zeros(n, t * A, dtype=torch.long),
        logprobs=logp.view(n, t * A),
        mask=torch.ones(n, t * A),
        group_ids=torch.zeros(n, dtype=torch.long),
        tasks=[None],
        extras={
            "images": images.view(n, t, 3, 32, 32),
            "states": states.view(n, t, S),
            "instr": instr.view(n, t, -1)[:, 0],
            "chains": chains.view(n, t, K + 1, 1, A),
        },
    )
    new = policy.log_probs(batch)
    ratio = torch.exp(new - batch.logprobs)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)
    adv = torch.tensor([1.0, -1.0])
    trainable = [p for p in policy.parameters() if p.requires_grad]
    w0 = [p.detach().clone() for p in trainable]
    before = (adv[:, None] * new).sum()
    opt = torch.optim.SGD(trainable, lr=1e-3)
    opt.zero_grad()
    (-before).backward()
    opt.step()
    with torch.no_grad():
        after = (adv[:, None] * policy.log_probs(batch)).sum()
    assert float(after) > float(before.detach())
    assert any(not torch.equal(a, b) for a, b in zip(w0, trainable, strict=True))
