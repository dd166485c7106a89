"""The outcome WM's edit-only input (domain.wm_input=edit) and the anchor-replay diagnostics."""

import json

import pytest
import torch

from wmrl.config import ConfigError, load_config
from wmrl.domain import RolloutBatch
from wmrl_research.diagnose import anchor_groups, crash_stats, within_group_stats
from wmrl_research.domain import EditRollout, ResearchWorldModel, edit_text, solution_text, wm_example
from wmrl_research.edits import apply_edits, knob_edit, knobs_view
from wmrl_research.pipeline import _wm_input_key
from wmrl_research.tasks import get_task
from world_models.outcome import ExecutionLog, OutcomeExample


def _edited(task, changes):
    res = apply_edits(task.baseline_source, knob_edit(task.baseline_source, changes), "knobs")
    assert res.ok, res.reason
    return res.source


def test_edit_text_keeps_only_changed_knobs_with_old_values():
    task = get_task("iris_cls")
    view = solution_text(task, task.baseline_source)
    assert edit_text(task, view) == "no change\n"
    name, value = next(iter(line.split(" = ", 1) for line in knobs_view(task.baseline_source).splitlines()))
    src = _edited(task, {name: 7 if value != "7" else 8})
    text = edit_text(task, solution_text(task, src))
    assert text.splitlines() == [f"{name} = {7 if value != '7' else 8} (was {value})"]
    # Other knob lines (identical in every rollout of a group) are gone.
    assert len(knobs_view(task.baseline_source).splitlines()) > 1
    # Free-mode diff lines outside the knobs are kept as they are.
    assert edit_text(task, view + "+print('x')\n") == "+print('x')\n"


class _Recorder:
    """An outcome model that records what it reads."""

    def __init__(self):
        self.predicted: list[str] = []
        self.updated: list[str] = []

    def predict(self, task_texts, solution_texts):
        self.predicted += list(solution_texts)
        return torch.zeros(len(task_texts)), torch.ones(len(task_texts))

    def update(self, examples, steps):
        self.updated += [e.solution_text for e in examples]
        return {}


@pytest.mark.parametrize("wm_input", ["view", "edit"])
def test_world_model_reads_the_configured_input_and_logs_the_view(tmp_path, wm_input):
    task = get_task("iris_cls")
    name, value = knobs_view(task.baseline_source).splitlines()[0].split(" = ", 1)
    src = _edited(task, {name: 7 if value != "7" else 8})
    batch = RolloutBatch(
        torch.zeros(2, 3).long(), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, dtype=torch.long),
        [task], [EditRollout(task.id, "e", src), EditRollout(task.id, "x", None, "rejected")],
    )  # fmt: skip
    rec = _Recorder()
    log = ExecutionLog(tmp_path / "log.jsonl")
    wm = ResearchWorldModel(rec, {task.id: task}, log, update_steps=1, wm_input=wm_input)
    wm.predict(batch)
    wm.update(batch, torch.tensor([0]), torch.tensor([0.5]))
    view = solution_text(task, src)
    expected = view if wm_input == "view" else edit_text(task, view)
    assert rec.predicted == [expected] and rec.updated == [expected]
    assert [e.solution_text for e in log.load()] == [view]  # the log keeps the full view
    with pytest.raises(ValueError, match="wm_input"):
        ResearchWorldModel(rec, {task.id: task}, log, 1, wm_input="diff")


def test_wm_input_config_and_cache_key():
    assert load_config("research-tiny", []).domain.wm_input == "view"
    cfg = load_config("research-tiny", ["--domain.wm_input=edit"])
    assert _wm_input_key(load_config("research-tiny", ["--domain.wm_input=view"]).domain) == []
    assert _wm_input_key(cfg.domain) == ["wm_input=edit"]
    with pytest.raises(ConfigError, match="domain.wm_input"):
        load_config("research-tiny", ["--domain.wm_input=diff"])
    ex = OutcomeExample("iris_cls", "t", "x = 1\n", 0.1, "", "log")
    assert wm_example(get_task("iris_cls"), ex, "view") is ex


def test_within_group_stats_and_crash_stats():
    groups = [
        ([0.1, 0.2, 0.3, 0.4], [0.0, 0.1, 0.2, 0.3]),  # perfect ranking
        ([0.4, 0.3, 0.2, 0.1], [0.0, 0.1, 0.2, 0.3]),  # reversed
        ([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]),  # constant true rewards: skipped
        ([0.1, 0.2], [0.0, 1.0]),  # too small: skipped
    ]
    st = within_group_stats(groups)
    assert st["n_groups"] == 2 and st["n_skipped"] == 2
    assert st["within_spearman"] == pytest.approx(0.0) and st["top1"] == pytest.approx(0.5)
    assert st["true_flat_frac"] == pytest.approx(0.25)  # the constant group of the four
    cs = crash_stats([0.5, 0.2, -0.3, 0.2], [0.3, 0.1, -1.0, -1.0])
    assert cs["n_crash"] == 2 and cs["wm_crash_mean"] == pytest.approx(-0.05)
    # ran (0.5, 0.2) vs crashed (-0.3, 0.2): 3 wins and one tie of 4 pairs.
    assert cs["auc_runs"] == pytest.approx(3.5 / 4)


def test_anchor_groups_follow_the_logged_counts(tmp_path):
    rec = lambda src, r: {  # noqa: E731
        "task_id": "iris_cls", "task_text": "t", "solution_text": "s", "reward": r, "status": "", "source": src,
    }  # fmt: skip
    lines = [rec("log", 0.0), rec("anchor", 0.1), rec("anchor", 0.2), rec("anchor", 0.3)]
    (tmp_path / "execution_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = [{"step": 0}, {"step": 1, "wm/update_examples": 2.0}, {"step": 2, "wm/update_examples": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    groups = anchor_groups(tmp_path)
    assert [[e.reward for e in g] for g in groups] == [[0.1, 0.2], [0.3]]
    rows[2]["wm/update_examples"] = 2.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    with pytest.raises(ValueError, match="anchor records"):
        anchor_groups(tmp_path)


class _StubWM:
    def __init__(self):
        self.fits = 0

    def fit(self, examples, steps):
        self.fits += 1
        return {}

    def predict(self, task_texts, solution_texts):
        return torch.arange(len(task_texts), dtype=torch.float32), torch.ones(len(task_texts))

    def update(self, examples, steps):
        return {}

    def state_dict_full(self):
        return {}

    def load_state_dict_full(self, state):
        pass


def test_pretrained_wm_cache_is_keyed_by_the_execution_log(tmp_path):
    from wmrl_research.pipeline import pretrain_world_model

    run = load_config("research-tiny", [f"--out_dir={tmp_path / 'run'}"])
    task = get_task("iris_cls")
    view = solution_text(task, task.baseline_source)
    examples = [OutcomeExample(task.id, "t", view, 0.1 * i, "", "log") for i in range(10)]
    wm = _StubWM()
    pretrain_world_model(run.domain, run, wm, examples, tmp_path, "execution_log-a.jsonl")
    pretrain_world_model(run.domain, run, wm, examples, tmp_path, "execution_log-a.jsonl")
    assert wm.fits == 1  # cached
    pretrain_world_model(run.domain, run, wm, examples, tmp_path, "execution_log-b.jsonl")
    assert wm.fits == 2  # another log: pretrained again, never the other log's WM
    assert len(list(tmp_path.glob("wm-*.pt"))) == 2


def test_preset_execution_log_size():
    # 16 samples per train task left the WM data-limited: halving the log's fit part cost 0.10-0.16
    # held-out Spearman on every seed (docs/results/research.md, "Diagnosis of the WM during training, and a
    # larger execution log": the finding "Data size", then "Change: `log_samples_per_task: 32`").
    assert load_config("research-tiny", []).domain.log_samples_per_task == 32
