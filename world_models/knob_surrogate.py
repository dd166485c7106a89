"""A tabular outcome WM: knob values parsed from the solution text -> a per-task tree ensemble.

The approach of hyper-parameter optimisers (SMAC's random forests, Optuna's TPE, BoTorch's GPs): a
program whose only free part is a block of ``NAME = literal`` knobs is a point of the task's knob
space, and its score is a function of that point that a small tabular regressor learns from a few
dozen executions, far better than a text model of the same data. Per task (the tasks share no knob
semantics worth pooling) :class:`KnobSurrogateOutcomeModel` fits one of two regressors:

- ``extra_trees`` (default): scikit-learn's ``ExtraTreesRegressor`` (``trees`` fully grown
  extremely randomised trees, every feature considered at each split) on the features below plus a
  one-hot code of each knob's value index; the mean over trees is the prediction and the spread of
  the trees' predictions (scaled, plus a floor) its variance;
- ``hgb``: ``HistGradientBoostingRegressor`` fitted on all of the task's executions for the mean,
  and ``members`` more fitted on bootstrap resamples whose spread (scaled, plus a floor) is the
  variance.

Features of one solution (:func:`knob_features`), for each knob of the task's space in declared
order: the value's index in the knob's space (NaN for a value outside it), its numeric value (NaN
for strings and None; booleans 0/1), and whether it differs from the baseline; then the number of
changed knobs and the number of other lines of the text (code edits outside the knobs block, which
this model cannot read beyond counting them). Both WM inputs of the research domain parse: the full
knobs view (``NAME = value`` lines) and the edit view (``NAME = new (was old)`` lines; knobs not
named keep their baseline value; ``no change``).

This module knows nothing of the research domain beyond that text format: it is given each task's
knob space and baseline values as Python source strings, keyed by the task text the WM receives.
A task with fewer than ``min_fit`` executions, or a task text it was not given, is predicted by the
mean and variance of the rewards seen so far for it (or of all rewards).
"""

from __future__ import annotations

import ast
import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from world_models.outcome import OutcomeExample

_LINE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*) = (?P<value>.*?)(?: \(was (?P<old>.*)\))?$")
FEATURES_PER_KNOB = 3


def parse_knob_text(text: str) -> tuple[dict[str, str], int]:
    """``({name: value source}, other_lines)`` of a knobs view or edit view.

    ``NAME = value`` and ``NAME = new (was old)`` lines give a knob's value (``new``); a ``no change``
    line is skipped; any other non-empty line (a free-mode diff line) is counted in ``other_lines``.
    """
    values: dict[str, str] = {}
    other = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line == "no change":
            continue
        m = _LINE.match(line)
        if m and not raw.startswith(("+", "-", " ", "\t")):
            values[m.group("name")] = m.group("value").strip()
        else:
            other += 1
    return values, other


def _numeric(value_src: str) -> float:
    """The number a knob's value source denotes (booleans 0/1), else NaN (strings, None, garbage)."""
    try:
        v = ast.literal_eval(value_src)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return math.nan
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float) and math.isfinite(float(v)):
        return float(v)
    return math.nan


def _canon(value_src: str) -> str:
    """A value source in a canonical form, so that ``1.0`` and ``1.00`` or ``'a'`` and ``"a"`` match."""
    try:
        return repr(ast.literal_eval(value_src))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value_src.strip()


class KnobSpace:
    """One task's knob space as the surrogate sees it: ``space[name]`` the allowed values' sources (in
    the task's declared order), ``baseline[name]`` the baseline value's source."""

    def __init__(self, space: Mapping[str, Sequence[str]], baseline: Mapping[str, str]):
        self.names = list(space)
        self.index = {n: {_canon(v): i for i, v in enumerate(space[n])} for n in self.names}
        self.baseline = {n: _canon(v) for n, v in baseline.items()}

    @property
    def n_features(self) -> int:
        return FEATURES_PER_KNOB * len(self.names) + 2

    def features(self, text: str) -> np.ndarray:
        """``[F]`` float features of one solution text (see the module docstring)."""
        values, other = parse_knob_text(text)
        row: list[float] = []
        changed_total = 0
        for n in self.names:
            src = values.get(n)
            v = _canon(src) if src is not None else self.baseline.get(n, "")
            idx = self.index[n].get(v)
            changed = float(n in self.baseline and v != self.baseline[n])
            row += [math.nan if idx is None else float(idx), _numeric(v), changed]
        for n, src in values.items():
            if n in self.baseline and _canon(src) != self.baseline[n]:
                changed_total += 1
        row += [float(changed_total), float(other)]
        return np.asarray(row, dtype=np.float64)

    def one_hot(self, x: np.ndarray) -> np.ndarray:
        """``[n, F]`` features -> ``[n, F + sum of space sizes]``: a one-hot code of each knob's value
        index appended (all zero for a value outside the space)."""
        cols = [x]
        for j, n in enumerate(self.names):
            idx = x[:, FEATURES_PER_KNOB * j]
            cols.append(np.stack([(idx == i).astype(np.float64) for i in range(len(self.index[n]))], 1))
        return np.concatenate(cols, 1)


def knob_features(text: str, space: Mapping[str, Sequence[str]], baseline: Mapping[str, str]) -> np.ndarray:
    """Features of one solution text under a task's knob space (see :class:`KnobSpace`)."""
    return KnobSpace(space, baseline).features(text)


ESTIMATORS = ("extra_trees", "hgb")


class KnobSurrogateOutcomeModel:
    """Per-task tree ensemble over knob features (the ``OutcomeModel`` protocol).

    ``tasks``: task text -> ``(space, baseline)`` (value sources, see :class:`KnobSpace`).
    ``fit`` and ``update`` add executions and refit the tasks they touch (``steps`` only switches an
    update's refit off when 0; an unrefitted task is refitted on all its data at its next refit).
    ``var = var_scale * spread + var_offset + var_floor``; :meth:`calibrate_variance` fits
    ``var_scale`` and ``var_offset`` on held-out executions.
    """

    def __init__(
        self,
        tasks: Mapping[str, tuple[Mapping[str, Sequence[str]], Mapping[str, str]]],
        estimator: str = "extra_trees",
        trees: int = 200,
        members: int = 4,
        max_iter: int = 150,
        learning_rate: float = 0.1,
        max_leaf_nodes: int = 8,
        min_samples_leaf: int = 3,
        l2_regularization: float = 0.1,
        min_fit: int = 6,
        var_floor: float = 1e-3,
        seed: int = 0,
    ):
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator={estimator!r} is not one of {', '.join(ESTIMATORS)}")
        if members < 1 or trees < 1:
            raise ValueError(f"members={members} and trees={trees} must be >= 1")
        self.estimator = estimator
        self.trees = trees
        self.spaces = {k: KnobSpace(s, b) for k, (s, b) in tasks.items()}
        self.members = members
        self.params = {
            "max_iter": max_iter,
            "learning_rate": learning_rate,
            "max_leaf_nodes": max_leaf_nodes,
            "min_samples_leaf": min_samples_leaf,
            "l2_regularization": l2_regularization,
        }
        self.min_fit = min_fit
        self.var_floor = var_floor
        self.var_scale, self.var_offset = 1.0, 0.0
        self.seed = seed
        self.examples: list[OutcomeExample] = []
        self._rows: dict[str, list[int]] = {}  # task text -> indices into examples
        # task text -> (feature columns used [F] bool, fitted members)
        self._models: dict[str, tuple[np.ndarray, list[Any]]] = {}

    # ---- training ---------------------------------------------------------------------------------
    def _add(self, examples: Sequence[OutcomeExample]) -> set[str]:
        touched = set()
        for e in examples:
            self._rows.setdefault(e.task_text, []).append(len(self.examples))
            self.examples.append(e)
            touched.add(e.task_text)
        return touched

    def _refit(self, task: str) -> None:
        with threadpool_limits(1):  # OpenMP threads on tiny data only contend (minutes on 2 busy cores)
            self._refit_locked(task)

    def _design(self, task: str, texts: Sequence[str]) -> np.ndarray:
        space = self.spaces[task]
        x = np.stack([space.features(t) for t in texts])  # [n, F]
        if self.estimator == "extra_trees":
            x = space.one_hot(x)
        # Trees split on -1 as "no value" (every feature is >= 0 otherwise but a negative number
        # knob's, where -1 still separates). HistGradientBoosting would take NaN, but not a column
        # that is all NaN in a bootstrap resample of a few rows.
        return np.nan_to_num(x, nan=-1.0)

    def _refit_locked(self, task: str) -> None:
        from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor

        rows = self._rows.get(task, [])
        if task not in self.spaces or len(rows) < self.min_fit:
            self._models.pop(task, None)
            return
        x = self._design(task, [self.examples[i].solution_text for i in rows])  # [n, F']
        y = np.asarray([self.examples[i].reward for i in rows], dtype=np.float64)  # [n]
        keep = ~np.all(x == x[:1], 0)  # drop constant columns (a string knob has no numeric value)
        x = _kept_columns(x, keep)
        # The draws depend on (seed, task, n) only, so a reloaded model refits to the same members.
        rng = np.random.default_rng([self.seed, zlib.crc32(task.encode()), len(rows)])
        if self.estimator == "extra_trees":
            m = ExtraTreesRegressor(
                self.trees, min_samples_leaf=1, max_features=1.0, random_state=int(rng.integers(2**31))
            )
            self._models[task] = (keep, [m.fit(x, y)])
            return
        models = []
        for k in range(self.members + 1):  # member 0 on all rows (the mean), the others bootstrapped
            idx = rng.integers(0, len(rows), len(rows)) if k else np.arange(len(rows))
            m = HistGradientBoostingRegressor(
                **self.params, early_stopping=False, random_state=int(rng.integers(2**31))
            )
            models.append(m.fit(x[idx], y[idx]))
        self._models[task] = (keep, models)

    def fit(self, examples: Sequence[OutcomeExample], steps: int = 0) -> dict[str, float]:
        for task in sorted(self._add(examples)):
            self._refit(task)
        return {"wm/fit_tasks": float(len(self._models)), "wm/train_size": float(len(self.examples))}

    def update(self, examples: Sequence[OutcomeExample], steps: int = 1) -> dict[str, float]:
        touched = self._add(examples)
        if steps > 0:
            for task in sorted(touched):
                self._refit(task)
        return {"wm/train_size": float(len(self.examples)), "wm/refit_tasks": float(len(touched))}

    # ---- prediction -------------------------------------------------------------------------------
    def _prior(self, task: str) -> tuple[float, float]:
        rows = self._rows.get(task) or range(len(self.examples))
        y = np.asarray([self.examples[i].reward for i in rows], dtype=np.float64)
        if y.size == 0:
            return 0.0, 1.0
        return float(y.mean()), float(y.var()) + self.var_floor

    def predict(
        self, task_texts: Sequence[str], solution_texts: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(task_texts)
        if len(solution_texts) != n:
            raise ValueError(f"{n} task texts but {len(solution_texts)} solution texts")
        mean, var = np.zeros(n), np.zeros(n)
        by_task: dict[str, list[int]] = {}
        for i, t in enumerate(task_texts):
            by_task.setdefault(t, []).append(i)
        for task, idx in by_task.items():
            fitted = self._models.get(task)
            if fitted is None:
                mean[idx], var[idx] = self._prior(task)
                continue
            keep, models = fitted
            x = _kept_columns(self._design(task, [solution_texts[i] for i in idx]), keep)
            with threadpool_limits(1):
                if self.estimator == "extra_trees":
                    # each tree's own prediction (``tree_.predict`` skips the per-call input checks
                    # that made this 30x slower; identical values)
                    x32 = np.ascontiguousarray(x, dtype=np.float32)
                    p = np.stack([t.tree_.predict(x32).reshape(len(idx)) for t in models[0].estimators_])
                    mu = p.mean(0)
                else:
                    p = np.stack([m.predict(x) for m in models])  # [1 + members, B]
                    mu, p = p[0], p[1:]
            mean[idx] = mu
            var[idx] = self.var_scale * p.var(0) + self.var_offset + self.var_floor
        return torch.from_numpy(mean).float(), torch.from_numpy(var).float()

    def calibrate_variance(self, examples: Sequence[OutcomeExample], max_scale: float = 100.0) -> float:
        """Fit ``var = var_scale * spread + var_offset + var_floor`` to the squared errors on
        ``examples`` (held-out executions) by non-negative least squares; returns ``var_scale``.

        The offset matters for ``extra_trees``: fully grown trees agree exactly on the executions
        they were fitted on, so the spread alone is zero there, however wrong the mean may be
        elsewhere."""
        from scipy.optimize import nnls

        self.var_scale, self.var_offset = 1.0, 0.0
        mean, var = self.predict([e.task_text for e in examples], [e.solution_text for e in examples])
        y = np.asarray([e.reward for e in examples], dtype=np.float64)
        spread = np.clip(var.double().numpy() - self.var_floor, 0, None)
        excess = np.clip((mean.double().numpy() - y) ** 2 - self.var_floor, 0, None)
        (a, b), _ = nnls(np.stack([spread, np.ones_like(spread)], 1), excess)
        self.var_scale, self.var_offset = float(min(a, max_scale)), float(b)
        return self.var_scale

    # ---- state ------------------------------------------------------------------------------------
    def state_dict_full(self) -> dict[str, Any]:
        """Plain data only (the examples; the members are refitted on load, deterministically)."""
        return {
            "examples": [asdict(e) for e in self.examples],
            "var_scale": self.var_scale,
            "var_offset": self.var_offset,
        }

    @classmethod
    def from_export(cls, path: str | Path) -> KnobSurrogateOutcomeModel:
        """The surrogate ``wmrl export`` wrote (``knob_surrogate.json``: task spaces, estimator,
        seed and the executions it learned from), refitted as the run had it."""
        spec = json.loads(Path(path).read_text())
        tasks = {t: (space, baseline) for t, (space, baseline) in spec["tasks"].items()}
        model = cls(tasks, estimator=spec["estimator"], members=spec["members"], seed=spec["seed"])
        model.load_state_dict_full(spec["state"])
        return model

    def load_state_dict_full(self, state: dict[str, Any]) -> None:
        self.examples, self._rows, self._models = [], {}, {}
        self.fit([OutcomeExample(**e) for e in state["examples"]])
        self.var_scale = float(state.get("var_scale", 1.0))
        self.var_offset = float(state.get("var_offset", 0.0))


def _kept_columns(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The columns of ``x`` ``[n, F]`` that ``keep`` ``[F]`` marks; where it marks none (every edit a
    task has seen sets the same values), one constant column ``[n, 1]``, on which a model fits the
    rows' mean."""
    return x[:, keep] if keep.any() else np.zeros((len(x), 1))
