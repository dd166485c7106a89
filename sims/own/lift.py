"""LiftColor: pick up the cube of the named colour (a distractor cube of another colour lies nearby).

Success: the named cube's centre is at least 6 cm above its resting height while the other cube
stays on the table. Progress: 0.3 for bringing the open fingers around the cube, 0.7 for the
fraction of the lift height reached.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sims.own.base import COLOURS, ColouredObjectsEnv, move_toward, rgba, tolerance_progress

HALF = 0.02
LIFT = 0.06


class LiftColorEnv(ColouredObjectsEnv):
    task_id = "wmrl/LiftColor-v0"
    xml_file = "lift.xml"
    n_objects = 2
    placement = (-0.18, 0.18, 0.12)
    max_steps = 60
    templates = (
        "pick up the {c} cube",
        "lift the {c} block",
        "grasp the {c} cube and raise it",
    )

    def apply_params(self, p: dict[str, Any]) -> None:
        for i in range(self.n_objects):
            self.model.geom(f"cube{i}").rgba[:] = rgba(COLOURS[p["colours"][i]])
            adr = self.model.jnt_qposadr[self.model.joint(f"cube{i}").id]
            self.data.qpos[adr : adr + 7] = [*p["positions"][i], HALF, 1, 0, 0, 0]

    def cube_pos(self, i: int) -> np.ndarray:
        return self.data.body(f"cube{i}").xpos.copy()

    def measure(self) -> tuple[float, bool]:
        g = self.params["goal"]
        cube, other = self.cube_pos(g), self.cube_pos(1 - g)
        grasp_point = cube - np.array([0.0, 0.0, HALF - 0.005])
        d = float(np.linalg.norm(self.tip_pos() - grasp_point))
        d0 = self._ref.setdefault("d0", d)
        height = float(np.clip((cube[2] - HALF) / LIFT, 0.0, 1.0))
        reach = max(tolerance_progress(d, d0, 0.01), 1.0 if height > 0.1 else 0.0)
        success = height >= 1.0 and other[2] < HALF + 0.01
        return 0.3 * reach + 0.7 * height, bool(success)

    def privileged(self) -> dict[str, np.ndarray]:
        return {"cube": self.cube_pos(self.params["goal"])}


class LiftExpert:
    """Open above the cube, descend around it, close, lift; re-tries from above if the cube slips."""

    def reset(self) -> None:
        self.phase = "approach"
        self.closing = 0

    def act(self, obs: dict, info: dict, env: LiftColorEnv) -> np.ndarray:
        if not hasattr(self, "phase"):
            self.reset()
        env = env.unwrapped
        cube, tip = env.privileged()["cube"], env.tip_pos()
        xy_err = float(np.linalg.norm(cube[:2] - tip[:2]))
        if self.phase == "approach":
            if xy_err < 0.008:
                self.phase = "descend"
            z = 0.08 if xy_err > 0.02 else max(tip[2] - 0.02, 0.06)
            return move_toward(env, np.array([cube[0], cube[1], max(z, 0.06)]), grip=-1.0)
        if self.phase == "descend":
            if tip[2] < 0.012:
                self.phase, self.closing = "close", 0
            return move_toward(env, np.array([cube[0], cube[1], 0.005]), grip=-1.0)
        if self.phase == "close":
            self.closing += 1
            if self.closing >= 4:
                self.phase = "lift"
            return move_toward(env, np.array([cube[0], cube[1], 0.005]), grip=1.0)
        # lift, and start over if the cube was not carried along
        if tip[2] > 0.05 and cube[2] < tip[2] - 0.01:
            self.phase = "approach"
            return move_toward(env, np.array([tip[0], tip[1], 0.1]), grip=-1.0)
        return move_toward(env, np.array([tip[0], tip[1], 0.16]), grip=1.0, gain=0.6)
