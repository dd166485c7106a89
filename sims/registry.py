"""Every task id we serve, what it is, how to build it and its expert. Nothing heavy is imported here.

A task id is also a registered Gymnasium id (``gymnasium.make("wmrl/PushColor-v0")`` works, with
Gymnasium's usual wrappers); ``sims.make`` builds the bare env so ``get_sim_state`` and friends are
reachable without ``.unwrapped``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from sims.specs import DMC_TASKS, MT10, dmc_task_id, mw_task_id

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

_MW = [
    TaskSpec(
        mw_task_id(name),
        "metaworld",
        "sims.metaworld_tasks:MetaWorldEnv",
        4,
        7,
        steps,
        instr,
        "sims.metaworld_tasks:MetaWorldExpert",
        kwargs={"env_name": name},
        expert_kwargs={"env_name": name},
    )
    for name, (steps, instr) in MT10.items()
]

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


def get(task_id: str) -> TaskSpec:
    try:
        return TASKS[task_id]
    except KeyError:
        raise KeyError(f"unknown task {task_id!r}; known: {sorted(TASKS)}") from None


def register_gym() -> None:
    """Register every task with Gymnasium (idempotent)."""
    import gymnasium as gym

    for spec in TASKS.values():
        if spec.task_id not in gym.registry:
            gym.register(
                id=spec.task_id,
                entry_point=spec.entry_point,
                kwargs=dict(spec.kwargs),
                disable_env_checker=True,
            )
