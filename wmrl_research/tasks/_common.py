"""Helpers that several tasks' data builders share (deterministic splits, forecasting windows)."""

from __future__ import annotations

import numpy as np

from wmrl_research.tasks.base import Splits, split_seed


def random_split(
    X: np.ndarray,
    y: np.ndarray,
    seed: int,
    fractions: tuple[float, float] = (0.6, 0.2),
    stratify: bool = True,
) -> Splits:
    """Shuffle and cut into train/val/test (``fractions`` = train, val; test gets the rest).

    With ``stratify`` each class is cut separately, so rare classes appear in every split. The
    shuffle is seeded by ``seed`` *and* the secret of the data build (:func:`split_seed`), so which
    rows are test rows cannot be derived from the task's code.
    """
    rng = np.random.default_rng(split_seed(seed))
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if stratify else [np.arange(len(y))]
    parts: list[list[np.ndarray]] = [[], [], []]
    for idx in groups:
        idx = rng.permutation(idx)
        a = int(round(fractions[0] * len(idx)))
        b = a + int(round(fractions[1] * len(idx)))
        for k, chunk in enumerate((idx[:a], idx[a:b], idx[b:])):
            parts[k].append(chunk)
    tr, va, te = (rng.permutation(np.concatenate(p)) for p in parts)
    return Splits(X[tr], y[tr], X[va], y[va], X[te], y[te])


def forecast_windows(
    series: np.ndarray,
    context: int,
    horizon: int,
    fractions: tuple[float, float] = (0.7, 0.15),
    stride: int = 1,
) -> Splits:
    """Rolling-origin windows: ``X`` = the ``context`` values before an origin, ``y`` = the next
    ``horizon`` values. Origins are split by time (train first, then val, then test), so every target
    of a later split lies after every target of an earlier one."""
    series = np.asarray(series, dtype=np.float64)
    origins = np.arange(context, len(series) - horizon + 1, stride)
    X = np.stack([series[o - context : o] for o in origins])
    y = np.stack([series[o : o + horizon] for o in origins])
    n = len(origins)
    a = int(fractions[0] * n)
    b = a + int(fractions[1] * n)
    # drop the windows whose targets overlap the next split's targets
    return Splits(X[: a - horizon], y[: a - horizon], X[a : b - horizon], y[a : b - horizon], X[b:], y[b:])
