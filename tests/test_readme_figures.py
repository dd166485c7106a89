"""Every figure the results tables quote from a committed report equals that report.

Each entry names a report (``benchmarks/results/<grid>/report.json``), the text the tables write
(a format string) and where its values are in the report. The full table (docs/results/README.md,
"Every grid") has one row linking to each report, which must hold the text; the README's summary
table, where a row links to that report, must hold it too. A report regenerated with other figures,
or a table edited by hand, fails here with the row, the expected text and the report's values."""

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The section with every grid's row, and the prefix its links to benchmarks/results/ take there.
INDEX = (ROOT / "docs" / "results" / "README.md").read_text().split("\n## Every grid\n")[1].split("\n## ")[0]
TABLES = {
    "docs/results/README.md": (INDEX, "../../benchmarks/results"),
    "README.md": (README, "benchmarks/results"),
}


def _get(report: dict, path: str) -> float:
    """``domains.<dom>.methods.<m>.figures.heldout_final.mean``-style paths; ``@D:M`` is shorthand for
    ``domains.D.methods.M.figures`` and ``!D:M`` for ``domains.D.evidence.M``."""
    if path.startswith("@"):
        dom, _, rest = path[1:].partition(":")
        method, _, rest = rest.partition(".")
        path = f"domains.{dom}.methods.{method}.figures.{rest}"
    elif path.startswith("!"):
        dom, _, rest = path[1:].partition(":")
        path = f"domains.{dom}.evidence.{rest}"
    value = report
    for key in path.split("."):
        value = value[key]
    return value


def _pct(x: float) -> float:
    return 100 * x


def _lb_t(mean: float, se: float, n: int) -> float:
    """The one-sided 95% t bound of a paired mean (the report's ``lb_t``)."""
    from scipy.stats import t

    return mean - t.ppf(0.95, n - 1) * se


# (grid, README text with {} for values, value paths, transform of each value or None)
FIGURES = [
    ("toy", "`anchors_only` {:.3f}, `wmrl` {:.3f}, `ppi` {:.3f}, `real` {:.3f}",
     ["@toy:anchors_only.heldout_final.mean", "@toy:wmrl.heldout_final.mean", "@toy:ppi.heldout_final.mean",
      "@toy:real.heldout_final.mean"], None),
    ("toy", "`ppi − anchors_only` {:+.3f} ± {:.3f} (bound {:+.3f}",
     ["!toy:ppi.vs_anchors_only.mean", "!toy:ppi.vs_anchors_only.se", "!toy:ppi.vs_anchors_only.lb_t"], None),
    ("research_tiny", "SFT {:.3f}; `real` {:.3f} ± {:.3f}",
     ["domains.research.heldout_start.mean", "@research:real.heldout_final.mean",
      "@research:real.heldout_final.se"], None),
    ("research_tiny", "`anchors_only` {:.3f} ± {:.3f}, `wmrl` {:.3f} ± {:.3f}, `ppi` {:.3f} ± {:.3f}",
     ["@research:anchors_only.heldout_final.mean", "@research:anchors_only.heldout_final.se",
      "@research:wmrl.heldout_final.mean", "@research:wmrl.heldout_final.se",
      "@research:ppi.heldout_final.mean", "@research:ppi.heldout_final.se"], None),
    ("research_heavy_prior", "`ppi` {:.3f} ± {:.3f}, `anchors_only` {:.3f} ± {:.3f}, paired {:+.3f} ± {:.3f}",
     ["@research:ppi.heldout_final.mean", "@research:ppi.heldout_final.se",
      "@research:anchors_only.heldout_final.mean", "@research:anchors_only.heldout_final.se",
      "@research:ppi.diff_vs_anchors_only.mean", "@research:ppi.diff_vs_anchors_only.se"], None),
    ("research_heavy_prior", "one-sided 95% t bound {:+.3f}",
     ["@research:ppi.diff_vs_anchors_only"], lambda d: _lb_t(d["mean"], d["se"], d["n"])),
    ("research_free_heavy", "start {:.3f}; `real` {:.3f}",
     ["domains.research.heldout_start.mean", "@research:real.heldout_final.mean"], None),
    ("research_free_heavy", "`anchors_only` {:.3f}, `wmrl` **{:.3f}** ({:+.3f} ± {:.3f} over `anchors_only`, bound {:+.3f}",
     ["@research:anchors_only.heldout_final.mean", "@research:wmrl.heldout_final.mean",
      "!research:wmrl.vs_anchors_only.mean", "!research:wmrl.vs_anchors_only.se",
      "!research:wmrl.vs_anchors_only.lb_t"], None),
    ("research_free_heavy", "`ppi` {:.3f} (bound {:+.3f}, behind its λ = 0 control at {:.3f})",
     ["@research:ppi.heldout_final.mean", "!research:ppi.vs_anchors_only.lb_t",
      "@research:ppi_lambda0.heldout_final.mean"], None),
    ("vla_rl", "SFT {:.1f}%; `real` {:.1f}% ± {:.1f}, `anchors_only` {:.1f}% ± {:.1f}, `wmrl` {:.1f}% ± {:.1f}",
     ["domains.vla.heldout_start.mean", "@vla:real.heldout_final.mean", "@vla:real.heldout_final.se",
      "@vla:anchors_only.heldout_final.mean", "@vla:anchors_only.heldout_final.se",
      "@vla:wmrl.heldout_final.mean", "@vla:wmrl.heldout_final.se"], _pct),
    ("vla_rl", "`wmrl − anchors_only` {:+.1f} ± {:.1f} points",
     ["@vla:wmrl.diff_vs_anchors_only.mean", "@vla:wmrl.diff_vs_anchors_only.se"], _pct),
]  # fmt: skip


def _rows(text: str, prefix: str, grid: str) -> list[str]:
    """The table rows of ``text`` that link to ``grid``'s report (``prefix/<grid>/report.md``)."""
    link = f"]({prefix}/{grid}/report.md)"
    return [line for line in text.splitlines() if line.startswith("|") and link in line]


@pytest.mark.parametrize(
    ("grid", "text", "paths", "transform"), FIGURES, ids=[f"{g}:{t[:30]}" for g, t, _, _ in FIGURES]
)
def test_readme_figures_equal_their_report(grid, text, paths, transform):
    report = json.loads((ROOT / "benchmarks" / "results" / grid / "report.json").read_text())
    values = [_get(report, p) for p in paths]
    if transform is not None:
        values = [transform(v) for v in values]
    assert all(isinstance(v, float | int) and math.isfinite(v) for v in values), values
    expected = text.format(*values)
    index_rows = _rows(INDEX, TABLES["docs/results/README.md"][1], grid)
    assert len(index_rows) == 1, (
        f"docs/results/README.md has {len(index_rows)} rows linking to {grid}'s report"
    )
    for name, (table, prefix) in TABLES.items():
        for row in _rows(table, prefix, grid):
            assert expected in row, f"{name}'s row of {grid} should read {expected!r}"


def test_the_quick_start_says_where_the_toy_starts_as_its_report_does():
    """The quick start's promise of learning quotes the committed toy report's start."""
    report = json.loads((ROOT / "benchmarks" / "results" / "toy" / "report.json").read_text())
    start = report["domains"]["toy"]["heldout_start"]
    assert start["se"] == 0  # every method of a seed starts from one policy, and the toy's is fixed
    quick = README.split("**What the debug presets show.**")[1].split("\n\n")[0]
    assert f"from its start, {start['mean']:.3f}" in quick
