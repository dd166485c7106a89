"""The confirmatory family's statistics against independent implementations (scipy, statsmodels),
and its verdicts on a hand-made pair of grid reports."""

import json

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from wmrl.config import ConfigError
from wmrl.family import (
    FamilyGrid,
    FamilySpec,
    combined_estimate,
    family_markdown,
    family_report,
    holm,
    holm_bound,
    load_family,
    one_sided_p,
    seeds_needed,
    write_family,
)


def test_one_sided_p_is_scipys_paired_t_test_and_shifts_by_the_margin():
    d = [0.12, -0.03, 0.2, 0.05, 0.09, -0.01, 0.3, 0.04]
    assert one_sided_p(d) == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="greater").pvalue, rel=1e-12)
    shifted = stats.ttest_1samp(d, -0.02, alternative="greater").pvalue
    assert one_sided_p(d, shift=0.02) == pytest.approx(shifted, rel=1e-12)
    assert one_sided_p(d, shift=0.02) < one_sided_p(d)  # non-inferiority is easier than superiority
    assert one_sided_p([0.1]) is None


def test_holm_matches_statsmodels_and_keeps_missing_values_out_of_the_count():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = list(rng.uniform(0, 0.2, size=5))
        assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-12)
    with_missing = holm([0.01, None, 0.04])
    assert with_missing[1] is None
    assert with_missing[0] == pytest.approx(0.02) and with_missing[2] == pytest.approx(0.04)


def test_holm_bound_is_the_largest_holm_p_the_unfinished_comparisons_can_give():
    rng = np.random.default_rng(1)
    for _ in range(20):
        p = list(rng.uniform(0, 0.1, size=4))
        finished = [True, True, False, False]
        bound = holm_bound(p, finished)
        assert bound[2:] == [None, None]
        # any values the unfinished two may end with give a Holm p at most the bound (statsmodels)
        for fill in rng.uniform(0, 1, size=(50, 2)):
            final = multipletests([p[0], p[1], *fill], method="holm")[1]
            assert final[0] <= bound[0] + 1e-12 and final[1] <= bound[1] + 1e-12
        assert bound[:2] == pytest.approx(list(multipletests([p[0], p[1], 1.0, 1.0], method="holm")[1][:2]))
    assert holm_bound([0.01, 0.04], [True, True]) == holm([0.01, 0.04])  # all finished: plain Holm
    with pytest.raises(ValueError, match="finished flags"):
        holm_bound([0.01], [True, False])


@pytest.mark.parametrize("sd,delta,alpha", [(0.236, 0.125, 0.05), (0.236, 0.125, 0.0125), (6.1, 4.0, 0.05)])
def test_seeds_needed_is_the_ceiling_of_statsmodels_solve_power(sd, delta, alpha):
    n = TTestPower().solve_power(effect_size=delta / sd, alpha=alpha, power=0.8, alternative="larger")
    assert seeds_needed(sd, delta, alpha) == int(np.ceil(n - 1e-9))
    assert seeds_needed(sd, delta, alpha / 4) > seeds_needed(sd, delta, alpha)  # a correction costs seeds
    with pytest.raises(ValueError, match="delta"):
        seeds_needed(sd, 0.0)


def test_combined_estimate_stouffer_matches_scipy_and_pools_standardised_effects():
    a, b = [0.1, 0.3, 0.2, 0.25, -0.05], [2.0, 5.0, -1.0, 4.0, 3.0, 6.0, 1.0, 2.5]
    c = combined_estimate([a, b])
    pa, pb = one_sided_p(a), one_sided_p(b)
    ref = stats.combine_pvalues([pa, pb], method="stouffer", weights=np.sqrt([len(a), len(b)]))
    assert c["stouffer_p"] == pytest.approx(ref.pvalue, rel=1e-9)
    da, db = np.mean(a) / np.std(a, ddof=1), np.mean(b) / np.std(b, ddof=1)
    assert min(da, db) < c["std_effect"] < max(da, db)  # a weighted mean of the two
    assert c["std_effect_lb"] < c["std_effect"]
    assert combined_estimate([[0.1]]) is None


def _report(domain: str, margin: float, finals: dict[str, list[float]], seeds: list[int]) -> dict:
    methods = {
        m: {
            "per_seed": {
                str(s): {"heldout_final": v, "exploratory": False} for s, v in zip(seeds, vals, strict=True)
            }
        }
        for m, vals in finals.items()
    }
    return {"domains": {domain: {"margin": margin, "methods": methods}}}


def test_family_verdicts_holm_controls_and_interim():
    seeds = list(range(8))
    base = [0.1, 0.2, 0.15, 0.3, 0.05, 0.25, 0.2, 0.1]
    strong = [b + 0.2 + 0.01 * k for k, b in enumerate(base)]  # clearly ahead on every seed
    worse = [b - 0.03 + 0.02 * (-1) ** k for k, b in enumerate(base)]  # behind by more than the margin
    research = _report("research", 0.02, {
        "anchors_only": base, "wmrl": strong, "wmrl_placebo": base,
        "ppi": worse, "ppi_placebo": base, "ppi_lambda0": base,
    }, seeds)  # fmt: skip
    vla = _report("vla", 0.01, {"anchors_only": base[:4], "wmrl": strong[:4], "ppi": base[:4]}, seeds[:4])
    spec = FamilySpec(name="t", methods=["wmrl", "ppi"], grids=[FamilyGrid(spec="a", report="r/a.json"),
                                                                FamilyGrid(spec="b", report="r/b.json")])  # fmt: skip
    fam = family_report(spec, [research, vla], [seeds, seeds])
    rows = {(r["domain"], r["method"]): r for r in fam["comparisons"]}
    assert rows[("research", "wmrl")]["verdict"] == "superior; gain counts"
    assert rows[("research", "wmrl")]["p_holm"] >= rows[("research", "wmrl")]["p"]
    assert rows[("research", "ppi")]["verdict"] == "not shown"
    assert rows[("vla", "wmrl")]["verdict"].startswith("interim (4 of the 8 declared seeds)")
    # the interim grid's two comparisons enter Holm at p = 1: research's Holm p is their bound
    assert fam["unfinished"] == 2 and rows[("vla", "wmrl")]["p_holm"] is None
    p_research = [rows[("research", m)]["p"] for m in ("wmrl", "ppi")]
    assert rows[("research", "wmrl")]["p_holm"] == pytest.approx(
        multipletests([*p_research, 1, 1], method="holm")[1][0]
    )
    assert "2 of the comparisons are unfinished" in family_markdown(fam)
    # a gain whose raw p passes but whose bound does not stays open while others are unfinished
    modest = [b + 0.04 + 0.05 * (-1) ** k for k, b in enumerate(base)]  # one-sided p about 0.04
    mid = _report("research", 0.02, {"anchors_only": base, "wmrl": modest}, seeds)
    spec_w = FamilySpec(name="t", methods=["wmrl"], grids=[FamilyGrid(spec="a", report="r/a.json"),
                                                          FamilyGrid(spec="b", report="r/b.json")])  # fmt: skip
    row = family_report(spec_w, [mid, None], [seeds, seeds])["comparisons"][0]
    assert row["p"] < 0.05 < row["p_holm"]
    assert row["verdict"] == "superiority open: decided when the other 1 comparison(s) finish"
    sure = _report("vla", 0.01, {"anchors_only": base, "wmrl": strong}, seeds)
    row = family_report(spec_w, [mid, sure], [seeds, seeds])["comparisons"][0]  # both finished: decided
    assert row["p_holm"] < 0.05 and row["verdict"] == "superior; does not clear its controls"
    # the same gain without its placebo run on 8 seeds does not count
    no_ctrl = _report("research", 0.02, {"anchors_only": base, "wmrl": strong}, seeds)
    spec1 = FamilySpec(name="t", methods=["wmrl"], grids=[FamilyGrid(spec="a", report="r/a.json")])
    assert family_report(spec1, [no_ctrl], [seeds])["comparisons"][0]["verdict"] == (
        "superior; does not clear its controls"
    )
    assert "| `wmrl` |" in family_markdown(fam)


def test_write_family_reads_the_grids_and_refuses_what_is_missing(tmp_path):
    (tmp_path / "grid.yaml").write_text(
        "methods: [wmrl]\nseeds: [0, 1, 2]\ndomains:\n  - name: toy\n    preset: toy\n"
    )
    report = _report("toy", 0.005, {"anchors_only": [0.1, 0.2, 0.3], "wmrl": [0.2, 0.25, 0.45]}, [0, 1, 2])
    (tmp_path / "report.json").write_text(json.dumps(report))
    fam_yaml = tmp_path / "family.yaml"
    fam_yaml.write_text(
        f"name: t\nmethods: [wmrl]\ngrids:\n  - spec: {tmp_path / 'grid.yaml'}\n    report: {tmp_path / 'report.json'}\n"
    )
    fam = write_family(fam_yaml, tmp_path / "out")
    assert fam["comparisons"][0]["complete"] and fam["comparisons"][0]["n"] == 3
    assert (tmp_path / "out" / "family.md").read_text().startswith("# Confirmatory family: t")
    # a grid run with --seeds=[...] other than its spec's, and a grid testing one of the methods
    fam_yaml.write_text(fam_yaml.read_text() + "    seeds: [0, 1, 2, 3]\n    methods: [wmrl]\n")
    rows = write_family(fam_yaml, tmp_path / "out")["comparisons"]
    assert len(rows) == 1 and rows[0]["declared_seeds"] == 4 and not rows[0]["complete"]
    assert rows[0]["verdict"] == "interim (3 of the 4 declared seeds): no verdict"
    fam_yaml.write_text(fam_yaml.read_text().replace("report.json", "missing.json"))
    rows = write_family(fam_yaml, tmp_path / "out")["comparisons"]  # a grid with no report yet: not run
    assert rows[0]["not_run"] and rows[0]["n"] == 0 and rows[0]["verdict"].startswith("not run yet")
    fam_yaml.write_text(fam_yaml.read_text().replace("grid.yaml", "nogrid.yaml"))
    with pytest.raises(ConfigError, match="nogrid.yaml"):  # its spec must exist: the seeds it fixed
        write_family(fam_yaml, tmp_path / "out")
    with pytest.raises(ConfigError, match="does not exist"):
        load_family(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="methods is empty"):
        FamilySpec(name="t", methods=[], grids=[FamilyGrid(spec="a", report="b")])


def test_wmrl_family_command_writes_the_table_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    from wmrl.cli import main

    (tmp_path / "grid.yaml").write_text(
        "methods: [wmrl]\nseeds: [0, 1]\ndomains:\n  - name: toy\n    preset: toy\n"
    )
    report = _report("toy", 0.005, {"anchors_only": [0.1, 0.2], "wmrl": [0.2, 0.25]}, [0, 1])
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "f.yaml").write_text(
        f"name: t\nmethods: [wmrl]\ngrids:\n  - spec: {tmp_path / 'grid.yaml'}\n    report: {tmp_path / 'report.json'}\n"
    )
    assert main(["family", str(tmp_path / "f.yaml"), "--out-dir", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "family.json").read_text())["comparisons"][0]["n"] == 2
    assert main(["family", str(tmp_path / "nope.yaml"), "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"wmrl: error: family spec {tmp_path / 'nope.yaml'} does not exist"]


def test_payoff_is_reals_budget_over_what_the_method_spent_to_reach_reals_final():
    from wmrl.family import payoff

    def cell(final, total, reach, wall):
        return {"heldout_final": final, "real_executions": total, "execs_to_real_final": reach,
                "sim_steps": None, "wall_clock_s": wall}  # fmt: skip

    dom = {"methods": {
        "real": {"per_seed": {"0": cell(0.5, 192, 192, 100.0), "1": cell(0.6, 192, 192, 100.0), "2": cell(0.4, 192, 160, 90.0)}},
        "wmrl": {"per_seed": {"0": cell(0.52, 48, 48, 50.0), "1": cell(0.58, 48, 32, 25.0), "2": cell(0.3, 48, None, 45.0)}},
    }}  # fmt: skip
    p = payoff(dom, "wmrl", margin=0.02, alpha=0.05)
    assert p["unit"] == "real executions" and p["seeds"] == [0, 1, 2]
    assert p["ratio_per_seed"] == [4.0, 6.0, None]  # seed 2 never reached real's final
    assert p["median_ratio"] == 4.0 and p["seeds_at_3x"] == 2
    assert p["wall_clock_ratio"] == pytest.approx(2.0)
    assert p["final_vs_real"] == pytest.approx((0.02 - 0.02 - 0.1) / 3)
    assert payoff({"methods": {"wmrl": dom["methods"]["wmrl"]}}, "wmrl", 0.02, 0.05) is None
