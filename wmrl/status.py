"""``wmrl status DIR``: where a run or a grid stands, read from its files (nothing is written).

For each run (a grid's cells, or the one run ``DIR`` holds): its state, the steps it has logged out
of its ``grpo.steps``, its latest in-run held-out score, the final score (a grid cell's
re-evaluation, a run's last evaluation), the training time so far and, for a running one, the time
its remaining steps take at its recent pace. A run is *running* while a process holds its
directory's lock (``wmrl.tracking.exclusive``), so a run killed mid-step reads as stopped, not as
running, whatever its files' ages.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from wmrl.config import ConfigError, load_config
from wmrl.tracking import CHECKPOINT, checkpoint_step, locked_by, read_metrics

RECENT_STEPS = 10  # the pace of a running run: the median of its last steps' time/step


def run_state(
    run_dir: Path, score: str, steps: int, grid_cell: bool = False, reevaluated: float | None = None
) -> dict:
    """One run's standing. ``score``: the evaluation key that is its score (``success``); a
    ``grid_cell`` is finished once re-evaluated, with the ``reevaluated`` score as its final one.

    Returns ``{"state", "step", "steps", "score_step", "score", "final", "elapsed_s",
    "eta_s", "holder", "checkpoint_step", "unsaved_steps"}``; ``state`` is one of finished,
    re-evaluating, trained (a grid cell whose re-evaluation is still to run), running, stopped (a
    checkpoint to resume), stopped before its first checkpoint, pending. ``step`` is the last
    logged step, except for a stopped run: the step of its checkpoint, where a resume continues;
    ``unsaved_steps`` counts the steps it logged past that checkpoint (killed before saving them:
    a resume moves their rows to ``metrics.orphaned.jsonl`` and trains them again)."""
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    holder = locked_by(run_dir)
    done = (run_dir / "summary.json").exists()
    if done and grid_cell and reevaluated is None:
        state = "re-evaluating" if holder else "trained"
    elif done:
        state = "finished"
    elif holder:
        state = "running"
    elif (run_dir / CHECKPOINT).exists():
        state = "stopped"
    elif rows:
        state = "stopped before its first checkpoint"
    else:
        state = "pending"
    saved = checkpoint_step(run_dir) if state in ("stopped", "running") else None
    if state == "stopped" and saved is not None:
        rows = [r for r in rows if r["step"] <= saved]  # what a resume continues from
    unsaved = 0
    if state == "stopped" and saved is not None:
        unsaved = len(read_metrics(run_dir)) - len(rows)
    scored = [r for r in rows if _finite(r.get(f"eval/{score}"))]
    step = int(rows[-1]["step"]) if rows else 0
    elapsed = next((r["time/elapsed"] for r in reversed(rows) if _finite(r.get("time/elapsed"))), None)
    if grid_cell:
        final = reevaluated
    else:
        final = scored[-1][f"eval/{score}"] if done and scored else None
    return {
        "state": state,
        "step": step,
        "steps": steps,
        "score_step": int(scored[-1]["step"]) if scored else None,
        "score": scored[-1][f"eval/{score}"] if scored else None,
        "final": final,
        "elapsed_s": elapsed,
        "eta_s": remaining_seconds(rows, steps) if state == "running" else None,
        "holder": holder,
        "checkpoint_step": saved,
        "unsaved_steps": unsaved,
    }


def remaining_seconds(rows: list[dict], steps: int) -> float | None:
    """``(steps - last step) * median(time/step of the last RECENT_STEPS rows)``; None without a
    timed step."""
    paces = [r["time/step"] for r in rows[-RECENT_STEPS:] if _finite(r.get("time/step"))]
    if not paces:
        return None
    return max(steps - int(rows[-1]["step"]), 0) * statistics.median(paces)


def grid_states(out: Path) -> tuple[list[dict], int, list[str]]:
    """Every cell of the grid in ``out`` (planned from its ``spec.yaml``) with its standing, the
    number of cells the grid runs at once, and the starts not yet prepared (``"vla seed 12"``: the
    domain's caches, SFT and WM pretraining, then the starting policy's held-out evaluation, which
    ``wmrl compare`` does before any cell of that seed trains)."""
    from wmrl.grid import plan
    from wmrl.grid_spec import base_method, load_spec, read_cached, reeval_current

    spec = load_spec(out / "spec.yaml")
    cells = plan(spec, out)
    score_of, steps_of = {}, {}
    for d in spec.domains:
        first = next(c for c in cells if c.domain == d.name)
        cfg = load_config(first.preset, first.overrides)
        score_of[d.name] = d.score or type(cfg.domain).HELDOUT_SCORE
        steps_of[d.name] = cfg.grpo.steps
    states = []
    for c in cells:
        score = score_of[c.domain]
        cached = reeval_current(c)
        reevaluated = (cached or {}).get("eval", {}).get(score)
        state = run_state(Path(c.run_dir), score, steps_of[c.domain], grid_cell=True, reevaluated=reevaluated)
        reeval_s = (cached or {}).get("seconds")
        states.append({"name": c.name, "code": base_method(c.method), "reeval_s": reeval_s} | state)
    unprepared = {f"{c.domain} seed {c.seed}": None for c in cells
                  if read_cached(Path(c.start_path), c.reeval_overrides) is None}  # fmt: skip
    workers = spec.executor.workers if spec.executor.type == "process" else 1
    return states, max(workers, 1), list(unprepared)


def status(path: str | Path) -> dict:
    """The standing of the grid or the run in ``path``: ``{"kind", "dir", "runs", "workers",
    "holder", "unprepared"}`` (``holder``: the process writing the grid, or the run, if one is;
    ``unprepared``: a grid's starts not yet prepared, see :func:`grid_states`)."""
    out = Path(path)
    if not out.is_dir():
        raise ConfigError(f"{out} is not a directory" if out.exists() else f"{out} does not exist")
    if (out / "spec.yaml").exists() and (out / "index.json").exists():
        runs, workers, unprepared = grid_states(out)
        return {"kind": "grid", "dir": str(out), "runs": runs, "workers": workers, "holder": locked_by(out),
                "unprepared": unprepared}  # fmt: skip
    if (out / "config.yaml").exists():
        cfg = load_config(out / "config.yaml", [f"--out_dir={out}"])
        state = run_state(out, type(cfg.domain).HELDOUT_SCORE, cfg.grpo.steps)
        return {"kind": "run", "dir": str(out), "runs": [{"name": out.name} | state], "workers": 1,
                "holder": state["holder"]}  # fmt: skip
    raise ConfigError(
        f"{out} holds neither a grid (spec.yaml and index.json, from `wmrl compare`) nor a run "
        "(config.yaml, from `wmrl run`)"
    )


def left_seconds(report: dict) -> float | None:
    """A grid's time to finish: each unfinished cell's remaining steps at its pace (a running cell's
    own; else the mean pace of the grid's cells that run the same method's code, a control with its
    method; else of all its cells), plus, for each cell not yet re-evaluated, the mean time the
    grid's re-evaluations took, spread over its workers. None before any step was timed."""
    runs = report["runs"]
    by_code = _paces(runs)
    if not by_code:
        return None
    overall = statistics.fmean(x for paces in by_code.values() for x in paces)
    reevals = [r["reeval_s"] for r in runs if _finite(r.get("reeval_s"))]
    reeval = statistics.fmean(reevals) if reevals else 0.0
    left = 0.0
    for r in runs:
        if r["state"] == "finished":
            continue
        left += reeval
        if r["state"] in ("trained", "re-evaluating"):
            continue
        pace = statistics.fmean(by_code[r.get("code", "")]) if r.get("code", "") in by_code else overall
        left += r["eta_s"] if r["eta_s"] is not None else max(r["steps"] - r["step"], 0) * pace
    return left / report["workers"]


def _paces(runs: list[dict]) -> dict[str, list[float]]:
    """Seconds per step of every timed run, by the method code it runs."""
    by_code: dict[str, list[float]] = {}
    for r in runs:
        if r["elapsed_s"] and r["step"]:
            by_code.setdefault(r.get("code", ""), []).append(r["elapsed_s"] / r["step"])
    return by_code


def untimed_cells(report: dict) -> int:
    """Pending cells whose method no cell of the grid has timed yet: :func:`left_seconds` counts
    them at the pace of other methods, which may be much faster or slower."""
    timed = _paces(report["runs"])
    return sum(r["state"] == "pending" and r.get("code", "") not in timed for r in report["runs"])


def format_status(report: dict) -> str:
    """The report as an aligned table, one run per line, then a line of totals."""
    head = ["run", "state", "step", "in-run score", "final", "train time", "left"]
    lines = [
        [
            r["name"],
            _state_label(r),
            f"{r['step']}/{r['steps']}",
            f"{r['score']:.4g} at {r['score_step']}" if r["score"] is not None else "-",
            f"{r['final']:.4g}" if r["final"] is not None else "-",
            _duration(r["elapsed_s"]),
            _duration(r["eta_s"]),
        ]
        for r in report["runs"]
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    text = [
        "  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [head, *lines]
    ]
    counts: dict[str, int] = {}
    for r in report["runs"]:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    total = f"{report['kind']} {report['dir']}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    if report["kind"] == "grid":
        left = left_seconds(report)
        if left:
            total += f"; about {_duration(left)} left on {report['workers']} worker(s)"
            if guessed := untimed_cells(report):
                total += f" ({guessed} cell(s) of methods not yet timed counted at the others' pace)"
        if report.get("holder"):
            total += f"; `wmrl compare` running ({report['holder']})"
            if report.get("unprepared"):
                total += f"\npreparing the start of {', '.join(report['unprepared'])} first"
                total += " (caches, SFT and WM pretraining on a first run here, then its held-out evaluation)"
    return "\n".join([*text, total])


def _state_label(run: dict) -> str:
    """``running (pid N on HOST)`` for a running run, else its state."""
    if run["state"] == "running" and run["holder"]:
        return f"running ({run['holder'].split(' since ')[0]})"
    if run["state"] == "stopped" and run.get("unsaved_steps"):
        n = run["unsaved_steps"]
        return (
            f"stopped at its checkpoint ({n} step{'s' if n > 1 else ''} logged past it, "
            "trained again on resume)"
        )
    return run["state"]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}" if minutes >= 60 else f"{minutes} min"


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)
