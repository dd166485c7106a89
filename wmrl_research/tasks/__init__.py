"""AutoResearch tasks: small offline ML problems with a baseline to improve and a hidden test split.

Each sub-package of this package is one task (a folder with ``__init__.py`` defining ``SPEC`` and a
baseline ``solution.py``); adding a folder adds a task. A user's own tasks live in folders of their
own, named by ``$WMRL_RESEARCH_TASKS`` or ``domain.task_dirs`` (``wmrl_research.task_folders``).
See ``README.md`` in this folder.

Public API (the agent, the world model and the grader use only this)::

    list_tasks(split=None, tier=None) -> list[ResearchTask]
    get_task(task_id) -> ResearchTask
    task_lines() -> list[str]          # "id<TAB>split<TAB>kind<TAB>metric<TAB>tier", for `wmrl tasks research`
    KNOBS_START, KNOBS_END, FAILURE_SCORE
    Metric, METRICS                    # a task's metric (tasks/metrics.py)

Loading the registry (any of the above) checks every task's definition (id, split, metric and its
direction, knobs) and raises :class:`TaskDefinitionError` with a one-line reason, before any data is
built or any sandbox runs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from functools import cache
from pathlib import Path

from wmrl_research.task_folders import TaskDefinitionError, task_folders, user_dirs
from wmrl_research.tasks.base import (
    DATA_ENV,
    FAILURE_SCORE,
    KNOBS_END,
    KNOBS_START,
    PREDICTIONS_FILE,
    SCORE_CLIP,
    SPLITS,
    TIERS,
    ResearchTask,
    Splits,
    TaskSpec,
    data_root,
    generator_rng,
    generator_seed,
    read_knobs,
    set_knobs,
)
from wmrl_research.tasks.metrics import METRICS, Metric, get_metric

__all__ = [
    "DATA_ENV",
    "FAILURE_SCORE",
    "KNOBS_END",
    "KNOBS_START",
    "METRICS",
    "Metric",
    "PREDICTIONS_FILE",
    "SCORE_CLIP",
    "SPLITS",
    "TIERS",
    "ResearchTask",
    "Splits",
    "TaskDefinitionError",
    "TaskSpec",
    "data_root",
    "generator_rng",
    "generator_seed",
    "get_task",
    "list_tasks",
    "read_knobs",
    "set_knobs",
    "task_lines",
]

_HERE = Path(__file__).parent


def _import_spec(task_id: str, folder: Path) -> object:
    """The ``SPEC`` of the task folder: a package task by its module name, a user's task (any id,
    dashes included) from its folder's ``__init__.py`` as a module of its own."""
    if folder.parent == _HERE:
        return getattr(importlib.import_module(f"{__name__}.{task_id}"), "SPEC", None)
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:8]
    name = f"wmrl_user_task_{digest}_{task_id.replace('-', '_')}"
    loader_spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # relative imports of the task's own modules resolve through it
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any failure of the user's code, reported in one line
        del sys.modules[name]
        raise TaskDefinitionError(
            f"task {task_id}: {folder / '__init__.py'} failed to import: {type(e).__name__}: {e}"
        ) from e
    return getattr(module, "SPEC", None)


def _load(task_id: str, folder: Path) -> ResearchTask:
    spec = _import_spec(task_id, folder)
    if not isinstance(spec, TaskSpec):
        raise TaskDefinitionError(
            f"task folder {task_id!r} must define SPEC = TaskSpec(...) in its __init__.py"
        )
    try:
        baseline = (folder / "solution.py").read_text()
    except OSError:
        raise TaskDefinitionError(f"task {task_id}: no baseline {folder / 'solution.py'}") from None
    reference = folder / "reference.py"
    return task_from_spec(task_id, spec, baseline, reference.read_text() if reference.is_file() else None)


def task_from_spec(task_id: str, spec: TaskSpec, baseline: str, reference: str | None = None) -> ResearchTask:
    """Check ``spec`` (and the baseline ``solution.py``) and build the task; raises
    :class:`TaskDefinitionError` naming the task and what is wrong. ``reference``: the source of the
    task's own ``reference.py`` (any program), else the reference is the baseline with
    ``spec.reference_knobs``."""
    if (reference is None) == (spec.reference_knobs is None):
        raise TaskDefinitionError(
            f"task {task_id}: give its reference solution one way: SPEC.reference_knobs or a reference.py"
            + (" (it has both)" if reference is not None else " (it has neither)")
        )
    if spec.split not in SPLITS:
        raise TaskDefinitionError(f"task {task_id}: split {spec.split!r} is not one of {', '.join(SPLITS)}")
    if spec.tier not in TIERS:
        raise TaskDefinitionError(f"task {task_id}: tier {spec.tier!r} is not one of {', '.join(TIERS)}")
    try:
        metric = get_metric(spec.metric)
    except KeyError as e:
        raise TaskDefinitionError(f"task {task_id}: {e.args[0]}") from None
    if spec.direction is not None and spec.direction != metric.direction:
        raise TaskDefinitionError(
            f"task {task_id}: direction={spec.direction!r} contradicts metric {metric.name} "
            f"(direction {metric.direction:+d}); leave direction out to use the metric's"
        )
    if not callable(spec.build_data):
        raise TaskDefinitionError(f"task {task_id}: build_data must be a function returning Splits")
    try:
        knobs = read_knobs(baseline)
    except (ValueError, SyntaxError) as e:
        raise TaskDefinitionError(f"task {task_id}: solution.py: {e}") from None
    unknown = (set(spec.knob_space) | set(spec.reference_knobs or {})) - set(knobs)
    if unknown:
        raise TaskDefinitionError(
            f"task {task_id}: knobs {sorted(unknown)} are not in solution.py's knobs block"
        )
    for name, values in spec.knob_space.items():
        if knobs[name] not in values:
            raise TaskDefinitionError(
                f"task {task_id}: baseline value {knobs[name]!r} of {name} not in its knob space"
            )
    return ResearchTask(
        id=task_id,
        split=spec.split,
        kind=spec.kind,
        description=spec.description.strip(),
        metric=metric.name,
        direction=metric.direction,
        baseline_source=baseline,
        reference_source=reference if reference is not None else set_knobs(baseline, spec.reference_knobs),
        knob_space={k: list(v) for k, v in spec.knob_space.items()},
        baseline_score=spec.baseline_score,
        reference_score=spec.reference_score,
        build_data=spec.build_data,
        data_version=spec.data_version,
        scorer=metric,
        tier=spec.tier,
        fixed_split=spec.fixed_split,
    )


def _registry() -> dict[str, ResearchTask]:
    """Every task of the package and of the user's task folders (``$WMRL_RESEARCH_TASKS``), loaded
    once per set of folders."""
    return _load_all(tuple(user_dirs()))


@cache
def _load_all(dirs: tuple[Path, ...]) -> dict[str, ResearchTask]:
    return {task_id: _load(task_id, folder) for task_id, folder in sorted(task_folders().items())}


def list_tasks(split: str | None = None, tier: str | None = None) -> list[ResearchTask]:
    """All tasks, or those of one split (``train`` or ``heldout``) and/or one cost tier (``light`` or
    ``heavy``), sorted by id."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known splits: {', '.join(SPLITS)}")
    if tier is not None and tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; known tiers: {', '.join(TIERS)}")
    return [
        t
        for t in _registry().values()
        if (split is None or t.split == split) and (tier is None or t.tier == tier)
    ]


def get_task(task_id: str) -> ResearchTask:
    """The task with this id; an unknown id raises KeyError listing the known ones."""
    reg = _registry()
    if task_id not in reg:
        raise KeyError(f"unknown research task {task_id!r}; known tasks: {', '.join(reg)}")
    return reg[task_id]


def task_lines() -> list[str]:
    """One ``id<TAB>split<TAB>kind<TAB>metric<TAB>tier`` line per task (what `wmrl tasks research` prints)."""
    return [f"{t.id}\t{t.split}\t{t.kind}\t{t.metric}\t{t.tier}" for t in list_tasks()]
