"""A user's own research task, built from the tasks README alone ("Your own tasks, outside the
package"): a folder outside the package, an id with dashes, statsmodels' bundled macrodata, a fixed
split, a reference that is a program of its own. Listed, measured and graded in the real sandbox.
Also: a task whose baseline fails stops `measure` and a run in one line; task lists that cannot
mean what they say are refused when the config is parsed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from wmrl.cli import main as wmrl_main
from wmrl.config import ConfigError, load_config
from wmrl_research import tasks as T
from wmrl_research.grading import execute_and_grade
from wmrl_research.tasks import get_task, list_tasks, set_knobs
from wmrl_research.tasks.__main__ import main as tasks_main

README = Path(T.__file__).parent / "README.md"
TASK = "macro-invest"
# The baseline as the README describes it: "a ridge regression with knobs ALPHA = 1e6 and
# STANDARDISE = False, written like the iris example above".
SOLUTION = '''"""Real investment: baseline solution (ridge regression)."""

import os

import numpy as np
from sklearn.linear_model import Ridge

# --- KNOBS START ---
ALPHA = 1e6  # ridge penalty
STANDARDISE = False  # scale features with the train split's mean and deviation
# --- KNOBS END ---

DATA_DIR = os.environ.get("WMRL_DATA_DIR", "data")


def load(name):
    d = np.load(os.path.join(DATA_DIR, name + ".npz"))
    return d["X"], (d["y"] if "y" in d.files else None)


def main():
    X_train, y_train = load("train")
    X_val, y_val = load("val")
    X_test, _ = load("test")
    if STANDARDISE:
        mu, sd = X_train.mean(0), X_train.std(0)
        X_train, X_val, X_test = ((x - mu) / sd for x in (X_train, X_val, X_test))
    model = Ridge(alpha=ALPHA).fit(X_train, y_train)
    print(f"val_mae={np.mean(np.abs(model.predict(X_val) - y_val)):.2f}")
    np.save("predictions.npy", model.predict(X_test))


if __name__ == "__main__":
    main()
'''


def _readme_files() -> tuple[str, str]:
    """The section's two Python blocks: the task's ``__init__.py`` and its ``reference.py``."""
    section = README.read_text().split("### Your own tasks, outside the package")[1].split("\n### ")[0]
    init, reference = re.findall(r"```python\n(.*?)```", section, re.S)
    return init, reference


@pytest.fixture
def my_tasks(tmp_path, monkeypatch):
    """``my-tasks/macro-invest`` as the README lays it out, and ``broken-base``: the same task whose
    baseline crashes. (The data cache is the session's: the sandbox of this process serves one.)"""
    init, reference = _readme_files()
    root = tmp_path / "my-tasks"
    for name, solution in (
        (TASK, SOLUTION),
        ("broken-base", SOLUTION.replace("def main():\n", "def main():\n    raise KeyError('realinv')\n")),
    ):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(init)
        (root / name / "solution.py").write_text(solution)
        (root / name / "reference.py").write_text(reference)
    yield root
    T._load_all.cache_clear()


def test_a_user_task_from_the_readme_is_listed_measured_built_and_graded(my_tasks, monkeypatch, capsys):
    monkeypatch.setenv("WMRL_RESEARCH_TASKS", str(my_tasks))
    assert wmrl_main(["tasks", "research"]) == 0
    assert f"{TASK}\ttrain\ttabular-regression\tmae\tlight" in capsys.readouterr().out.splitlines()

    # measured in the real sandbox; then the scores are copied into SPEC, as the README says
    assert tasks_main(["measure", TASK]) == 0
    row = json.loads(capsys.readouterr().out)
    base, ref = row["baseline"], row["reference"]
    assert 0 < ref < base  # MAE: the log-log reference beats the over-regularised ridge
    init = my_tasks / TASK / "__init__.py"
    init.write_text(
        init.read_text()
        .replace("baseline_score=0.0,", f"baseline_score={base!r},")
        .replace("reference_score=1.0,", f"reference_score={ref!r},")
    )
    T._load_all.cache_clear()  # a new process reads the edited SPEC

    task = get_task(TASK)
    assert (task.baseline_score, task.reference_score, task.fixed_split) == (base, ref, True)
    assert "np.linalg.lstsq" in task.reference_source and "KNOBS START" not in task.reference_source
    # built with its own fixed split: no secret drawn, the test rows are the last fifth of the quarters
    public, hidden = task.data_dirs()
    assert not (hidden.parent / f"{hidden.name}.secret").exists()
    from statsmodels.datasets import macrodata

    df = macrodata.load_pandas().data
    with np.load(public / "test.npz") as test:
        np.testing.assert_array_equal(test["X"][:, 0], df["realgdp"].to_numpy()[int(0.8 * len(df)) :])
    np.testing.assert_array_equal(
        np.load(hidden / "y_test.npy"), df["realinv"].to_numpy()[int(0.8 * len(df)) :]
    )

    # graded like any task: 0 at the baseline, 1 at the reference, an edit somewhere else
    b, r = execute_and_grade(TASK, task.baseline_source), execute_and_grade(TASK, task.reference_source)
    assert (b.status, r.status) == ("ok", "ok")
    assert (b.score, r.score) == (pytest.approx(0.0, abs=1e-9), pytest.approx(1.0))
    edit = execute_and_grade(TASK, set_knobs(task.baseline_source, {"ALPHA": 1.0, "STANDARDISE": True}))
    assert edit.status == "ok" and edit.score != pytest.approx(0.0) and -1 <= edit.score <= 2

    # a run names the folder in its config: parsed, the workers' environment carries it
    monkeypatch.delenv("WMRL_RESEARCH_TASKS")
    cfg = load_config(
        "research-debug", [f"--domain.task_dirs=[{my_tasks}]", f"--domain.train_tasks=[{TASK}]"]
    )
    from wmrl_research.pipeline import select_tasks

    assert [t.id for t in select_tasks(cfg.domain)[0]] == [TASK]
    import os

    assert str(my_tasks) in os.environ["WMRL_RESEARCH_TASKS"].split(os.pathsep)


def test_a_failing_baseline_fails_measure_and_stops_a_run_before_training(
    my_tasks, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("WMRL_RESEARCH_TASKS", str(my_tasks))
    assert tasks_main(["measure", "broken-base"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["baseline"] is None
    assert err.strip() == (
        "python -m wmrl_research.tasks: error: task broken-base: its baseline solution failed (error): exit "
        "code 1: KeyError: 'realinv'; no rollout of the task can be graded until it runs"
    )
    assert tasks_main(["measure", "no-such-task"]) == 2
    assert capsys.readouterr().err.startswith("python -m wmrl_research.tasks: error: unknown research task")

    cache = tmp_path / "cache"
    argv = ["run", "research-debug", "--out-dir", str(tmp_path / "run"), f"--domain.cache_dir={cache}"]
    argv += [f"--domain.task_dirs=[{my_tasks}]", "--domain.train_tasks=[broken-base]"]
    assert wmrl_main([*argv, "--domain.heldout_tasks=[sunspots_forecast]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the build's progress lines
    assert err == (
        "wmrl: error: task broken-base: its baseline solution failed on this data build: exit code 1: "
        "KeyError: 'realinv' (`python -m wmrl_research.tasks measure broken-base` runs its baseline and "
        "reference)"
    )
    assert not cache.exists()  # stopped before the SFT stage wrote anything


@pytest.mark.parametrize("name", ["train_tasks", "heldout_tasks"])
def test_an_empty_task_list_is_refused_in_one_line(name, tmp_path, capsys):
    argv = ["run", "research-debug", "--out-dir", str(tmp_path / "run"), f"--domain.{name}=[]"]
    assert wmrl_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(
        f"wmrl: error: domain.{name}=[] lists no task: list task ids"
    )
    assert f"or set domain.{name}=null for " in err
    assert not (tmp_path / "run").exists()


def test_an_unset_task_list_is_named_when_the_run_starts():
    from wmrl_research.config import ResearchConfig
    from wmrl_research.pipeline import select_tasks, unset_task_notes

    cfg = ResearchConfig()
    train, heldout = select_tasks(cfg)
    notes = unset_task_notes(cfg, train, heldout)
    heavy = len(list_tasks("train", "heavy"))
    assert notes[0].startswith(
        f"domain.train_tasks is unset: using every train task, heavy ones included: "
        f"{len(list_tasks('train'))} tasks, {heavy} of them heavy ("
    )
    assert notes[1].startswith("domain.heldout_tasks is unset: using the held-out tasks of the train tasks'")
    explicit = ResearchConfig(train_tasks=["iris_cls"], heldout_tasks=["sunspots_forecast"])
    assert unset_task_notes(explicit, *select_tasks(explicit)) == []


def test_a_missing_task_folder_is_refused_when_the_config_is_parsed(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"^domain.task_dirs: no folder '.*nowhere'; give folders that hold one sub-folder per task$",
    ):
        load_config("research-debug", [f"--domain.task_dirs=[{tmp_path / 'nowhere'}]"])


def test_a_user_runs_the_conformance_check_on_their_own_tasks(my_tasks, monkeypatch, capsys):
    """`python -m wmrl_research.tasks check` checks the tasks of $WMRL_RESEARCH_TASKS (pytest's
    tests/research/test_tasks.py collects only the package's): one line per task, exit 1 on a problem."""
    monkeypatch.setenv("WMRL_RESEARCH_TASKS", str(my_tasks))
    capsys.readouterr()
    assert tasks_main(["check", "--no-run"]) == 0
    assert capsys.readouterr().out.splitlines() == ["task broken-base: ok", f"task {TASK}: ok"]
    assert tasks_main(["check"]) == 1  # executed: broken-base's baseline raises
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith("task broken-base: its baseline failed in the sandbox (")
        and "realinv" in lines[0]
    )
    assert lines[-1] == f"task {TASK}: ok"
    solution = my_tasks / TASK / "solution.py"
    solution.write_text(solution.read_text().replace("def main():", "def main(:"))
    T._load_all.cache_clear()
    assert tasks_main(["check", TASK, "--no-run"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"task {TASK}: its baseline does not compile: "), out
    monkeypatch.delenv("WMRL_RESEARCH_TASKS")
    T._load_all.cache_clear()
    assert tasks_main(["check"]) == 2
    assert "no task of your own to check" in capsys.readouterr().err


def test_a_task_folder_without_init_is_named_not_skipped(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "my-task"
    folder.mkdir()
    (folder / "solution.py").write_text(get_task("iris_cls").baseline_source)
    (tmp_path / "data").mkdir()  # a folder that is no task stays quiet
    monkeypatch.setenv("WMRL_RESEARCH_TASKS", str(tmp_path))
    T._load_all.cache_clear()
    try:
        assert wmrl_main(["tasks", "research"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"wmrl: error: task folder {str(folder)!r} has a solution.py but no __init__.py: a task is "
            "defined by SPEC = TaskSpec(...) in its __init__.py (wmrl_research/tasks/README.md)\n"
        )
    finally:
        monkeypatch.delenv("WMRL_RESEARCH_TASKS")
        T._load_all.cache_clear()


def test_random_split_stratifies_a_regression_target_by_quantile_bins_not_by_value():
    """``stratify=True`` (the default) on a float target: every split gets its share of rows and of
    the target's range (by each distinct value, every row was a stratum of one and went to train)."""
    from wmrl_research.tasks._common import random_split

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(500, 3)), rng.normal(size=500)
    s = random_split(X, y, seed=1)
    assert (len(s.y_train), len(s.y_val), len(s.y_test)) == (300, 100, 100)
    assert abs(np.median(s.y_test) - np.median(y)) < 0.3 and s.y_test.min() < -1 < 1 < s.y_test.max()
    labels = rng.integers(0, 3, size=500)  # class labels: each class cut separately, as before
    s = random_split(X, labels, seed=1)
    for c in range(3):
        n = int((labels == c).sum())
        assert int((s.y_test == c).sum()) == n - round(0.6 * n) - round(0.2 * n)
