"""lerobot SmolVLA built offline (local tiny SmolVLM directory) with a learnable Gaussian head."""

import os
import socket

import numpy as np
import pytest
import torch

from wmrl.domain import RolloutBatch
from wmrl_vla.lerobot_bridge import sft_gaussian
from wmrl_vla.smolvla_bridge import SmolVLABridgeConfig, SmolVLAGaussianPolicy

INSTR = ["reach the red target", "touch the blue spot", "go to the green marker"]
S, A = 7, 4


def _cfg(cache) -> SmolVLABridgeConfig:
    return SmolVLABridgeConfig(
        image_size=32, state_dim=S, action_dim=A, text_hidden=32, vision_hidden=16, patch_size=8,
        corpus=INSTR, tokenizer_vocab=96, vlm_cache_dir=str(cache), num_steps=3,
    )  # fmt: skip


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """Built with every outgoing connection refused: nothing may come from a hub."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access while building SmolVLA: {args}")

    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex
    socket.socket.connect = socket.socket.connect_ex = refuse
    try:
        torch.manual_seed(0)
        pol = SmolVLAGaussianPolicy(_cfg(tmp_path_factory.mktemp("smolvlm")))
    finally:
        socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    pol.eval()
    return pol


def _batch(policy, n=2, t=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, t, 3, 32, 32), generator=g, dtype=torch.uint8)
    states = torch.randn(n, t, S, generator=g)
    actions = torch.randn(n, t, A, generator=g).clamp(-1, 1)
    mask = torch.ones(n, t * A)
    if n > 1:
        mask[1, 2 * A :] = 0  # rollout 1 has 2 steps
    return RolloutBatch(
        tokens=torch.zeros(n, t * A, dtype=torch.long),
        logprobs=torch.zeros(n, t * A),
        mask=mask,
        group_ids=torch.zeros(n, dtype=torch.long),
        tasks=[None],
        extras={
            "images": images,
            "states": states,
            "actions": actions,
            "instr": policy.tokenizer.encode([INSTR[i % len(INSTR)] for i in range(n)]),
        },
    )


def test_builds_lerobot_smolvla_from_a_local_vlm_dir(policy):
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    lp = policy.lerobot_policy
    assert isinstance(lp, SmolVLAPolicy)
    c = lp.config
    assert not c.load_vlm_weights and c.chunk_size == c.n_action_steps == 1
    assert (policy.vlm_dir / "config.json").exists() and c.vlm_model_name == str(policy.vlm_dir)
    # the tokenizer carries SmolVLM's special tokens, which SmolVLA reads by id
    hf = policy.tokenizer.hf
    assert (
        lp.model.fake_image_token == hf.convert_tokens_to_ids("<fake_token_around_image>") != hf.unk_token_id
    )
    assert lp.model.global_image_token == hf.convert_tokens_to_ids("<global-img>") != hf.unk_token_id
    ids = policy.tokenizer.encode(["reach the red target"])
    assert ids.shape == (1, policy.cfg.max_instr_tokens)
    real = ids[0][ids[0] != policy.tokenizer.pad_id]
    assert (ids[0, len(real) :] == policy.tokenizer.pad_id).all()  # right-padded
    assert "".join(hf.convert_ids_to_tokens(real.tolist())) == "reachtheredtarget"
    # words outside the tokenizer's corpus fall back to smaller pieces, never to <unk>
    assert hf.unk_token_id not in policy.tokenizer.encode(["Lift the PURPLE block!"])[0].tolist()
    # SmolVLA's own stochastic sampler runs on the same inputs
    img = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    ids = policy.tokenizer.encode(INSTR[:2])
    lp.reset()
    a = lp.select_action(
        {"observation.image": img.float() / 255, "observation.state": torch.randn(2, S),
         "observation.language.tokens": ids, "observation.language.attention_mask": ids != policy.tokenizer.pad_id}
    )  # fmt: skip
    assert a.shape == (2, A) and torch.isfinite(a).all()


def test_log_probs_match_torch_normal(policy):
    batch = _batch(policy)
    lp = policy.log_probs(batch)
    assert lp.shape == (2, 3 * A)
    ex = batch.extras
    for i in range(2):
        for s in range(3):
            sl = slice(s * A, (s + 1) * A)
            if batch.mask[i, s * A] == 0:
                assert (lp[i, sl] == 0).all()
                continue
            mu = policy.mean(ex["images"][i, s : s + 1], ex["states"][i, s : s + 1], ex["instr"][i : i + 1])[
                0
            ]
            dist = torch.distributions.Normal(mu, policy.log_std.exp())
            assert torch.allclose(lp[i, sl], dist.log_prob(ex["actions"][i, s]), atol=1e-5)
    # differentiable in the log std and, through the unrolled sampler, in SmolVLA's VLM and expert
    lp[batch.mask.bool()].sum().backward()
    assert policy.log_std.grad.abs().sum() > 0
    model = policy.lerobot_policy.model
    for part in (
        model.vlm_with_expert.lm_expert,
        model.vlm_with_expert.vlm.model.vision_model,
        model.state_proj,
    ):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    policy.zero_grad()


def test_instruction_changes_the_mean(policy):
    g = torch.Generator().manual_seed(3)
    img = torch.randint(0, 256, (1, 3, 32, 32), generator=g, dtype=torch.uint8).expand(3, -1, -1, -1)
    st = torch.randn(1, S, generator=g).expand(3, -1)
    with torch.no_grad():
        mu = policy.mean(img, st, policy.tokenizer.encode(INSTR))
    assert (mu[0] - mu[1]).abs().max() > 1e-4 and (mu[0] - mu[2]).abs().max() > 1e-4
    # the same instruction gives the same mean, whatever else shares the batch
    with torch.no_grad():
        mu0 = policy.mean(img[:1], st[:1], policy.tokenizer.encode(INSTR[:1]))
    assert torch.allclose(mu0[0], mu[0], atol=1e-5)


def test_act_samples_with_temperature(policy):
    g = torch.Generator().manual_seed(1)
    img = torch.randint(0, 256, (1, 3, 32, 32), generator=g, dtype=torch.uint8).expand(400, -1, -1, -1)
    st = torch.randn(1, S, generator=g).expand(400, -1)
    instr = policy.tokenizer.encode(INSTR[:1] * 400)
    tokens, lp, a = policy.act(img, st, instr, 1.0, torch.Generator().manual_seed(0))
    mu = policy.mean(img[:1], st[:1], instr[:1])[0].detach()
    assert tokens.dtype == torch.long and (tokens == 0).all()
    std = policy.log_std.exp().detach()
    assert torch.allclose(lp, torch.distributions.Normal(mu, std).log_prob(a), atol=1e-5)
    _, _, a2 = policy.act(img, st, instr, 0.5, torch.Generator().manual_seed(0))
    assert torch.allclose(a2 - mu, 0.5 * (a - mu), atol=1e-5)  # same noise, half the spread
    _, _, a0 = policy.act(img[:2], st[:2], instr[:2], 0.0)
    assert torch.allclose(a0, mu.expand(2, -1), atol=1e-5)


def test_batch_log_probs_equal_sampling_log_probs(policy):
    """Roll out step by step (batch of 3, different instructions), then recompute from the batch:
    the importance ratio of every token is 1."""
    n, t = 3, 4
    batch = _batch(policy, n=n, t=t, seed=5)
    ex = batch.extras
    gen = torch.Generator().manual_seed(0)
    lps, acts = [], []
    for s in range(t):
        _, lp, a = policy.act(ex["images"][:, s], ex["states"][:, s], ex["instr"], 1.0, gen)
        lps.append(lp)
        acts.append(a)
    ex["actions"] = torch.stack(acts, 1)
    batch.logprobs = torch.stack(lps, 1).reshape(n, t * A) * batch.mask
    with torch.no_grad():
        new = policy.log_probs(batch, chunk=5)  # chunks that mix rollouts and steps
    m = batch.mask.bool()
    assert torch.allclose((new[m] - batch.logprobs[m]).exp(), torch.ones(int(m.sum())), atol=1e-4)


def _records(n=3, t=6):
    g = np.random.default_rng(0)
    return [
        {
            "observation.image": g.integers(0, 255, (t, 32, 32, 3), dtype=np.uint8),
            "observation.state": g.normal(size=(t, S)).astype(np.float32),
            "action": np.tile([[0.5, -0.5, 0.2, -1.0]], (t, 1)).astype(np.float32),
            "next.reward": np.zeros(t, np.float32),
            "next.success": np.zeros(t, bool),
            "instruction": INSTR[i % len(INSTR)],
        }
        for i in range(n)
    ]


def test_sft_lowers_the_nll_and_trains_every_part(tmp_path):
    torch.manual_seed(0)
    pol = SmolVLAGaussianPolicy(_cfg(tmp_path))
    before = {k: v.detach().clone() for k, v in pol.named_parameters() if v.requires_grad}
    hist = sft_gaussian(pol, _records(), epochs=5, batch_size=9, lr=3e-3)
    assert hist[-1] < hist[0] - 0.5, hist
    changed = {k for k, v in pol.named_parameters() if k in before and not torch.equal(v, before[k])}
    for part in ("log_std", "lm_expert", "vision_model", "text_model", "state_proj", "action_out_proj"):
        assert any(part in k for k in changed), part


def test_save_load_round_trip(policy, tmp_path):
    path = tmp_path / "smolvla.pt"
    policy.save(path)
    # a fresh cache dir: the local SmolVLM directory is rewritten from the checkpoint
    again = SmolVLAGaussianPolicy.load(path, vlm_cache_dir=str(tmp_path / "fresh"))
    again.eval()
    assert again.vlm_dir != policy.vlm_dir and (again.vlm_dir / "tokenizer.json").exists()
    assert torch.equal(again.tokenizer.encode(INSTR), policy.tokenizer.encode(INSTR))
    batch = _batch(policy, seed=2)
    with torch.no_grad():
        assert torch.equal(again.log_probs(batch), policy.log_probs(batch))
        ex = batch.extras
        assert torch.equal(
            again.mean(ex["images"][:, 0], ex["states"][:, 0], ex["instr"]),
            policy.mean(ex["images"][:, 0], ex["states"][:, 0], ex["instr"]),
        )


def test_unknown_policy_lists_the_valid_ones():
    from wmrl.config import ConfigError
    from wmrl_vla.config import VLAConfig

    with pytest.raises(ConfigError, match="small_vla, lerobot_act, lerobot_smolvla"):
        VLAConfig(policy="smolvla")
    assert VLAConfig(policy="lerobot_smolvla").policy == "lerobot_smolvla"


def test_lerobot_smolvla_through_the_domain_and_trainer(tmp_path):
    """vla-debug with policy=lerobot_smolvla: demos -> SFT -> WM -> GRPO steps, all offline; the
    batch's log-probs are recomputed exactly and the GRPO update moves SmolVLA's own weights."""
    from wmrl.config import load_config
    from wmrl.trainer import Trainer

    over = [
        f"--out_dir={tmp_path / 'run'}",
        f"--domain.cache_dir={tmp_path / 'cache'}",
        "--domain.policy=lerobot_smolvla",
        "--domain.record_anchors=false",
        "--domain.eval_episodes_per_task=1",
        "--grpo.steps=1",
    ]
    cfg = load_config("vla-debug", over)
    domain = cfg.domain.build(cfg)
    assert isinstance(domain.policy, SmolVLAGaussianPolicy)
    assert (tmp_path / "cache" / "smolvlm").is_dir()  # the local SmolVLM lives in the domain's cache
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(1))
    batch = domain.generate(tasks, 2, torch.tensor([True, False]))
    assert batch.payload[0]["kind"] == "sim" and batch.payload[2]["kind"] == "imagined"
    with torch.no_grad():
        lp = domain.policy.log_probs(batch)
    m = batch.mask.bool()
    assert torch.allclose(lp[m], batch.logprobs[m], atol=1e-4)
    params = {k: v.detach().clone() for k, v in domain.policy.named_parameters() if v.requires_grad}
    last = Trainer(cfg, domain).train()
    assert np.isfinite(last["reward/mean"]) and last["exec/real_total"] > 0
    changed = {
        k for k, v in domain.policy.named_parameters() if k in params and not torch.equal(v, params[k])
    }
    assert "log_std" in changed and any("lm_expert" in k for k in changed)
    domain.close()
