"""The evidence standard of a comparison (docs/design.md section 7): the lower bounds, the verdicts at a
margin, the controls (placebo WM, ppi with λ = 0) and the seeds left out as exploratory."""

import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from scipy import stats

from wmrl.config import load_config
from wmrl.controls import placebo_prediction, within_group_permutation
from wmrl.domain import Prediction
from wmrl.grid_spec import CONTROLS, DomainEntry, GridSpec
from wmrl.learner import group_advantages, policy_gradient
from wmrl.methods import ppi as ppi_method
from wmrl.report import (
    clears,
    domain_evidence,
    lower_bound_bootstrap,
    lower_bound_t,
    paired_evidence,
    seed_list,
    verdict,
)
from wmrl.trainer import Trainer

DIFFS = [0.012, 0.020, -0.004, 0.031, 0.001, 0.015, 0.008, 0.019]


def test_the_t_lower_bound_is_the_one_sided_t_interval():
    """By hand: mean − t_{0.95, n−1} sd / √n; and scipy's own one-sided interval."""
    d = np.array(DIFFS)
    by_hand = d.mean() - stats.t.ppf(0.95, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    assert lower_bound_t(DIFFS) == pytest.approx(by_hand, rel=1e-12)
    scipy_low = stats.ttest_1samp(d, 0.0, alternative="greater").confidence_interval(0.95).low
    assert lower_bound_t(DIFFS) == pytest.approx(scipy_low, rel=1e-12)
    assert lower_bound_t([0.01] * 4) == 0.01  # no spread: the bound is the mean
    assert lower_bound_t([0.01]) is None


def test_the_bootstrap_bound_lies_between_the_t_bound_and_the_mean():
    """With eight seeds the BCa bound ignores the t tail: above the t bound, below the mean; it is
    reproducible (a fixed generator) and absent for fewer than three seeds."""
    low = lower_bound_bootstrap(DIFFS)
    assert lower_bound_t(DIFFS) < low < np.mean(DIFFS)
    assert lower_bound_bootstrap(DIFFS) == low
    assert lower_bound_bootstrap(DIFFS[:2]) is None and lower_bound_bootstrap([0.1] * 5) is None


def test_verdicts_flip_at_the_margin():
    m = 0.005
    assert verdict(1e-9, m) == "superior"
    assert verdict(0.0, m) == verdict(-m + 1e-9, m) == "non-inferior"
    assert verdict(-m, m) == verdict(-m - 1e-9, m) == "not shown"
    assert verdict(None, m) is None and verdict(0.1, None) is None


def _per_cell(finals: dict[str, list[float]], exploratory: dict[str, list[int]] | None = None) -> dict:
    exploratory = exploratory or {}
    return {
        (m, s): {"heldout_final": v, "exploratory": s in exploratory.get(m, [])}
        for m, vals in finals.items()
        for s, v in enumerate(vals)
    }


METHODS = ["anchors_only", "ppi", "ppi_placebo", "ppi_lambda0"]


def _evidence(shift: float, placebo_shift: float = -0.01, exploratory=None, margin=0.005) -> dict:
    """ppi = anchors_only + shift + the DIFFS pattern minus its mean; the controls below ppi by a
    seed-varying gap of mean -placebo_shift."""
    base = [0.7 + 0.01 * s for s in range(8)]
    spread = [x - np.mean(DIFFS) for x in DIFFS]
    ppi = [b + shift + e for b, e in zip(base, spread, strict=True)]
    gap = [placebo_shift + 0.3 * e for e in spread]
    finals = {
        "anchors_only": base,
        "ppi": ppi,
        "ppi_placebo": [p - g for p, g in zip(ppi, gap, strict=True)],
        "ppi_lambda0": [p - g for p, g in zip(ppi, gap, strict=True)],
    }
    return domain_evidence(_per_cell(finals, exploratory), METHODS, list(range(8)), margin)["ppi"]


def test_the_verdict_of_a_method_flips_where_its_lower_bound_crosses_the_margin():
    half_width = np.mean(DIFFS) - lower_bound_t(DIFFS)  # the t bound sits this far below the mean
    assert _evidence(half_width + 1e-4)["verdict"] == "superior"
    assert _evidence(half_width - 1e-4)["verdict"] == "non-inferior"
    assert _evidence(half_width - 0.005 + 1e-4)["verdict"] == "non-inferior"
    assert _evidence(half_width - 0.005 - 1e-4)["verdict"] == "not shown"
    assert _evidence(half_width - 0.005 - 1e-4, margin=0.01)["verdict"] == "non-inferior"
    e = _evidence(half_width + 1e-4)
    assert e["vs_anchors_only"]["lb_t"] == pytest.approx(1e-4, abs=1e-9)
    wins = sum(half_width + 1e-4 + x - np.mean(DIFFS) > 0 for x in DIFFS)
    assert e["vs_anchors_only"]["seeds"] == list(range(8)) and e["vs_anchors_only"]["wins"] == wins < 8


def test_a_gain_counts_only_where_the_method_clears_every_control():
    e = _evidence(0.05, placebo_shift=0.01)
    assert e["verdict"] == "superior" and e["clears_controls"] and e["gain_counts"]
    assert set(e["vs_controls"]) == {"ppi_placebo", "ppi_lambda0"}
    e = _evidence(0.05, placebo_shift=-0.01)  # ppi below its controls: superior, but no gain counts
    assert e["verdict"] == "superior" and e["clears_controls"] is False and e["gain_counts"] is False
    assert clears([]) is None and clears([None]) is False
    assert clears([{"lb_t": None}]) is None and clears([{"lb_t": 0.1}, {"lb_t": 0.0}]) is False


def test_exploratory_seeds_are_left_out_and_named():
    e = _evidence(0.05, exploratory={"ppi": [0, 1, 2, 3]})
    assert e["exploratory_seeds"] == [0, 1, 2, 3] and e["vs_anchors_only"]["seeds"] == [4, 5, 6, 7]
    assert e["vs_controls"]["ppi_placebo"]["n"] == 4
    # a control's flag does not remove the method's seeds
    assert _evidence(0.05, exploratory={"ppi_placebo": [0]})["vs_anchors_only"]["n"] == 8
    assert paired_evidence({0: 1.0, 1: None}, {0: 0.5, 1: 0.2}, [0, 1])["seeds"] == [0]
    assert seed_list([0, 1, 2, 3, 6]) == "0-3, 6" and seed_list([4, 5]) == "4, 5"


def test_a_spec_margin_must_be_non_negative():
    with pytest.raises(ValueError, match="margin=-0.1 must be >= 0"):
        GridSpec(methods=["ppi"], domains=[DomainEntry(name="t", preset="toy", margin=-0.1)])
    assert GridSpec(methods=["ppi"], domains=[DomainEntry(name="t", preset="toy")]).all_methods == [
        "anchors_only", "ppi", "ppi_placebo", "ppi_lambda0",
    ]  # fmt: skip


# ---- the placebo WM --------------------------------------------------------------------------------


def test_the_placebo_permutes_scores_within_each_group_and_touches_no_other_generator():
    gid = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 0])  # groups need not be contiguous
    pred = Prediction(torch.arange(10.0), torch.arange(10.0) * 10)
    before = torch.get_rng_state()
    out = placebo_prediction(pred, gid, seed=3, step=5)
    assert torch.equal(torch.get_rng_state(), before)
    for g in range(3):  # the same multiset per group; a row's score and variance move together
        rows = gid == g
        assert sorted(out.mean[rows].tolist()) == sorted(pred.mean[rows].tolist())
    assert torch.equal(out.var, out.mean * 10)
    assert torch.equal(placebo_prediction(pred, gid, 3, 5).mean, out.mean)  # (seed, step) alone
    perms = {tuple(within_group_permutation(gid, 3, step).tolist()) for step in range(50)}
    assert len(perms) > 40


def test_the_placebo_permutation_is_uniform_within_a_group():
    """Over many steps each row of a group of 4 takes each of its group's scores about 1/4 of the
    time (chi-square test of the 4x4 table)."""
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    counts = np.zeros((4, 4))
    for step in range(2000):
        perm = within_group_permutation(gid, 0, step)
        counts[np.arange(4), perm[:4].numpy()] += 1
    assert stats.chisquare(counts.flatten()).pvalue > 0.001


def _trainer(tmp_path, *extra):
    cfg = load_config("toy", [f"--out_dir={tmp_path}", "--tracking.eval_every=0", *extra])
    return Trainer(cfg, cfg.domain.build(cfg))


def _spy(obj, name: str, record: list):
    """Wrap ``obj.name`` so each call's arguments and result are appended to ``record``."""
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        record.append((args, kwargs, result))
        return result

    setattr(obj, name, wrapper)


@contextmanager
def _spy_ppi(record: list):
    """Within the block, record each call of ppi's advantages as ``_spy`` does (its arguments after
    the trainer: batch, r_hat, var, r_cal, r_true, group_anchor, n_tasks)."""
    original = ppi_method.prediction_powered_advantages

    def wrapper(trainer, *args, **kwargs):
        result = original(trainer, *args, **kwargs)
        record.append((args, kwargs, result))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ppi_method, "prediction_powered_advantages", wrapper)
        yield


def test_ppi_placebo_runs_ppis_path_on_permuted_scores_with_the_runs_other_draws_unchanged(tmp_path):
    """One step of ppi and of ppi_placebo (the grid's overrides): the same tasks, rollouts, anchors,
    true rewards and raw WM scores; ppi_placebo's scores in ppi's code path are a within-group
    permutation of the WM's, ppi's are the WM's own."""
    seen = {}
    for label in ("ppi", "ppi_placebo"):
        method, over = ("ppi", []) if label == "ppi" else CONTROLS[label]
        t = _trainer(tmp_path / label, f"--method={method}", *over)
        gen, wm, ppi = [], [], []
        _spy(t.domain, "generate", gen)
        _spy(t.domain.world_model, "predict", wm)
        with _spy_ppi(ppi):
            t.train_step()
        batch = gen[0][2]
        r_hat, r_true = ppi[0][0][1], ppi[0][0][4]
        seen[label] = (batch, wm[0][2].mean, r_hat, r_true, torch.get_rng_state())
    (b0, raw0, used0, true0, rng0), (b1, raw1, used1, true1, rng1) = seen["ppi"], seen["ppi_placebo"]
    assert torch.equal(b0.tokens, b1.tokens) and b0.tasks == b1.tasks
    assert torch.equal(raw0, raw1)
    assert torch.equal(true0.isnan(), true1.isnan())
    assert torch.equal(true0[~true0.isnan()], true1[~true1.isnan()])
    assert torch.equal(rng0, rng1)
    assert torch.equal(used0, raw0)  # ppi uses the WM's scores as they are
    assert not torch.equal(used1, raw1)
    for g in b1.group_ids.unique():
        rows = b1.group_ids == g
        assert sorted(used1[rows].tolist()) == sorted(raw1[rows].tolist())


def test_ppi_lambda0_takes_exactly_the_anchors_only_gradient(tmp_path):
    """ppi_lambda0 (ppi's code path, λ = 0): anchor rows get (N/n) A, every other row 0, and the
    step's gradient (token mean over all N tasks' rows) equals GRPO's on the anchor rows alone."""
    method, over = CONTROLS["ppi_lambda0"]
    t = _trainer(tmp_path, f"--method={method}", *over, "--grpo.optimizer=sgd")
    gen, ppi, grads = [], [], []
    _spy(t.domain, "generate", gen)
    import wmrl.trainer as trainer_module

    original = trainer_module.grpo_update

    def spy_update(policy, optimizer, batch, adv, used, cfg, *args, **kwargs):
        anchors = ~ppi[0][0][4].isnan()
        a_true, true_used = group_advantages(ppi[0][0][4], batch.group_ids, cfg.advantage, cfg.std_eps)
        grads.append(
            (
                adv.clone(),
                used.clone(),
                policy_gradient(policy, batch, adv, used, cfg),
                policy_gradient(policy, batch, a_true, true_used & anchors, cfg),
                a_true,
                anchors,
            )
        )
        return original(policy, optimizer, batch, adv, used, cfg, *args, **kwargs)

    trainer_module.grpo_update = spy_update
    try:
        with _spy_ppi(ppi):
            metrics = t.train_step()
    finally:
        trainer_module.grpo_update = original
    adv, used, g_ppi, g_anchors, a_true, anchors = grads[0]
    n_tasks, n_anchor_groups = t.cfg.grpo.tasks_per_step, int(metrics["exec/step"]) // t.cfg.grpo.group_size
    assert metrics["ppi/lambda"] == 0 and 0 < n_anchor_groups < n_tasks
    assert torch.allclose(adv[anchors], n_tasks / n_anchor_groups * a_true[anchors])
    assert torch.equal(adv[~anchors], torch.zeros_like(adv[~anchors])) and bool(used.all())
    assert g_anchors.norm() > 0
    assert torch.allclose(g_ppi, g_anchors, rtol=1e-5, atol=1e-7)


def test_the_placebo_permutes_the_execution_log_that_starts_lambda_too(tmp_path):
    """With ppi.prior_from_log the placebo's λ window starts from the log's groups with their WM
    scores permuted within each group (true rewards in place), never the WM's own ranking."""
    window = {}
    for label in ("ppi", "ppi_placebo"):
        over = CONTROLS[label][1] if label in CONTROLS else []
        t = _trainer(tmp_path / label, "--method=ppi", "--ppi.prior_from_log=true", *over)
        window[label] = list(t.method_state.tuner.groups)
    assert len(window["ppi"]) == len(window["ppi_placebo"]) == 8
    moved = 0
    for (h, r, _, _), (hp, rp, _, _) in zip(window["ppi"], window["ppi_placebo"], strict=True):
        assert rp == r and sorted(hp) == sorted(h)
        moved += hp != h
    assert moved >= 6
