"""The theory check on a shortened grid (benchmarks/specs/toy.yaml, seeds 0-2, through
`wmrl compare`): the orderings docs/design.md section 5 expects, with margins."""

import json
from pathlib import Path

import pytest

from wmrl.cli import main

SPEC = Path(__file__).resolve().parents[2] / "benchmarks" / "specs" / "toy.yaml"
METHODS = ["real", "anchors_only", "wm", "mix", "debias", "denoise", "wmrl", "ppi"]


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    """Mean over seeds of each method's figures (the report's ``figures``, means only)."""
    out = tmp_path_factory.mktemp("theory") / "grid"
    # The orderings need the methods alone: the controls (the spec's `control: true`) are left out.
    assert main(["compare", str(SPEC), "--out-dir", str(out), "--seeds=[0,1,2]", "--control=false"]) == 0
    toy = json.loads((out / "report.json").read_text())["domains"]["toy"]["methods"]
    assert list(toy) == METHODS
    assert (out / "report.png").stat().st_size > 10_000
    return {m: {k: (f or {}).get("mean") for k, f in toy[m]["figures"].items()} for m in METHODS}


def test_wm_alone_ends_clearly_below_real(summary):
    assert summary["wm"]["heldout_final"] < summary["real"]["heldout_final"] - 0.05


def test_debias_beats_mix(summary):
    assert summary["debias"]["heldout_final"] > summary["mix"]["heldout_final"] + 0.003
    assert summary["debias"]["residual_after"] < 0.6 * summary["debias"]["residual_before"]


def test_denoise_keeps_the_update_closer_to_the_true_one_than_mix(summary):
    assert summary["denoise"]["update_error"] < summary["mix"]["update_error"] - 0.02


def test_wmrl_at_least_mix_and_closes_most_of_the_gap(summary):
    wm, real, wmrl = (summary[m]["heldout_final"] for m in ("wm", "real", "wmrl"))
    assert wmrl >= summary["mix"]["heldout_final"]
    assert (wmrl - wm) / (real - wm) > 0.5


def test_real_needs_one_over_rho_more_executions(summary):
    ratio = summary["real"]["real_executions"] / summary["wmrl"]["real_executions"]
    assert ratio == pytest.approx(1 / 0.25)
    assert summary["wm"]["real_executions"] == 0


def test_ppi_beats_the_anchors_alone_and_wmrl(summary):
    """The prediction-powered correction clears the no-WM control at equal real executions."""
    ppi, anchors_only, real = (summary[m] for m in ("ppi", "anchors_only", "real"))
    assert ppi["real_executions"] == anchors_only["real_executions"] == summary["wmrl"]["real_executions"]
    assert ppi["heldout_final"] > anchors_only["heldout_final"] + 0.01
    assert ppi["heldout_final"] > summary["wmrl"]["heldout_final"] + 0.01
    assert real["heldout_final"] > ppi["heldout_final"]
