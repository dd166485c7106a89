"""Execute a solution in the sandbox and grade its predictions against the hidden test labels.

The grader runs *outside* the sandbox: the solution only writes ``predictions.npy``; this module
loads it (no pickles), checks its shape and values, and computes the task's metric against labels
the sandbox never mounts. Anything the solution prints (a "score: 1.0" line, say) is ignored.

Failure semantics (DESIGN.md section 2): a solution that crashes, times out, is killed or writes
invalid predictions is *graded* and earns :data:`FAILURE_SCORE`; a failure of the grader or the
sandbox itself *raises*, so the core's executors mark the rollout ungraded.

:func:`execute_and_grade` and :func:`reward` are module-level and take only strings and floats, so
they pickle into a process pool or a Ray task as a :class:`wmrl.domain.Job`. Each process keeps one
warm sandbox (:func:`wmrl_research.sandbox.default_sandbox`), started on its first call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl_research.sandbox import STATUSES, default_sandbox
from wmrl_research.tasks import FAILURE_SCORE, get_task, list_tasks


def _as_labels(pred: np.ndarray) -> np.ndarray:
    if not np.all(np.equal(np.mod(pred, 1), 0)):
        raise ValueError("class predictions must be integer labels")
    return pred.astype(np.int64)


def accuracy(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(_as_labels(p) == y))


def macro_f1(y: np.ndarray, p: np.ndarray) -> float:
    """Mean F1 over the classes present in the labels (unseen predicted classes only cost precision)."""
    p = _as_labels(p)
    scores = []
    for c in np.unique(y):
        tp = np.sum((p == c) & (y == c))
        fp = np.sum((p == c) & (y != c))
        fn = np.sum((p != c) & (y == c))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def f1(y: np.ndarray, p: np.ndarray) -> float:
    """F1 of the positive (minority) class 1."""
    p = _as_labels(p)
    tp = np.sum((p == 1) & (y == 1))
    fp = np.sum((p == 1) & (y != 1))
    fn = np.sum((p != 1) & (y == 1))
    return 0.0 if tp == 0 else float(2 * tp / (2 * tp + fp + fn))


def rmse(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.sqrt(np.mean((p.astype(np.float64) - y) ** 2)))


def mae(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean(np.abs(p.astype(np.float64) - y)))


# name -> (function, direction): +1 higher is better, -1 lower is better
METRICS: dict[str, tuple[Callable[[np.ndarray, np.ndarray], float], int]] = {
    "accuracy": (accuracy, 1),
    "macro_f1": (macro_f1, 1),
    "f1": (f1, 1),
    "rmse": (rmse, -1),
    "mae": (mae, -1),
}


@dataclass
class GradeResult:
    """One graded execution. ``score`` is the normalised score (``FAILURE_SCORE`` on failure)."""

    task_id: str
    status: str  # one of sandbox.STATUSES
    raw_score: float | None
    score: float
    seconds: float  # the solution's own wall-clock time in the sandbox
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def score_predictions(metric: str, labels: np.ndarray, path: Path) -> float:
    """The metric of the predictions file at ``path``; ValueError if the file is not valid predictions."""
    if metric not in METRICS:
        raise KeyError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    try:
        pred = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 (any parse failure means invalid predictions)
        raise ValueError(f"predictions.npy is not a numpy array file: {type(e).__name__}: {e}") from None
    if not isinstance(pred, np.ndarray) or pred.dtype.kind not in "biuf":
        raise ValueError(f"predictions must be a numeric array, got dtype {getattr(pred, 'dtype', None)}")
    if pred.shape != labels.shape and pred.shape == (*labels.shape, 1):
        pred = pred[..., 0]
    if pred.shape != labels.shape:
        raise ValueError(f"predictions have shape {pred.shape}, expected {labels.shape}")
    if not np.all(np.isfinite(pred)):
        raise ValueError("predictions contain NaN or infinity")
    value = METRICS[metric][0](labels, pred)
    if not np.isfinite(value):
        raise ValueError(f"metric {metric} is not finite")
    return value


def execute_raw(task_id: str, solution_source: str, timeout_s: float = 60.0) -> GradeResult:
    """Like :func:`execute_and_grade` but without normalising (``score`` is the raw score, or
    ``FAILURE_SCORE`` on failure): what measuring a new task's baseline and reference needs."""
    if not isinstance(solution_source, str):
        raise TypeError(f"solution_source must be str, got {type(solution_source).__name__}")
    task = get_task(task_id)
    public, _ = task.data_dirs()
    labels = task.test_labels()
    warm = os.environ.get("WMRL_SANDBOX_WARM", "1") != "0"
    result = default_sandbox(warm=warm).run(solution_source, public, timeout_s=timeout_s)
    assert result.status in STATUSES
    seconds = result.seconds
    if result.status != "ok" or result.predictions_path is None:
        tail = result.stderr.strip()[-600:]
        msg = result.message + (f"\n{tail}" if tail else "")
        return GradeResult(task_id, result.status, None, FAILURE_SCORE, seconds, msg)
    try:
        raw = score_predictions(task.metric, labels, result.predictions_path)
    except ValueError as e:
        return GradeResult(task_id, "invalid", None, FAILURE_SCORE, seconds, str(e))
    return GradeResult(task_id, "ok", raw, raw, seconds, "")


def execute_and_grade(task_id: str, solution_source: str, timeout_s: float = 60.0) -> GradeResult:
    """Run ``solution_source`` for task ``task_id`` in this process's sandbox and grade it.

    Raises KeyError for an unknown task, TypeError/ValueError for bad arguments and
    :class:`wmrl_research.sandbox.SandboxError` when the sandbox fails (the rollout is ungraded).
    """
    result = execute_raw(task_id, solution_source, timeout_s)
    if result.ok and result.raw_score is not None:
        result.score = get_task(task_id).normalise(result.raw_score)
    return result


def warm_up() -> float:
    """Start this process's sandbox now (seconds taken). The first execution in a process otherwise
    pays the worker's start (imports: 5-25 s on a 2-core machine); an executor whose job timeout is
    tight can call this from its pool initializer."""
    t0 = time.monotonic()
    public, _ = get_task(list_tasks()[0].id).data_dirs()
    warm = os.environ.get("WMRL_SANDBOX_WARM", "1") != "0"
    result = default_sandbox(warm=warm).run("pass\n", public, timeout_s=30.0)
    if result.status != "invalid":  # "pass" writes no predictions: anything else is a broken sandbox
        raise RuntimeError(f"sandbox warm-up ran with status {result.status}: {result.message}")
    return time.monotonic() - t0


def reward(task_id: str, solution_source: str, timeout_s: float = 60.0) -> float:
    """The normalised score of one execution: what a :class:`wmrl.domain.Job` returns."""
    return execute_and_grade(task_id, solution_source, timeout_s).score
