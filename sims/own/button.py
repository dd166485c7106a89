"""PressButton: press the button with the named cap colour down, among two distractor buttons.

Each cap rides a 2 cm spring-loaded slide joint. Success: the named cap is pressed at least 1.4 cm.
Progress: 0.4 for bringing the finger tips over the cap, 0.6 for the fraction of the press.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sims.own.base import COLOURS, ColouredObjectsEnv, move_toward, rgba, tolerance_progress

TRAVEL = 0.02
PRESSED = 0.014
CAP_TOP = 0.054  # table-frame height of an unpressed cap's top face


class PressButtonEnv(ColouredObjectsEnv):
    task_id = "wmrl/PressButton-v0"
    xml_file = "button.xml"
    n_objects = 3
    placement = (-0.2, 0.2, 0.13)
    max_steps = 50
    templates = (
        "press the {c} button",
        "push down the {c} button",
        "hit the {c} button",
    )

    def apply_params(self, p: dict[str, Any]) -> None:
        for i in range(self.n_objects):
            self.model.body(f"button{i}").pos[:2] = p["positions"][i]
            self.model.geom(f"cap{i}").rgba[:] = rgba(COLOURS[p["colours"][i]])

    def depression(self, i: int) -> float:
        adr = self.model.jnt_qposadr[self.model.joint(f"cap{i}").id]
        return float(-self.data.qpos[adr])

    def goal_pos(self) -> np.ndarray:
        xy = self.params["positions"][self.params["goal"]]
        return np.array([xy[0], xy[1], CAP_TOP])

    def measure(self) -> tuple[float, bool]:
        goal = self.goal_pos()
        tip = self.tip_pos()
        d = float(np.linalg.norm(tip - goal))
        d0 = self._ref.setdefault("d0", d)
        press = float(np.clip(self.depression(self.params["goal"]) / PRESSED, 0.0, 1.0))
        reach = max(tolerance_progress(d, d0, 0.02), 1.0 if press > 0.1 else 0.0)
        return 0.4 * reach + 0.6 * press, press >= 1.0

    def privileged(self) -> dict[str, np.ndarray]:
        return {"goal": self.goal_pos()}


class PressButtonExpert:
    """Fly to a point above the named cap, then push straight down through it."""

    def reset(self) -> None:
        pass

    def act(self, obs: dict, info: dict, env: PressButtonEnv) -> np.ndarray:
        env = env.unwrapped
        tip, goal = env.tip_pos(), env.privileged()["goal"]
        if np.linalg.norm(goal[:2] - tip[:2]) < 0.012:
            z = goal[2] - TRAVEL - 0.01
        else:
            z = max(goal[2] + 0.04, tip[2]) if np.linalg.norm(goal[:2] - tip[:2]) > 0.05 else goal[2] + 0.04
        return move_toward(env, np.array([goal[0], goal[1], z]), grip=1.0)
