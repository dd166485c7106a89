"""A task's conformance check, for the package's tasks and a user's own alike
(``python -m wmrl_research.tasks check [TASK_ID ...]``; without ids, the tasks of
``$WMRL_RESEARCH_TASKS``): what ``tests/research/test_tasks.py`` checks of the package's tasks,
as a list of one-line problems (empty: the task conforms).

- definition: a split of ``SPLITS`` (a task is ``train`` or ``heldout``, never both), the knobs
  block once in the baseline (and in a reference derived from it), both solutions compile, every
  knob of the space has at least two values and the baseline's value among them, the reference's
  knob values in the space, and a reference derived from the baseline differs from it only inside
  its knobs block;
- data: ``build_data`` writes ``train.npz`` and ``val.npz`` with ``X`` and ``y``, ``test.npz`` with
  ``X`` alone, and the test labels (as many as test rows) outside the public folder;
- execution (``execute=True``): baseline and reference run in the sandbox and the reference beats
  the baseline on the task's metric.
"""

from __future__ import annotations

import numpy as np

from wmrl_research.tasks.base import KNOBS_END, KNOBS_START, SPLITS, ResearchTask, read_knobs


def definition_problems(t: ResearchTask) -> list[str]:
    out = []
    if t.split not in SPLITS:
        out.append(f"split={t.split!r} is not one of {', '.join(SPLITS)} (a task is one or the other)")
    derived = KNOBS_START in t.reference_source
    sources = [("baseline", t.baseline_source)] + ([("reference", t.reference_source)] if derived else [])
    for name, src in sources:
        if src.count(KNOBS_START) != 1 or src.count(KNOBS_END) != 1:
            out.append(
                f"its {name} must hold one knobs block ({KNOBS_START!r} ... {KNOBS_END!r}) exactly once"
            )
    for name, src in (("baseline", t.baseline_source), ("reference", t.reference_source)):
        try:
            compile(src, f"{name}.py", "exec")
        except SyntaxError as e:
            out.append(f"its {name} does not compile: {e.msg} (line {e.lineno})")
    if out:
        return out
    knobs = read_knobs(t.baseline_source)
    if not t.knob_space:
        out.append("SPEC.knob_space is empty: the agent has nothing to edit")
    for k, vs in t.knob_space.items():
        if k not in knobs:
            out.append(f"knob {k} of SPEC.knob_space is not a line of the baseline's knobs block")
        elif len(vs) < 2:
            out.append(f"knob {k} has {len(vs)} value(s) in SPEC.knob_space; give at least two")
        elif knobs[k] not in vs:
            out.append(f"the baseline's {k} = {knobs[k]!r} is not among SPEC.knob_space's values {vs!r}")
    if derived:
        ref = read_knobs(t.reference_source)
        out += [
            f"the reference's {k} = {v!r} is not among SPEC.knob_space's values {t.knob_space[k]!r}"
            for k, v in ref.items()
            if k in t.knob_space and v not in t.knob_space[k]
        ]
        b_head, b_rest = t.baseline_source.split(KNOBS_START)
        r_head, r_rest = t.reference_source.split(KNOBS_START)
        if b_head != r_head or b_rest.split(KNOBS_END)[1] != r_rest.split(KNOBS_END)[1]:
            out.append("the reference differs from the baseline outside the knobs block")
        if t.baseline_source == t.reference_source:
            out.append("the reference is the baseline itself")
    return out


def data_problems(t: ResearchTask) -> list[str]:
    try:
        public, hidden = t.data_dirs()
    except Exception as e:  # noqa: BLE001 - the user's build_data, reported in one line
        return [f"its build_data failed: {type(e).__name__}: {e}"]
    out = []
    names = sorted(p.name for p in public.iterdir())
    if names != ["test.npz", "train.npz", "val.npz"]:
        return [f"its public data folder holds {names}, not train.npz, val.npz and test.npz alone"]
    with np.load(public / "test.npz") as d:
        if d.files != ["X"]:
            out.append(f"test.npz holds {d.files}: only X (its labels are the grader's, never public)")
        n_test = len(d["X"])
    for part in ("train", "val"):
        with np.load(public / f"{part}.npz") as d:
            if sorted(d.files) != ["X", "y"] or len(d["X"]) != len(d["y"]) or len(d["X"]) == 0:
                out.append(f"{part}.npz must hold X and y with as many rows, at least one")
    if len(t.test_labels()) != n_test:
        out.append(f"{len(t.test_labels())} test labels for {n_test} test rows")
    if public in hidden.parents or hidden in public.parents:
        out.append("the hidden test labels lie inside the public data folder")
    return out


def execution_problems(t: ResearchTask, timeout_s: float = 120.0) -> list[str]:
    from wmrl_research.grading import execute_raw

    out, scores = [], {}
    for name, source in (("baseline", t.baseline_source), ("reference", t.reference_source)):
        r = execute_raw(t.id, source, timeout_s=timeout_s)
        scores[name] = r.raw_score
        if not r.ok:
            last = [ln.strip() for ln in r.message.splitlines() if ln.strip()]
            out.append(f"its {name} failed in the sandbox ({r.status}): {last[-1] if last else 'no message'}")
    base, ref = scores["baseline"], scores["reference"]
    if base is not None and ref is not None and (ref - base) * t.direction <= 0:
        better = "higher" if t.direction > 0 else "lower"
        out.append(
            f"its reference ({ref:.6g}) does not beat its baseline ({base:.6g}) on {t.metric} ({better} is better)"
        )
    return out


def conformance(t: ResearchTask, execute: bool = True, timeout_s: float = 120.0) -> list[str]:
    """Every problem of task ``t``, one line each, naming the task (empty: it conforms)."""
    problems = definition_problems(t)
    if not problems:
        problems += data_problems(t)
    if not problems and execute:
        problems += execution_problems(t, timeout_s)
    return [f"task {t.id}: {p}" for p in problems]
