"""The knob surrogate WM: feature parsing on hand-made texts, learning a known response, online refits."""

import itertools
import math
import random

import numpy as np
import pytest
import torch

from world_models.knob_surrogate import KnobSpace, KnobSurrogateOutcomeModel, knob_features, parse_knob_text
from world_models.outcome import OutcomeExample, outcome_metrics

SPACE = {
    "MODEL": ['"ridge"', '"forest"', '"knn"'],
    "ALPHA": ["0.01", "0.1", "1.0", "10.0"],
    "SCALE": ["False", "True"],
}
BASE = {"MODEL": '"ridge"', "ALPHA": "1.0", "SCALE": "False"}
TASK = "toy | tabular-regression | rmse"


def test_parse_knob_text_reads_views_and_edit_views():
    assert parse_knob_text('MODEL = "knn"\nALPHA = 0.1\n') == ({"MODEL": '"knn"', "ALPHA": "0.1"}, 0)
    assert parse_knob_text('ALPHA = 10.0 (was 1.0)\nMODEL = "a b" (was "ridge")\n') == (
        {"ALPHA": "10.0", "MODEL": '"a b"'},
        0,
    )
    assert parse_knob_text("no change\n") == ({}, 0)
    # free-mode diff lines are counted, never read as knobs
    assert parse_knob_text("ALPHA = 0.1\n+    x = 1\n-    y = 2\n") == ({"ALPHA": "0.1"}, 2)


def test_knob_features_by_hand():
    f = knob_features('MODEL = "knn"\nALPHA = 0.1\nSCALE = False\n', SPACE, BASE)
    # per knob: index in its space, numeric value, changed; then n changed, other lines
    expected = [2, math.nan, 1, 1, 0.1, 1, 0, 0.0, 0, 2, 0]
    np.testing.assert_array_equal(f, np.array(expected, dtype=float))
    # the edit view of the same solution gives the same features (unnamed knobs keep the baseline)
    g = knob_features('MODEL = "knn" (was "ridge")\nALPHA = 0.1 (was 1.0)\n', SPACE, BASE)
    np.testing.assert_array_equal(f, g)
    # the baseline itself; equal literals written differently; a value outside the space
    base = knob_features("no change\n", SPACE, BASE)
    np.testing.assert_array_equal(base, np.array([0, math.nan, 0, 2, 1.0, 0, 0, 0.0, 0, 0, 0], dtype=float))
    same = knob_features("MODEL = 'ridge'\nALPHA = 1.00\n", SPACE, BASE)
    np.testing.assert_array_equal(same, base)
    out = knob_features("ALPHA = 1.01\nSCALE = True\n", SPACE, BASE)
    assert math.isnan(out[3]) and out[4] == 1.01 and out[5] == 1  # no index, still a number
    assert out[6:9].tolist() == [1, 1.0, 1] and out[9] == 2


def truth(model: str, alpha: float, scale: bool) -> float:
    """A known response with an interaction and a crash (knn without scaling)."""
    if model == "knn" and not scale:
        return -1.0
    return {"ridge": 0.0, "forest": 0.6, "knn": 0.3}[model] - 0.25 * abs(math.log10(alpha) + 1) + 0.3 * scale


def example(model: str, alpha: float, scale: bool, rng: random.Random, noise: float = 0.02) -> OutcomeExample:
    text = f'MODEL = "{model}"\nALPHA = {alpha}\nSCALE = {scale}\n'
    return OutcomeExample("toy", TASK, text, truth(model, alpha, scale) + rng.gauss(0, noise), "ok", "log")


def grid(rng: random.Random, repeats: int = 1) -> list[OutcomeExample]:
    pts = list(itertools.product(["ridge", "forest", "knn"], [0.01, 0.1, 1.0, 10.0], [False, True]))
    return [example(*p, rng) for _ in range(repeats) for p in pts]


def surrogate(estimator: str = "extra_trees", **kw) -> KnobSurrogateOutcomeModel:
    return KnobSurrogateOutcomeModel(
        {TASK: (SPACE, BASE)}, estimator=estimator, trees=50, members=4, max_iter=60, **kw
    )


def test_one_hot_codes_value_indices():
    space = KnobSpace(SPACE, BASE)
    x = np.stack([space.features('MODEL = "knn"\n'), space.features("ALPHA = 1.01\n")])
    oh = space.one_hot(x)
    assert oh.shape == (2, space.n_features + 3 + 4 + 2)
    np.testing.assert_array_equal(oh[:, : space.n_features], x)
    np.testing.assert_array_equal(oh[0, space.n_features :], [0, 0, 1, 0, 0, 1, 0, 1, 0])
    np.testing.assert_array_equal(oh[1, space.n_features :], [1, 0, 0, 0, 0, 0, 0, 1, 0])  # 1.01: none


@pytest.mark.parametrize("estimator", ["extra_trees", "hgb"])
def test_surrogate_learns_a_known_response_and_reports_variance(estimator):
    rng = random.Random(0)
    train = grid(rng, repeats=3)
    test = grid(rng)
    wm = surrogate(estimator)
    wm.fit(train)
    mean, var = wm.predict([e.task_text for e in test], [e.solution_text for e in test])
    y = torch.tensor([e.reward for e in test])
    m = outcome_metrics(mean, var, y)
    assert m["spearman"] > 0.9 and m["mae"] < 0.15, m
    assert var.shape == mean.shape and bool((var > 0).all())
    # a task it was never given, and one with no data: the prior of the rewards seen so far
    mean2, var2 = wm.predict(["other | x | y"], ['MODEL = "ridge"\n'])
    assert mean2.item() == pytest.approx(float(np.mean([e.reward for e in train])), abs=1e-5)
    assert var2.item() > 0


@pytest.mark.parametrize("estimator", ["extra_trees", "hgb"])
def test_update_refits_on_new_anchors_and_state_round_trips(estimator):
    rng = random.Random(1)
    wm = surrogate(estimator, min_fit=4)
    # first only ridge edits: forest is unknown territory, predicted like ridge
    wm.fit([example("ridge", a, s, rng) for a in (0.01, 0.1, 1.0, 10.0) for s in (False, True)])
    probe = ['MODEL = "forest"\nALPHA = 0.1\nSCALE = True\n']
    before, _ = wm.predict([TASK], probe)
    anchors = [example("forest", a, s, rng) for a in (0.01, 0.1, 1.0, 10.0) for s in (False, True)] * 2
    info = wm.update(anchors, steps=1)
    assert info["wm/train_size"] == 24
    after, _ = wm.predict([TASK], probe)
    assert after.item() == pytest.approx(truth("forest", 0.1, True), abs=0.15)
    assert abs(after.item() - before.item()) > 0.3
    # steps=0 stores the anchors without refitting
    frozen, _ = wm.predict([TASK], probe)
    wm.update([example("forest", 0.1, True, rng, noise=0) for _ in range(4)], steps=0)
    assert torch.equal(wm.predict([TASK], probe)[0], frozen) and len(wm.examples) == 28
    # the next refit uses every stored example; the state is plain data and reloads to the same model
    wm.update([example("ridge", 0.1, True, rng)], steps=1)
    other = surrogate(estimator, min_fit=4)
    other.load_state_dict_full(wm.state_dict_full())
    texts = [e.solution_text for e in grid(rng)]
    assert torch.equal(
        other.predict([TASK] * len(texts), texts)[0], wm.predict([TASK] * len(texts), texts)[0]
    )


@pytest.mark.parametrize("estimator", ["extra_trees", "hgb"])
def test_a_task_whose_edits_all_set_the_same_values_is_fitted_to_their_mean(estimator):
    """Six anchors of one edit (no column varies, so none is kept): the model predicts their mean
    instead of failing to fit on zero features (a grid cell once stopped there), and it is a fitted
    model, not the prior: an edit it has not seen gets the same mean."""
    rng = random.Random(2)
    same = [example("forest", 0.1, True, rng, noise=0.05) for _ in range(6)]
    wm = surrogate(estimator, min_fit=4)
    wm.fit(same)
    assert TASK in wm._models
    mean, var = wm.predict([TASK, TASK], [same[0].solution_text, 'MODEL = "knn"\n'])
    expected = float(np.mean([e.reward for e in same]))
    assert mean.tolist() == pytest.approx([expected, expected], abs=1e-5)
    assert bool((var > 0).all())


@pytest.mark.parametrize("estimator", ["extra_trees", "hgb"])
def test_calibrated_variance_matches_held_out_error(estimator):
    rng = random.Random(2)
    wm = surrogate(estimator)
    wm.fit(grid(rng, repeats=2))
    hold = [
        example(*p, rng, noise=0.2) for p in itertools.product(["ridge", "forest"], [0.1, 1.0], [True])
    ] * 3
    wm.calibrate_variance(hold)
    mean, var = wm.predict([e.task_text for e in hold], [e.solution_text for e in hold])
    err2 = (mean - torch.tensor([e.reward for e in hold])).pow(2).mean()
    assert var.mean().item() == pytest.approx(err2.item(), rel=0.3)
    assert wm.var_offset > 0 or wm.var_scale > 1  # the noise is larger than the trees' own spread


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match="extra_trees, hgb"):
        surrogate("gp")
