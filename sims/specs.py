"""Static tables of the third-party tasks we adapt (no heavy imports: read by the registry)."""

from __future__ import annotations

from dataclasses import dataclass

#: The ten tasks of MetaWorld's MT10 (v3): (time limit in env steps, instruction). MetaWorld's own
#: expert needs 40-150 steps on these.
MT10: dict[str, tuple[int, str]] = {
    "reach-v3": (100, "reach the goal position with the gripper"),
    "push-v3": (150, "push the puck to the goal"),
    "pick-place-v3": (150, "pick up the puck and place it at the goal"),
    "door-open-v3": (150, "open the door"),
    "drawer-open-v3": (150, "open the drawer"),
    "drawer-close-v3": (150, "close the drawer"),
    "button-press-topdown-v3": (150, "press the button from the top"),
    "peg-insert-side-v3": (200, "insert the peg into the hole from the side"),
    "window-open-v3": (150, "slide the window open"),
    "window-close-v3": (150, "slide the window closed"),
}


#: Time limit of every other MetaWorld v3 task (any of the 50, by configuration: see
#: ``sims.registry.get``). MetaWorld's own expert succeeds within it on every task; the slowest
#: need ~200 steps (``benchmarks/metaworld_experts.py``, ``benchmarks/results/metaworld_experts.json``).
MW_OTHER_STEPS = 250
#: ... except these, whose expert needs longer (push-back: 74-364 steps).
MW_LONG_STEPS: dict[str, int] = {"push-back-v3": 400}

MW_PREFIX = "wmrl/MetaWorld-"


def mw_task_id(env_name: str) -> str:
    return f"{MW_PREFIX}{env_name}"


def mw_max_steps(env_name: str) -> int:
    """Time limit of a MetaWorld v3 task: MT10's own, else ``MW_LONG_STEPS`` or ``MW_OTHER_STEPS``."""
    if env_name in MT10:
        return MT10[env_name][0]
    return MW_LONG_STEPS.get(env_name, MW_OTHER_STEPS)


def mw_instruction(env_name: str) -> str:
    """Instruction of a MetaWorld v3 task: MT10's own, else its name in words ("dial-turn-v3" -> "dial turn")."""
    if env_name in MT10:
        return MT10[env_name][1]
    return env_name.removesuffix("-v3").replace("-", " ")


@dataclass(frozen=True)
class DMCSpec:
    domain: str
    task: str
    instruction: str
    max_steps: int
    action_repeat: int
    action_dim: int
    state_dim: int
    #: "reacher": fingertip inside the target; "reward": suite reward >= 0.99
    success: str
    expert: str | None  # "module:Class"


DMC_TASKS: dict[str, DMCSpec] = {
    "reacher-easy": DMCSpec(
        "reacher",
        "easy",
        "move the arm's fingertip onto the red target",
        60,
        2,
        2,
        6,
        "reacher",
        "sims.dmc:ReacherExpert",
    ),
    "reacher-hard": DMCSpec(
        "reacher",
        "hard",
        "move the arm's fingertip onto the small red target",
        60,
        2,
        2,
        6,
        "reacher",
        "sims.dmc:ReacherExpert",
    ),
    "manipulator-bring_ball": DMCSpec(
        "manipulator", "bring_ball", "bring the ball to the target", 150, 4, 5, 44, "reward", None
    ),
}


def dmc_task_id(name: str) -> str:
    return f"wmrl/DMC-{name}-v0"
