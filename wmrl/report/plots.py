"""The report's plots: ``report.png`` (in-run held-out score against real executions, wall-clock and
simulator steps) and ``report_wm.png`` (the world model's quality against the GRPO step)."""

from __future__ import annotations

from pathlib import Path

from wmrl.report.figures import SMOOTH_STEPS, WM_QUALITY, rolling_mean


def _offline_note(dom: dict) -> dict[int, str]:
    """The plot's x-label notes, per curve index (0: executions, 3: simulator steps): the offline data
    the WM methods pretrained on, which the curves (the RL budget) leave out."""
    notes = {}
    for x, key, unit in ((0, "offline_executions", "executions"), (3, "offline_sim_steps", "sim steps")):
        vals = [f[key]["mean"] for e in dom["methods"].values() if (f := e.get("figures", {})).get(key)]
        if vals:
            notes[x] = f"\n(WM methods: + {max(vals):,.0f} offline {unit} before training)"
    return notes


def plot(report: dict, path: Path) -> Path:
    """Per domain (a row): mean in-run held-out score against real executions, against wall-clock
    and, for a domain with a simulator, against its training simulator steps; one line per method
    (points aligned by evaluation index over seeds). The offline data the WM methods pretrained on is
    named under the x-axes it would add to."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    doms = report["domains"]
    has_sim = {
        d: any(len(p) > 3 and p[3] > 0 for v in dom["curves"].values() for p in v) for d, dom in doms.items()
    }
    cols = 3 if any(has_sim.values()) else 2
    fig, axes = plt.subplots(len(doms), cols, figsize=(5.5 * cols, 3.6 * len(doms)), squeeze=False)
    for (dname, dom), row in zip(doms.items(), axes, strict=True):
        panels = [(0, "real executions"), (1, "wall-clock s (training)")]
        panels += [(3, "simulator steps (training)")] if has_sim[dname] else []
        for m in dom["methods"]:
            curves = [v for k, v in dom["curves"].items() if k.split("/")[0] == m and v]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            arr = np.array([c[:n] for c in curves], dtype=float).mean(0)
            for ax, (x, _) in zip(row, panels, strict=False):
                ax.plot(arr[:, x], arr[:, 2], marker=".", label=m)
        offline = _offline_note(dom)
        for ax, (x, xl) in zip(row, panels, strict=False):
            ax.set_xlabel(xl + (offline.get(x, "")))
            ax.set_ylabel(f"eval/{dom['score']}")
            ax.set_title(dname)
            ax.grid(alpha=0.3)
        for ax in row[len(panels) :]:
            ax.axis("off")
        if row[0].get_legend_handles_labels()[0]:  # a domain with no curve has nothing to label
            row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_wm_quality(report: dict, path: Path) -> Path | None:
    """Per domain whose runs log it (a row), the world model's quality against the GRPO step, one panel
    per :data:`WM_QUALITY` metric, one line per method (mean over its seeds at each step, faint; its
    :data:`SMOOTH_STEPS`-step rolling mean, bold), the target band shaded: where a line leaves the
    band, the WM stopped knowing the policy. None (nothing written) when no run logged any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    doms = {d: dom for d, dom in report["domains"].items() if dom.get("wm_curves")}
    if not doms:
        return None
    cols = len(WM_QUALITY)
    fig, axes = plt.subplots(len(doms), cols, figsize=(5.0 * cols, 3.4 * len(doms)), squeeze=False)
    for (dname, dom), row in zip(doms.items(), axes, strict=True):
        for j, (ax, (key, label, (lo, hi), scale)) in enumerate(zip(row, WM_QUALITY, strict=True)):
            for m in dom["methods"]:
                by_step: dict[float, list[float]] = {}
                for k, curve in dom["wm_curves"].items():
                    if k.split("/seed")[0] == m:
                        for p in curve:
                            if p[1 + j] is not None:
                                by_step.setdefault(p[0], []).append(p[1 + j])
                if by_step:
                    steps = sorted(by_step)
                    per_step = [float(np.mean(by_step[x])) for x in steps]
                    (faint,) = ax.plot(steps, per_step, lw=0.8, alpha=0.3)
                    ax.plot(
                        steps, rolling_mean(per_step, SMOOTH_STEPS), lw=1.8, color=faint.get_color(), label=m
                    )
            ax.axhspan(lo, hi if hi is not None else max(1.0, lo), color="tab:green", alpha=0.08)
            ax.set_yscale(scale)
            ax.set_title(f"{dname}: {key} (bold: {SMOOTH_STEPS}-step rolling mean)", fontsize=9)
            ax.set_xlabel("GRPO step")
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
