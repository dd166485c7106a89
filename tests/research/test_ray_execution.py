"""Research executions through the core's Ray executor: the same sandboxed grading as locally."""

import pytest

from wmrl.domain import Job
from wmrl.executors import RayExecutor
from wmrl_research.grading import reward
from wmrl_research.tasks import FAILURE_SCORE, get_task


@pytest.fixture(scope="module")
def ray_executor(ray_cluster):
    ex = RayExecutor(max_concurrent=2, timeout_s=120.0)
    yield ex
    ex.close()


@pytest.mark.slow
def test_ray_workers_grade_solutions_in_the_sandbox_like_a_local_run(ray_executor):
    task = get_task("iris_cls")
    hostile = "import os\nos.kill(os.getppid(), 9)\n"  # tries to kill the process that runs it
    sources = [task.reference_source, task.baseline_source, "raise SystemExit(3)\n", hostile]
    jobs = [Job(fn=reward, args=(task.id, s, 60.0)) for s in sources]
    # normalised scores: the reference scores 1 and the baseline 0 by construction
    assert [r.reward for r in ray_executor.run(jobs)] == pytest.approx(
        [1.0, 0.0, FAILURE_SCORE, FAILURE_SCORE], abs=1e-6
    )
    # the Ray workers survived the hostile solution and still grade
    assert ray_executor.run(jobs[:1])[0].reward == pytest.approx(1.0, abs=1e-6)


@pytest.mark.slow
def test_wmrl_run_research_on_ray(ray_cluster, tmp_path, capsys):
    """`wmrl run research-debug --executor.type=ray` through the CLI: the build's execution log, the
    held-out evaluation and every training step's anchors are graded by the sandbox on Ray workers
    (of the session's cluster, which the run joins)."""
    import json

    from wmrl.cli import main

    run = tmp_path / "run"
    argv = [
        "run",
        "research-debug",
        "--out-dir",
        str(run),
        "--executor.type=ray",
        f"--domain.cache_dir={tmp_path / 'cache'}",
        "--domain.sft_steps=10",
        "--domain.wm_pretrain_steps=10",
        "--domain.log_samples_per_task=4",
        "--domain.eval_samples_per_task=1",
        "--grpo.steps=2",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # one anchor group of 4 rollouts per step, graded in the sandbox: none came back ungraded
    assert [r["exec/step"] for r in rows] == [4.0, 4.0] and all(r["exec/ungraded"] == 0 for r in rows)
    assert all(-1.0 <= r["reward/anchor_true"] <= 1.5 for r in rows)
    # the final held-out evaluation ran on Ray too: every sample graded
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval/ungraded_frac"] == 0.0 and -1.0 <= summary["eval/score_mean"] <= 1.5
