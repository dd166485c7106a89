"""Every task id we serve, what it is, how to build it and its expert. Nothing heavy is imported here.

Besides the tasks listed here (``TASKS``: ours, MetaWorld's MT10, dm_control), every MetaWorld v3
task is served by configuration alone as ``wmrl/MetaWorld-<name>`` (e.g.
``wmrl/MetaWorld-dial-turn-v3``), with MetaWorld's own scripted policy as its expert: ``get``
resolves such ids against the installed MetaWorld (importing it, a few seconds, only then).

A task id is also a registered Gymnasium id (``gymnasium.make("wmrl/PushColor-v0")`` works, with
Gymnasium's usual wrappers); ``sims.make`` builds the bare env so ``get_sim_state`` and friends are
reachable without ``.unwrapped``.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any

from sims.specs import (
    DMC_TASKS,
    MT10,
    MW_PREFIX,
    MW_V3_NAMES,
    dmc_task_id,
    mw_instruction,
    mw_max_steps,
    mw_task_id,
)

SOURCES = ("own", "metaworld", "dm_control")


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    source: str  # "own" | "metaworld" | "dm_control"
    entry_point: str  # "module:Class"
    action_dim: int
    state_dim: int
    max_steps: int
    example_instruction: str
    #: "module:Class" of the scripted expert, constructed with ``expert_kwargs``; None = no expert
    expert: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    expert_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def splits_combos(self) -> bool:
        """Whether the env's ``split`` selects instruction/colour combinations (our own tasks); the
        other sources accept ``split`` for interface parity only (held out by seed alone), so their
        envs of every split are interchangeable."""
        return self.source == "own"

    def info(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "source": self.source,
            "action_dim": self.action_dim,
            "state_dim": self.state_dim,
            "max_steps": self.max_steps,
            "instruction": self.example_instruction,
            "has_expert": self.expert is not None,
        }


def load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_OWN = [
    TaskSpec(
        "wmrl/ReachColor-v0",
        "own",
        "sims.own.reach:ReachColorEnv",
        4,
        7,
        50,
        "reach the red target",
        "sims.own.reach:ReachExpert",
    ),
    TaskSpec(
        "wmrl/PushColor-v0",
        "own",
        "sims.own.push:PushColorEnv",
        4,
        7,
        80,
        "push the red puck to the green zone",
        "sims.own.push:PushExpert",
    ),
    TaskSpec(
        "wmrl/PressButton-v0",
        "own",
        "sims.own.button:PressButtonEnv",
        4,
        7,
        50,
        "press the blue button",
        "sims.own.button:PressButtonExpert",
    ),
    TaskSpec(
        "wmrl/LiftColor-v0",
        "own",
        "sims.own.lift:LiftColorEnv",
        4,
        7,
        60,
        "pick up the red cube",
        "sims.own.lift:LiftExpert",
    ),
]


def _mw_spec(name: str, steps: int, instruction: str) -> TaskSpec:
    return TaskSpec(
        mw_task_id(name),
        "metaworld",
        "sims.metaworld_tasks:MetaWorldEnv",
        4,
        7,
        steps,
        instruction,
        "sims.metaworld_tasks:MetaWorldExpert",
        kwargs={"env_name": name},
        expert_kwargs={"env_name": name},
    )


_MW = [_mw_spec(name, steps, instr) for name, (steps, instr) in MT10.items()]

_DMC = [
    TaskSpec(
        dmc_task_id(name),
        "dm_control",
        "sims.dmc:DMCEnv",
        s.action_dim,
        s.state_dim,
        s.max_steps,
        s.instruction,
        s.expert,
        kwargs={"name": name},
    )
    for name, s in DMC_TASKS.items()
]

TASKS: dict[str, TaskSpec] = {t.task_id: t for t in [*_OWN, *_MW, *_DMC]}
OWN_TASKS: list[str] = [t.task_id for t in _OWN]


@functools.cache
def metaworld_names() -> tuple[str, ...]:
    """Every MetaWorld v3 task name ("assembly-v3", ...; the 50 of the pinned MetaWorld 3.0, listed
    in ``sims.specs.MW_V3_NAMES`` so that naming them imports no MetaWorld)."""
    return MW_V3_NAMES


def all_task_ids() -> list[str]:
    """``TASKS`` and every other MetaWorld v3 task id."""
    return [*TASKS, *(t for t in map(mw_task_id, metaworld_names()) if t not in TASKS)]


def close_names(name: str, known, n: int = 5) -> list[str]:
    """Up to ``n`` of ``known`` closest to ``name`` (difflib), best first."""
    return difflib.get_close_matches(str(name), [str(k) for k in known], n=n, cutoff=0.5)


def unknown_task_message(task_id: str) -> str | None:
    """None if ``task_id`` is served (see ``get``), else why not, with the closest ids."""
    if task_id in TASKS:
        return None
    if task_id.startswith(MW_PREFIX) and task_id.removeprefix(MW_PREFIX) in metaworld_names():
        return None
    known = all_task_ids()
    close = close_names(task_id, known)
    hint = f"; close: {', '.join(close)}" if close else ""
    return (
        f"unknown task {task_id!r}{hint} ({len(known)} ids: ours, dm_control's and every MetaWorld v3 "
        f"task as {MW_PREFIX}<name>, e.g. {MW_PREFIX}dial-turn-v3; `wmrl tasks vla` lists them)"
    )


@functools.cache
def _metaworld_spec(task_id: str) -> TaskSpec:
    name = task_id.removeprefix(MW_PREFIX)
    spec = _mw_spec(name, mw_max_steps(name), mw_instruction(name))
    _register(spec)
    return spec


def get(task_id: str) -> TaskSpec:
    """The spec of ``task_id``: one of ``TASKS`` or any MetaWorld v3 task; KeyError (with the closest
    ids) otherwise."""
    spec = TASKS.get(task_id)
    if spec is not None:
        return spec
    msg = unknown_task_message(task_id)
    if msg is not None:
        raise KeyError(msg)
    return _metaworld_spec(task_id)


def register_gym() -> None:
    """Register every task with Gymnasium (idempotent)."""
    for spec in TASKS.values():
        _register(spec)


def _register(spec: TaskSpec) -> None:
    import gymnasium as gym

    if spec.task_id not in gym.registry:
        gym.register(
            id=spec.task_id, entry_point=spec.entry_point, kwargs=dict(spec.kwargs), disable_env_checker=True
        )
