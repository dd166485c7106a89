"""Helpers that several tasks' data builders share (deterministic splits, forecasting windows)."""

from __future__ import annotations

import numpy as np

from wmrl_research.tasks.base import Splits, split_seed

# A float target (regression) is stratified by this many quantile bins, not by each distinct value.
STRATIFY_BINS = 10


def random_split(
    X: np.ndarray,
    y: np.ndarray,
    seed: int,
    fractions: tuple[float, float] = (0.6, 0.2),
    stratify: bool = True,
) -> Splits:
    """Shuffle and cut into train/val/test.

    ``fractions``: the shares of the rows that go to train and to val; test gets the rest (the
    default: 60 % train, 20 % val, 20 % test). Each share is rounded per stratum.

    ``stratify``: cut each stratum separately, so that every split holds each stratum in the same
    proportions (rare classes appear in every split). The strata of class labels (an integer, bool
    or string ``y``) are its classes; those of a float ``y`` (a regression target) are
    ``STRATIFY_BINS`` quantile bins of it, never its distinct values (each would be a stratum of one
    row, and every row would land in train). ``False``: one shuffle of all rows.

    The shuffle is seeded by ``seed`` *and* the secret of the data build (:func:`split_seed`), so
    which rows are test rows cannot be derived from the task's code.
    """
    rng = np.random.default_rng(split_seed(seed))
    groups = (
        [np.flatnonzero(s == c) for s in [strata(y)] for c in np.unique(s)]
        if stratify
        else [np.arange(len(y))]
    )
    parts: list[list[np.ndarray]] = [[], [], []]
    for idx in groups:
        idx = rng.permutation(idx)
        a = int(round(fractions[0] * len(idx)))
        b = a + int(round(fractions[1] * len(idx)))
        for k, chunk in enumerate((idx[:a], idx[a:b], idx[b:])):
            parts[k].append(chunk)
    tr, va, te = (rng.permutation(np.concatenate(p)) for p in parts)
    return Splits(X[tr], y[tr], X[va], y[va], X[te], y[te])


def strata(y: np.ndarray) -> np.ndarray:
    """The stratum of each row for :func:`random_split`: its class for labels, its quantile bin
    (``STRATIFY_BINS`` bins; of the row's mean for a multi-output target) for a float target."""
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.floating):
        v = y.reshape(len(y), -1).mean(1) if y.ndim > 1 else y
        edges = np.unique(np.quantile(v, np.linspace(0, 1, STRATIFY_BINS + 1)[1:-1]))
        return np.searchsorted(edges, v, side="right")
    if y.ndim > 1:  # several labels per row: one stratum per combination
        return np.unique(y.reshape(len(y), -1), axis=0, return_inverse=True)[1].ravel()
    return y


def forecast_windows(
    series: np.ndarray,
    context: int,
    horizon: int,
    test_windows: int,
    train_fraction: float = 0.8,
) -> Splits:
    """Forecasting windows: ``X`` = the ``context`` values before an origin, ``y`` = the next
    ``horizon`` values, split by time.

    The test set is the last ``test_windows`` windows *without overlap* (one every
    ``context + horizon`` steps, the last ending with the series): no test window's inputs hold a
    value of another's targets, so the targets cannot be read off later test rows (with stride-1
    windows every target but the last horizon is an input of a later test window). The train and
    validation windows (stride 1, train first, ``train_fraction`` of them) end before the first
    test target, with a gap of ``horizon`` between them so that no validation target is a train
    target. What a later test window still shows is the series *after* an earlier window's targets
    (their future, not their values): tasks/README.md states what that is worth.
    """
    series = np.asarray(series, dtype=np.float64)
    block = context + horizon
    if test_windows < 1 or len(series) - test_windows * block < block + context:
        raise ValueError(
            f"forecast_windows: a series of {len(series)} values is too short for {test_windows} "
            f"test windows of {context}+{horizon} values and any train/validation windows"
        )
    test_origins = np.array([len(series) - horizon - k * block for k in range(test_windows)][::-1])
    origins = np.arange(context, test_origins[0] - horizon + 1)  # every target before the test's
    X = np.stack([series[o - context : o] for o in origins])
    y = np.stack([series[o : o + horizon] for o in origins])
    a = int(train_fraction * len(origins))
    X_test = np.stack([series[o - context : o] for o in test_origins])
    y_test = np.stack([series[o : o + horizon] for o in test_origins])
    return Splits(X[: a - horizon], y[: a - horizon], X[a:], y[a:], X_test, y_test)
