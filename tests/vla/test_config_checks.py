"""VLA task lists are checked when the config is parsed: one line, exit status 2, the fix named."""

from __future__ import annotations

import pytest

import sims
from wmrl.cli import main


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        (
            "[wmrl/ReachColor-v0,wmrl/DMC-manipulator-bring_ball-v0]",
            "domain.tasks: wmrl/DMC-manipulator-bring_ball-v0 has no scripted expert to record "
            "demonstrations from; choose tasks with one (`wmrl tasks vla` says which have an expert)",
        ),
        (
            "[wmrl/ReachColor-v0,wmrl/DMC-reacher-easy-v0]",
            "domain.tasks must share state and action dims (one policy acts in all): wmrl/ReachColor-v0 "
            "state 7 action 4, wmrl/DMC-reacher-easy-v0 state 6 action 2; train such tasks in separate runs",
        ),
    ],
)
def test_tasks_a_run_cannot_use_are_refused_before_anything_is_built(tasks, message, tmp_path, capsys):
    assert main(["run", "vla-debug", "--out-dir", str(tmp_path / "run"), f"--domain.tasks={tasks}"]) == 2
    assert capsys.readouterr().err.strip() == f"wmrl: error: {message}"
    assert not (tmp_path / "run").exists()


def test_wmrl_tasks_vla_says_which_tasks_have_an_expert_and_their_time_limit(capsys):
    assert main(["tasks", "vla"]) == 0
    rows = {line.split("\t")[0]: line.split("\t") for line in capsys.readouterr().out.splitlines()}
    for task_id in sims.list_tasks():
        _, _, _, steps, expert, _ = rows[task_id]
        info = sims.task_info(task_id)
        assert steps == f"{info['max_steps']} steps"
        assert expert == ("expert" if info["has_expert"] else "no expert")
    assert rows["wmrl/DMC-manipulator-bring_ball-v0"][4] == "no expert"
    assert rows["wmrl/MetaWorld-dial-turn-v3"][4] == "expert"  # beyond MT10 too
