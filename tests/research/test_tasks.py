"""Research tasks: the public API, the data contract, and conformance of every task.

Conformance runs each task's baseline and reference solution once, for real, in the sandbox
(module-scoped fixture) and checks the recorded scores, that the reference beats the baseline and
that normalisation maps them to 0 and 1.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from wmrl_research import tasks as T
from wmrl_research.grading import METRICS, GradeResult, execute_and_grade, reward, warm_up
from wmrl_research.tasks import FAILURE_SCORE, KNOBS_END, KNOBS_START, get_task, list_tasks, task_lines

ALL_IDS = [t.id for t in list_tasks()]
# Recorded scores must reproduce; a little slack for BLAS/CPU differences across machines.
REL_TOL, ABS_TOL = 0.02, 0.02


# --- API ---------------------------------------------------------------------------------------
def test_there_are_enough_tasks_of_every_kind():
    assert len(ALL_IDS) >= 12
    assert len(list_tasks("heldout")) >= 3
    assert len(list_tasks("train")) + len(list_tasks("heldout")) == len(ALL_IDS)
    kinds = {t.kind for t in list_tasks()}
    for needed in (
        "tabular-classification",
        "tabular-regression",
        "imbalanced-classification",
        "ts-forecasting",
        "ts-classification",
        "image-classification-cnn",
        "sequence-classification-rnn",
    ):
        assert needed in kinds, f"no task of kind {needed}"
    heldout_kinds = {t.kind for t in list_tasks("heldout")}
    assert len(heldout_kinds) >= 3  # the held-out split is not one kind only


def test_unknown_task_and_split_fail_listing_the_known_ones():
    with pytest.raises(KeyError, match="wine_cls"):
        get_task("no_such_task")
    with pytest.raises(ValueError, match="train, heldout"):
        list_tasks("test")


def test_task_lines_are_tab_separated_id_split_kind_metric():
    lines = task_lines()
    assert [ln.split("\t")[0] for ln in lines] == ALL_IDS
    for ln in lines:
        tid, split, kind, metric = ln.split("\t")
        task = get_task(tid)
        assert (split, kind, metric) == (task.split, task.kind, task.metric)


@pytest.mark.parametrize("task_id", ALL_IDS)
def test_task_definition_is_consistent(task_id):
    t = get_task(task_id)
    assert t.split in ("train", "heldout")
    assert t.metric in METRICS and METRICS[t.metric][1] == t.direction
    assert t.description and len(t.description) > 80
    for src in (t.baseline_source, t.reference_source):
        assert src.count(KNOBS_START) == 1 and src.count(KNOBS_END) == 1
        compile(src, "solution.py", "exec")
    # the reference differs from the baseline only inside the knobs block
    b_head, b_rest = t.baseline_source.split(KNOBS_START)
    r_head, r_rest = t.reference_source.split(KNOBS_START)
    assert b_head == r_head and b_rest.split(KNOBS_END)[1] == r_rest.split(KNOBS_END)[1]
    assert t.baseline_source != t.reference_source
    knobs = T.read_knobs(t.baseline_source)
    assert t.knob_space and all(knobs[k] in vs and len(vs) >= 2 for k, vs in t.knob_space.items())
    ref_knobs = T.read_knobs(t.reference_source)
    assert all(ref_knobs[k] in t.knob_space.get(k, [ref_knobs[k]]) for k in ref_knobs)


def test_set_knobs_round_trips_and_rejects_unknown_knobs():
    src = get_task("wine_cls").baseline_source
    edited = T.set_knobs(src, {"MODEL": "hgb", "C": 10.0})
    assert T.read_knobs(edited) == {**T.read_knobs(src), "MODEL": "hgb", "C": 10.0}
    with pytest.raises(KeyError, match="NOT_A_KNOB"):
        T.set_knobs(src, {"NOT_A_KNOB": 1})
    with pytest.raises(ValueError, match="knobs block"):
        T.read_knobs("x = 1\n")


def test_normalise_maps_baseline_to_0_reference_to_1_and_clips():
    for t in list_tasks():
        assert t.normalise(t.baseline_score) == pytest.approx(0.0, abs=1e-12)
        assert t.normalise(t.reference_score) == pytest.approx(1.0)
        better = t.reference_score + 10 * (t.reference_score - t.baseline_score)
        worse = t.baseline_score - 10 * (t.reference_score - t.baseline_score)
        assert t.normalise(better) == T.SCORE_CLIP[1]
        assert t.normalise(worse) == T.SCORE_CLIP[0]
        assert t.normalise(float("nan")) == FAILURE_SCORE
    d = get_task("diabetes_reg")  # lower is better: a lower RMSE than the baseline is positive
    assert d.direction == -1 and d.normalise(d.baseline_score - 1.0) > 0


@pytest.mark.parametrize("task_id", ALL_IDS)
def test_data_layout_keeps_test_labels_out_of_the_public_folder(task_id):
    t = get_task(task_id)
    public, hidden = t.data_dirs()
    assert sorted(p.name for p in public.iterdir()) == ["test.npz", "train.npz", "val.npz"]
    with np.load(public / "test.npz") as d:
        assert d.files == ["X"]
        n_test = len(d["X"])
    for part in ("train", "val"):
        with np.load(public / f"{part}.npz") as d:
            assert sorted(d.files) == ["X", "y"] and len(d["X"]) == len(d["y"]) > 0
    labels = t.test_labels()
    assert len(labels) == n_test > 0
    assert public not in hidden.parents and hidden not in public.parents


# --- conformance ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[GradeResult, GradeResult]]:
    """Every task's baseline and reference, executed and graded once in the sandbox."""
    out = {}
    for t in list_tasks():
        out[t.id] = (
            execute_and_grade(t.id, t.baseline_source, timeout_s=120),
            execute_and_grade(t.id, t.reference_source, timeout_s=120),
        )
    return out


@pytest.mark.parametrize("task_id", ALL_IDS)
def test_baseline_and_reference_reproduce_their_recorded_scores(task_id, measured):
    t = get_task(task_id)
    base, ref = measured[task_id]
    assert base.status == "ok", base.message
    assert ref.status == "ok", ref.message
    assert base.raw_score == pytest.approx(t.baseline_score, rel=REL_TOL, abs=ABS_TOL)
    assert ref.raw_score == pytest.approx(t.reference_score, rel=REL_TOL, abs=ABS_TOL)
    # the reference beats the baseline in the metric's direction, as executed (not only as recorded)
    assert (ref.raw_score - base.raw_score) * t.direction > 0
    assert base.score == pytest.approx(0.0, abs=0.1)
    assert ref.score == pytest.approx(1.0, abs=0.1)
    # budgets are in epochs/steps: every execution stays cheap
    assert base.seconds < 30 and ref.seconds < 30


def test_reward_is_a_picklable_module_level_job_function():
    fn = pickle.loads(pickle.dumps(reward))
    assert fn is reward
    value = fn("wine_cls", get_task("wine_cls").baseline_source, 60.0)
    assert math.isclose(value, 0.0, abs_tol=1e-9)


def test_jobs_run_through_the_core_executor_and_attacks_do_not_stop_the_run():
    from wmrl.domain import Job
    from wmrl.executors import InlineExecutor

    t = get_task("wine_cls")
    jobs = [
        Job(fn=reward, args=(t.id, t.reference_source, 60.0)),
        Job(fn=reward, args=(t.id, "import os\nos.kill(os.getppid(), 9)\n", 60.0)),
        Job(fn=reward, args=(t.id, "raise SystemExit(1)\n", 60.0)),
        Job(fn=reward, args=(t.id, t.baseline_source, 60.0)),
    ]
    results = InlineExecutor(max_concurrent=1, timeout_s=60.0).run(jobs)
    assert [r.status for r in results] == ["ok"] * 4  # solution failures are graded, not errors
    assert [r.value for r in results] == pytest.approx([1.0, FAILURE_SCORE, FAILURE_SCORE, 0.0])
    assert warm_up() < 5.0  # the process's sandbox is already running


def test_bad_arguments_raise_instead_of_scoring():
    with pytest.raises(KeyError, match="known tasks"):
        execute_and_grade("no_such_task", "print(1)")
    with pytest.raises(TypeError, match="str"):
        execute_and_grade("wine_cls", b"print(1)")  # type: ignore[arg-type]
