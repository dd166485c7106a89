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


def mw_task_id(env_name: str) -> str:
    return f"wmrl/MetaWorld-{env_name}"


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
