"""ppi's update is unbiased over the anchor draw, checked by exact enumeration of every draw: with
ungraded anchor rows, missing WM scores, varying rollout lengths and twin groups, through the
trainer's own code (:func:`wmrl.ppi.ppi_rows`, then one SGD step of :func:`wmrl.learner.grpo_update`).
"""

import itertools
import math

import pytest
import torch

from wmrl.config import ConfigError, GRPOConfig, load_config
from wmrl.domain import RolloutBatch
from wmrl.learner import group_advantages, grpo_update, policy_gradient
from wmrl.ppi import ppi_advantages, ppi_rows

N, G, T, A = 5, 4, 3, 4  # tasks, rollouts per task, tokens per rollout, token vocabulary
CFG = GRPOConfig(group_size=G, tasks_per_step=N, optimizer="sgd", lr=1.0, max_grad_norm=0.0)


class TokenPolicy(torch.nn.Module):
    """``π(x_t | k) = softmax(θ[k])`` for every token of a rollout with context ``k``."""

    def __init__(self, n_contexts: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.theta = torch.nn.Parameter(torch.randn(n_contexts, A, generator=g, dtype=torch.float64))

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        logp = torch.log_softmax(self.theta[batch.extras["context"]], dim=-1)  # [R, A]
        return logp.gather(1, batch.tokens)  # [R, T]


def _rollouts(context: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and masks ``[R, T]`` with lengths 1..T, fixed per seed."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(A, (context.numel(), T), generator=g)
    lengths = torch.randint(1, T + 1, (context.numel(),), generator=g)
    return tokens, (torch.arange(T) < lengths[:, None]).double()


def _batch(tokens, mask, context, group_ids, real_row=None) -> RolloutBatch:
    return RolloutBatch(
        tokens=tokens,
        logprobs=torch.zeros(tokens.shape, dtype=torch.float64),
        mask=mask,
        group_ids=group_ids,
        tasks=list(range(int(group_ids.max()) + 1)),
        extras={"context": context},
        real_row=real_row,
    )


def _sgd_step(policy: TokenPolicy, batch, adv, used, counted=None) -> torch.Tensor:
    """The parameter change of one plain SGD step (lr 1, no clipping) of grpo_update: -gradient."""
    before = policy.theta.detach().clone()
    with torch.no_grad():
        batch.logprobs = policy.log_probs(batch)  # sampled from the policy: ratio 1
    opt = torch.optim.SGD(policy.parameters(), lr=CFG.lr)
    grpo_update(policy, opt, batch, adv.double(), used, CFG, counted=counted)
    step = policy.theta.detach() - before
    with torch.no_grad():
        policy.theta.copy_(before)
    return step


def _problem(seed=0, ungraded=(), wm_missing=()):
    """A shared-rollout step: N groups of G rollouts, true rewards (NaN at ``ungraded`` rows) and
    WM scores (NaN at ``wm_missing`` rows) fixed for every draw."""
    g = torch.Generator().manual_seed(seed)
    gid = torch.arange(N).repeat_interleave(G)
    tokens, mask = _rollouts(gid, seed)
    r = torch.rand(N * G, generator=g, dtype=torch.float64)
    r_hat = torch.tanh(2 * r) + 0.4 * torch.randn(N * G, generator=g, dtype=torch.float64)
    r[list(ungraded)] = float("nan")
    r_hat[list(wm_missing)] = float("nan")
    return _batch(tokens, mask, gid.clone(), gid), r, r_hat


def _draws(n):
    for subset in itertools.combinations(range(N), n):
        anchor = torch.zeros(N, dtype=torch.bool)
        anchor[list(subset)] = True
        yield anchor


def _ppi_mean_step(policy, batch, r, r_hat, n, lam, old_rule=False):
    """The ppi SGD step averaged over every draw of ``n`` anchors (executed rows see ``r``).
    ``old_rule``: the rule before this fix (ungraded rows uncorrected, the loss over the used rows)."""
    steps = []
    for anchor in _draws(n):
        r_seen = torch.where(anchor[batch.group_ids], r, torch.full_like(r, float("nan")))
        p = ppi_rows(r_seen, r_hat, batch.group_ids, anchor, None, N, lam, CFG.advantage, CFG.std_eps)
        if old_rule:
            corrected = p.corrected & group_advantages(r_seen, batch.group_ids)[1]
            wm_used = group_advantages(r_hat, batch.group_ids)[1]
            true_used = group_advantages(r_seen, batch.group_ids)[1]
            adv, used = ppi_advantages(p.adv_true, true_used, p.adv_wm, wm_used, corrected, N, n, lam)
            steps.append(_sgd_step(policy, batch, adv, used))
        else:
            steps.append(_sgd_step(policy, batch, p.adv, p.used, p.counted))
    return torch.stack(steps).mean(0)


def _full_step(policy, batch, r, counted_all=True):
    """Full-execution GRPO's SGD step, its loss over every rollout's tokens (``counted_all``) or over
    its used rows' (plain GRPO)."""
    adv, used = group_advantages(r, batch.group_ids, CFG.advantage, CFG.std_eps)
    counted = torch.ones_like(used) if counted_all else None
    return _sgd_step(policy, batch, adv, used, counted)


def _rel_err(x, y) -> float:
    return float((x - y).norm() / y.norm())


@pytest.mark.parametrize("lam", [0.7, torch.linspace(0.2, 1.0, N * G, dtype=torch.float64)])
def test_ungraded_anchor_rows_keep_the_update_unbiased(lam):
    """Two ungraded rows (one leaves its group a single graded rollout, so that group is skipped):
    the mean over all 10 draws of 2 anchors of 5 equals full-execution GRPO; the old rule, which
    left an ungraded row's λÂ uncorrected, is off by more than 10%."""
    batch, r, r_hat = _problem(ungraded=(1, 8, 9, 10))
    policy = TokenPolicy(N)
    target = _full_step(policy, batch, r)
    mean = _ppi_mean_step(policy, batch, r, r_hat, 2, lam)
    assert _rel_err(mean, target) < 1e-6
    assert _rel_err(_ppi_mean_step(policy, batch, r, r_hat, 2, lam, old_rule=True), target) > 0.1
    # the fixed denominator counts the ungraded rows: GRPO's step times graded tokens / all tokens
    used = group_advantages(r, batch.group_ids)[1]
    scale = float(batch.mask[used].sum() / batch.mask.sum())
    assert torch.allclose(target, scale * _full_step(policy, batch, r, counted_all=False), atol=1e-7)


def test_missing_wm_scores_keep_the_denominator_and_the_update_unbiased():
    """Three rows without a WM score, every rollout graded and of varying length: the mean over every
    draw is plain GRPO's step exactly; dividing by the used rows' tokens (the old rule) is biased."""
    batch, r, r_hat = _problem(seed=1, wm_missing=(0, 6, 13))
    policy = TokenPolicy(N, seed=1)
    target = _full_step(policy, batch, r, counted_all=False)
    assert torch.allclose(target, _full_step(policy, batch, r), atol=1e-7)  # every row is used
    for n in (1, 2, 3):
        assert _rel_err(_ppi_mean_step(policy, batch, r, r_hat, n, 0.8), target) < 1e-6
    assert _rel_err(_ppi_mean_step(policy, batch, r, r_hat, 2, 0.8, old_rule=True), target) > 0.01


def test_ungraded_rows_and_missing_scores_together_on_seq_mean():
    global CFG
    saved, CFG = CFG, GRPOConfig(group_size=G, tasks_per_step=N, optimizer="sgd", lr=1.0, max_grad_norm=0.0,
                                 loss_agg="seq_mean")  # fmt: skip
    try:
        batch, r, r_hat = _problem(seed=2, ungraded=(3, 17), wm_missing=(4, 5, 17))
        policy = TokenPolicy(N, seed=2)
        target = _full_step(policy, batch, r)
        assert _rel_err(_ppi_mean_step(policy, batch, r, r_hat, 2, 0.6), target) < 1e-6
    finally:
        CFG = saved


def test_twin_groups_with_an_ungraded_real_row_are_unbiased():
    """A twin domain: each task has one imagined group (context N + t, WM-scored) and, when it is an
    anchor, a real group (context t) too; the anchor's imagined group is appended as its twin. With
    a real rollout ungraded, the mean over every draw is full execution's step on the real groups."""
    g = torch.Generator().manual_seed(3)
    real_ctx, imag_ctx = torch.arange(N).repeat_interleave(G), (N + torch.arange(N)).repeat_interleave(G)
    real_tokens, _ = _rollouts(real_ctx, 3)
    imag_tokens, _ = _rollouts(imag_ctx, 4)
    mask = torch.ones(N * G, T, dtype=torch.float64)  # real and imagined rollouts of equal length
    r = torch.rand(N * G, generator=g, dtype=torch.float64)
    r_hat = r + 0.5 * torch.randn(N * G, generator=g, dtype=torch.float64)
    r[[2, 13]] = float("nan")
    policy = TokenPolicy(2 * N, seed=3)
    gid = torch.arange(N).repeat_interleave(G)
    target = _full_step(policy, _batch(real_tokens, mask, real_ctx, gid), r)
    steps = []
    for anchor in _draws(2):
        order = torch.cat([torch.arange(N), anchor.nonzero().squeeze(-1)])  # each group's task
        is_real = torch.cat([anchor, torch.zeros(2, dtype=torch.bool)])
        rows = (order[:, None] * G + torch.arange(G)).flatten()
        real_row = is_real.repeat_interleave(G)
        tokens = torch.where(real_row[:, None], real_tokens[rows], imag_tokens[rows])
        ctx = torch.where(real_row, real_ctx[rows], imag_ctx[rows])
        gids = torch.arange(N + 2).repeat_interleave(G)
        twin_of = torch.cat([torch.full((N,), -1), anchor.nonzero().squeeze(-1)])  # [N + 2] groups
        stands_for = twin_of[gids] * G + torch.arange(gids.numel()) % G  # a twin row -> its real row
        twin_rows = torch.where(twin_of[gids] >= 0, stands_for, torch.full_like(gids, -1))
        batch = _batch(tokens, torch.ones(rows.numel(), T, dtype=torch.float64), ctx, gids, twin_rows)
        r_seen = torch.where(real_row, r[rows], torch.full_like(r[rows], float("nan")))
        r_wm = torch.where(real_row, torch.full_like(r[rows], float("nan")), r_hat[rows])
        group_anchor = torch.cat([anchor, torch.zeros(2, dtype=torch.bool)])
        p = ppi_rows(r_seen, r_wm, gids, group_anchor, twin_rows, N, 0.9, CFG.advantage, CFG.std_eps)
        steps.append(_sgd_step(policy, batch, p.adv, p.used, p.counted))
    assert _rel_err(torch.stack(steps).mean(0), target) < 1e-6


def test_the_learners_gradient_uses_the_same_denominator_as_its_update():
    batch, r, r_hat = _problem(seed=4, wm_missing=(2,))
    policy = TokenPolicy(N, seed=4)
    p = ppi_rows(r, r_hat, batch.group_ids, torch.ones(N, dtype=torch.bool), None, N, 0.5)
    grad = policy_gradient(policy, batch, p.adv.double(), p.used, CFG, counted=p.counted)
    assert torch.allclose(-grad.view(N, A), _sgd_step(policy, batch, p.adv, p.used, p.counted), atol=1e-7)


def test_no_anchor_group_is_refused_never_a_wm_only_update():
    batch, r, r_hat = _problem()
    none = torch.zeros(N, dtype=torch.bool)
    with pytest.raises(ValueError, match="at least one anchor group per step, got n_anchors=0 of 5"):
        ppi_rows(torch.full_like(r, float("nan")), r_hat, batch.group_ids, none, None, N, 0.5)
    with pytest.raises(ConfigError) as e:
        load_config("toy", ["--method=ppi", "--anchors.min_groups=0", "--anchors.fraction=0.02"])
    assert "0 anchor groups per step" in str(e.value) and "anchors.min_groups=1" in str(e.value)
    assert math.isfinite(load_config("toy", ["--method=wm", "--anchors.min_groups=0"]).anchors.fraction)


def test_the_trainer_corrects_an_ungraded_anchor_row_and_counts_every_rollout(tmp_path):
    """ppi's advantages as train_step runs them (prediction_powered_advantages): an anchor row that came back ungraded gets λÂ(1 − N/n),
    and the loss's denominator counts every rollout of the step."""
    from wmrl.methods.ppi import prediction_powered_advantages
    from wmrl.trainer import Trainer

    cfg = load_config("toy", [f"--out_dir={tmp_path}", "--method=ppi", "--ppi.lam=0.5"])
    trainer = Trainer(cfg, cfg.domain.build(cfg))
    n_tasks, g = cfg.grpo.tasks_per_step, cfg.grpo.group_size
    gid = torch.arange(n_tasks).repeat_interleave(g)
    ctx = gid.clone()
    batch = RolloutBatch(
        tokens=torch.zeros(n_tasks * g, 1, dtype=torch.long),
        logprobs=torch.zeros(n_tasks * g, 1),
        mask=torch.ones(n_tasks * g, 1),
        group_ids=gid,
        tasks=list(range(n_tasks)),
        extras={"context": ctx},
    )
    r_hat = torch.rand(n_tasks * g, generator=torch.Generator().manual_seed(0))
    anchor = torch.zeros(n_tasks, dtype=torch.bool)
    anchor[:4] = True
    r_true = torch.where(anchor[gid], r_hat.sqrt(), torch.full_like(r_hat, float("nan")))
    r_true[1] = float("nan")  # an anchor rollout the grader failed on
    adv, used, counted, _ = prediction_powered_advantages(
        trainer, batch, r_hat, None, r_hat, r_true, anchor, n_tasks
    )
    adv_wm = group_advantages(r_hat, gid, cfg.grpo.advantage, cfg.grpo.std_eps)[0]
    assert float(adv[1]) == pytest.approx(0.5 * float(adv_wm[1]) * (1 - n_tasks / 4), rel=1e-6)
    assert bool(used[1]) and bool(counted.all())
