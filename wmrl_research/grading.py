"""Execute a solution in the sandbox and grade its predictions against the hidden test labels.

The grader runs *outside* the sandbox: the solution only writes ``predictions.npy``; this module
loads it (no pickles), checks its shape and values, and computes the task's metric against labels
the sandbox never mounts. Anything the solution prints (a "score: 1.0" line, say) is ignored.

Failure semantics (docs/design.md section 2): a solution that crashes, times out, is killed or writes
invalid predictions is *graded* and earns :data:`FAILURE_SCORE`; a failure of the grader or the
sandbox itself *raises*, so the core's executors mark the rollout ungraded.

:func:`execute_and_grade` and :func:`reward` are module-level and take only strings and floats, so
they pickle into a process pool or a Ray task as a :class:`wmrl.domain.Job`. Each process keeps one
warm sandbox (:func:`wmrl_research.sandbox.default_sandbox`), started on its first call.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wmrl.domain import Graded
from wmrl_research.sandbox import STATUSES, SandboxError, default_sandbox
from wmrl_research.tasks import FAILURE_SCORE, METRICS, Metric, get_task, list_tasks
from wmrl_research.tasks.base import source_digest
from wmrl_research.tasks.metrics import get_metric

# Re-exported: the metrics live with the tasks (``wmrl_research/tasks/metrics.py``).
__all__ = [
    "METRICS",
    "GradeResult",
    "build_scores",
    "calibrate",
    "execute_and_grade",
    "execute_raw",
    "reward",
    "warm_up",
]

CALIBRATION_FILE = "scores.json"  # in a task's hidden folder: this build's baseline and reference
CALIBRATION_TIMEOUT_S = 300.0
MIN_GAP_FRACTION = 0.25  # of the recorded reference-minus-baseline gap that a data build must keep
MAX_REDRAWS = 12  # imbalanced_synth: its reference beat its baseline by that margin on 2 of 6 splits tried
_CALIBRATION_LOCK = threading.Lock()


@dataclass
class GradeResult:
    """One graded execution. ``score`` is the normalised score (``FAILURE_SCORE`` on failure)."""

    task_id: str
    status: str  # one of sandbox.STATUSES
    raw_score: float | None
    score: float
    seconds: float  # the solution's own wall-clock time in the sandbox
    message: str = ""
    cpu_s: float = 0.0  # the solution's CPU time (user + system): its cost on an idle core

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def score_predictions(metric: str | Metric, labels: np.ndarray, path: Path) -> float:
    """The metric of the predictions file at ``path``; ValueError if the file is not valid predictions."""
    metric = get_metric(metric)
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
    try:
        value = metric(labels, pred)
    except (ValueError, TypeError, ArithmeticError) as e:  # predictions the metric cannot score
        raise ValueError(f"metric {metric.name} rejected the predictions: {e}") from None
    if not np.isfinite(value):
        raise ValueError(f"metric {metric.name} is not finite")
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
        return GradeResult(task_id, result.status, None, FAILURE_SCORE, seconds, msg, result.cpu_s)
    try:
        raw = score_predictions(task.scorer or task.metric, labels, result.predictions_path)
    except ValueError as e:
        return GradeResult(task_id, "invalid", None, FAILURE_SCORE, seconds, str(e), result.cpu_s)
    return GradeResult(task_id, "ok", raw, raw, seconds, "", result.cpu_s)


def execute_and_grade(task_id: str, solution_source: str, timeout_s: float = 60.0) -> GradeResult:
    """Run ``solution_source`` for task ``task_id`` in this process's sandbox and grade it.

    Raises KeyError for an unknown task, TypeError/ValueError for bad arguments and
    :class:`wmrl_research.sandbox.SandboxError` when the sandbox fails (the rollout is ungraded).
    """
    if not isinstance(solution_source, str):
        raise TypeError(f"solution_source must be str, got {type(solution_source).__name__}")
    scale = build_scores(task_id)
    result = execute_raw(task_id, solution_source, timeout_s)
    if result.ok and result.raw_score is not None:
        result.score = get_task(task_id).normalise(result.raw_score, *scale)
    return result


def build_scores(task_id: str) -> tuple[float, float]:
    """``(baseline, reference)`` raw scores on this machine's data build of the task.

    Each data build has its own secret split, so the baseline's and the reference's scores differ
    a little from build to build (and from the recorded ``SPEC`` figures). They are measured once
    per build in the sandbox, on first use, and cached next to the hidden labels (never mounted),
    so that normalised scores mean the same on every machine: 0 at the baseline, 1 at the
    reference. A split on which the reference keeps less than :data:`MIN_GAP_FRACTION` of its
    recorded improvement over the baseline (a small test set can do that) is discarded and redrawn
    (at most :data:`MAX_REDRAWS` times; a task's fixed split is never redrawn). A change of the
    baseline or reference source measures them again. Raises :class:`SandboxError` if the baseline or the
    reference fails, or no split qualifies (the task's rollouts are then ungraded, not mis-scored).
    Calibrations are serialised across processes by a lock file next to the hidden labels.
    """
    task = get_task(task_id)
    _, hidden = task.data_dirs()
    with _CALIBRATION_LOCK, _file_lock(hidden.parent / f"{hidden.name}.lock"):
        for attempt in range(MAX_REDRAWS + 1):
            _, hidden = task.data_dirs()
            path = hidden / CALIBRATION_FILE
            sources = source_digest(task.baseline_source + task.reference_source)
            try:
                d = json.loads(path.read_text())
                if d.get("sources", sources) == sources:  # measured on these solutions (or before
                    return float(d["baseline"]), float(d["reference"])  # the digest was recorded)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass
            runs = {
                name: execute_raw(task_id, src, CALIBRATION_TIMEOUT_S)
                for name, src in (("baseline", task.baseline_source), ("reference", task.reference_source))
            }
            for name, r in runs.items():
                if not r.ok or r.raw_score is None:
                    raise SandboxError(
                        f"task {task_id}: its {name} solution failed on this data build: {r.message}"
                    )
            base, ref = runs["baseline"].raw_score, runs["reference"].raw_score
            recorded_gap = abs(task.reference_score - task.baseline_score)
            if (ref - base) * task.direction > MIN_GAP_FRACTION * recorded_gap:
                fd, tmp = tempfile.mkstemp(prefix=".scores-", dir=hidden)
                with os.fdopen(fd, "w") as f:
                    json.dump(
                        {"baseline": base, "reference": ref, "metric": task.metric, "redraws": attempt,
                         "sources": sources}, f
                    )  # fmt: skip
                os.replace(tmp, path)
                return base, ref
            if task.fixed_split:
                raise SandboxError(
                    f"task {task_id}: on its fixed split the reference ({ref:.6g}) does not beat the "
                    f"baseline ({base:.6g}) by {MIN_GAP_FRACTION:.0%} of the recorded gap; measure and "
                    f"record the scores again (`python -m wmrl_research.tasks measure {task_id}`)"
                )
            task.discard_data()  # this split makes the reference no better than the baseline: redraw
    raise SandboxError(
        f"task {task_id}: on {MAX_REDRAWS + 1} secret splits the reference did not beat the baseline "
        f"by {MIN_GAP_FRACTION:.0%} of the recorded gap; check the task's recorded scores"
    )


def calibrate(task_id: str) -> float:
    """:func:`build_scores` as a :class:`wmrl.domain.Job` (returns 0.0): a run executes it for each
    of its tasks before training, so that a task whose baseline or reference fails (none of its
    rollouts could be graded) stops the run at once. Raises SandboxError with a one-line message
    (the solution's last error line) naming the task and how to run it."""
    try:
        build_scores(task_id)
    except SandboxError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        tail = f": {lines[-1]}" if len(lines) > 1 else ""
        raise SandboxError(
            f"{lines[0]}{tail} (`python -m wmrl_research.tasks measure {task_id}` runs its baseline and "
            "reference)"
        ) from None
    return 0.0


@contextlib.contextmanager
def _file_lock(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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


def graded_reward(task_id: str, solution_source: str, timeout_s: float = 60.0) -> Graded:
    """:func:`reward` with the sandbox's status (``"ok"``, ``"error"``, ``"timeout"``, ``"invalid"``,
    ``"killed"``) as the outcome, so that a run counts the executions that hit the wall-clock limit."""
    result = execute_and_grade(task_id, solution_source, timeout_s)
    return Graded(result.score, result.status)
