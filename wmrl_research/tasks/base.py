"""The research-task type, its normalised score, and the on-disk data layout a solution reads.

A task is one sub-package of :mod:`wmrl_research.tasks` holding ``__init__.py`` (a module-level
``SPEC = TaskSpec(...)``) and the baseline ``solution.py``. See ``README.md`` next to this file.

The contract between a solution and the grader (the why: labels never enter the sandbox):

- the solution runs with its working directory set to a fresh, empty, writable folder;
- ``$WMRL_DATA_DIR`` (read-only) holds ``train.npz`` and ``val.npz`` (arrays ``X`` and ``y``) and
  ``test.npz`` (array ``X`` only);
- the solution writes ``predictions.npy`` into its working directory: one prediction per test row,
  shaped like the hidden labels (``[n]`` or ``[n, horizon]``);
- the grader, outside the sandbox, loads those predictions and compares them with labels that live
  in a folder the sandbox never mounts.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import math
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wmrl_research.tasks.metrics import Metric

KNOBS_START = "# --- KNOBS START ---"
KNOBS_END = "# --- KNOBS END ---"
# The normalised score of a solution that crashed, timed out, or wrote invalid predictions.
FAILURE_SCORE = -1.0
# Normalised scores are clipped to this range so one lucky or broken run cannot dominate a batch.
SCORE_CLIP = (-1.0, 2.0)
SPLITS = ("train", "heldout")
# Cost tiers: "light" tasks run in about a second, "heavy" ones in 3-15 s per execution (longer
# training, larger data, cross-validation), where execution dominates an RL step.
TIERS = ("light", "heavy")
PREDICTIONS_FILE = "predictions.npy"
DATA_ENV = "WMRL_DATA_DIR"
# Bump to invalidate every cached data set (e.g. after changing the layout). 2: random splits are
# seeded by a secret per data build (before: by the task's fixed seed alone).
DATA_LAYOUT_VERSION = 2
SECRET_SUFFIX = ".secret"
_SPLIT_SECRET: contextvars.ContextVar[str | None] = contextvars.ContextVar("split_secret", default=None)


@dataclass(frozen=True)
class Splits:
    """What a task's data builder returns: features and labels for train/val, the hidden test split."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """Everything a task author writes (in the task folder's ``__init__.py``), by keyword.

    Attributes:
        description: what the agent is told (data shapes, the goal, the metric).
        kind: e.g. ``tabular-classification``, ``ts-forecasting``.
        metric: the name of a metric in :data:`wmrl_research.tasks.metrics.METRICS`, or the task's
            own :class:`~wmrl_research.tasks.metrics.Metric` (name, direction, function).
        build_data: ``() -> Splits``, deterministic; runs once per machine (the result is cached).
        knob_space: knob name -> candidate values (Python literals), for generating valid edits.
        reference_knobs: knob values that turn the baseline into the stronger reference solution;
            leave it out when the task folder holds its own ``reference.py`` (any program).
        baseline_score, reference_score: measured with ``python -m wmrl_research.tasks measure``.
        split: ``train`` (used for training) or ``heldout`` (evaluation only).
        tier: ``light`` (about a second per execution) or ``heavy`` (3-15 s; see :data:`TIERS`).
        data_version: bump when ``build_data`` changes, so cached data is rebuilt.
        direction: optional; +1 if higher is better, -1 if lower is better. The metric decides it;
            if given, it must agree (a check that the author meant that metric).
        fixed_split: ``build_data`` returns the same split on every machine (a time split, a
            published test set): no split secret is drawn for it, and a build whose reference does
            not beat its baseline is an error, not redrawn. Its test rows are then known from the
            task's code (their labels still never enter a sandbox).
    """

    description: str
    kind: str
    metric: str | Metric
    build_data: Callable[[], Splits]
    knob_space: dict[str, list[Any]]
    reference_knobs: dict[str, Any] | None = None
    baseline_score: float
    reference_score: float
    split: str = "train"
    data_version: int = 1
    direction: int | None = None
    tier: str = "light"
    fixed_split: bool = False


@dataclass
class ResearchTask:
    """A research task as the agent, the world model and the grader see it."""

    id: str
    split: str
    kind: str
    description: str
    metric: str
    direction: int
    baseline_source: str
    reference_source: str
    knob_space: dict[str, list[Any]]
    baseline_score: float
    reference_score: float
    build_data: Callable[[], Splits] = field(repr=False, compare=False)
    data_version: int = 1
    scorer: Metric | None = field(default=None, repr=False, compare=False)  # the metric itself
    tier: str = "light"
    fixed_split: bool = False  # TaskSpec.fixed_split: no split secret, no redraw

    def normalise(self, raw: float, baseline: float | None = None, reference: float | None = None) -> float:
        """``(raw - baseline) / (reference - baseline)``: 0 at the baseline, 1 at the reference.

        ``baseline`` and ``reference`` default to the recorded scores (``SPEC``); the grader passes
        the ones measured on this machine's data build (:func:`wmrl_research.grading.build_scores`).
        Signed by the metric's direction (the reference is better than the baseline in that
        direction, so the ratio is already positive for improvements), clipped to
        :data:`SCORE_CLIP`; a non-finite raw score is a failure.
        """
        if raw is None or not math.isfinite(raw):
            return FAILURE_SCORE
        baseline = self.baseline_score if baseline is None else baseline
        reference = self.reference_score if reference is None else reference
        gap = reference - baseline
        if gap * self.direction <= 0:
            raise ValueError(
                f"task {self.id}: reference {reference} does not beat baseline "
                f"{baseline} in direction {self.direction:+d}"
            )
        value = (raw - baseline) / gap
        return float(min(max(value, SCORE_CLIP[0]), SCORE_CLIP[1]))

    # --- data on disk -------------------------------------------------------------------------
    def data_dirs(self, root: Path | None = None) -> tuple[Path, Path]:
        """``(public_dir, hidden_dir)``, building and caching the data on first use.

        The public folder holds what the sandbox may read; the hidden one holds ``y_test.npy`` and is
        never mounted into a sandbox. Building is atomic (a temporary folder renamed into place), so
        concurrent processes that race on the first build all see a complete folder.
        """
        root = data_root() if root is None else root
        key = f"{self.id}-v{self.data_version}"
        public, hidden = root / "public" / key, root / "hidden" / key
        if (public / "test.npz").exists() and (hidden / "y_test.npy").exists():
            return public, hidden
        with split_secret(None if self.fixed_split else build_secret(root / "hidden", key)):
            splits = self.build_data()
        _check_splits(self.id, splits)
        for folder, arrays in (
            (hidden, {"y_test.npy": splits.y_test}),
            (
                public,
                {
                    "train.npz": {"X": splits.X_train, "y": splits.y_train},
                    "val.npz": {"X": splits.X_val, "y": splits.y_val},
                    "test.npz": {"X": splits.X_test},
                },
            ),
        ):
            _write_atomic(folder, arrays)
        return public, hidden

    def discard_data(self, root: Path | None = None) -> None:
        """Delete this task's data build (public, hidden and its split secret): the next
        :meth:`data_dirs` draws a new secret and builds again."""
        root = data_root() if root is None else root
        key = f"{self.id}-v{self.data_version}"
        (root / "hidden" / f"{key}{SECRET_SUFFIX}").unlink(missing_ok=True)
        for folder in (root / "public" / key, root / "hidden" / key):
            if folder.exists():
                trash = folder.with_name(f".{key}-discarded-{secrets.token_hex(4)}")
                os.rename(folder, trash)  # atomic: readers see the old build or none
                shutil.rmtree(trash, ignore_errors=True)

    def test_labels(self, root: Path | None = None) -> np.ndarray:
        """The hidden test labels (for the grader only)."""
        _, hidden = self.data_dirs(root)
        return np.load(hidden / "y_test.npy", allow_pickle=False)


@contextlib.contextmanager
def split_secret(secret: str | None) -> Iterator[None]:
    """While active, :func:`split_seed` mixes ``secret`` into every split seed (see ``data_dirs``)."""
    token = _SPLIT_SECRET.set(secret)
    try:
        yield
    finally:
        _SPLIT_SECRET.reset(token)


def split_seed(seed: int) -> list[int]:
    """The seed a data builder's random split uses: the task's ``seed`` plus the secret of the data
    build in progress (none outside :meth:`ResearchTask.data_dirs`). The secret is drawn once per
    data build and stored next to the hidden labels, outside every sandbox, so a solution cannot
    tell which rows are test rows even knowing the task's code and seed."""
    secret = _SPLIT_SECRET.get()
    words = [] if secret is None else [int(secret[i : i + 8], 16) for i in range(0, len(secret), 8)]
    return [int(seed), *words]


def generator_seed(seed: int) -> int:
    """The seed a data *generator* uses (``make_classification``'s ``random_state``, mnist1d's
    ``args.seed``): outside a data build, ``seed`` itself; inside one, 32 bits drawn from ``seed``
    and the build's secret. A solution that knows the generator, its parameters and ``seed`` (say,
    from the visible row counts) still cannot regenerate the build's rows and match them to get
    their labels: it would have to try 2**32 seeds, a generation each. Prefer :func:`generator_rng`
    where the generator takes a NumPy ``Generator`` (the secret's full 128 bits)."""
    secret = _SPLIT_SECRET.get()
    if secret is None:
        return int(seed)
    digest = hashlib.sha256(f"generator:{int(seed)}:{secret}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def generator_rng(seed: int) -> np.random.Generator:
    """A NumPy ``Generator`` for a task's generated data, seeded by ``seed`` and the data build's
    secret (see :func:`generator_seed`); a stream other than the split's (:func:`split_seed`)."""
    return np.random.default_rng([*split_seed(seed), 0x67656E])  # "gen"


def build_secret(hidden_root: Path, key: str) -> str:
    """The secret of data build ``key`` (hex), created on first use (atomically: concurrent first
    builds agree on one) as ``hidden_root/<key>.secret``."""
    path = hidden_root / f"{key}{SECRET_SUFFIX}"
    if not path.exists():
        hidden_root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}-", dir=hidden_root)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16))
            try:
                os.link(tmp, path)  # fails if another process won the race: use its secret
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    secret = path.read_text().strip()
    if not re.fullmatch(r"[0-9a-f]{32}", secret):
        raise ValueError(f"corrupt split secret in {path}: delete it with the task's data to rebuild")
    return secret


def data_root() -> Path:
    """Where task data is cached: ``$WMRL_RESEARCH_DATA`` or ``~/.cache/wmrl/research``."""
    env = os.environ.get("WMRL_RESEARCH_DATA")
    base = Path(env) if env else Path.home() / ".cache" / "wmrl" / "research"
    return base / f"layout{DATA_LAYOUT_VERSION}"


def _check_splits(task_id: str, s: Splits) -> None:
    for part in ("train", "val", "test"):
        X, y = getattr(s, f"X_{part}"), getattr(s, f"y_{part}")
        if len(X) != len(y):
            raise ValueError(f"task {task_id}: X_{part} has {len(X)} rows but y_{part} has {len(y)}")
        if X.dtype == object or y.dtype == object:
            raise ValueError(f"task {task_id}: {part} arrays must be numeric (no object dtype)")


def _write_atomic(folder: Path, files: dict[str, Any]) -> None:
    if folder.exists():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name, value in files.items():
            if name.endswith(".npz"):
                np.savez(tmp / name, **value)
            else:
                np.save(tmp / name, value)
        os.chmod(tmp, 0o755)
        os.rename(tmp, folder)
    except OSError:
        if not folder.exists():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# --- knobs ----------------------------------------------------------------------------------------
_KNOB_LINE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.+?)\s*(?P<comment>#.*)?$")


def _knob_block_lines(source: str) -> tuple[list[str], int, int]:
    lines = source.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.strip() == KNOBS_START]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == KNOBS_END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError("source must contain exactly one knobs block (KNOBS_START ... KNOBS_END)")
    return lines, starts[0], ends[0]


def read_knobs(source: str) -> dict[str, Any]:
    """``{name: value}`` of the top-level ``NAME = literal`` lines inside the knobs block."""
    import ast

    lines, lo, hi = _knob_block_lines(source)
    out: dict[str, Any] = {}
    for ln in lines[lo + 1 : hi]:
        m = _KNOB_LINE.match(ln.rstrip("\n"))
        if m:
            out[m.group("name")] = ast.literal_eval(m.group("value"))
    return out


def set_knobs(source: str, values: dict[str, Any]) -> str:
    """``source`` with the given knobs set (each must already exist in the knobs block)."""
    lines, lo, hi = _knob_block_lines(source)
    missing = set(values)
    for i in range(lo + 1, hi):
        m = _KNOB_LINE.match(lines[i].rstrip("\n"))
        if m and m.group("name") in values:
            name = m.group("name")
            comment = f"  {m.group('comment')}" if m.group("comment") else ""
            lines[i] = f"{name} = {values[name]!r}{comment}\n"
            missing.discard(name)
    if missing:
        raise KeyError(f"knobs not in the knobs block: {sorted(missing)}")
    return "".join(lines)


def source_digest(source: str) -> str:
    """A short content hash (for logs and caches)."""
    return hashlib.sha256(source.encode()).hexdigest()[:12]
