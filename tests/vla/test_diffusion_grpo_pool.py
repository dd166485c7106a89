"""The pooled paired summary of benchmarks/diffusion_grpo.py (``pooled_paired``, ``--pool``), checked
against counts and the Wald interval worked out by hand, and on the committed 200-episode results
against the pooled figures docs/diffusion.md reports for them."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # the script imports its sibling act_chunk_start by name

from diffusion_grpo import pool_results, pooled_paired  # noqa: E402


def test_pooled_paired_counts_and_wald_interval():
    # seed A: episode 0 gained, seed B: episode 0 lost; 5 episodes, d = 0
    after = [[True, True, False], [False, True]]
    before = [[False, True, False], [True, True]]
    out = pooled_paired(after, before)
    assert (out["n10"], out["n01"], out["both"], out["neither"], out["episodes"]) == (1, 1, 2, 1, 5)
    assert out["difference"] == 0.0 and out["mcnemar_exact_p"] == 1.0
    half = 1.96 * (2 / 5 / 5) ** 0.5  # sqrt(((n10 + n01)/n - d²)/n)
    assert out["ci95_wald"] == pytest.approx([-half, half])
    # 3 gained, 0 lost of 4: d = 0.75, var = (0.75 - 0.5625) / 4
    out = pooled_paired([[True, True, True, False]], [[False, False, False, False]])
    assert out["difference"] == 0.75
    half = 1.96 * (0.1875 / 4) ** 0.5
    assert out["ci95_wald"] == pytest.approx([0.75 - half, 0.75 + half])


def test_pooled_paired_refuses_unmatched_seeds():
    with pytest.raises(ValueError, match="same seeds before and after: 1 and 2"):
        pooled_paired([[True]], [[True], [False]])
    with pytest.raises(ValueError, match="same seeds"):
        pooled_paired([], [])


def test_pool_results_reproduces_the_documented_whole_chain_figure():
    # docs/diffusion.md: whole chain, open loop, 25 steps, 5 seeds x 200 episodes: 190 gained, 167 lost
    res = BENCH / "results" / "diffusion_grpo"
    out = pool_results([str(res / f"seed{s}_25steps_act4_200eps.json") for s in range(5)])
    assert out["seeds"] == [0, 1, 2, 3, 4] and out["before_success"] == pytest.approx(0.614)
    final = out["final"]
    assert (final["n10"], final["n01"], final["episodes"]) == (190, 167, 1000)
    assert round(final["mcnemar_exact_p"], 2) == 0.24
    assert [round(100 * x, 1) for x in final["ci95_wald"]] == [-1.4, 6.0]


def test_seed_mean_test_matches_scipy_and_the_formula():
    from diffusion_grpo import gains, seed_mean_test
    from scipy import stats

    g = [-0.075, 0.085, 0.04, 0.055, 0.015]
    out = seed_mean_test(g)
    ref = stats.ttest_1samp(g, 0.0, alternative="greater")
    assert out["t"] == pytest.approx(ref.statistic) and out["p_one_sided"] == pytest.approx(ref.pvalue)
    mean, sd = sum(g) / 5, (sum((x - sum(g) / 5) ** 2 for x in g) / 4) ** 0.5
    assert (out["mean_gain"], out["sd"]) == pytest.approx((mean, sd))
    assert out["lower_bound_95"] == pytest.approx(mean - 2.131847 * sd / 5**0.5, abs=1e-6)
    assert (out["seeds"], out["seeds_with_gain"]) == (5, 4)
    assert gains([[True, True], [False, True, True, True]], [[False, True], [True] * 4]) == [0.5, -0.25]
    with pytest.raises(ValueError, match="at least 2 seeds, got 1"):
        seed_mean_test([0.1])


def test_pool_results_adds_the_per_seed_test_of_the_gains():
    res = BENCH / "results" / "diffusion_grpo"
    out = pool_results([str(res / f"seed{s}_25steps_act4_200eps.json") for s in range(5)])
    per = out["final"]["per_seed"]
    assert per["seeds"] == 5 and per["mean_gain"] == pytest.approx(out["final"]["difference"])
    assert pool_results([str(res / "seed0_25steps_act4_200eps.json")])["final"]["per_seed"] is None


def test_per_seed_gains_are_each_runs_own_and_plot(tmp_path):
    import json

    from diffusion_grpo import plot_pool

    res = BENCH / "results" / "diffusion_grpo"
    paths = [str(res / f"seed{s}_75steps_act4_200eps.json") for s in range(4)]
    out = pool_results(paths)
    own = [json.loads(Path(p).read_text())["runs"][0]["gain_success_t1"] for p in paths]
    assert out["final"]["per_seed"]["gains"] == pytest.approx(own) and out["final_step"] == 75
    png = plot_pool(out, tmp_path / "gains.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="two or more seeds"):
        plot_pool(pool_results(paths[:1]), tmp_path / "one.png")
