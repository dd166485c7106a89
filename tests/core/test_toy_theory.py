"""The theory check on a shortened run: the orderings docs/design.md section 5 expects, with margins."""

import json

import pytest

from wmrl.config import load_config
from wmrl.experiment import compare


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    out = tmp_path_factory.mktemp("theory")
    cfg = load_config("toy", [f"--out_dir={out}", "--compare.seeds=[0,1,2]"])
    s = compare(cfg)
    assert json.loads((out / "summary.json").read_text())["methods"].keys() == s["methods"].keys()
    assert (out / "comparison.png").stat().st_size > 10_000
    return s["methods"]


def test_wm_alone_ends_clearly_below_real(summary):
    assert summary["wm"]["final_true_reward"] < summary["real"]["final_true_reward"] - 0.05


def test_debias_beats_mix(summary):
    assert summary["debias"]["final_true_reward"] > summary["mix"]["final_true_reward"] + 0.003
    assert summary["debias"]["wm_residual_after"] < 0.6 * summary["debias"]["wm_residual_before"]


def test_denoise_keeps_the_update_closer_to_the_true_one_than_mix(summary):
    assert summary["denoise"]["update_error"] < summary["mix"]["update_error"] - 0.02


def test_wmrl_at_least_mix_and_closes_most_of_the_gap(summary):
    wm, real, wmrl = (summary[m]["final_true_reward"] for m in ("wm", "real", "wmrl"))
    assert wmrl >= summary["mix"]["final_true_reward"]
    assert (wmrl - wm) / (real - wm) > 0.5


def test_real_needs_one_over_rho_more_executions(summary):
    ratio = summary["real"]["real_executions"] / summary["wmrl"]["real_executions"]
    assert ratio == pytest.approx(1 / 0.25)
    assert summary["wm"]["real_executions"] == 0


def test_ppi_beats_the_anchors_alone_and_wmrl(summary):
    """The prediction-powered correction clears the no-WM control at equal real executions."""
    ppi, anchors_only, real = (summary[m] for m in ("ppi", "anchors_only", "real"))
    assert ppi["real_executions"] == anchors_only["real_executions"] == summary["wmrl"]["real_executions"]
    assert ppi["final_true_reward"] > anchors_only["final_true_reward"] + 0.01
    assert ppi["final_true_reward"] > summary["wmrl"]["final_true_reward"] + 0.01
    assert real["final_true_reward"] > ppi["final_true_reward"]
