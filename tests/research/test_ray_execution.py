"""Research executions through the core's Ray executor: the same sandboxed grading as locally."""

import pytest

from wmrl.domain import Job
from wmrl.executors import RayExecutor
from wmrl_research.grading import reward
from wmrl_research.tasks import FAILURE_SCORE, get_task


@pytest.fixture(scope="module")
def ray_executor():
    ex = RayExecutor(max_concurrent=2, timeout_s=120.0)
    yield ex
    ex.close()
    import ray

    ray.shutdown()


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
