"""A comparison report as text: ``report.md`` and the self-contained ``report.html`` (its tables, and
``report.png`` embedded as base64), from the report's JSON alone."""

from __future__ import annotations

import base64
import html

from wmrl.grid_spec import grid_controls
from wmrl.methods import controls as method_controls
from wmrl.methods.base import method_with_role
from wmrl.report.figures import COLUMNS, TABLES
from wmrl.report.stats import MULTIPLICITY

ABSENT = "—"


def fmt_value(v: float | None) -> str:
    if v is None:
        return ABSENT
    a = abs(v)
    if a == 0:
        return "0"
    return f"{v:.0f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def fmt_cell(f: dict | None, seeds: int | None = None) -> str:
    """``mean ± se`` (``mean`` alone for one seed), ``(k of n)`` appended where the figure covers
    ``k`` of the row's ``n = seeds`` finished seeds, or the absent mark."""
    if f is None:
        return ABSENT
    text = fmt_value(f["mean"]) + (f" ± {fmt_value(f['se'])}" if f.get("se") is not None else "")
    return text + (f" ({f['n']} of {seeds})" if seeds is not None and f["n"] < seeds else "")


def table_rows(report: dict, keys: list[str]) -> tuple[list[str], list[list[str]]]:
    head = ["domain", "method", "seeds", *[COLUMNS[k][0] for k in keys]]
    rows = []
    for dname, dom in report["domains"].items():
        for m, entry in dom["methods"].items():
            n = sum(1 for v in entry["per_seed"].values() if v["status"] == "finished")
            rows.append(
                [
                    dname,
                    m,
                    f"{n}/{len(entry['per_seed'])}",
                    *[fmt_cell(entry["figures"].get(k), n) for k in keys],
                ]
            )
    return head, rows


def control_kinds() -> dict[str, str]:
    """The kinds of control the registry's methods declare, in its order: label (the evidence
    table's column "LB vs <label>") -> one line on what it is (:class:`wmrl.methods.Control`)."""
    kinds: dict[str, str] = {}
    for c in method_controls().values():
        kinds.setdefault(c.label, c.note)
    return kinds


def evidence_head() -> list[str]:
    """The evidence table's columns: against the registry's baseline, then one per kind of control."""
    return [
        "domain", "method", "seeds", f"Δ vs {_baseline()}", "95% LB (t)", "95% LB (BCa)", "ahead on",
        "margin", "verdict", *(f"LB vs {k}" for k in control_kinds()), "clears controls", "gain counts",
    ]  # fmt: skip


def evidence_notes() -> list[str]:
    """The evidence table's notes (Markdown), naming the baseline and the kinds of control."""
    kinds = control_kinds()
    return [
        f"Paired over seeds: the method's held-out final minus `{_baseline()}`'s (the same real executions, "
        "no WM). **95% LB**: one-sided 95% lower bound of the mean difference (t: scipy's one-sample t "
        "test; BCa: bootstrap, narrower than t with few seeds).",
        "**verdict** at the domain's margin: superior (LB > 0), non-inferior (-margin < LB <= 0), "
        "not shown (LB <= -margin).",
        f"**LB vs {' / '.join(kinds)}**: the same bound for the method minus its controls "
        f"({'; '.join(kinds.values())}). **clears controls**: "
        "every control's bound > 0. **gain counts**: superior and clears its controls.",
        "**seeds** are the method's fresh seeds; seeds whose results were seen before the method was "
        "chosen (ledger.json, the spec's seen_seeds) are named and left out. Each verdict is one "
        "comparison at 95%; no correction for the number of comparisons in the table.",
    ]


def _baseline() -> str:
    """The registry's baseline method (``anchors_only``), the evidence's reference point."""
    return method_with_role("baseline") or "baseline"


def seed_list(seeds: list[int]) -> str:
    """``0-3, 6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    run: list[int] = []
    for s in sorted(seeds):
        if run and s != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
            run = []
        run.append(s)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


def evidence_rows(report: dict) -> list[list[str]]:
    """One row per domain and WM method or control (the evidence table, :func:`evidence_head`)."""
    rows = []
    for dname, dom in report["domains"].items():
        for m, e in (dom.get("evidence") or {}).items():
            vs = e["vs_anchors_only"]
            ctl = e.get("vs_controls", {})
            seeds = seed_list(vs["seeds"]) if vs else ABSENT
            if e["exploratory_seeds"]:
                seeds += f" ({seed_list(e['exploratory_seeds'])} exploratory, left out)"

            def lb(x: dict | None, key: str = "lb_t") -> str:
                return fmt_value(x[key]) if x and x.get(key) is not None else ABSENT

            # m's own control of each kind (none for a control itself)
            own = {c.label: name for name, c in method_controls().items() if c.base.name == m}
            yes_no = {True: "yes", False: "no", None: ABSENT}
            rows.append([
                dname, m, seeds, fmt_cell(vs), lb(vs), lb(vs, "lb_bootstrap"),
                f"{vs['wins']} of {vs['n']}" if vs else ABSENT,
                fmt_value(e["margin"]), e["verdict"] or ABSENT,
                *(lb(ctl.get(own[k])) if k in own else ABSENT for k in control_kinds()),
                "(a control)" if m in grid_controls() else yes_no[e["clears_controls"]] if ctl else "not run",
                yes_no[e.get("gain_counts")] if m not in grid_controls() else ABSENT,
            ])  # fmt: skip
    return rows


def markdown(report: dict, command: str | None = None) -> str:
    lines = ["# Comparison report", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += _preamble(report) + [""]
    rows = evidence_rows(report)
    if rows:
        head = evidence_head()
        lines += [f"## Evidence against {_baseline()}", "", "| " + " | ".join(head) + " |"]
        lines += ["|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows] + [""]
        lines += [f"- {x}" for x in evidence_notes()] + [""]
    for title, keys in TABLES.items():
        head, rows = table_rows(report, keys)
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    lines += ["## Columns", ""] + [f"- **{lab}**: {note}" for lab, note in COLUMNS.values()]
    lines += [
        "",
        "Mean ± standard error over seeds; — marks a figure the domain or method does not produce.",
        "",
    ]
    lines += ["![score against real executions and wall-clock](report.png)", ""]
    if any(dom.get("wm_curves") for dom in report["domains"].values()):
        lines += ["The world model's quality during the runs, against its targets (shaded):", "",
                  "![world-model quality against the GRPO step](report_wm.png)", ""]  # fmt: skip
    return "\n".join(lines)


def _preamble(report: dict) -> list[str]:
    out = [f"- verdicts: {report.get('multiplicity', MULTIPLICITY)}"]
    fixed = report.get("seeds_fixed_at") or {}
    seeds = report["spec"]["seeds"]
    times = sorted({t for t in fixed.values() if t})
    unknown = [int(s) for s, t in fixed.items() if not t]
    text = f"- seeds {seed_list(seeds)}"
    if times:
        text += f", fixed before their cells ran (ledger.json: {', '.join(times)} UTC)"
    if unknown:
        text += f"; seeds {seed_list(unknown)} ran before the ledger was kept (when fixed: unknown)"
    if report["spec"].get("seen_seeds"):
        text += f"; seen before this variant was chosen: {seed_list(report['spec']['seen_seeds'])}"
    out.append(text)
    for dname, dom in report["domains"].items():
        start = fmt_cell(dom["heldout_start"])
        out.append(
            f"- **{dname}** (preset `{dom['preset']}`): score `{dom['score']}`, held-out re-evaluation "
            f"{', '.join(dom['reeval_overrides'])}; starting policy {start}"
            + (
                f"; non-inferiority margin {fmt_value(dom['margin'])}"
                if dom.get("margin") is not None
                else ""
            )
        )
    for dname, dom in report["domains"].items():
        starts = dom.get("starts") or {}
        if len(starts) == 1:
            out.append(
                f"- **{dname}**: every seed starts from policy {next(iter(starts))} (SHA-1 of its weights): "
                "the comparisons hold for this start"
            )
        elif starts and all(len(seeds) == 1 for seeds in starts.values()):
            given = ", ".join(f"{seeds[0]}: {sha}" for sha, seeds in starts.items())
            out.append(
                f"- **{dname}**: each seed starts from its own policy (seed: SHA-1 of its weights; {given}): "
                "every comparison is paired within a seed, and the spread between starts adds to it"
            )
        elif starts:
            given = "; ".join(f"{sha}: seeds {seed_list(seeds)}" for sha, seeds in starts.items())
            out.append(
                f"- **{dname}: its seeds started from {len(starts)} policies** ({given}): the spread "
                "between starts adds to every paired difference"
            )
        for seed, starts_of in (dom.get("start_mismatch") or {}).items():
            given = ", ".join(f"`{m}` {sha}" for m, sha in starts_of.items())
            out.append(
                f"- **{dname} seed {seed}: its cells started from different policies** ({given}): its "
                "paired differences compare different starts; re-run them from one start"
            )
    if report.get("grid_wall_s") is not None:
        out.append(
            f"- wall-clock of the grid's stages (start-up excluded) in the run that finished it: "
            f"{report['grid_wall_s']:.0f} s"
        )
    for part in report.get("merged_from", []):
        wall = f", its stages' wall-clock {part['grid_wall_s']:.0f} s" if part.get("grid_wall_s") else ""
        seeds = ", ".join(map(str, part["seeds"]))
        out.append(f"- merged: seeds {seeds} from `{part['report']}`{wall}")
    for m, src in report.get("method_sources", {}).items():
        given = "; ".join(f"{d}: {' '.join(o) or 'none'}" for d, o in src["overrides"].items())
        out.append(f"- `{m}`: every cell from `{src['report']}` (that grid's overrides: {given})")
    return out


def html_report(report: dict, png: bytes | None, command: str | None = None) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Comparison report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:nth-child(-n+3),th{text-align:left}th{background:#f3f3f3}</style></head><body>",
        "<h1>Comparison report</h1>",
    ]
    if command:
        parts.append(f"<p>Command: <code>{esc(command)}</code></p>")
    parts.append("<ul>" + "".join(f"<li>{_inline_html(x[2:])}</li>" for x in _preamble(report)) + "</ul>")
    rows = evidence_rows(report)
    if rows:
        parts.append(
            f"<h2>Evidence against {esc(_baseline())}</h2><table><tr>"
            + "".join(f"<th>{esc(h)}</th>" for h in evidence_head())
            + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append(
            "</table><ul>" + "".join(f"<li>{_inline_html(x)}</li>" for x in evidence_notes()) + "</ul>"
        )
    for title, keys in TABLES.items():
        head, rows = table_rows(report, keys)
        parts.append(
            f"<h2>{esc(title)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append("</table>")
    parts.append(
        "<h2>Columns</h2><ul>" + "".join(f"<li><b>{esc(a)}</b>: {esc(b)}</li>" for a, b in COLUMNS.values())
    )
    parts.append(
        "</ul><p>Mean ± standard error over seeds; — marks a figure the domain or method does not produce.</p>"
    )
    if png:
        parts.append(
            f"<img alt='score against real executions and wall-clock' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def _inline_html(text: str) -> str:
    """Escape ``text`` and turn its markdown ``**bold**`` and ```code``` into HTML."""
    import re

    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)
