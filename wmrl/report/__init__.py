"""The report of a comparison grid: the domains side by side with the same columns.

``report.json`` (every figure per cell and as mean +- standard error over seeds), ``report.md`` and
a self-contained ``report.html`` (tables, and ``report.png`` embedded as base64): per domain and
method, the final held-out score and its gain over the starting policy, the share of ``real``'s gain
kept, paired differences against ``real`` and ``anchors_only``, real executions (and simulator
steps), executions to reach ``real``'s final score, wall-clock and its split, and the WM
diagnostics. A figure that a domain or method does not produce is absent (``None`` in JSON, ``—`` in
the tables), never zero. ``report_wm.png``, where runs log it: the world model's quality against the
GRPO step (:data:`WM_QUALITY`: success AUC, advantage correlation, z²) beside its target bands.

**Evidence** (docs/design.md section 7; ``evidence`` per domain in JSON, the first table of the report):
per WM method and control, the paired difference of held-out scores to ``anchors_only`` over the
seeds, with a one-sided 95% lower bound (:func:`lower_bound_t`, scipy's one-sample t test on the
paired differences; a BCa bootstrap bound beside it), a non-inferiority verdict at the domain's
margin (:func:`verdict`), the same bound against each of the method's controls (its placebo, and
``ppi_lambda0`` for ppi), and whether its gain counts: superior to ``anchors_only`` and above every
control. Cells marked exploratory (their method chosen after their seed's results were seen:
wmrl/grid.py) are left out and named.

The package by concern: :mod:`wmrl.report.figures` (one cell's figures and the columns),
:mod:`wmrl.report.stats` (means, paired differences, lower bounds, verdicts),
:mod:`wmrl.report.aggregate` (a domain's figures over seeds and its evidence),
:mod:`wmrl.report.render` (Markdown and HTML), :mod:`wmrl.report.plots` and
:mod:`wmrl.report.merge` (one report from the reports of a grid run in parts). The names below are
the package's public ones, importable from ``wmrl.report``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from wmrl.grid_spec import read_json
from wmrl.report.aggregate import (
    aggregate_domain,
    domain_evidence,
    start_mismatches,
    starts_by_policy,
    summarise,
)
from wmrl.report.figures import (
    COLUMNS,
    REACH_KEYS,
    SMOOTH_STEPS,
    TABLES,
    TIME_KEYS,
    WM_QUALITY,
    cell_figures,
    cost_to_reach,
    rolling_mean,
    wm_quality_curve,
)
from wmrl.report.merge import merge_reports
from wmrl.report.plots import plot, plot_wm_quality
from wmrl.report.render import (
    ABSENT,
    control_kinds,
    evidence_head,
    evidence_notes,
    evidence_rows,
    fmt_cell,
    fmt_value,
    html_report,
    markdown,
    seed_list,
    table_rows,
)
from wmrl.report.stats import (
    CONFIDENCE,
    MULTIPLICITY,
    VERDICTS,
    clears,
    lower_bound_bootstrap,
    lower_bound_t,
    mean_se,
    paired,
    paired_evidence,
    verdict,
)

if TYPE_CHECKING:
    from wmrl.grid_spec import Cell, GridSpec

__all__ = [
    "ABSENT", "COLUMNS", "CONFIDENCE", "MULTIPLICITY", "REACH_KEYS", "SMOOTH_STEPS", "TABLES",
    "TIME_KEYS", "VERDICTS", "WM_QUALITY", "aggregate_domain", "cell_figures", "clears",
    "control_kinds", "cost_to_reach", "domain_evidence", "evidence_head", "evidence_notes",
    "evidence_rows", "fmt_cell", "fmt_value", "html_report", "lower_bound_bootstrap", "lower_bound_t",
    "markdown", "mean_se", "merge_reports", "paired", "paired_evidence", "plot", "plot_wm_quality",
    "rolling_mean", "seed_list", "start_mismatches", "starts_by_policy", "summarise", "table_rows",
    "verdict", "wm_quality_curve", "write_report", "write_report_files"
]  # fmt: skip


def write_report(out: Path, spec: GridSpec, cells: list[Cell], grid_wall_s: float | None = None,
                 command: str | None = None) -> dict:  # fmt: skip
    """Write report.json, report.md, report.png and report.html into ``out``; returns the report."""
    report = summarise(out, spec, cells)
    previous = read_json(out / "report.json") or {}
    # the wall-clock of the run that finished the grid is kept when a later call only rewrites the report
    report["grid_wall_s"] = grid_wall_s if grid_wall_s is not None else previous.get("grid_wall_s")
    return write_report_files(out, report, command)


def write_report_files(out: Path, report: dict, command: str | None = None) -> dict:
    """``report`` as report.json, report.md, report.png and report.html in ``out``; returns it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False))
    png = plot(report, out / "report.png").read_bytes()
    plot_wm_quality(report, out / "report_wm.png")
    (out / "report.md").write_text(markdown(report, command))
    (out / "report.html").write_text(html_report(report, png, command))
    return report
