"""Task metrics: a name, a direction and a function of ``(labels, predictions)``.

A task declares its metric in its ``SPEC`` next to its data, either by the name of one of the
metrics below (``metric="accuracy"``) or as its own :class:`Metric`::

    from wmrl_research.tasks.metrics import Metric

    def _balanced_accuracy(y, p):
        from sklearn.metrics import balanced_accuracy_score  # heavy imports inside the function

        return balanced_accuracy_score(y, p)

    SPEC = TaskSpec(..., metric=Metric("balanced_accuracy", +1, _balanced_accuracy, labels=True))

The grader checks the predictions file (numeric, finite, shaped like the labels) before it calls the
function; ``labels=True`` also requires integer class labels. The functions use ``sklearn.metrics``
where it has one. An unknown name fails when the task registry loads (listing the tasks), before
any sandbox run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Metric:
    """``fn(labels, predictions) -> float``; ``direction`` +1: higher is better, -1: lower is better."""

    name: str
    direction: int
    fn: Callable[[np.ndarray, np.ndarray], float]
    # Predictions must be integer class labels (checked before ``fn`` sees them).
    labels: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"metric name must be lower_snake_case, got {self.name!r}")
        if self.direction not in (1, -1):
            raise ValueError(f"metric {self.name}: direction must be +1 or -1, got {self.direction!r}")
        if not callable(self.fn):
            raise ValueError(f"metric {self.name}: fn must be callable, got {type(self.fn).__name__}")

    def __call__(self, labels: np.ndarray, predictions: np.ndarray) -> float:
        if self.labels:
            if not np.all(np.equal(np.mod(predictions, 1), 0)):
                raise ValueError("class predictions must be integer labels")
            predictions = predictions.astype(np.int64)
        return float(self.fn(labels, predictions))


def _accuracy(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import accuracy_score

    return accuracy_score(y, p)


def _f1(y: np.ndarray, p: np.ndarray) -> float:
    """F1 of the positive (minority) class 1; other predicted labels count as 'not 1'."""
    from sklearn.metrics import f1_score

    return f1_score(y, p, labels=[1], average="micro", zero_division=0.0)


def _macro_f1(y: np.ndarray, p: np.ndarray) -> float:
    """Mean F1 over the classes present in the labels (unseen predicted classes only cost recall)."""
    from sklearn.metrics import f1_score

    return f1_score(y, p, labels=np.unique(y), average="macro", zero_division=0.0)


def _rmse(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import root_mean_squared_error

    return root_mean_squared_error(y, p.astype(np.float64))


def _mae(y: np.ndarray, p: np.ndarray) -> float:
    """Mean absolute error over every entry (for ``[n, horizon]`` forecasts: over all horizons)."""
    from sklearn.metrics import mean_absolute_error

    return mean_absolute_error(y, p.astype(np.float64))


def _r2(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import r2_score

    return r2_score(y, p.astype(np.float64))


def _roc_auc(y: np.ndarray, p: np.ndarray) -> float:
    """Binary ROC-AUC of scores (e.g. P(class 1)) against 0/1 labels."""
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(y, p.astype(np.float64))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("accuracy", 1, _accuracy, labels=True),
        Metric("f1", 1, _f1, labels=True),
        Metric("macro_f1", 1, _macro_f1, labels=True),
        Metric("rmse", -1, _rmse),
        Metric("mae", -1, _mae),
        Metric("r2", 1, _r2),
        Metric("roc_auc", 1, _roc_auc),
    )
}


def get_metric(metric: str | Metric) -> Metric:
    """``metric`` itself, or the named metric; an unknown name raises KeyError listing the known."""
    if isinstance(metric, Metric):
        return metric
    if metric not in METRICS:
        raise KeyError(
            f"unknown metric {metric!r}; known metrics: {', '.join(METRICS)} "
            "(or declare your own: metric=Metric(name, direction, fn))"
        )
    return METRICS[metric]
