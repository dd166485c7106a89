"""Random free-form code edits (the code log's generator) and the resumable code log."""

import ast
import random

import pytest

from wmrl.domain import Job
from wmrl_research.code_edits import build_code_log, random_code_sources, sample_code_edit
from wmrl_research.domain import solution_text
from wmrl_research.edits import apply_edits, knobs_view, parse_edits
from wmrl_research.tasks import get_task

TASK_IDS = ["iris_cls", "diabetes_reg", "digits_cnn", "seq_motif_rnn", "co2_forecast"]


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_code_edits_apply_in_free_mode_parse_and_change_code_outside_the_knobs(task_id):
    task = get_task(task_id)
    rng = random.Random(0)
    code_only = 0
    for _ in range(40):
        text = sample_code_edit(task.baseline_source, rng, knob_space=task.knob_space)
        assert parse_edits(text)
        res = apply_edits(task.baseline_source, text, "free")
        assert res.ok, res.reason
        ast.parse(res.source)
        assert apply_edits(task.baseline_source, text, "knobs").ok is False  # never a knobs-mode edit
        view = solution_text(task, res.source)
        assert any(line[:1] in "+-" for line in view.splitlines())  # a code line changed
        code_only += knobs_view(res.source) == knobs_view(task.baseline_source)
    assert 5 < code_only < 40  # some edits also move knobs, most do not


def test_random_code_sources_are_distinct_and_seeded():
    task = get_task("digits_cnn")
    a = random_code_sources(task, 30, random.Random(4))
    b = random_code_sources(task, 30, random.Random(4))
    assert a == b and len(set(a)) == 30 and task.baseline_source not in a


def _length_reward(task_id: str, source: str, timeout_s: float) -> float:
    return float(len(source) % 7)


class _Interrupted(RuntimeError):
    pass


class _InlineScoring:
    """Runs each job's ``fn`` in this process; raises after ``stop_after`` calls of ``run`` (a run
    killed half-way)."""

    def __init__(self, stop_after: int | None = None):
        self.calls, self.stop_after = 0, stop_after

    def run(self, jobs: list[Job]):
        if self.stop_after is not None and self.calls >= self.stop_after:
            raise _Interrupted
        self.calls += 1
        return [_Result(j.fn(*j.args)) for j in jobs]


class _Result:
    def __init__(self, reward: float):
        self.reward = reward


def test_code_log_resumes_where_an_interrupted_build_stopped(tmp_path, monkeypatch):
    import wmrl_research.grading as grading

    monkeypatch.setattr(grading, "reward", _length_reward)  # scoring by text: the log's bookkeeping only
    tasks = [get_task("iris_cls"), get_task("wine_cls")]
    path = tmp_path / "code_log.jsonl"
    with pytest.raises(_Interrupted):
        build_code_log(tasks, 10, 0, 5.0, _InlineScoring(stop_after=2), path, chunk=4, say=lambda m: None)
    assert not path.exists() and len(path.with_suffix(".partial").read_text().splitlines()) == 8
    resumed = _InlineScoring()
    log = build_code_log(tasks, 10, 0, 5.0, resumed, path, chunk=4, say=lambda m: None)
    assert resumed.calls == 3  # 12 jobs left of 20, 4 per call
    whole = build_code_log(tasks, 10, 0, 5.0, _InlineScoring(), tmp_path / "whole.jsonl", chunk=20,
                           say=lambda m: None)  # fmt: skip
    assert [e.solution_text for e in log.load()] == [e.solution_text for e in whole.load()]
    assert [e.reward for e in log.load()] == [e.reward for e in whole.load()]
    assert {e.source for e in log.load()} == {"code"}
