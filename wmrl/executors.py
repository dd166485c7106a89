"""Real execution of rollouts: a local process pool (default), Ray for a cluster, or inline.

All executors share one contract: ``run(jobs)`` executes :class:`~wmrl.domain.Job` s with at most
``max_concurrent`` running at once, each under a wall-clock timeout, and returns one
:class:`JobResult` per job in order. A job that raises, times out or is cancelled is reported in its
result; it never takes the others (or the training run) down. ``cancel()`` from another thread stops
the jobs of the current ``run`` call. An optional ``initializer`` (a picklable function of no
arguments, e.g. starting a sandbox) runs once in every worker before it takes jobs, so that a
worker's start-up does not count against a job's timeout.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from wmrl.config import ExecutorConfig
from wmrl.domain import Graded, Job


class ExecutorError(RuntimeError):
    """The executor itself could not start or broke (not a job failure)."""


@dataclass
class JobResult:
    # "ok" | "error" (the job raised) | "timeout" | "cancelled"
    status: str
    value: float | None = None
    error: str | None = None
    seconds: float = 0.0
    # how a completed job's execution ended, in the domain's words (a job that returned a Graded)
    outcome: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def reward(self) -> float:
        """The true reward, or NaN (ungraded) when the job did not complete."""
        return float(self.value) if self.ok and self.value is not None else float("nan")


def _completed(value: float | Graded, seconds: float) -> JobResult:
    """The result of a job that returned ``value``: a float reward, or a :class:`Graded` (reward and
    outcome)."""
    if isinstance(value, Graded):
        return JobResult("ok", float(value.reward), seconds=seconds, outcome=str(value.outcome))
    return JobResult("ok", float(value), seconds=seconds)


def _noop() -> float:
    return 0.0


def _initialize(initializer) -> float:
    """Start a worker: Ctrl-C is the trainer's (which finishes its step, jobs included, then stops),
    so a worker ignores SIGINT; then the initializer, whose failure is logged, not fatal (the
    worker's jobs then meet the same failure and report it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is None:
        return 0.0
    try:
        initializer()
    except Exception:  # noqa: BLE001 - a worker must stay able to report its jobs' errors
        logging.getLogger("wmrl").warning("executor worker initializer failed", exc_info=True)
    return 0.0


def _timed_call(fn, args):
    t0 = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - t0


class Executor:
    def __init__(self, max_concurrent: int, timeout_s: float):
        self.max_concurrent = max_concurrent
        self.timeout_s = timeout_s
        self._cancel = threading.Event()

    def run(self, jobs: list[Job]) -> list[JobResult]:
        raise NotImplementedError

    def cancel(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InlineExecutor(Executor):
    """Runs jobs one by one in this process. Cannot enforce timeouts (a job that hangs, hangs the run):
    for debugging and for jobs that are cheap by construction (the toy domain)."""

    def run(self, jobs: list[Job]) -> list[JobResult]:
        self._cancel.clear()
        out = []
        for job in jobs:
            if self._cancel.is_set():
                out.append(JobResult("cancelled"))
                continue
            t0 = time.perf_counter()
            try:
                value = job.fn(*job.args)
                out.append(_completed(value, time.perf_counter() - t0))
            except Exception as e:  # a failing job is reported, never raised
                out.append(JobResult("error", error=_describe(e), seconds=time.perf_counter() - t0))
        return out


class ProcessPoolExecutor(Executor):
    """A local pool of worker processes (pebble). A job past its timeout is killed with its worker,
    which the pool replaces. Workers start from a fork server, so the trainer's threads and CUDA state
    are never forked."""

    def __init__(
        self,
        max_concurrent: int,
        timeout_s: float,
        start_method: str = "forkserver",
        initializer: Callable[[], object] | None = None,
    ):
        super().__init__(max_concurrent, timeout_s)
        from pebble import ProcessPool

        try:
            self._pool = ProcessPool(
                max_workers=max_concurrent,
                context=multiprocessing.get_context(start_method),
                # pebble starts a job's timeout when a worker takes it, i.e. after this (a worker
                # replaced after a timeout runs it again)
                initializer=_initialize,
                initargs=(initializer,),
            )
        except Exception as e:
            raise ExecutorError(
                f"could not start a local process pool of {max_concurrent} workers: {e}"
            ) from e

    def run(self, jobs: list[Job]) -> list[JobResult]:
        self._cancel.clear()
        futures = [
            self._pool.schedule(_timed_call, args=(j.fn, j.args), timeout=self.timeout_s) for j in jobs
        ]
        out: list[JobResult] = []
        for fut in futures:
            while True:
                if self._cancel.is_set():
                    fut.cancel()
                try:
                    value, seconds = fut.result(timeout=0.05)
                    out.append(_completed(value, seconds))
                except FutureTimeout:
                    if fut.done():  # pebble reports the job's own timeout as TimeoutError too
                        out.append(JobResult("timeout", error=f"killed after {self.timeout_s:g} s"))
                    else:
                        continue
                except CancelledError:
                    out.append(JobResult("cancelled"))
                except Exception as e:
                    out.append(JobResult("error", error=_describe(e)))
                break
        return out

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)


class RayExecutor(Executor):
    """Ray tasks on a cluster (``address``) or a local one started on demand. At most
    ``max_concurrent`` tasks are in flight; a task past its timeout is force-cancelled (its worker
    process is killed)."""

    def __init__(
        self,
        max_concurrent: int,
        timeout_s: float,
        address: str | None = None,
        num_cpus: float = 1.0,
        initializer: Callable[[], object] | None = None,
    ):
        super().__init__(max_concurrent, timeout_s)
        import ray

        self._ray = ray
        try:
            if not ray.is_initialized():
                kwargs: dict[str, Any] = dict(
                    include_dashboard=False, log_to_driver=False, configure_logging=False
                )
                if address is None:
                    _start_local_ray(ray, num_cpus=max(int(max_concurrent * num_cpus), 1), **kwargs)
                else:
                    _check_reachable(address)
                    ray.init(address=address, **kwargs)
        except (Exception, SystemExit) as e:  # ray.init calls sys.exit when it gives up on a cluster
            raise ExecutorError(f"could not start or reach a Ray cluster at address={address!r}: {e}") from e
        self._remote = ray.remote(num_cpus=num_cpus, max_retries=0)(_timed_call)
        # Start the workers (and run the initializer in each) now, so that a job's timeout measures
        # the job and not a worker's start-up. Best effort: Ray usually gives later tasks these
        # warm workers but does not promise to (a job on a fresh worker pays its start).
        warm = (_initialize, (initializer,)) if initializer else (_noop, ())
        ray.get([self._remote.remote(*warm) for _ in range(max_concurrent)])

    def run(self, jobs: list[Job]) -> list[JobResult]:
        ray = self._ray
        self._cancel.clear()
        out: list[JobResult | None] = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]
        running: dict = {}  # ref -> (index, start time)
        while todo or running:
            while todo and len(running) < self.max_concurrent and not self._cancel.is_set():
                i = todo.pop()
                running[self._remote.remote(jobs[i].fn, jobs[i].args)] = (i, time.monotonic())
            if self._cancel.is_set():
                for i in todo:
                    out[i] = JobResult("cancelled")
                todo = []
                for ref, (i, _) in running.items():
                    ray.cancel(ref, force=True)
                    out[i] = JobResult("cancelled")
                running = {}
                break
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.05)
            for ref in done:
                i, _ = running.pop(ref)
                try:
                    value, seconds = ray.get(ref)
                    out[i] = _completed(value, seconds)
                except Exception as e:
                    out[i] = JobResult("error", error=_describe(e))
            now = time.monotonic()
            for ref, (i, t0) in list(running.items()):
                if now - t0 > self.timeout_s:
                    ray.cancel(ref, force=True)
                    running.pop(ref)
                    out[i] = JobResult("timeout", error=f"cancelled after {self.timeout_s:g} s")
        return [r if r is not None else JobResult("cancelled") for r in out]


def _start_local_ray(ray, attempts: int = 3, **kwargs) -> None:
    """``ray.init`` of a local cluster, retried: Ray gives its raylet a fixed 30 s to register with
    the GCS, which a loaded machine can miss ("The current node timed out during startup")."""
    for attempt in range(attempts):
        try:
            ray.init(**kwargs)
            return
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == attempts - 1:
                raise
            ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` address nothing listens on (Ray itself retries for minutes)."""
    import socket

    if address in ("auto", "local") or "://" in address or ":" not in address:
        return
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        raise ExecutorError(f"nothing answers at Ray address {address!r}: {e}") from e


def make_executor(
    cfg: ExecutorConfig, max_concurrent: int, initializer: Callable[[], object] | None = None
) -> Executor:
    """The executor named by ``cfg.type`` with at most ``max_concurrent`` jobs at once;
    ``initializer`` runs once in each worker process before its first job (not inline)."""
    if cfg.type == "inline":
        return InlineExecutor(max_concurrent, cfg.timeout_s)
    if cfg.type == "process":
        return ProcessPoolExecutor(max_concurrent, cfg.timeout_s, initializer=initializer)
    if cfg.type == "ray":
        return RayExecutor(
            max_concurrent, cfg.timeout_s, cfg.ray_address, cfg.num_cpus, initializer=initializer
        )
    raise ExecutorError(f"unknown executor type {cfg.type!r}")


def _describe(e: BaseException) -> str:
    tb = "".join(traceback.format_exception_only(type(e), e)).strip()
    return tb[-2000:]
