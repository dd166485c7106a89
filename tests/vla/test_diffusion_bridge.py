"""The denoising chain's log-probability (wmrl_vla/denoising_chain.py) and lerobot's DiffusionPolicy
behind it (wmrl_vla/diffusion_bridge.py), checked against computations written here independently:
diffusers' own ``DDPMScheduler.step`` for the means and ``torch.distributions.Normal`` for densities."""

import numpy as np
import pytest
import torch
from chain_checks import one_grpo_step, rescored_ratio, rollout_log_probs, sim_chain_batch
from torch.distributions import Normal

from wmrl.config import load_config
from wmrl.domain import RolloutBatch
from wmrl_vla.denoising_chain import (
    CHAIN_SCORINGS,
    chain_log_prob,
    chain_log_terms,
    ddpm_step_std,
    scored_chain_log_prob,
    scored_terms,
)
from wmrl_vla.diffusion_bridge import DiffusionBridgeConfig, DiffusionChainPolicy, action_chunks, train_bc
from wmrl_vla.policies import policy_kind

REACHER = "wmrl/DMC-reacher-easy-v0"
CFG = DiffusionBridgeConfig(
    image_size=16, state_dim=5, action_dim=3, use_image=False, horizon=4, down_dims=[8, 16],
    diffusion_step_embed_dim=8, num_train_timesteps=20, chain_steps=5, min_std=0.05,
)  # fmt: skip


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return DiffusionChainPolicy.from_config(CFG)


def _obs(b, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.zeros(b, 3, 16, 16, dtype=torch.uint8), torch.randn(b, 5, generator=g)


def _batch(policy, n=3, t=2, seed=0):
    """``n`` rollouts of ``t`` steps sampled by ``policy`` (the last rollout one step shorter)."""
    images, states = _obs(n * t, seed)
    _, logp, _, chains = policy.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(seed))
    a = CFG.action_dim
    mask = torch.ones(n, t * a)
    mask[-1, (t - 1) * a :] = 0
    batch = RolloutBatch(
        tokens=torch.zeros(n, t * a, dtype=torch.long),
        logprobs=(logp.view(n, t * a) * mask).detach(),
        mask=mask,
        group_ids=torch.zeros(n, dtype=torch.long),
        tasks=[None],
        extras={
            "images": images.view(n, t, 3, 16, 16),
            "states": states.view(n, t, 5),
            "chains": chains.view(n, t, *chains.shape[1:]),
        },
    )
    return batch


def test_chain_log_prob_is_the_sum_of_its_gaussians():
    g = torch.Generator().manual_seed(1)
    chain, means = torch.randn(2, 4, 3, 2, generator=g), torch.randn(2, 3, 3, 2, generator=g)
    stds = torch.tensor([0.5, 0.2, 0.1])
    want = Normal(0.0, 1.0).log_prob(chain[:, 0]) + sum(
        Normal(means[:, k], stds[k]).log_prob(chain[:, k + 1]) for k in range(3)
    )
    torch.testing.assert_close(chain_log_prob(chain, means, stds), want)
    with pytest.raises(ValueError, match="do not match"):
        chain_log_prob(chain, means[:, :2], stds)


def _diffusers_terms(policy, states, chain):
    """``[start, step 0, ..., step K-1]``, each ``[B, H, A]``: the chain's Gaussian log-densities
    computed step by step from diffusers' own ``DDPMScheduler.step`` (its mean: the step's output minus
    its own noise, drawn again from a generator in the same state) and ``torch.distributions.Normal``."""
    from diffusers import DDPMScheduler

    sched = DDPMScheduler.from_config(policy.model.noise_scheduler.config)
    sched.set_timesteps(CFG.chain_steps)
    b = chain.shape[0]
    with torch.no_grad():
        cond = policy.model._prepare_global_conditioning(
            {"observation.state": states[:, None], "observation.environment_state": states[:, None]}
        )
        terms = [Normal(0.0, 1.0).log_prob(chain[:, 0])]
        for k, t in enumerate(sched.timesteps):
            x = chain[:, k]
            out = policy.model.unet(x, torch.full((b,), int(t)), global_cond=cond)
            noisy = sched.step(out, t, x, generator=torch.Generator().manual_seed(9)).prev_sample
            z = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
            std = float(sched._get_variance(t)) ** 0.5 if t > 0 else 0.0
            mean = noisy - std * z if t > 0 else noisy
            terms.append(Normal(mean, max(std, CFG.min_std)).log_prob(chain[:, k + 1]))
    return terms


def _variant(policy, chain_scoring, act_steps=1, ft_denoising_steps=None):
    """``policy``'s network (shared) scored with ``chain_scoring``, executing ``act_steps`` positions,
    fine-tuning the last ``ft_denoising_steps`` steps (a frozen base copied from the network now)."""
    return DiffusionChainPolicy(
        policy.lerobot_policy, CFG.chain_steps, CFG.min_std, bridge_config=CFG, chain_scoring=chain_scoring,
        act_steps=act_steps, ft_denoising_steps=ft_denoising_steps,
    )  # fmt: skip


@pytest.mark.parametrize("executed", [1, 2])
def test_scored_chain_log_prob_sums_exactly_its_kept_terms(executed):
    """Each scoring sums exactly its Gaussian terms (torch.distributions.Normal), for the first
    ``executed`` of H=3 chunk positions executed; "joint" is chain_log_prob summed over positions."""
    g = torch.Generator().manual_seed(2)
    chain, means = torch.randn(2, 4, 3, 2, generator=g), torch.randn(2, 3, 3, 2, generator=g)
    stds = torch.tensor([0.5, 0.2, 0.1])
    e = executed

    def normal(k, pos):  # [B, A]: row k's terms (0 the start, k+1 step k) summed over chunk positions pos
        d = Normal(0.0, 1.0) if k == 0 else Normal(means[:, k - 1, pos], stds[k - 1])
        return d.log_prob(chain[:, k, pos]).sum(1)

    every = slice(None)
    want = {
        "joint": sum(normal(k, every) for k in range(4)),
        "executed_marginal": sum(normal(k, every) for k in range(3)) + normal(3, slice(0, e)),
        "executed_only": sum(normal(k, slice(0, e)) for k in range(4)),
    }
    for scoring, w in want.items():
        torch.testing.assert_close(scored_chain_log_prob(chain, means, stds, scoring, e), w)
    torch.testing.assert_close(
        scored_chain_log_prob(chain, means, stds), chain_log_prob(chain, means, stds).sum(1)
    )
    with pytest.raises(ValueError, match="'dppo' is not one of joint, executed_marginal, executed_only"):
        scored_chain_log_prob(chain, means, stds, "dppo")
    with pytest.raises(ValueError, match="executed=4 chunk positions: must be 1..3"):
        scored_chain_log_prob(chain, means, stds, "executed_only", 4)


def test_chain_log_prob_equals_diffusers_ddpm_steps(policy):
    """(a) The recorded chain's log-prob equals one computed step by step from diffusers' own
    ``DDPMScheduler.step`` and ``torch.distributions.Normal`` (:func:`_diffusers_terms`)."""
    images, states = _obs(4, seed=3)
    _, logp, action, chain = policy.act_with_chain(
        images, states, None, 1.0, torch.Generator().manual_seed(5)
    )
    assert chain.shape == (4, CFG.chain_steps + 1, CFG.horizon, CFG.action_dim)
    torch.testing.assert_close(action, chain[:, -1, 0])
    want = sum(_diffusers_terms(policy, states, chain))
    torch.testing.assert_close(logp, want.sum(1), rtol=1e-5, atol=1e-4)


def test_executed_scorings_equal_diffusers_terms_they_keep(policy):
    """The executed-position scorings of a real policy's chain, sampled and re-scored, equal the sum of
    exactly their kept diffusers/Normal terms: "executed_marginal" all but the final step's terms of
    the unexecuted positions 1..H-1, "executed_only" position 0 alone at every step."""
    images, states = _obs(3, seed=6)
    chain = policy.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(7))[3]
    terms = _diffusers_terms(policy, states, chain)
    want = {
        "joint": sum(t.sum(1) for t in terms),
        "executed_marginal": sum(t.sum(1) for t in terms[:-1]) + terms[-1][:, 0],
        "executed_only": sum(t[:, 0] for t in terms),
    }
    for scoring in CHAIN_SCORINGS:
        pol = _variant(policy, scoring)
        _, logp, _, again = pol.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(7))
        assert torch.equal(again, chain)  # the scoring changes the log-prob, not the sampler
        torch.testing.assert_close(logp, want[scoring], rtol=1e-5, atol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(pol.chain_log_probs(images, states, chain), logp, rtol=0, atol=5e-5)
    with pytest.raises(ValueError, match="chain_scoring='dppo' is not one of joint"):
        _variant(policy, "dppo")


def test_stds_follow_the_scheduler_and_the_floor(policy):
    assert torch.all(policy.stds >= CFG.min_std)
    assert float(policy.stds[-1]) == pytest.approx(CFG.min_std)  # DDPM's last step is noiseless
    assert torch.all(policy.stds[:-1] >= policy.stds[1:])  # noisier early
    assert ddpm_step_std(0.5, 0.8, 0.0) == pytest.approx(((0.2 / 0.5) * (1 - 0.5 / 0.8)) ** 0.5)


@pytest.mark.parametrize("chain_scoring", CHAIN_SCORINGS)
def test_rescored_chain_gives_ratio_one(policy, chain_scoring):
    """(b) Re-scoring the recorded chains under unchanged parameters: ratio 1 on every real token, to
    float32 rounding against the sampler's step-by-step U-Net passes (each token sums up to K x H
    Gaussian terms), and bit for bit between two re-scorings; under every scoring."""
    policy = _variant(policy, chain_scoring)
    batch = _batch(policy)
    new = policy.log_probs(batch)
    ratio = torch.exp(new - batch.logprobs)[batch.mask > 0]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)
    assert torch.all(new[batch.mask == 0] == 0)
    again = policy.log_probs(batch)
    assert torch.equal(torch.exp(again - new)[batch.mask > 0], torch.ones_like(ratio))


def test_gradient_step_raises_advantage_weighted_log_prob():
    """(c) One SGD step on -sum_i A_i log p(chain_i) raises it and changes the U-Net."""
    torch.manual_seed(0)
    pol = DiffusionChainPolicy.from_config(CFG)
    batch = _batch(pol, n=4, t=1, seed=2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def objective():
        return (adv[:, None] * pol.log_probs(batch) * batch.mask).sum()

    before = objective()
    w0 = [p.detach().clone() for p in pol.parameters()]
    opt = torch.optim.SGD(pol.parameters(), lr=1e-3)
    opt.zero_grad()
    (-before).backward()
    opt.step()
    assert float(objective().detach()) > float(before.detach())
    assert any(not torch.equal(a, b) for a, b in zip(w0, pol.parameters(), strict=True))


def test_temperature_zero_is_the_deterministic_chain_of_means(policy):
    images, states = _obs(2, seed=4)
    a = policy.act(images, states, None, 0.0, torch.Generator().manual_seed(0))[2]
    b = policy.act(images, states, None, 0.0, torch.Generator().manual_seed(1))[2]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="common random numbers"):
        policy.act(images, states, None, 1.0, noise=torch.rand(2, 3))


def test_action_chunks_pad_with_the_last_action():
    acts = np.arange(6, dtype=np.float32).reshape(3, 2)
    c = action_chunks(acts, 4)
    assert c.shape == (3, 4, 2)
    np.testing.assert_array_equal(c[2], np.repeat(acts[2:], 4, 0))
    np.testing.assert_array_equal(c[0, :3], acts)


def test_bc_lowers_the_diffusion_loss():
    """Cloning demos of one constant action with lerobot's diffusion loss (train_bc) lowers that loss
    on a fixed draw of noise and timesteps."""
    torch.manual_seed(0)
    pol = DiffusionChainPolicy.from_config(CFG)
    t = 12
    states = np.random.default_rng(0).standard_normal((t, 5)).astype(np.float32)
    rec = {
        "observation.image": np.zeros((t, 16, 16, 3), np.uint8),
        "observation.state": states,
        "action": np.tile(np.array([[0.5, -0.5, 0.0]], np.float32), (t, 1)),
        "next.reward": np.zeros(t, np.float32),
        "next.success": np.zeros(t, bool),
        "instruction": "reach",
    }
    chunks = torch.from_numpy(action_chunks(rec["action"], CFG.horizon))
    images, sts = torch.zeros(t, 3, 16, 16, dtype=torch.uint8), torch.from_numpy(states)

    def loss():
        with torch.no_grad():
            return float(pol.bc_loss(images, sts, chunks, generator=torch.Generator().manual_seed(0)))

    before = loss()
    train_bc(pol, [rec], steps=80, batch_size=16, lr=3e-3)
    assert loss() < 0.9 * before


def test_rollouts_carry_chains_into_the_batch_and_a_grpo_step_raises_the_positive_ones():
    """Real simulator rollouts of a chain policy record their chains (SimRollout -> payload -> batch),
    the batch re-scores them to ratio 1, and one update of the core's GRPO loss (rollout 0 advantage
    +1, rollout 1 -1) raises rollout 0's chains' log-density and lowers rollout 1's (the shared
    checks in chain_checks.py, as for SmolVLA's chain)."""
    torch.manual_seed(0)
    pol = DiffusionChainPolicy.from_config(
        DiffusionBridgeConfig(**{**CFG.__dict__, "state_dim": 6, "action_dim": 2})
    )
    batch = sim_chain_batch(pol, "wmrl/DMC-reacher-easy-v0", [0, 1], 16, max_steps=3)
    assert batch.extras["chains"].shape[2:] == (CFG.chain_steps + 1, 4, 2)
    ratio = rescored_ratio(pol, batch)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)
    before = rollout_log_probs(pol, batch)
    w0 = [p.detach().clone() for p in pol.parameters()]
    # a small step: the untrained U-Net's log-density is steep (at lr 1e-3 a step can overshoot)
    stats = one_grpo_step(pol, batch, torch.tensor([1.0, -1.0]), lr=1e-4)
    assert stats["loss/optimizer_steps"] == 1 and stats["loss/clip_frac"] == 0
    after = rollout_log_probs(pol, batch)
    assert float(after[0]) > float(before[0]) and float(after[1]) < float(before[1]), (before, after)
    assert any(not torch.equal(a, b) for a, b in zip(w0, pol.parameters(), strict=True))


def test_a_lerobot_diffusion_folder_is_post_trainable(tmp_path):
    """``domain.policy_path`` to a lerobot diffusion folder (n_obs_steps=1): accepted, loaded with its
    processors, and its chain sampled and re-scored."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    from wmrl_vla.policies import check_policy_path

    c = DiffusionConfig(
        input_features={
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 32, 32)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(4,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        n_obs_steps=1, horizon=4, n_action_steps=1, drop_n_last_frames=0, crop_shape=None,
        pretrained_backbone_weights=None, use_group_norm=True, down_dims=(8, 16),
        diffusion_step_embed_dim=8, spatial_softmax_num_keypoints=4, num_train_timesteps=20,
        num_inference_steps=3, device="cpu", push_to_hub=False,
    )  # fmt: skip
    folder = tmp_path / "pretrained_model"
    DiffusionPolicy(c).save_pretrained(folder)
    for proc in make_pre_post_processors(c, dataset_stats=None):
        proc.save_pretrained(folder)
    assert check_policy_path(folder, 32) == "diffusion"
    cfg = load_config("vla-debug", [f"--domain.policy_path={folder}", "--domain.image_size=32"]).domain
    kind = policy_kind(cfg)  # the folder's type resolves to the diffusion kind, not the pretrained one
    assert (cfg.policy, type(kind).__name__, kind.words()) == (
        "lerobot_diffusion",
        "LeRobotDiffusion",
        f"your policy ({folder})",
    )
    assert kind.cache_fields()["policy_path"] == str(folder)
    pol = kind.prepare([], torch.device("cpu"))
    assert isinstance(pol, DiffusionChainPolicy) and pol.source_path == str(folder)
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    states = torch.randn(2, 4)
    _, logp, action, chain = pol.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(0))
    assert chain.shape == (2, 4, 4, 2) and action.shape == (2, 2)
    torch.testing.assert_close(pol.chain_log_probs(images, states, chain), logp, rtol=0, atol=5e-5)


@pytest.mark.parametrize("act_steps", [2, 4])
def test_open_loop_chunk_log_prob_scores_the_executed_positions(policy, act_steps):
    """With ``act_steps`` k the actions are the chain's first k chunk positions and the log-prob sums
    exactly the Normal terms (diffusers' step means) each scoring keeps for those k positions; at
    k = H every scoring is the joint. Re-scored, the ratio is 1."""
    images, states = _obs(3, seed=8)
    chain = policy.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(9))[3]
    terms = _diffusers_terms(policy, states, chain)  # [start, step 0..K-1], each [B, H, A]
    k = act_steps
    want = {
        "joint": sum(t.sum(1) for t in terms),
        "executed_marginal": sum(t.sum(1) for t in terms[:-1]) + terms[-1][:, :k].sum(1),
        "executed_only": sum(t[:, :k].sum(1) for t in terms),
    }
    for scoring in CHAIN_SCORINGS:
        pol = _variant(policy, scoring, act_steps)
        _, logp, actions, again = pol.act_with_chain(
            images, states, None, 1.0, torch.Generator().manual_seed(9)
        )
        assert torch.equal(again, chain)  # act_steps changes what is executed and scored, not the sampler
        assert torch.equal(actions, chain[:, -1, :k])  # [B, k, A], executed open loop
        torch.testing.assert_close(logp, want[scoring], rtol=1e-5, atol=1e-4)
        with torch.no_grad():
            rho = torch.exp(pol.chain_log_probs(images, states, chain) - logp)
        assert float((rho - 1).abs().max()) < 1e-5
    if k == CFG.horizon:
        torch.testing.assert_close(want["executed_only"], want["joint"])


def test_act_steps_beyond_the_horizon_is_refused(policy):
    for bad in (0, CFG.horizon + 1):
        with pytest.raises(
            ValueError, match=rf"^act_steps={bad} must be 1..4 \(the policy's chunk horizon\)$"
        ):
            _variant(policy, "joint", bad)


def _reacher_policy(**fields):
    torch.manual_seed(0)
    return DiffusionChainPolicy.from_config(
        DiffusionBridgeConfig(**{**CFG.__dict__, "state_dim": 6, "action_dim": 2, **fields})
    )


def test_open_loop_rollout_records_one_decision_per_chunk():
    """A policy executing 3 of its 4 chunk positions open loop, in the real simulator for 7 steps:
    decisions at steps 0, 3, 6 (the last chunk cut by the time limit), each one chain whose first 3
    positions are the actions executed; the batch holds one step per decision (its frame and state),
    re-scores them to ratio 1, and the recorded log-prob is the Normal sum of the 3 executed
    positions' terms (executed_only). The ratio is 1 to float32 rounding, |rho - 1| < 5e-5 as in the
    closed-loop rollout test: the sampler's U-Net passes (2 rows) and the re-scoring's (one pass, 30
    rows) round differently, and each token sums 18 terms of several units each."""
    from wmrl_vla.batch import collate, sim_payload
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    pol = _reacher_policy(act_steps=3, chain_scoring="executed_only")
    pool = EnvPool(16, max_steps=7)
    try:
        rs = run_episodes(
            policy_actor(pol, 1.0, torch.Generator().manual_seed(0)), [(REACHER, 0), (REACHER, 1)], pool
        )
    finally:
        pool.close()
    for r in rs:
        assert r.length == 7 and r.decision_steps.tolist() == [0, 3, 6]
        assert r.chains.shape == (3, CFG.chain_steps + 1, 4, 2) and r.logprobs.shape == (3, 2)
        for d, step in enumerate(r.decision_steps):
            done = r.actions[step : step + 3]
            np.testing.assert_array_equal(done, r.chains[d, -1, : len(done)])
    batch = collate([sim_payload(r) for r in rs], [None], 2, 16, pol.tokenizer)
    assert batch.mask.shape == (2, 3 * 2) and bool(batch.mask.all())
    assert torch.equal(batch.extras["states"][1], torch.from_numpy(rs[1].states[[0, 3, 6]]))
    ratio = rescored_ratio(pol, batch)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)
    assert torch.equal(rescored_ratio(pol, batch), ratio)  # re-scoring is deterministic
    chains = torch.from_numpy(rs[0].chains)
    with torch.no_grad():
        x = chains[:, :-1].reshape(-1, 4, 2)
        steps = torch.arange(CFG.chain_steps).repeat(3)
        cond = pol.condition(
            torch.zeros(3, 3, 16, 16, dtype=torch.uint8), torch.from_numpy(rs[0].states[[0, 3, 6]])
        )
        means = pol.step_means(x, steps, cond.repeat_interleave(CFG.chain_steps, 0)).view(
            3, CFG.chain_steps, 4, 2
        )
    want = Normal(0.0, 1.0).log_prob(chains[:, 0, :3]).sum(1) + sum(
        Normal(means[:, k, :3], pol.stds[k]).log_prob(chains[:, k + 1, :3]).sum(1)
        for k in range(CFG.chain_steps)
    )
    torch.testing.assert_close(torch.from_numpy(rs[0].logprobs), want, rtol=1e-5, atol=1e-4)


def test_closed_loop_rollout_is_unchanged_by_act_steps_one():
    """act_steps 1 (the default) is the closed loop it always was: run_episodes records exactly
    (bit for bit) the actions, log-probs and chains of a step-by-step loop written here, one
    act_with_chain call per env step from the same generator, and no decision_steps."""
    import sims
    from wmrl_vla.rollout import EnvPool, policy_actor, run_episodes

    pol = _reacher_policy()
    pool = EnvPool(16, max_steps=5)
    try:
        (r,) = run_episodes(policy_actor(pol, 1.0, torch.Generator().manual_seed(3)), [(REACHER, 0)], pool)
    finally:
        pool.close()
    env = sims.make(REACHER, image_size=16, split="train", max_steps=5)
    o, _ = env.reset(seed=0)
    g, acts, lps, chains = torch.Generator().manual_seed(3), [], [], []
    done = False
    while not done:
        img = torch.from_numpy(np.ascontiguousarray(o["image"].transpose(2, 0, 1)))[None]
        _, lp, a, ch = pol.act_with_chain(img, torch.from_numpy(o["state"][None]), None, 1.0, g)
        o, _, term, trunc, _ = env.step(a[0].numpy())
        acts.append(a[0].numpy())
        lps.append(lp[0].numpy())
        chains.append(ch[0].numpy())
        done = term or trunc
    env.close()
    assert r.decision_steps is None and r.length == len(acts) == 5
    np.testing.assert_array_equal(r.actions, np.stack(acts))
    np.testing.assert_array_equal(r.logprobs, np.stack(lps))
    np.testing.assert_array_equal(r.chains, np.stack(chains))


# -- ft_denoising_steps: only the chain's last K' steps fine-tuned, the first K - K' a frozen base ---------


@pytest.mark.parametrize("ft_steps", [1, 2, 3])
def test_ft_steps_score_exactly_the_last_steps_terms(ft_steps):
    """With K' of K = 4 steps fine-tuned, each scoring sums exactly its Normal terms of the last K'
    steps (rows K-K'+1..K; the start and the first K-K' steps left out), given those steps' means
    alone; executed first 2 of H = 3 positions."""
    g = torch.Generator().manual_seed(3)
    chain, means = torch.randn(2, 5, 3, 2, generator=g), torch.randn(2, 4, 3, 2, generator=g)
    stds = torch.tensor([0.8, 0.5, 0.2, 0.1])
    first, e = 4 - ft_steps, 2

    def normal(k, pos):  # [B, A]: step k's terms (row k+1) summed over chunk positions pos
        return Normal(means[:, k, pos], stds[k]).log_prob(chain[:, k + 1, pos]).sum(1)

    every = slice(None)
    tail = range(first, 4)
    want = {
        "joint": sum(normal(k, every) for k in tail),
        "executed_marginal": sum(normal(k, every) for k in tail if k < 3) + normal(3, slice(0, e)),
        "executed_only": sum(normal(k, slice(0, e)) for k in tail),
    }
    for scoring, w in want.items():
        got = scored_chain_log_prob(chain, means[:, first:], stds, scoring, e, ft_steps)
        torch.testing.assert_close(got, w)


@pytest.mark.parametrize("scoring", CHAIN_SCORINGS)
def test_ft_steps_equal_to_the_chain_is_todays_scoring_bit_for_bit(scoring):
    """K' = K (and the default None) sums every kept term as before: bit for bit the masked sum of
    chain_log_terms, start included."""
    g = torch.Generator().manual_seed(4)
    chain, means = torch.randn(2, 5, 4, 3, generator=g), torch.randn(2, 4, 4, 3, generator=g)
    stds = torch.tensor([0.8, 0.5, 0.2, 0.1])
    today = (chain_log_terms(chain, means, stds) * scored_terms(4, 4, 2, scoring)[None, :, :, None]).sum(
        (1, 2)
    )
    assert torch.equal(scored_chain_log_prob(chain, means, stds, scoring, 2, 4), today)
    assert torch.equal(scored_chain_log_prob(chain, means, stds, scoring, 2), today)
    assert torch.equal(scored_terms(4, 4, 2, scoring, 4), scored_terms(4, 4, 2, scoring))


def test_bad_ft_steps_are_refused_in_one_line(policy):
    g = torch.Generator().manual_seed(5)
    chain, means = torch.randn(1, 4, 2, 2, generator=g), torch.randn(1, 3, 2, 2, generator=g)
    for bad in (0, 4):
        with pytest.raises(
            ValueError, match=rf"^ft_denoising_steps={bad} must be 1..3 \(the chain's denoising steps\)$"
        ):
            scored_chain_log_prob(chain, means, torch.ones(3), ft_steps=bad)
    for bad in (0, -1, CFG.chain_steps + 1):
        with pytest.raises(
            ValueError, match=rf"^ft_denoising_steps={bad} must be 1..5 \(the chain's denoising steps\)$"
        ):
            _variant(policy, "joint", ft_denoising_steps=bad)
    with pytest.raises(ValueError, match=r"^ft_denoising_steps=6 must be 1..5"):
        DiffusionChainPolicy.from_config(DiffusionBridgeConfig(**{**CFG.__dict__, "ft_denoising_steps": 6}))


@pytest.mark.parametrize("act_steps", [1, 4])
def test_ft_steps_log_prob_is_the_last_steps_diffusers_terms(policy, act_steps):
    """A real policy fine-tuning its last K' = 2 of K = 5 steps: before any update its base equals the
    network, so it samples the very chain the whole-chain policy samples, and its log-prob is the sum
    of exactly the last 2 steps' kept diffusers/Normal terms (no start, no earlier step), under every
    scoring; re-scored, the ratio is 1."""
    images, states = _obs(3, seed=10)
    chain = _variant(policy, "joint", act_steps).act_with_chain(
        images, states, None, 1.0, torch.Generator().manual_seed(11)
    )[3]
    terms = _diffusers_terms(policy, states, chain)[-2:]  # steps K-2, K-1: each [B, H, A]
    k = act_steps
    want = {
        "joint": sum(t.sum(1) for t in terms),
        "executed_marginal": terms[0].sum(1) + terms[1][:, :k].sum(1),
        "executed_only": sum(t[:, :k].sum(1) for t in terms),
    }
    for scoring in CHAIN_SCORINGS:
        pol = _variant(policy, scoring, act_steps, ft_denoising_steps=2)
        assert pol.first_ft_step == CFG.chain_steps - 2 and pol.base_model is not None
        _, logp, _, again = pol.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(11))
        assert torch.equal(again, chain)
        torch.testing.assert_close(logp, want[scoring], rtol=1e-5, atol=1e-4)
        with torch.no_grad():
            rho = torch.exp(pol.chain_log_probs(images, states, chain) - logp)
        assert float((rho - 1).abs().max()) < 1e-5


def test_ft_steps_equal_to_the_chain_is_todays_policy(policy):
    """K' = K is the whole chain fine-tuned, as before: no base network, the same parameters, and bit
    for bit the same chains, log-probs and re-scored log-probs as the default."""
    images, states = _obs(3, seed=12)
    today, full = (
        _variant(policy, "executed_marginal", 2),
        _variant(policy, "executed_marginal", 2, CFG.chain_steps),
    )
    assert full.base_model is None and full.first_ft_step == 0
    assert [n for n, _ in full.named_parameters()] == [n for n, _ in today.named_parameters()]
    a = today.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(13))
    b = full.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(13))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    with torch.no_grad():
        assert torch.equal(
            today.chain_log_probs(images, states, a[3]), full.chain_log_probs(images, states, a[3])
        )


def test_ft_steps_grpo_step_moves_only_the_fine_tuned_network(tmp_path):
    """Behaviour cloning copies the cloned network into the frozen base; one update of the core's GRPO
    loss on real simulator rollouts (rollout 0 advantage +1, rollout 1 -1) leaves the base's
    parameters unchanged and changes the fine-tuned ones, raises rollout 0's log-prob (of its last
    K' = 2 steps) and lowers rollout 1's; resampled from the same noise, the chain's states up to
    x^{K-K'} (the start and the base's steps) are unchanged and the fine-tuned steps' are not. Saved
    and loaded, the policy keeps both networks."""
    pol = _reacher_policy(ft_denoising_steps=2)
    assert {n for n, p in pol.named_parameters() if not p.requires_grad} == {
        n for n, _ in pol.named_parameters() if n.startswith("base_model.")
    }
    rec = {
        "observation.image": np.zeros((6, 16, 16, 3), np.uint8),
        "observation.state": np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32),
        "action": np.full((6, 2), 0.3, np.float32),
        "next.reward": np.zeros(6, np.float32),
        "next.success": np.zeros(6, bool),
        "instruction": "reach",
    }
    init = [p.detach().clone() for p in pol.model.parameters()]
    train_bc(pol, [rec], steps=3, batch_size=4, lr=1e-3)
    for p, q in zip(pol.model.parameters(), pol.base_model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert any(not torch.equal(p, p0) for p, p0 in zip(pol.model.parameters(), init, strict=True))

    batch = sim_chain_batch(pol, REACHER, [0, 1], 16, max_steps=3)
    ratio = rescored_ratio(pol, batch)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=5e-5)
    images, states = batch.extras["images"][:, 0], batch.extras["states"][:, 0]
    chain0 = pol.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(1))[3]
    before = rollout_log_probs(pol, batch)
    base0 = [p.detach().clone() for p in pol.base_model.parameters()]
    ft0 = [p.detach().clone() for p in pol.model.parameters()]
    stats = one_grpo_step(pol, batch, torch.tensor([1.0, -1.0]), lr=1e-4)
    assert stats["loss/optimizer_steps"] == 1
    after = rollout_log_probs(pol, batch)
    assert float(after[0]) > float(before[0]) and float(after[1]) < float(before[1]), (before, after)
    assert all(torch.equal(p, q) for p, q in zip(pol.base_model.parameters(), base0, strict=True))
    assert any(not torch.equal(p, q) for p, q in zip(pol.model.parameters(), ft0, strict=True))
    chain1 = pol.act_with_chain(images, states, None, 1.0, torch.Generator().manual_seed(1))[3]
    first = pol.first_ft_step
    assert torch.equal(chain1[:, : first + 1], chain0[:, : first + 1])
    assert not torch.equal(chain1[:, first + 1 :], chain0[:, first + 1 :])

    pol.save(tmp_path / "ft.pt")
    loaded = DiffusionChainPolicy.load(tmp_path / "ft.pt")
    for (n, p), (m, q) in zip(pol.named_parameters(), loaded.named_parameters(), strict=True):
        assert n == m and torch.equal(p, q)


def test_a_saved_clone_loads_with_other_chain_settings(tmp_path):
    """The cached clone is loaded as ``domain.chain`` says it acts (open loop, scoring, fine-tuned
    steps): the same network, a frozen base that is a copy of it; a base saved with it is dropped
    where the whole chain is fine-tuned."""
    pol = _reacher_policy()
    pol.save(tmp_path / "clone.pt")
    again = DiffusionChainPolicy.load(
        tmp_path / "clone.pt", act_steps=3, chain_scoring="executed_marginal", ft_denoising_steps=2
    )
    assert (again.act_steps, again.chain_scoring, again.ft_steps, again.first_ft_step) == (
        3,
        "executed_marginal",
        2,
        CFG.chain_steps - 2,
    )
    saved, loaded = pol.state_dict(), again.state_dict()
    assert {k for k in loaded if not k.startswith("base_model.")} == set(saved)
    for k, v in saved.items():
        assert torch.equal(loaded[k], v), k
        if k.startswith("model."):  # the frozen base starts as the network
            assert torch.equal(loaded["base_model." + k.removeprefix("model.")], v), k
    again.save(tmp_path / "ft.pt")
    assert DiffusionChainPolicy.load(tmp_path / "ft.pt").ft_steps == 2  # as saved, unless replaced
    plain = DiffusionChainPolicy.load(tmp_path / "ft.pt", act_steps=1, ft_denoising_steps=None)
    assert plain.base_model is None and plain.act_steps == 1 and set(plain.state_dict()) == set(saved)


def test_a_chunked_diffusion_policy_imagines_as_it_executes(tmp_path):
    """``--domain.chain.act_steps=2`` on a built VLA domain: simulated and imagined rollouts alike keep
    one step per decision (a chain each, its first 2 positions the actions stepped), the world model
    scores every stepped action (``wm_actions``, not the decisions' first ones), and the batch re-scores
    its recorded log-probs (ratio 1)."""
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={tmp_path / 'run'}", f"--domain.cache_dir={tmp_path / 'cache'}", "--method=wmrl",
         "--domain.policy=lerobot_diffusion", "--domain.chain.act_steps=2"],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)
    try:
        assert domain.policy.act_steps == 2
        tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(0))
        batch = domain.generate(tasks, 3, torch.tensor([True, False]))
        assert [p["kind"] for p in batch.payload] == ["sim"] * 3 + ["imagined"] * 3
        for i, p in enumerate(batch.payload):
            done = np.asarray(p["executed_actions"])  # [T_env, A]
            decisions = -(-len(done) // 2)
            assert len(p["actions"]) == len(p["logprobs"]) == len(p["chains"]) == decisions
            np.testing.assert_array_equal(p["actions"], done[::2])
            for d in range(decisions):
                np.testing.assert_allclose(
                    done[2 * d : 2 * d + 2], p["chains"][d, -1, : len(done[2 * d : 2 * d + 2])]
                )
            assert torch.equal(
                batch.extras["wm_actions"][i, : len(done)], torch.as_tensor(done, dtype=torch.float32)
            )
            assert int(batch.extras["wm_step_mask"][i].sum()) == len(done)
            assert int(batch.extras["step_mask"][i].sum()) == decisions
        with torch.no_grad():
            lp = domain.policy.log_probs(batch)
        assert float(((lp - batch.logprobs) * batch.mask).abs().max()) < 5e-5
        pred = domain.world_model.predict(batch)
        batch.extras["actions"] = torch.zeros_like(batch.extras["actions"])  # not what the WM reads
        assert torch.equal(domain.world_model.predict(batch).mean, pred.mean)
    finally:
        domain.close()
