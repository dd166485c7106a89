"""Research tasks: the public API, the data contract, and conformance of every task.

Conformance runs each light task's baseline and reference solution once, for real, in the sandbox
(module-scoped fixture) and checks the recorded scores, that the reference beats the baseline and
that normalisation maps them to 0 and 1. Heavy-tier tasks (3-15 s per execution) get the same
definition and data-layout checks but are not executed here (`python -m wmrl_research.tasks measure`
measures them; their figures are in the tasks README).
"""

from __future__ import annotations

import json
import math
import pickle
import re

import numpy as np
import pytest

from wmrl_research import tasks as T
from wmrl_research.grading import (
    METRICS,
    MIN_GAP_FRACTION,
    GradeResult,
    build_scores,
    execute_and_grade,
    reward,
    score_predictions,
    warm_up,
)
from wmrl_research.tasks import (
    FAILURE_SCORE,
    KNOBS_END,
    KNOBS_START,
    Metric,
    TaskDefinitionError,
    TaskSpec,
    get_task,
    list_tasks,
    task_from_spec,
    task_lines,
)

ALL_IDS = [t.id for t in list_tasks()]
LIGHT_IDS = [t.id for t in list_tasks(tier="light")]


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
    assert len(list_tasks(tier="light")) + len(list_tasks(tier="heavy")) == len(ALL_IDS)
    # the heavy tier: at least 4 train and 2 held-out tasks, of more than one kind each
    assert len(list_tasks("train", "heavy")) >= 4 and len(list_tasks("heldout", "heavy")) >= 2
    assert len({t.kind for t in list_tasks("train", "heavy")}) >= 3
    assert len({t.kind for t in list_tasks("heldout", "heavy")}) >= 2


def test_unknown_task_and_split_fail_listing_the_known_ones():
    with pytest.raises(KeyError, match="wine_cls"):
        get_task("no_such_task")
    with pytest.raises(ValueError, match="train, heldout"):
        list_tasks("test")
    with pytest.raises(ValueError, match="light, heavy"):
        list_tasks(tier="huge")


def test_task_lines_are_tab_separated_id_split_kind_metric_tier():
    lines = task_lines()
    assert [ln.split("\t")[0] for ln in lines] == ALL_IDS
    for ln in lines:
        tid, split, kind, metric, tier = ln.split("\t")
        task = get_task(tid)
        assert (split, kind, metric, tier) == (task.split, task.kind, task.metric, task.tier)


@pytest.mark.parametrize("task_id", ALL_IDS)
def test_task_definition_is_consistent(task_id):
    t = get_task(task_id)
    assert t.split in ("train", "heldout")
    assert (
        t.metric in METRICS and METRICS[t.metric].direction == t.direction and t.scorer is METRICS[t.metric]
    )
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
    """Every light task's baseline and reference, executed and graded once in the sandbox."""
    out = {}
    for t in list_tasks(tier="light"):
        out[t.id] = (
            execute_and_grade(t.id, t.baseline_source, timeout_s=120),
            execute_and_grade(t.id, t.reference_source, timeout_s=120),
        )
    return out


@pytest.mark.parametrize("task_id", LIGHT_IDS)
def test_baseline_and_reference_reproduce_this_builds_scores(task_id, measured):
    """Each data build has its own secret split: its baseline and reference scores are measured
    once (``build_scores``) and normalise to exactly 0 and 1; the reference stays clearly ahead.
    (How far a build's scores lie from the recorded ones depends on the task: iris' baseline
    ranged over 0.67-0.73 on four builds, imbalanced_synth's F1 over 0.21-0.58.)"""
    t = get_task(task_id)
    base, ref = measured[task_id]
    assert base.status == "ok", base.message
    assert ref.status == "ok", ref.message
    b, r = build_scores(task_id)
    assert base.raw_score == pytest.approx(b, rel=1e-6, abs=1e-9)
    assert ref.raw_score == pytest.approx(r, rel=1e-6, abs=1e-9)
    assert base.score == pytest.approx(0.0, abs=1e-6) and ref.score == pytest.approx(1.0, abs=1e-6)
    # the reference beats the baseline in the metric's direction, as executed on this build
    assert (ref.raw_score - base.raw_score) * t.direction > 0
    # and keeps at least a quarter of the recorded improvement (else the build is redrawn)
    assert (r - b) * t.direction > MIN_GAP_FRACTION * abs(t.reference_score - t.baseline_score)
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


# --- task definitions: metrics declared next to the data, checked at registration ----------------
def _spec(**kw) -> TaskSpec:
    base = get_task("iris_cls")
    fields = dict(
        description="x" * 100,
        kind="tabular-classification",
        metric="accuracy",
        build_data=lambda: None,
        knob_space={"C": [0.001, 1.0]},
        reference_knobs={"C": 1.0},
        baseline_score=0.5,
        reference_score=0.9,
    )
    fields.update(kw)
    return TaskSpec(**fields), base.baseline_source


def test_an_unknown_metric_fails_at_registration_naming_the_known_ones():
    spec, src = _spec(metric="roc_auc_typo")
    with pytest.raises(
        TaskDefinitionError, match=r"task my_task: unknown metric 'roc_auc_typo'; known metrics: accuracy, f1"
    ):
        task_from_spec("my_task", spec, src)
    spec, src = _spec(metric="rmse", direction=1)
    with pytest.raises(TaskDefinitionError, match="direction=1 contradicts metric rmse"):
        task_from_spec("my_task", spec, src)
    spec, src = _spec(split="test")
    with pytest.raises(TaskDefinitionError, match="split 'test'"):
        task_from_spec("my_task", spec, src)
    spec, src = _spec(tier="huge")
    with pytest.raises(TaskDefinitionError, match="tier 'huge' is not one of light, heavy"):
        task_from_spec("my_task", spec, src)
    with pytest.raises(ValueError, match="direction must be"):
        Metric("auc", 0, lambda y, p: 0.0)


def test_a_task_declares_its_own_metric(tmp_path):
    def balanced_accuracy(y, p):
        from sklearn.metrics import balanced_accuracy_score

        return balanced_accuracy_score(y, p)

    spec, src = _spec(metric=Metric("balanced_accuracy", 1, balanced_accuracy, labels=True))
    task = task_from_spec("my_task", spec, src)
    assert (task.metric, task.direction, task.scorer.fn) == ("balanced_accuracy", 1, balanced_accuracy)
    y = np.array([0, 0, 0, 1])
    np.save(tmp_path / "p.npy", np.array([0, 0, 0, 0]))
    assert score_predictions(task.scorer, y, tmp_path / "p.npy") == pytest.approx(0.5)
    np.save(tmp_path / "p.npy", np.array([0, 0, 0, 0.5]))  # labels=True: class labels only
    with pytest.raises(ValueError, match="integer labels"):
        score_predictions(task.scorer, y, tmp_path / "p.npy")


def _f1_loop(y, p, c):
    tp, fp, fn = np.sum((p == c) & (y == c)), np.sum((p == c) & (y != c)), np.sum((p != c) & (y == c))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def test_builtin_metrics_equal_the_earlier_hand_written_ones():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.integers(0, 3, 40)
        p = rng.integers(0, 4, 40)  # including a class the labels never have
        assert METRICS["accuracy"](y, p) == pytest.approx(np.mean(p == y))
        assert METRICS["macro_f1"](y, p) == pytest.approx(np.mean([_f1_loop(y, p, c) for c in np.unique(y)]))
        assert METRICS["f1"](y, p) == pytest.approx(_f1_loop(y, p, 1))
        yf, pf = rng.normal(size=(40, 3)), rng.normal(size=(40, 3))
        assert METRICS["mae"](yf, pf) == pytest.approx(np.mean(np.abs(yf - pf)))
        assert METRICS["rmse"](yf[:, 0], pf[:, 0]) == pytest.approx(
            np.sqrt(np.mean((yf[:, 0] - pf[:, 0]) ** 2))
        )
    assert METRICS["f1"](np.array([0, 0]), np.array([0, 0])) == 0.0  # no positive: 0, not an error


def test_each_data_build_has_its_own_secret_split(tmp_path):
    t = get_task("iris_cls")
    a_pub, a_hid = t.data_dirs(tmp_path / "a")
    b_pub, b_hid = t.data_dirs(tmp_path / "b")
    assert t.data_dirs(tmp_path / "a") == (a_pub, a_hid)  # cached: the same build
    secrets = [(p.parent / f"{p.name}.secret").read_text() for p in (a_hid, b_hid)]
    assert secrets[0] != secrets[1] and all(len(x) == 32 for x in secrets)
    xa, xb = (np.load(p / "test.npz")["X"] for p in (a_pub, b_pub))
    assert xa.shape == xb.shape and not np.array_equal(xa, xb)  # other test rows
    full = t.build_data()  # the task's code and seed alone: neither build's split
    assert not np.array_equal(full.X_test, xa) and not np.array_equal(full.X_test, xb)
    rows = lambda s: sorted(map(tuple, np.concatenate([s.X_train, s.X_val, s.X_test])))  # noqa: E731
    with np.load(a_pub / "train.npz") as tr, np.load(a_pub / "val.npz") as va:
        assert sorted(map(tuple, np.concatenate([tr["X"], va["X"], xa]))) == rows(full)  # same data


def test_presets_list_their_train_tasks_explicitly():
    """A new train task does not silently join a preset (its figures would change)."""
    from wmrl.config import load_config

    for preset, tier in (
        ("research-tiny", "light"),
        ("research-debug", "light"),
        ("research-heavy", "heavy"),
    ):
        dom = load_config(preset, []).domain
        assert dom.train_tasks and dom.heldout_tasks, f"{preset} must list its train and held-out tasks"
        assert all(get_task(i).split == "train" and get_task(i).tier == tier for i in dom.train_tasks)
        assert all(get_task(i).split == "heldout" and get_task(i).tier == tier for i in dom.heldout_tasks)
    assert len(load_config("research-tiny", []).domain.train_tasks) == 10
    heavy = load_config("research-heavy", []).domain
    assert len(heavy.train_tasks) >= 4 and len(heavy.heldout_tasks) >= 2


def test_held_out_tasks_default_to_the_train_tasks_tiers_and_must_be_held_out():
    from wmrl.config import ConfigError, load_config
    from wmrl_research.pipeline import select_tasks

    light = load_config("research-tiny", ["--domain.heldout_tasks=null"]).domain
    assert [t.id for t in select_tasks(light)[1]] == [t.id for t in list_tasks("heldout", "light")]
    heavy = load_config("research-heavy", ["--domain.heldout_tasks=null"]).domain
    assert [t.id for t in select_tasks(heavy)[1]] == [t.id for t in list_tasks("heldout", "heavy")]
    # a task of the other split is refused when the config is parsed, with the fix
    with pytest.raises(
        ConfigError,
        match=r"^domain.heldout_tasks: iris_cls is not of the heldout split .*; move it to domain.train_tasks$",
    ):
        load_config("research-tiny", ["--domain.heldout_tasks=[iris_cls]"])
    with pytest.raises(
        ConfigError,
        match=r"^domain.train_tasks: mnist1d_cnn, sunspots_forecast are not of the train split .*; move "
        r"them to domain.heldout_tasks$",
    ):
        load_config("research-debug", ["--domain.train_tasks=[iris_cls,mnist1d_cnn,sunspots_forecast]"])


def test_a_split_on_which_the_reference_does_not_beat_the_baseline_is_redrawn(monkeypatch):
    """Calibration runs the real baseline and reference in the sandbox; a build that keeps too
    little of the recorded gap is discarded (a new secret, a new split), up to MAX_REDRAWS times."""
    from wmrl_research import grading
    from wmrl_research.sandbox import SandboxError

    t = get_task("iris_cls")
    _, hidden = t.data_dirs()
    secret = (hidden.parent / f"{hidden.name}.secret").read_text()
    monkeypatch.setattr(grading, "MAX_REDRAWS", 1)
    monkeypatch.setattr(t, "reference_score", 100.0)  # no split can keep a quarter of this gap
    t.discard_data()
    with pytest.raises(SandboxError, match="on 2 secret splits the reference did not beat the baseline"):
        build_scores("iris_cls")
    _, hidden = t.data_dirs()
    assert not (hidden / "scores.json").exists()
    assert (hidden.parent / f"{hidden.name}.secret").read_text() != secret  # redrawn
    monkeypatch.undo()
    b, r = build_scores("iris_cls")  # with the real recorded scores the new build calibrates
    assert r > b and json.loads((hidden / "scores.json").read_text())["redraws"] == 0


def test_listing_tasks_reports_a_bad_task_folder_in_one_line_before_any_run(tmp_path, monkeypatch, capsys):
    """A user adds a task folder with a metric the registry does not know: `wmrl tasks research`
    (and anything that loads the registry) fails at once with the task's id and the known metrics."""
    from wmrl.cli import main

    folder = tmp_path / "my-auc-task"
    folder.mkdir()
    (folder / "solution.py").write_text(get_task("iris_cls").baseline_source)
    (folder / "__init__.py").write_text(
        "from wmrl_research.tasks import TaskSpec\n"
        "SPEC = TaskSpec(description='x', kind='tabular-classification', metric='roc-auc',\n"
        "    build_data=lambda: None, knob_space={}, reference_knobs={}, baseline_score=0.5, reference_score=0.9)\n"
    )
    monkeypatch.setenv("WMRL_RESEARCH_TASKS", str(tmp_path))
    assert main(["tasks", "research"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("wmrl: error: task my-auc-task: unknown metric 'roc-auc'; known metrics: accuracy")
    assert "roc_auc" in err
    monkeypatch.delenv("WMRL_RESEARCH_TASKS")
    assert [t.id for t in list_tasks()] == ALL_IDS


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ("Iris Copy", "task folder '.*Iris Copy': a task id is lower-case letters, digits, '_' and '-'"),
        ("iris_cls", "task id 'iris_cls' is defined twice: .*; rename one of the folders"),
    ],
)
def test_a_user_task_folder_with_a_bad_or_taken_id_is_named_in_one_line(
    tmp_path, monkeypatch, capsys, folder, message
):
    from wmrl.cli import main

    (tmp_path / folder).mkdir()
    (tmp_path / folder / "__init__.py").write_text("")
    monkeypatch.setenv("WMRL_RESEARCH_TASKS", str(tmp_path))
    assert main(["tasks", "research"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.match(f"wmrl: error: {message}", err), err


# --- labels that could be derived from what a solution sees (issue 52) ----------------------------
FORECAST_IDS = [t.id for t in list_tasks() if t.kind == "ts-forecasting"]


def _runs(row: np.ndarray, arrays: list[np.ndarray]) -> bool:
    """Whether ``row`` occurs as a contiguous run in a row of one of ``arrays``."""
    n = len(row)
    for a in arrays:
        a = a.reshape(len(a), -1)
        if a.shape[1] < n:
            continue
        view = np.lib.stride_tricks.sliding_window_view(a, n, axis=1)
        if np.any(np.all(view == row, axis=-1)):
            return True
    return False


@pytest.mark.parametrize("task_id", FORECAST_IDS)
def test_no_test_target_can_be_read_off_the_public_data(task_id):
    """With stride-1 test windows every target but the last horizon is an input of a later test
    window (a solution that rebuilt the series from ``test.npz`` scored 1.21 and 1.66): no test
    window's targets may occur in any public array (another test row, train or validation)."""
    t = get_task(task_id)
    public, _ = t.data_dirs()
    y_test = t.test_labels()
    arrays = [np.load(public / "test.npz")["X"]]
    for part in ("train", "val"):
        with np.load(public / f"{part}.npz") as d:
            arrays += [d["X"], d["y"]]
    leaked = [i for i, row in enumerate(y_test) if _runs(row, arrays)]
    assert not leaked, f"{task_id}: the targets of test windows {leaked} are in the public data"
    assert len(y_test) >= 3  # still a test set


def test_forecast_windows_never_show_a_test_target_anywhere_public():
    """By position: on the series 0, 1, 2, ... the values are their indices, so no test target's
    index may be among the public arrays' values; a series too short is refused in one line."""
    from wmrl_research.tasks._common import forecast_windows

    s = forecast_windows(np.arange(300), context=40, horizon=4, test_windows=3)
    public = np.concatenate([a.ravel() for a in (s.X_train, s.y_train, s.X_val, s.y_val, s.X_test)])
    assert not set(s.y_test.ravel()) & set(public)
    assert s.y_test.shape == (3, 4) and s.y_test[-1, -1] == 299  # the last window ends the series
    assert not set(s.y_val.ravel()) & set(s.y_train.ravel())
    with pytest.raises(ValueError, match=r"^forecast_windows: a series of 100 values is too short[^\n]*$"):
        forecast_windows(np.arange(100), context=40, horizon=4, test_windows=3)
