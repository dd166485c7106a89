"""Prediction-powered advantages: unbiasedness, the anchors-only limit, the tuned λ, twins, resume."""

import itertools
import math

import numpy as np
import ppi_py
import pytest
import torch

from wmrl.config import ConfigError, GRPOConfig, PPIConfig, load_config
from wmrl.domain import RolloutBatch
from wmrl.grid_spec import DomainEntry, GridSpec, with_control
from wmrl.learner import group_advantages, grpo_update, policy_gradient, score_directions
from wmrl.ppi import (
    PowerTuner,
    gradient_row_products,
    ppi_advantages,
    rho_lower_bound,
    shrink_lambda,
    variance_ratio,
)
from wmrl.runs import train_run
from wmrl.toy import SoftmaxPolicy
from wmrl.trainer import Trainer

N_TASKS, G = 6, 4


def _batch(n_tasks=N_TASKS, seed=0):
    g = torch.Generator().manual_seed(seed)
    ctx = torch.arange(n_tasks).repeat_interleave(G)
    tokens = torch.randint(5, (n_tasks * G, 1), generator=g)
    return RolloutBatch(
        tokens=tokens,
        logprobs=torch.full((n_tasks * G, 1), math.log(0.2)),
        mask=torch.ones(n_tasks * G, 1),
        group_ids=ctx.clone(),
        tasks=list(range(n_tasks)),
        extras={"context": ctx},
    )


def _shared_ppi(adv_true, adv_wm, anchor_tasks, lam, n_tasks=N_TASKS):
    """ppi advantages when the anchors are ``anchor_tasks`` (shared rollouts, all graded)."""
    anchor = torch.zeros(n_tasks, dtype=torch.bool)
    anchor[list(anchor_tasks)] = True
    rows = anchor.repeat_interleave(G)
    ones = torch.ones_like(rows)
    return ppi_advantages(adv_true, rows, adv_wm, ones, rows, n_tasks, len(anchor_tasks), lam)[0]


def _advantages(seed=0):
    g = torch.Generator().manual_seed(seed)
    gid = torch.arange(N_TASKS).repeat_interleave(G)
    r = torch.rand(N_TASKS * G, generator=g)
    r_hat = r + 0.3 * torch.randn(N_TASKS * G, generator=g)
    return group_advantages(r, gid, "dr_grpo")[0], group_advantages(r_hat, gid, "dr_grpo")[0]


@pytest.mark.parametrize("lam", [0.0, 0.37, 1.0])
def test_unbiased_over_the_anchor_draw_for_every_lambda(lam):
    """Averaged over every choice of n anchors among N tasks, the ppi advantages (and so the
    gradient, linear in them at ratio 1) equal the full-execution ones, for a fixed WM."""
    adv_true, adv_wm = _advantages()
    n = 2
    draws = [_shared_ppi(adv_true, adv_wm, s, lam) for s in itertools.combinations(range(N_TASKS), n)]
    assert torch.allclose(torch.stack(draws).mean(0), adv_true, atol=1e-6)
    policy, batch, cfg = SoftmaxPolicy(N_TASKS, 5), _batch(), GRPOConfig(group_size=G, tasks_per_step=N_TASKS)
    with torch.no_grad():
        policy.theta.normal_(generator=torch.Generator().manual_seed(1))
    used = torch.ones(N_TASKS * G, dtype=torch.bool)
    grads = torch.stack([policy_gradient(policy, batch, a, used, cfg) for a in draws])
    assert torch.allclose(grads.mean(0), policy_gradient(policy, batch, adv_true, used, cfg), atol=1e-6)
    if lam > 0:  # not a trivial identity: single draws differ from the full update
        assert not torch.allclose(draws[0], adv_true, atol=1e-3)


def test_matches_ppi_py_for_a_scalar_mean():
    """With one rollout per task and its value as its 'advantage', the mean ppi advantage is the
    PPI++ point estimate of the mean with the anchors' labels and every task's prediction."""
    rng = np.random.default_rng(0)
    big_n, n = 40, 10
    y = rng.normal(size=big_n)
    y_hat = 0.8 * y + 0.4 * rng.normal(size=big_n)
    anchor = torch.zeros(big_n, dtype=torch.bool)
    anchor[rng.choice(big_n, n, replace=False)] = True
    for lam in (0.0, 0.6, 1.0):
        a, _ = ppi_advantages(
            torch.tensor(y),
            anchor,
            torch.tensor(y_hat),
            torch.ones(big_n, dtype=torch.bool),
            anchor,
            big_n,
            n,
            lam,
        )
        ref = ppi_py.ppi_mean_pointestimate(y[anchor.numpy()], y_hat[anchor.numpy()], y_hat, lam=lam)
        assert float(a.mean()) == pytest.approx(float(np.asarray(ref).ravel()[0]), abs=1e-10)


def test_variance_ratio_and_optimal_lambda_match_a_simulation():
    """Var g_ppi / Var(anchors alone) = 1 - (1 - n/N)(2λc - λ²σ̂²)/σ² for anchors drawn among the N
    scored tasks, minimised at λ* = c/σ̂² (not PPI++'s disjoint-set c/((1 + n/N)σ̂²))."""
    rng = np.random.default_rng(1)
    big_n, n, reps = 16, 4, 40_000
    g = rng.normal(size=(reps, big_n))
    g_hat = 0.7 * g + 0.6 * rng.normal(size=(reps, big_n))
    c, h, t = 0.7, 0.7**2 + 0.6**2, 1.0
    idx = np.argsort(rng.random((reps, big_n)), axis=1)[:, :n]
    g_a, h_a = np.take_along_axis(g, idx, 1), np.take_along_axis(g_hat, idx, 1)
    base = g_a.mean(1).var()

    def empirical(lam):
        return (lam * g_hat.mean(1) + (g_a - lam * h_a).mean(1)).var() / base

    for lam in (0.3, c / h, 1.0):
        assert empirical(lam) == pytest.approx(variance_ratio(c, h, t, lam, n / big_n), abs=0.03)
    assert empirical(c / h) < empirical(c / (h * (1 + n / big_n))) < empirical(0.0)


def test_lambda_zero_reproduces_anchors_only_exactly():
    """GRPO on the anchor groups alone and ppi with λ = 0 take the same optimizer step (SGD: Adam's
    first step is about lr * sign(grad), which blows a 1e-9 rounding difference up to a step)."""
    adv_true, adv_wm = _advantages(seed=3)
    anchors = [1, 4]
    batch = _batch()
    cfg = GRPOConfig(group_size=G, tasks_per_step=N_TASKS, optimizer="sgd", lr=10.0)
    policies = [SoftmaxPolicy(N_TASKS, 5) for _ in range(2)]
    opts = [torch.optim.SGD(p.parameters(), lr=cfg.lr) for p in policies]
    a_ppi = _shared_ppi(adv_true, adv_wm, anchors, lam=0.0)
    grpo_update(policies[0], opts[0], batch, a_ppi, torch.ones_like(a_ppi, dtype=torch.bool), cfg)
    rows = torch.isin(batch.group_ids, torch.tensor(anchors))
    grpo_update(policies[1], opts[1], batch, adv_true, rows, cfg)
    assert not torch.equal(policies[0].theta, torch.zeros(N_TASKS, 5))
    assert torch.allclose(policies[0].theta, policies[1].theta, atol=1e-6)


def _tuner_lambda(noise: float, calibrate: bool, var_bins: int = 1) -> float:
    tuner = PowerTuner(PPIConfig(warmup_groups=4, var_bins=var_bins), advantage="grpo")
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        r = torch.rand(4 * 8, generator=g)
        r_hat = torch.tanh(3 * r) + noise * torch.randn(4 * 8, generator=g)  # monotone distortion + noise
        tuner.observe(r_hat, r, torch.arange(4).repeat_interleave(8))
    return tuner.lam(calibrate)


def test_tuned_lambda_tracks_the_world_model_quality():
    assert _tuner_lambda(0.0, calibrate=True) == pytest.approx(1.0, abs=0.05)  # perfect ranking: λ -> 1
    good, bad, useless = (_tuner_lambda(s, calibrate=True) for s in (0.05, 0.5, 50.0))
    assert 1.0 >= good > bad > useless and useless < 0.15
    assert PowerTuner(PPIConfig(warmup_groups=4)).lam(True) == 0.0  # before the warm-up: anchors alone
    assert PowerTuner(PPIConfig(lam=0.3)).lam(True) == 0.3


def test_per_variance_bin_lambda_leans_less_on_uncertain_rollouts():
    tuner = PowerTuner(PPIConfig(warmup_groups=2, var_bins=2), advantage="dr_grpo")
    g = torch.Generator().manual_seed(0)
    for _ in range(16):
        r = torch.rand(8, generator=g)
        var = torch.tensor([0.001, 1.0]).repeat(4)  # half the rollouts precise, half noisy
        tuner.observe(r + var.sqrt() * torch.randn(8, generator=g), r, torch.zeros(8, dtype=torch.long), var)
    lam = tuner.lam(False, torch.tensor([0.001, 1.0]))
    assert lam[0] > 0.5 and lam[1] < 0.2  # the noisy rows also blur the group mean: < 1 for the precise


def _cfg(tmp_path, *extra):
    return load_config(
        "toy",
        [
            f"--out_dir={tmp_path}",
            "--tracking.eval_every=0",
            "--ppi.warmup_groups=4",
            "--debias.warmup_pairs=32",
            *extra,
        ],
    )


def test_twin_groups_with_common_noise_correlate_and_without_do_not(tmp_path):
    rho = {}
    for crn in (True, False):
        cfg = _cfg(
            tmp_path / str(crn),
            "--method=ppi",
            "--grpo.steps=12",
            "--domain.twin_anchors=true",
            f"--domain.twin_common_noise={str(crn).lower()}",
        )
        trainer = Trainer(cfg, cfg.domain.build(cfg))
        rows = [trainer.train_step() for _ in range(cfg.grpo.steps)]
        rho[crn] = np.nanmean([r["ppi/rho"] for r in rows])
        assert rows[-1]["ppi/lambda"] > 0 if crn else True
    assert rho[True] > 0.4 and abs(rho[False]) < 0.2


def test_anchors_only_executes_and_generates_only_the_anchor_groups(tmp_path):
    a = train_run(_cfg(tmp_path / "a", "--method=anchors_only", "--grpo.steps=3"))
    w = train_run(_cfg(tmp_path / "w", "--method=ppi", "--grpo.steps=3"))
    assert a["exec/real_total"] == w["exec/real_total"] == 3 * 4 * 8  # 4 anchor groups of 8 per step
    assert a["anchors/fraction"] == 1.0 and "ppi/lambda" in w and "wm/residual_before" not in a


def test_ppi_resume_is_exact(tmp_path):
    ref = Trainer(cfg := _cfg(tmp_path / "ref", "--method=ppi", "--grpo.steps=8"), cfg.domain.build(cfg))
    ref.train()
    part = _cfg(tmp_path / "run", "--method=ppi", "--grpo.steps=5")
    Trainer(part, part.domain.build(part)).train()
    full = _cfg(tmp_path / "run", "--method=ppi", "--grpo.steps=8")
    resumed = Trainer(full, full.domain.build(full), resume=True)
    resumed.train()
    assert torch.equal(ref.policy.theta, resumed.policy.theta)
    assert (
        ref.method_state.tuner.state_dict() == resumed.method_state.tuner.state_dict()
        and ref.method_state.tuner.seen > 4
    )


def test_every_comparison_with_a_wm_method_includes_anchors_only():
    assert with_control(["real", "wmrl"]) == ["real", "anchors_only", "wmrl"]
    assert with_control(["ppi"]) == ["anchors_only", "ppi"]
    assert with_control(["real"]) == ["real"]
    spec = GridSpec(methods=["ppi"], domains=[DomainEntry(name="toy", preset="toy")])
    assert spec.all_methods[:2] == ["anchors_only", "ppi"]


def test_an_execution_log_starts_lambda_before_the_runs_own_warm_up(tmp_path):
    """With ppi.prior_from_log the first step already leans on the WM (the toy's log of 8 groups
    fills the 4-group warm-up); without it the warm-up's steps are anchors alone."""
    lam = {}
    for prior in (False, True):
        cfg = _cfg(
            tmp_path / str(prior),
            "--method=ppi",
            "--grpo.steps=2",
            f"--ppi.prior_from_log={str(prior).lower()}",
        )
        trainer = Trainer(cfg, cfg.domain.build(cfg))
        assert trainer.method_state.tuner.seen == (8 if prior else 0)
        lam[prior] = trainer.train_step()["ppi/lambda"]
    assert lam[False] == 0.0 and lam[True] > 0.3  # the toy WM ranks well outside its rank-error contexts


def test_the_prior_log_is_the_starting_policys_and_leaves_the_runs_draws_alone(tmp_path):
    plain = _cfg(tmp_path / "a", "--method=ppi", "--ppi.lam=0.5")
    prior = _cfg(tmp_path / "b", "--method=ppi", "--ppi.lam=0.5", "--ppi.prior_from_log=true")
    d_plain, d_prior = plain.domain.build(plain), prior.domain.build(prior)
    groups = d_prior.prior_anchor_groups()
    assert len(groups) == 8 and all(len(h) == len(r) == prior.grpo.group_size for h, r in groups)
    r_true = torch.tensor([r for _, r in groups])
    h = torch.tensor([h for h, _ in groups])
    assert torch.corrcoef(torch.stack([h.flatten(), r_true.flatten()]))[0, 1] > 0.5
    # a fixed lambda: the log changes nothing the run draws or trains
    a, b = Trainer(plain, d_plain), Trainer(prior, d_prior)
    for _ in range(2):
        a.train_step(), b.train_step()
    assert torch.equal(a.policy.theta, b.policy.theta)


def test_prior_from_log_needs_a_domain_with_an_execution_log():
    with pytest.raises(ConfigError, match="needs a domain with a pre-training execution log"):
        load_config("vla-debug", ["--ppi.prior_from_log=true"])
    with pytest.raises(ConfigError, match="domain.log_groups=0"):
        load_config("toy", ["--domain.log_groups=0"])


def _twin_batch(seed=0):
    """One real group of G rollouts on context 0 and its twin group, half of it on context 1
    (another observation of the same task, as an imagined rollout sees predicted frames), same tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, (G, 1), generator=g).repeat(2, 1)
    ctx = torch.tensor([0] * G + [0, 1] * (G // 2))
    return RolloutBatch(
        tokens=tokens,
        logprobs=torch.full((2 * G, 1), math.log(0.2)),
        mask=torch.ones(2 * G, 1),
        group_ids=torch.tensor([0] * G + [1] * G),
        tasks=[0, 0],
        extras={"context": ctx},
    )


def test_gradient_moments_are_the_inner_products_of_the_group_gradients():
    """(g·ĝ, |ĝ|², |g|²) from per-rollout score directions equal those of the two groups' policy
    gradients computed by the learner (token mean over G rollouts: g = -G · policy_gradient)."""
    batch = _twin_batch()
    policy = SoftmaxPolicy(2, 5)
    with torch.no_grad():
        policy.theta.copy_(torch.randn(2, 5, generator=torch.Generator().manual_seed(1)))
    adv_true, adv_wm = (torch.randn(G, generator=torch.Generator().manual_seed(s)) for s in (2, 3))
    s = score_directions(policy, batch, torch.arange(2 * G), "token_mean")
    moments = gradient_row_products(adv_true, adv_wm, s @ s.T).sum(0)
    cfg = GRPOConfig(group_size=G, tasks_per_step=1)
    real, twin = torch.arange(2 * G) < G, torch.arange(2 * G) >= G
    g = -G * policy_gradient(policy, batch, torch.cat([adv_true, adv_true]), real, cfg).double()
    g_hat = -G * policy_gradient(policy, batch, torch.cat([adv_wm, adv_wm]), twin, cfg).double()
    expected = torch.stack([g @ g_hat, g_hat @ g_hat, g @ g])
    assert torch.allclose(moments, expected, rtol=1e-6) and expected[0].abs() > 1e-3


def test_gradient_moments_with_orthonormal_shared_directions_are_the_advantage_moments():
    adv_true, adv_wm = _advantages()
    a, h = adv_true[:G].double(), adv_wm[:G].double()
    eye = torch.eye(G, dtype=torch.float64)
    gram = torch.cat([torch.cat([eye, eye], 1), torch.cat([eye, eye], 1)])
    assert torch.allclose(gradient_row_products(a, h, gram), torch.stack([a * h, h * h, a * a], 1))
    with pytest.raises(ValueError, match="expected"):
        gradient_row_products(a, h, eye)


def _lambda_on(moments: str, twin_gram) -> float:
    """λ after 8 groups whose WM scores rank the true rewards perfectly; ``twin_gram(m)`` is the
    gram of the real rows' and twin rows' score directions."""
    tuner = PowerTuner(PPIConfig(warmup_groups=4, var_bins=1, moments=moments), advantage="grpo")
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        r = torch.rand(G, generator=g)
        tuner.observe(r, r, torch.zeros(G, dtype=torch.long), gram=twin_gram(G))
    return tuner.lam(calibrate=False)


def test_a_twin_whose_gradients_point_elsewhere_gets_no_weight_on_gradient_moments():
    """Perfectly ranked twin scores: λ is 1 on advantages whatever the directions; on gradients it
    is 1 when twin rows share their real rows' (orthonormal) directions, 0 when orthogonal to them."""

    def shared(m):
        eye = torch.eye(m, dtype=torch.float64)
        return torch.cat([torch.cat([eye, eye], 1), torch.cat([eye, eye], 1)])

    def orthogonal(m):
        return torch.eye(2 * m, dtype=torch.float64)

    assert _lambda_on("advantage", orthogonal) == pytest.approx(1.0)
    assert _lambda_on("gradient", shared) == pytest.approx(1.0)
    assert _lambda_on("gradient", orthogonal) == 0.0
    with pytest.raises(ValueError, match="needs the rows' score-direction gram"):
        PowerTuner(PPIConfig(moments="gradient")).observe(
            torch.rand(4), torch.rand(4), torch.zeros(4, dtype=torch.long)
        )


def test_gradient_moments_config_errors():
    with pytest.raises(ConfigError, match="ppi.moments"):
        load_config("toy", ["--ppi.moments=gradients"])
    with pytest.raises(ConfigError, match="needs ppi.moments=advantage"):
        load_config("toy", ["--ppi.moments=gradient", "--ppi.prior_from_log=true"])


def test_a_twin_ppi_run_on_gradient_moments_tunes_lambda_and_resumes_exactly(tmp_path):
    extra = ("--method=ppi", "--domain.twin_anchors=true", "--ppi.moments=gradient")
    ref = Trainer(cfg := _cfg(tmp_path / "ref", *extra, "--grpo.steps=8"), cfg.domain.build(cfg))
    rows = [ref.train_step() for _ in range(8)]
    assert rows[-1]["ppi/lambda"] > 0 and all(math.isfinite(r["ppi/rho_grad"]) for r in rows)
    assert all(g[3] is not None for g in ref.method_state.tuner.groups)
    part = _cfg(tmp_path / "run", *extra, "--grpo.steps=5")
    Trainer(part, part.domain.build(part)).train()
    full = _cfg(tmp_path / "run", *extra, "--grpo.steps=8")
    resumed = Trainer(full, full.domain.build(full), resume=True)
    resumed.train()
    assert torch.equal(ref.policy.theta, resumed.policy.theta)
    assert ref.method_state.tuner.state_dict() == resumed.method_state.tuner.state_dict()


def test_a_tuner_state_saved_before_grams_were_kept_still_loads():
    tuner = PowerTuner(PPIConfig())
    tuner.load_state_dict({"groups": [[[0.1, 0.2], [0.0, 1.0], [float("nan")] * 2]], "seen": 1})
    assert tuner.groups[0][3] is None and tuner.moments(calibrate=False)[1] > 0


def _pooled_within_group_rho(x: np.ndarray, y: np.ndarray) -> float:
    """The pooled within-group correlation of ``[K, m]`` samples (each group centred on its mean)."""
    xc, yc = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    return float((xc * yc).sum() / np.sqrt((xc**2).sum() * (yc**2).sum()))


def test_rho_lower_bound_covers_the_true_correlation_at_its_confidence():
    """Windows of K = 8 groups of m = 8 bivariate-normal rows with ρ = 0.4: the Fisher-z bound on
    n_eff = M − K + 1 rows lies below ρ in about 90% of windows (an independent pooled estimate)."""
    rng = np.random.default_rng(0)
    k, m, rho, reps = 8, 8, 0.4, 2000
    x = rng.normal(size=(reps, k, m))
    y = rho * x + np.sqrt(1 - rho**2) * rng.normal(size=(reps, k, m))
    lows = [rho_lower_bound(_pooled_within_group_rho(x[i], y[i]), k * m - k + 1, 0.9) for i in range(reps)]
    assert np.mean(np.array(lows) <= rho) == pytest.approx(0.9, abs=0.02)
    assert rho_lower_bound(0.5, 3, 0.9) == -1.0 and rho_lower_bound(0.5, 10**9, 0.9) == pytest.approx(
        0.5, abs=1e-3
    )


def test_shrink_lambda_formula():
    """λ = λ̂ · clip(ρ_lo/ρ̂, 0, 1), ρ_lo = tanh(atanh ρ̂ − Φ⁻¹(conf)/sqrt(n_eff − 3))."""
    lo = math.tanh(math.atanh(0.6) - 1.2815515655446004 / math.sqrt(40 - 3))
    assert shrink_lambda(0.8, 0.6, 40, 0.9) == pytest.approx(0.8 * lo / 0.6, rel=1e-9)
    assert shrink_lambda(0.8, 0.1, 40, 0.9) == 0.0  # ρ not told from 0 at 90%
    assert shrink_lambda(0.8, 0.6, 40, 0.5) == pytest.approx(0.8)  # confidence 0.5: the point estimate
    assert shrink_lambda(0.0, 0.6, 40, 0.9) == 0.0 and shrink_lambda(0.5, float("nan"), 40, 0.9) == 0.0


def _window_lambdas(rho: float, confidence: float | None, reps: int = 100) -> np.ndarray:
    """The tuned λ of ``reps`` independent windows of 8 groups of 8 rows whose WM scores correlate
    with the true rewards at ``rho`` within groups (dr_grpo advantages: centred, not scaled)."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(reps):
        tuner = PowerTuner(PPIConfig(warmup_groups=8, var_bins=1, shrink_confidence=confidence), "dr_grpo")
        r = rng.normal(size=64)
        r_hat = rho * r + np.sqrt(1 - rho**2) * rng.normal(size=64)
        tuner.observe(torch.tensor(r_hat), torch.tensor(r), torch.arange(8).repeat_interleave(8))
        out.append(tuner.lam(calibrate=False))
    return np.array(out)


def test_shrinkage_keeps_a_useless_world_model_out_and_a_good_one_in():
    """ρ = 0: without shrinkage about half the windows lean on the WM, with it about 1 in 10; ρ = 0.9:
    shrinkage costs a few percent of λ."""
    assert np.mean(_window_lambdas(0.0, None) > 0) > 0.35
    assert np.mean(_window_lambdas(0.0, 0.9) > 0) < 0.17
    good_raw, good = _window_lambdas(0.9, None), _window_lambdas(0.9, 0.9)
    assert np.all(good <= good_raw) and good.mean() > 0.93 * good_raw.mean()
    tuner = PowerTuner(PPIConfig(warmup_groups=2))
    tuner.observe(torch.rand(16), torch.rand(16), torch.arange(2).repeat_interleave(8))
    assert tuner.n_eff() == 16 - 2 + 1
    with pytest.raises(ConfigError, match="ppi.shrink_confidence=1.0 must lie in"):
        load_config("toy", ["--ppi.shrink_confidence=1.0"])
