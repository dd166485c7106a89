import os
import subprocess
import sys
import threading
import time

import pytest
from executor_jobs import (
    boom,
    broken_initializer,
    graded,
    initialized_by,
    pid_job,
    sleepy,
    slow_initializer,
    span,
    square,
)

from wmrl.domain import Job
from wmrl.executors import InlineExecutor, ProcessPoolExecutor, RayExecutor


def _jobs():
    return [Job(square, (3,)), Job(boom, (1,)), Job(sleepy, (600,)), Job(square, (4,)), Job(graded, (2,))]


def _check_semantics(results):
    assert [r.status for r in results] == ["ok", "error", "timeout", "ok", "ok"]
    assert results[0].value == 9 and results[3].value == 16
    assert "bad input 1" in results[1].error
    assert results[2].reward != results[2].reward  # ungraded -> NaN
    # a job that returns a Graded: its reward, and its outcome handed back beside it
    assert results[4].reward == 4.0 and results[4].outcome == "outcome 2"
    assert [r.outcome for r in results[:4]] == [None] * 4


def test_process_pool_semantics_and_kills_timeouts():
    with ProcessPoolExecutor(max_concurrent=2, timeout_s=1.0) as ex:
        t0 = time.time()
        _check_semantics(ex.run(_jobs()))
        assert time.time() - t0 < 300  # the 600 s job was killed, not waited for (margin for a loaded host)
        assert ex.run([Job(square, (5,))])[0].value == 25  # the pool recovered


def _max_overlap(starts_ms, dur_ms):
    events = sorted([(s, 1) for s in starts_ms] + [(s + dur_ms, -1) for s in starts_ms])
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def test_process_pool_respects_concurrency_cap():
    with ProcessPoolExecutor(max_concurrent=2, timeout_s=30) as ex:
        res = ex.run([Job(span, (0.3,)) for _ in range(6)])
    assert all(r.ok for r in res)
    assert _max_overlap([r.value for r in res], 300) <= 2


def test_cancel_stops_pending_jobs():
    with ProcessPoolExecutor(max_concurrent=1, timeout_s=60) as ex:
        threading.Timer(0.5, ex.cancel).start()
        t0 = time.time()
        res = ex.run([Job(sleepy, (60,)) for _ in range(4)])
        assert time.time() - t0 < 120  # not 4 x 60 s: the pending jobs never ran
        assert all(r.status == "cancelled" for r in res)


def test_initializer_runs_in_each_worker_before_its_jobs_and_outside_their_timeout():
    """The initializer (1.5 s) is longer than the job timeout (1 s): counted against the first job,
    that job would time out."""
    with ProcessPoolExecutor(max_concurrent=1, timeout_s=1.0, initializer=slow_initializer) as ex:
        first, pid = ex.run([Job(initialized_by, (0,)), Job(pid_job, (0,))])
        assert first.ok and pid.ok and first.value == pid.value != os.getpid()
        timed_out, after = ex.run([Job(sleepy, (600,)), Job(initialized_by, (0,))])
        # the worker killed with the timed-out job is replaced, and its successor initialized too
        assert timed_out.status == "timeout" and after.ok and after.value not in (0.0, pid.value)


def test_a_failing_initializer_leaves_the_jobs_to_report():
    with ProcessPoolExecutor(max_concurrent=2, timeout_s=30, initializer=broken_initializer) as ex:
        res = ex.run([Job(square, (3,)), Job(initialized_by, (0,))])
    assert [r.status for r in res] == ["ok", "ok"] and res[0].value == 9 and res[1].value == 0.0


def test_inline_reports_errors_without_raising():
    res = InlineExecutor(1, 1.0).run([Job(square, (2,)), Job(boom, (2,)), Job(graded, (3,))])
    assert [r.status for r in res] == ["ok", "error", "ok"]
    assert (res[2].reward, res[2].outcome) == (9.0, "outcome 3") and res[0].outcome is None


@pytest.fixture(scope="module")
def ray_executor(ray_cluster):
    import executor_jobs
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(executor_jobs)  # Ray workers do not see the tests' sys.path
    return RayExecutor(max_concurrent=2, timeout_s=5.0)


@pytest.mark.slow
def test_ray_same_semantics_as_process_pool(ray_executor):
    _check_semantics(ray_executor.run(_jobs()))
    res = ray_executor.run([Job(span, (0.5,)) for _ in range(4)])
    assert all(r.ok for r in res) and _max_overlap([r.value for r in res], 500) <= 2
    assert all(r.value != os.getpid() for r in ray_executor.run([Job(pid_job, (0,))]))


def test_unreachable_ray_cluster_is_a_clear_error():
    # In a process of its own: this one may hold the session's Ray cluster, which an executor joins.
    code = (
        "from wmrl.config import ExecutorConfig\n"
        "from wmrl.executors import ExecutorError, make_executor\n"
        "try:\n"
        "    make_executor(ExecutorConfig(type='ray', ray_address='127.0.0.1:1'), 1)\n"
        "except ExecutorError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "could not start or reach a Ray cluster at address='127.0.0.1:1'" in out.stdout, out.stderr
