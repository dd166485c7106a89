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


# Every MetaWorld v3 task name of the pinned MetaWorld 3.0 (its ALL_V3_ENVIRONMENTS), listed here so
# that `wmrl tasks vla` names them without importing MetaWorld (about 2 s); a test checks the list
# against the installed package.
MW_V3_NAMES: tuple[str, ...] = (
    "assembly-v3",
    "basketball-v3",
    "bin-picking-v3",
    "box-close-v3",
    "button-press-topdown-v3",
    "button-press-topdown-wall-v3",
    "button-press-v3",
    "button-press-wall-v3",
    "coffee-button-v3",
    "coffee-pull-v3",
    "coffee-push-v3",
    "dial-turn-v3",
    "disassemble-v3",
    "door-close-v3",
    "door-lock-v3",
    "door-open-v3",
    "door-unlock-v3",
    "drawer-close-v3",
    "drawer-open-v3",
    "faucet-close-v3",
    "faucet-open-v3",
    "hammer-v3",
    "hand-insert-v3",
    "handle-press-side-v3",
    "handle-press-v3",
    "handle-pull-side-v3",
    "handle-pull-v3",
    "lever-pull-v3",
    "peg-insert-side-v3",
    "peg-unplug-side-v3",
    "pick-out-of-hole-v3",
    "pick-place-v3",
    "pick-place-wall-v3",
    "plate-slide-back-side-v3",
    "plate-slide-back-v3",
    "plate-slide-side-v3",
    "plate-slide-v3",
    "push-back-v3",
    "push-v3",
    "push-wall-v3",
    "reach-v3",
    "reach-wall-v3",
    "shelf-place-v3",
    "soccer-v3",
    "stick-pull-v3",
    "stick-push-v3",
    "sweep-into-v3",
    "sweep-v3",
    "window-close-v3",
    "window-open-v3",
)
