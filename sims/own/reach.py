"""ReachColor: move the hand onto the disc of the named colour, among two distractor discs.

Success: the finger tips are within 3 cm (horizontally) of the named disc's centre and at most 4 cm
above the table. Progress: fraction of the start distance to a point 2 cm above the disc covered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sims.own.base import COLOURS, ColouredObjectsEnv, move_toward, rgba, tolerance_progress

HIT_RADIUS = 0.03
HIT_HEIGHT = 0.04


class ReachColorEnv(ColouredObjectsEnv):
    task_id = "wmrl/ReachColor-v0"
    xml_file = "reach.xml"
    n_objects = 3
    placement = (-0.2, 0.2, 0.1)
    max_steps = 50
    templates = (
        "reach the {c} target",
        "move the gripper to the {c} disc",
        "touch the {c} spot",
        "go to the {c} marker",
    )

    def apply_params(self, p: dict[str, Any]) -> None:
        for i in range(self.n_objects):
            self.model.body(f"target{i}").pos[:2] = p["positions"][i]
            self.model.geom(f"target{i}").rgba[:] = rgba(COLOURS[p["colours"][i]])

    def goal_pos(self) -> np.ndarray:
        xy = np.asarray(self.params["positions"][self.params["goal"]])
        return np.array([xy[0], xy[1], 0.02])

    def measure(self) -> tuple[float, bool]:
        tip, goal = self.tip_pos(), self.goal_pos()
        dist = float(np.linalg.norm(tip - goal))
        start = self._ref.setdefault("d0", dist)
        success = bool(np.linalg.norm(tip[:2] - goal[:2]) < HIT_RADIUS and tip[2] < HIT_HEIGHT)
        return tolerance_progress(dist, start, 0.02), success

    def privileged(self) -> dict[str, np.ndarray]:
        return {"goal": self.goal_pos()}


class ReachExpert:
    """Fly above the named disc, then descend onto it."""

    def reset(self) -> None:
        pass

    def act(self, obs: dict, info: dict, env: ReachColorEnv) -> np.ndarray:
        env = env.unwrapped
        tip, goal = env.tip_pos(), env.privileged()["goal"]
        near = np.linalg.norm(goal[:2] - tip[:2]) < 0.02
        return move_toward(env, np.array([goal[0], goal[1], 0.01 if near else 0.07]), grip=-1.0)
