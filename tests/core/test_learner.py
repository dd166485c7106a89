import math

import pytest
import torch

from wmrl.config import ConfigError, GRPOConfig
from wmrl.domain import RolloutBatch
from wmrl.learner import aggregate, clipped_policy_loss, group_advantages, grpo_update, make_optimizer

NAN = float("nan")


def test_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 4.0])
    gid = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, used = group_advantages(r, gid, "grpo", std_eps=0.0)
    # group 0: mean .5, std .5 -> +1, -1; group 1: equal rewards -> 0 (not 0/0 with eps=0)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0, -1.0, 1.0]))
    assert used.all()
    dr, _ = group_advantages(r, gid, "dr_grpo")
    assert torch.allclose(dr, torch.tensor([0.5, -0.5, 0.0, 0.0, -1.0, 1.0]))


def test_ungraded_excluded_and_small_groups_skipped():
    r = torch.tensor([1.0, NAN, 3.0, 5.0, NAN, NAN])
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, used = group_advantages(r, gid, "dr_grpo")
    # group 0 uses rollouts 0 and 2 only (mean 2, not 4/3 as a zero for the NaN would give)
    assert torch.allclose(adv[[0, 2]], torch.tensor([-1.0, 1.0]))
    assert used.tolist() == [True, False, True, False, False, False]
    assert adv[~used].abs().sum() == 0


def test_group_advantages_match_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(40, generator=g)
    r[torch.rand(40, generator=g) < 0.2] = NAN
    gid = torch.arange(8).repeat_interleave(5)
    adv, used = group_advantages(r, gid, "grpo", 1e-4)
    for k in range(8):
        rows = [i for i in range(40) if gid[i] == k and math.isfinite(r[i])]
        if len(rows) < 2:
            assert not used[gid == k].any()
            continue
        vals = [float(r[i]) for i in rows]
        m = sum(vals) / len(vals)
        s = math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
        for i in rows:
            assert adv[i].item() == pytest.approx((float(r[i]) - m) / (s + 1e-4), rel=1e-5)


def _loop_loss(logp, old, adv, mask, eps, agg):
    per_seq, total, count = [], 0.0, 0.0
    for i in range(logp.shape[0]):
        s, c = 0.0, 0.0
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            rho = math.exp(logp[i, t] - old[i, t])
            a = float(adv[i])
            term = -min(rho * a, max(min(rho, 1 + eps), 1 - eps) * a)
            s, c = s + term, c + 1
        total, count = total + s, count + c
        if c:
            per_seq.append(s / c)
    return total / count if agg == "token_mean" else sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_clipped_loss_matches_loop(agg):
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(5, 7, generator=g)
    old = logp + 0.4 * (torch.rand(5, 7, generator=g) - 0.5)
    adv = torch.randn(5, generator=g)
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    mask[3] = 0  # a rollout with no real token
    loss, stats = clipped_policy_loss(logp, old, adv, mask, 0.1, agg)
    assert loss.item() == pytest.approx(_loop_loss(logp, old, adv, mask, 0.1, agg), rel=1e-5)
    assert 0 < stats["clip_frac"] < 1


def test_kl_term_is_k3_and_zero_at_reference():
    logp = torch.log(torch.tensor([[0.2, 0.5]]))
    adv = torch.zeros(1)
    mask = torch.ones(1, 2)
    loss0, st0 = clipped_policy_loss(logp, logp, adv, mask, 0.2, ref_logprobs=logp, kl_coef=1.0)
    assert loss0.item() == pytest.approx(0.0) and st0["kl_ref"].item() == pytest.approx(0.0)
    ref = torch.log(torch.tensor([[0.4, 0.25]]))
    loss, _ = clipped_policy_loss(logp, logp, adv, mask, 0.2, ref_logprobs=ref, kl_coef=0.5)
    d = ref - logp
    assert loss.item() == pytest.approx(0.5 * float((torch.exp(d) - d - 1).mean()), rel=1e-6)


def test_aggregate_rejects_unknown():
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        clipped_policy_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0.2, "sum"
        )
    assert aggregate(torch.ones(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "seq_mean").item() == 1.0


class _Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(4, 3))

    def log_probs(self, batch):
        return torch.log_softmax(self.theta[batch.extras["ctx"]], -1).gather(1, batch.tokens)


def _batch(policy):
    ctx = torch.arange(4).repeat_interleave(4)
    tokens = torch.tensor([0, 1, 2, 0] * 4).unsqueeze(-1)
    with torch.no_grad():
        lp = policy.log_probs(
            RolloutBatch(tokens, tokens.float(), torch.ones(16, 1), ctx, list(range(4)), extras={"ctx": ctx})
        )
    return RolloutBatch(tokens, lp, torch.ones(16, 1), ctx, list(range(4)), extras={"ctx": ctx})


def test_grpo_update_moves_towards_positive_advantage_and_leaves_unused_groups():
    policy = _Table()
    batch = _batch(policy)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0] * 3 + [NAN, NAN, NAN, 1.0])  # group 3: one graded rollout
    adv, used = group_advantages(rewards, batch.group_ids)
    cfg = GRPOConfig(tasks_per_step=4, minibatches=2, epochs=2, lr=0.5, optimizer="sgd", max_grad_norm=10.0)
    metrics = grpo_update(policy, make_optimizer(list(policy.parameters()), cfg), batch, adv, used, cfg)
    assert metrics["loss/optimizer_steps"] == 4  # 2 epochs x 2 minibatches
    p = torch.softmax(policy.theta.detach(), -1)
    assert (p[:3, 0] > 1 / 3).all() and (p[:3, 1] < 1 / 3).all()
    assert torch.equal(policy.theta[3].detach(), torch.zeros(3))  # skipped group: no gradient


def test_target_kl_stops_the_update_before_the_step_that_would_pass_it():
    """grpo.target_kl: the first step is always taken; a later minibatch whose approx_kl under the
    pre-step policy is above 1.5 x target_kl ends the update without its step. A target no step
    reaches changes nothing, bit for bit."""

    def update(target_kl):
        policy = _Table()
        batch = _batch(policy)
        adv, used = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * 4), batch.group_ids)
        cfg = GRPOConfig(tasks_per_step=4, minibatches=2, epochs=2, lr=0.5, optimizer="sgd",
                         max_grad_norm=10.0, target_kl=target_kl)  # fmt: skip
        gen = torch.Generator().manual_seed(3)
        opt = make_optimizer(list(policy.parameters()), cfg)
        metrics = grpo_update(policy, opt, batch, adv, used, cfg, generator=gen)
        return policy.theta.detach().clone(), metrics

    free, m_free = update(None)
    assert m_free["loss/optimizer_steps"] == 4 and "loss/kl_stopped" not in m_free
    loose, m_loose = update(1e6)
    assert torch.equal(loose, free) and m_loose["loss/kl_stopped"] == 0.0
    # a tiny target: each table row is one group's, so the first epoch's second minibatch sees no
    # change yet (KL 0) and the second epoch's first minibatch ends it: exactly a 1-epoch update
    tight, m_tight = update(1e-9)
    assert m_tight["loss/optimizer_steps"] == 2 and m_tight["loss/kl_stopped"] == 1.0
    assert m_tight["loss/kl_at_stop"] > 1.5e-9 and math.isnan(m_loose["loss/kl_at_stop"])
    policy = _Table()
    batch = _batch(policy)
    adv, used = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0] * 4), batch.group_ids)
    cfg1 = GRPOConfig(tasks_per_step=4, minibatches=2, epochs=1, lr=0.5, optimizer="sgd", max_grad_norm=10.0)
    gen = torch.Generator().manual_seed(3)
    grpo_update(
        policy, make_optimizer(list(policy.parameters()), cfg1), batch, adv, used, cfg1, generator=gen
    )
    assert torch.equal(tight, policy.theta.detach())
    assert not torch.equal(tight, free)
    with pytest.raises(ConfigError, match="target_kl"):
        GRPOConfig(target_kl=0.0)


class _Seq(torch.nn.Module):
    """Per context (4) and token position (3), a distribution over 3 tokens."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(1)))

    def log_probs(self, batch):
        logp = torch.log_softmax(self.theta[batch.extras["ctx"]], -1)
        return logp.gather(-1, batch.tokens.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batches_accumulate_the_same_update(agg):
    """grpo.micro_batch: each minibatch's gradient summed over passes of 1 or 5 rollouts ends at the
    parameters and diagnostics of the whole minibatch at once (rollouts of 0-3 real tokens, a KL term,
    anchor rows, gradient clipping, two epochs of two minibatches, so later passes see clipped
    ratios). SGD: Adam would turn the float noise of a zero gradient into a step."""
    g = torch.Generator().manual_seed(0)
    ctx = torch.arange(4).repeat_interleave(4)
    tokens = torch.randint(0, 3, (16, 3), generator=g)
    mask = (torch.arange(3) < torch.randint(0, 4, (16,), generator=g)[:, None]).float()
    rewards = torch.rand(16, generator=g)
    adv, used = group_advantages(rewards, ctx)
    anchor = ctx < 2

    def update(micro_batch):
        torch.manual_seed(0)
        policy, reference = _Seq(), _Seq()
        with torch.no_grad():
            lp = policy.log_probs(
                RolloutBatch(tokens, tokens.float(), mask, ctx, list(range(4)), extras={"ctx": ctx})
            )
        batch = RolloutBatch(tokens, lp, mask, ctx, list(range(4)), extras={"ctx": ctx})
        cfg = GRPOConfig(tasks_per_step=4, minibatches=2, epochs=2, optimizer="sgd", lr=3.0, loss_agg=agg,
                         kl_coef=0.1, max_grad_norm=0.5, micro_batch=micro_batch)  # fmt: skip
        opt = make_optimizer(list(policy.parameters()), cfg)
        gen = torch.Generator().manual_seed(5)
        metrics = grpo_update(policy, opt, batch, adv, used, cfg, reference, gen, anchor=anchor)
        return policy.theta.detach(), metrics

    theta, metrics = update(None)
    assert metrics["loss/clip_frac"] > 0 and metrics["loss/kl_ref"] > 0  # the paths that could differ
    for micro_batch in (1, 5):
        theta_m, metrics_m = update(micro_batch)
        torch.testing.assert_close(theta_m, theta, rtol=1e-5, atol=1e-6)
        assert metrics_m.keys() == metrics.keys()
        for k, v in metrics.items():
            assert math.isclose(metrics_m[k], v, rel_tol=1e-4, abs_tol=1e-6), (
                micro_batch,
                k,
                metrics_m[k],
                v,
            )


def test_micro_batch_must_be_positive():
    from wmrl.config import ConfigError, load_config

    assert load_config(None, ["--grpo.micro_batch=4"]).grpo.micro_batch == 4
    with pytest.raises(ConfigError, match="grpo.micro_batch=0 must be >= 1"):
        load_config(None, ["--grpo.micro_batch=0"])


def test_gradient_clipping_bounds_the_step():
    policy = _Table()
    batch = _batch(policy)
    adv, used = group_advantages(torch.tensor([100.0, -100.0, 0.0, 0.0] * 4), batch.group_ids, "dr_grpo")
    cfg = GRPOConfig(tasks_per_step=4, lr=1.0, optimizer="sgd", max_grad_norm=0.01)
    grpo_update(policy, make_optimizer(list(policy.parameters()), cfg), batch, adv, used, cfg)
    assert policy.theta.detach().norm().item() == pytest.approx(0.01, rel=1e-4)


def test_an_advantage_kind_is_one_registered_function_the_config_and_the_learner_share():
    """The config accepts exactly the registered kinds and group_advantages applies the registered
    function: a kind registered here is a valid grpo.advantage and is what the learner computes."""
    from wmrl.advantages import ADVANTAGES, register_advantage
    from wmrl.config import ConfigError, load_config

    assert list(ADVANTAGES) == ["grpo", "dr_grpo"]
    with pytest.raises(ConfigError, match="grpo.advantage='sign' is not one of grpo, dr_grpo"):
        load_config(None, ["--grpo.advantage=sign"])
    register_advantage("sign")(lambda dev, std, std_eps: dev.sign())
    try:
        assert load_config(None, ["--grpo.advantage=sign"]).grpo.advantage == "sign"
        r, gid = torch.tensor([0.0, 2.0, 5.0, float("nan")]), torch.tensor([0, 0, 0, 0])
        adv, used = group_advantages(r, gid, "sign")
        assert adv.tolist() == [-1.0, -1.0, 1.0, 0.0] and used.tolist() == [True, True, True, False]
        with pytest.raises(ValueError, match="unknown advantage kind 'nope'"):
            group_advantages(r, gid, "nope")
    finally:
        del ADVANTAGES["sign"]
