"""SmolVLA's flow-matching chain with an exact log-probability (wmrl_vla.smolvla_bridge.
SmolVLAFlowChainPolicy), built offline around the tiny local SmolVLM, checked against an independent
step-by-step computation with lerobot's own ``denoise_step`` and ``torch.distributions.Normal``; and
the policy the ``lerobot_smolvla_chain`` kind builds from a VLA domain config, rolled out in the real
simulator and updated by the core's GRPO step (the shared checks in ``chain_checks.py``)."""

import copy
import math

import pytest
import torch
from chain_checks import one_grpo_step, rescored_ratio, rollout_log_probs, sim_chain_batch
from torch.distributions import Normal

from wmrl.config import load_config
from wmrl.domain import RolloutBatch
from wmrl_vla.policies import policy_kind
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


@pytest.fixture(scope="module")
def kind_policy(tmp_path_factory):
    """(domain config, policy) as the pipeline makes them: vla-debug (one of our MuJoCo tasks, 32 px)
    with ``domain.policy=lerobot_smolvla_chain``, its expert demos recorded and cloned by the kind's
    ``prepare`` (the SFT checkpoint cached in the domain's cache_dir)."""
    from wmrl_vla.pipeline import prepare_demos

    root = tmp_path_factory.mktemp("smolvla-chain-kind")
    over = [f"--domain.cache_dir={root}", "--domain.policy=lerobot_smolvla_chain"]
    cfg = load_config("vla-debug", over).domain
    demos = prepare_demos(cfg, progress=False)
    return cfg, policy_kind(cfg).prepare(demos, torch.device("cpu"), progress=False)


@pytest.fixture(scope="module")
def kind_batch(kind_policy):
    """Two real rollouts (3 steps at most) of the kind's policy, collated into one group."""
    cfg, pol = kind_policy
    return sim_chain_batch(pol, cfg.tasks[0], [0, 1], cfg.image_size, max_steps=3)


def test_the_kind_builds_the_chain_policy_of_the_domain_config(kind_policy):
    """prepare clones (lerobot_smolvla's SFT: Gaussian NLL of the mean + flow-matching loss) and
    caches SmolVLAFlowChainPolicy at the task's dims; build (wmrl export's path) loads that checkpoint
    back as the same chain policy."""
    import json

    from wmrl_vla.demos import task_dims

    cfg, pol = kind_policy
    kind = policy_kind(cfg)
    assert type(pol) is SmolVLAFlowChainPolicy and pol.records_chain
    assert (pol.cfg.image_size, pol.cfg.state_dim, pol.cfg.action_dim) == (
        cfg.image_size,
        *task_dims(cfg.tasks),
    )
    assert pol.cfg.text_hidden == cfg.d_model
    sft = json.loads(kind.cache_path().with_suffix(".json").read_text())
    assert len(sft["nll"]) == cfg.sft_epochs and math.isfinite(sft["nll"][-1]) and sft["policy"] == kind.name
    again = kind.build()
    assert type(again) is SmolVLAFlowChainPolicy
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in pol.state_dict().items())


def test_the_kind_policy_carries_its_chains_from_the_simulator_and_rescores_them(kind_policy, kind_batch):
    """(b) Real rollouts carry their chains into the batch, and re-scoring that batch under unchanged
    parameters gives ratio 1 on every real token."""
    _, pol = kind_policy
    k, a, ex = pol.cfg.num_steps, pol.cfg.action_dim, kind_batch.extras
    assert ex["chains"].shape == (2, kind_batch.mask.shape[1] // a, k + 1, 1, a)
    steps = ex["step_mask"] > 0
    torch.testing.assert_close(ex["chains"][:, :, -1, 0][steps], ex["actions"][steps])  # each chain's end
    ratio = rescored_ratio(pol, kind_batch)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)


def test_one_grpo_step_on_the_kind_policy_raises_the_positive_advantage_chains(kind_policy, kind_batch):
    """(c) One update of the core's GRPO loss on that batch (rollout 0 advantage +1, rollout 1 -1)
    changes SmolVLA's parameters, raises rollout 0's chains' log-density and lowers rollout 1's."""
    pol = copy.deepcopy(kind_policy[1])
    before = rollout_log_probs(pol, kind_batch)
    w0 = {n: p.detach().clone() for n, p in pol.named_parameters() if p.requires_grad}
    stats = one_grpo_step(pol, kind_batch, torch.tensor([1.0, -1.0]), lr=1e-2)
    assert stats["loss/optimizer_steps"] == 1 and stats["loss/clip_frac"] == 0  # ratio 1 when it starts
    after = rollout_log_probs(pol, kind_batch)
    assert float(after[0]) > float(before[0]) and float(after[1]) < float(before[1]), (before, after)
    changed = {n for n, p in pol.named_parameters() if n in w0 and not torch.equal(p, w0[n])}
    assert any("lm_expert" in n for n in changed) and any("vision_model" in n for n in changed)
    assert "log_std" not in changed  # the Gaussian head's spread plays no part in the chain
