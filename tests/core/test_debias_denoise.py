import math

import pytest
import torch

from wmrl.config import DebiasConfig, DenoiseConfig, half_life_to_alpha
from wmrl.debias import OnlineDebiaser, centred_residual
from wmrl.denoise import (
    InverseVarianceDenoiser,
    anchor_weight,
    normalise_weights,
    residuals_and_variances,
    sample_weights,
)


def test_identity_until_warmup_then_refit_cadence():
    d = OnlineDebiaser(DebiasConfig(warmup_pairs=10, refit_every=5, buffer_size=100))
    x = torch.linspace(0, 1, 9)
    assert not d.observe(x, x**3)
    assert torch.equal(d(x), x)  # 9 pairs < warm-up: identity
    assert d.observe(torch.tensor([0.5]), torch.tensor([0.125]))  # 10th pair: first fit
    assert d.fitted and not torch.equal(d(x), x)
    assert not d.observe(torch.rand(4), torch.rand(4))  # 4 new < refit_every
    assert d.observe(torch.rand(1), torch.rand(1))  # 5th new pair: refit


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (-50.0, 10.0)])
def test_calibration_undoes_a_non_affine_distortion_in_any_range(lo, hi):
    g = torch.Generator().manual_seed(0)
    r = lo + (hi - lo) * torch.rand(3000, generator=g, dtype=torch.float64)
    u = (r - lo) / (hi - lo)
    r_hat = 7.0 + 3.0 * torch.sqrt(u)  # saturating, different units and offset
    d = OnlineDebiaser(DebiasConfig(warmup_pairs=200, refit_every=64, buffer_size=5000))
    d.observe(r_hat, r)
    test = lo + (hi - lo) * torch.rand(500, generator=g, dtype=torch.float64)
    cal = d(7.0 + 3.0 * torch.sqrt((test - lo) / (hi - lo)))
    assert (cal - test).abs().max() < 0.03 * (hi - lo)
    # monotone, and clipped to the fitted range outside it
    grid = torch.linspace(0, 20, 200, dtype=torch.float64)
    assert (d(grid).diff() >= 0).all()
    assert d(torch.tensor([1e6], dtype=torch.float64)).item() <= hi + 1e-9


def test_buffer_is_fifo_and_state_round_trips():
    cfg = DebiasConfig(warmup_pairs=4, refit_every=2, buffer_size=6)
    d = OnlineDebiaser(cfg)
    d.observe(torch.arange(10.0), torch.arange(10.0) ** 2)
    assert [p[0] for p in d.pairs] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    e = OnlineDebiaser(cfg)
    e.load_state_dict(d.state_dict())
    x = torch.linspace(0, 12, 30)
    assert torch.equal(d(x), e(x)) and e.seen == 10


def test_nan_scores_stay_nan_and_are_not_observed():
    d = OnlineDebiaser(DebiasConfig(warmup_pairs=2, refit_every=1, buffer_size=10))
    d.observe(torch.tensor([0.0, float("nan"), 1.0]), torch.tensor([0.0, 1.0, float("nan")]))
    assert d.seen == 1
    assert math.isnan(d(torch.tensor([float("nan")])).item())


def test_centred_residual_matches_loop_and_ignores_offsets():
    pred = torch.tensor([1.0, 2.0, 4.0, 10.0, 10.0])
    true = torch.tensor([0.0, 2.0, 3.0, 5.0, 6.0])
    gid = torch.tensor([0, 0, 0, 1, 1])
    res = centred_residual(pred, true, gid)
    d0 = [1.0, 0.0, 1.0]
    m0 = sum(d0) / 3
    assert res[0].item() == pytest.approx(sum((x - m0) ** 2 for x in d0) / 3)
    assert res[1].item() == pytest.approx(0.25)
    assert torch.allclose(centred_residual(pred + 100.0, true, gid), res)  # a per-group offset cancels


def test_denoiser_sets_c_at_warmup_then_freezes():
    cfg = DenoiseConfig(half_life=4.0, warmup_obs=3, w_target=2.0, w_max=4.0)
    den = InverseVarianceDenoiser(cfg)
    true = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    gid = torch.tensor([0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])  # residual_g = 0.25, var_g = 0.25 -> ratio 1
    den.observe(pred[:4], true[:4], gid[:4])
    assert den.c is None and den.w == 1.0
    den.observe(pred[4:], true[4:], torch.tensor([0, 0]))
    assert den.n_obs == 3 and den.c == pytest.approx(1.0) and den.w == pytest.approx(2.0)
    # a perfect WM from now on: s2 decays with the half-life, c stays frozen, w relaxes towards 1
    for _ in range(4):
        den.observe(true[:2], true[:2], torch.tensor([0, 0]))
    assert den.c == pytest.approx(1.0)
    assert den.s2 == pytest.approx(0.5, rel=1e-6)  # four observations = one half-life
    assert den.w == pytest.approx(1.5, rel=1e-6)


def test_groups_with_equal_true_rewards_are_skipped():
    den = InverseVarianceDenoiser(DenoiseConfig(warmup_obs=1))
    den.observe(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([0, 0]))
    assert den.n_obs == 0 and den.s2 is None


def test_s2_is_a_ratio_of_averages_so_a_near_flat_group_cannot_swamp_it():
    """True rewards 0, 0, 2e-4, 0 differ only by noise; that group's own ratio res / var is in the
    millions, and an average of per-group ratios would pin the anchor weight at w_max."""
    pred = torch.tensor([0.1, 0.3, 0.2, 0.0, 0.5, 0.5, 0.5, 0.5])
    true = torch.tensor([0.0, 0.0, 2e-4, 0.0, 0.0, 1.0, 0.0, 1.0])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    res, var = residuals_and_variances(pred, true, gid)
    d0 = [p - t for p, t in zip([0.1, 0.3, 0.2, 0.0], [0.0, 0.0, 2e-4, 0.0], strict=True)]
    md0 = sum(d0) / 4
    assert res[0].item() == pytest.approx(sum((d - md0) ** 2 for d in d0) / 4)
    assert var[0].item() == pytest.approx(sum((t - 5e-5) ** 2 for t in [0.0, 0.0, 2e-4, 0.0]) / 4)
    assert res[1].item() == pytest.approx(0.25) and var[1].item() == pytest.approx(0.25)
    assert (res[0] / var[0]).item() > 1e5
    den = InverseVarianceDenoiser(DenoiseConfig(half_life=1.0, warmup_obs=2, w_target=2.0, w_max=4.0))
    den.observe(pred, true, gid)  # alpha = 1/2: both EWMAs are the plain means of the two groups
    assert den.s2 == pytest.approx((res.sum() / var.sum()).item())
    assert 1.0 < den.s2 < 1.2 and den.w == pytest.approx(2.0)
    # checkpoints round-trip; one from before the ratio of averages ("s2" only) keeps its s2 and w
    again = InverseVarianceDenoiser(den.cfg)
    again.load_state_dict(den.state_dict())
    assert (again.s2, again.w, again.n_obs) == (den.s2, den.w, den.n_obs)
    old = InverseVarianceDenoiser(den.cfg)
    old.load_state_dict({"s2": 3.0, "n_obs": 40, "c": 0.5})
    assert old.s2 == 3.0 and old.w == pytest.approx(2.5)


def test_weights_formulae():
    assert anchor_weight(10.0, 1.0, 4.0) == 4.0 and anchor_weight(0.0, 1.0, 4.0) == 1.0
    assert half_life_to_alpha(1.0) == pytest.approx(0.5)
    w = sample_weights(torch.tensor([0.0, 1.0, 3.0]), var_floor=1.0, w_max=10.0)
    u = torch.tensor([1.0, 0.5, 0.25])
    assert torch.allclose(w, u / u.mean())
    used = torch.tensor([True, True, False])
    nw = normalise_weights(torch.tensor([4.0, 2.0, 100.0]), used)
    assert nw[used].mean().item() == pytest.approx(1.0)
