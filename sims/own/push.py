"""PushColor: push the named puck into the named zone, with a distractor puck and a distractor zone.

Success: the named puck's centre lies within 4 cm of the named zone's centre. Progress: 0.2 for
bringing the hand to the puck, 0.8 for the fraction of the puck's start distance to the zone covered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sims.own.base import COLOURS, TabletopEnv, move_toward, rgba, tolerance_progress

PUCK_RADIUS = 0.03
ZONE_RADIUS = 0.04  # success radius around the zone centre (the drawn square is 10 x 10 cm)


def _seg_dist(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    ab = b - a
    t = float(np.clip(np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-12), 0.0, 1.0))
    return float(np.linalg.norm(p - (a + t * ab)))


class PushColorEnv(TabletopEnv):
    task_id = "wmrl/PushColor-v0"
    xml_file = "push.xml"
    max_steps = 80
    templates = (
        "push the {c} puck to the {z} zone",
        "slide the {c} puck onto the {z} square",
        "move the {c} puck into the {z} area",
    )

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        colours = rng.choice(len(COLOURS), 4, replace=False).tolist()  # puck0, puck1, zone0, zone1
        while True:
            zones = self.sample_positions(rng, 2, -0.18, 0.18, 0.14)
            pucks = self.sample_positions(rng, 2, -0.16, 0.16, 0.1, avoid=list(zones))
            # the named pair is (puck0, zone0) before shuffling; keep its path and approach clear
            a, b = pucks[0], zones[0]
            u = (b - a) / np.linalg.norm(b - a)
            approach = a - u * 0.08
            ok = (
                0.12 <= np.linalg.norm(b - a) <= 0.3
                and _seg_dist(pucks[1], approach, b) > 0.1
                and np.linalg.norm(pucks[1] - a) > 0.12
                and np.all(np.abs(approach) < 0.25)
            )
            if ok:
                break
        flip_p, flip_z = bool(rng.integers(2)), bool(rng.integers(2))
        order_p = [1, 0] if flip_p else [0, 1]
        order_z = [1, 0] if flip_z else [0, 1]
        return {
            "colours": colours,
            "pucks": pucks[order_p].tolist(),
            "zones": zones[order_z].tolist(),
            "goal_puck": order_p.index(0),
            "goal_zone": order_z.index(0),
            "template": int(rng.integers(len(self.templates))),
        }

    def combo_of(self, p: dict[str, Any]) -> tuple[int, ...]:
        return (p["template"], p["colours"][p["goal_puck"]], p["colours"][2 + p["goal_zone"]])

    def instruction_of(self, p: dict[str, Any]) -> str:
        c = COLOURS[p["colours"][p["goal_puck"]]]
        z = COLOURS[p["colours"][2 + p["goal_zone"]]]
        return self.templates[p["template"]].format(c=c, z=z)

    def apply_params(self, p: dict[str, Any]) -> None:
        for i in range(2):
            self.model.body(f"zone{i}").pos[:2] = p["zones"][i]
            self.model.geom(f"zone{i}").rgba[:] = rgba(COLOURS[p["colours"][2 + i]])
            self.model.geom(f"puck{i}").rgba[:] = rgba(COLOURS[p["colours"][i]])
            adr = self.model.jnt_qposadr[self.model.joint(f"puck{i}").id]
            self.data.qpos[adr : adr + 7] = [*p["pucks"][i], 0.02, 1, 0, 0, 0]

    def puck_pos(self, i: int) -> np.ndarray:
        return self.data.body(f"puck{i}").xpos.copy()

    def measure(self) -> tuple[float, bool]:
        puck = self.puck_pos(self.params["goal_puck"])
        zone = np.asarray(self.params["zones"][self.params["goal_zone"]])
        d_goal = float(np.linalg.norm(puck[:2] - zone))
        d_hand = float(np.linalg.norm(self.tip_pos() - puck))
        g0 = self._ref.setdefault("d_goal0", d_goal)
        h0 = self._ref.setdefault("d_hand0", d_hand)
        reach = tolerance_progress(d_hand, h0, PUCK_RADIUS + 0.03)
        # once the puck has moved toward the zone, the reaching part stays earned
        push = tolerance_progress(d_goal, g0, ZONE_RADIUS * 0.5)
        reach = max(reach, 1.0 if push > 0.05 else 0.0)
        return 0.2 * reach + 0.8 * push, d_goal < ZONE_RADIUS

    def privileged(self) -> dict[str, np.ndarray]:
        return {
            "puck": self.puck_pos(self.params["goal_puck"]),
            "zone": np.asarray(self.params["zones"][self.params["goal_zone"]], dtype=float),
        }


class PushExpert:
    """Go around to the far side of the puck (seen from the zone), descend, push it along the line.

    Closed-loop: the push direction is recomputed from the puck's current position every step, so a
    puck that drifts sideways is steered back; if the hand loses the puck it lifts and re-approaches.
    """

    LOW = 0.012
    HIGH = 0.08

    def reset(self) -> None:
        self.phase = "approach"
        self.back = 0.0  # extra stand-off, grown when the way down is blocked
        self.blocked = 0

    def act(self, obs: dict, info: dict, env: PushColorEnv) -> np.ndarray:
        if not hasattr(self, "phase"):
            self.reset()
        env = env.unwrapped
        pv = env.privileged()
        puck, zone, tip = pv["puck"][:2], pv["zone"], env.tip_pos()
        to_goal = zone - puck
        u = to_goal / max(np.linalg.norm(to_goal), 1e-6)
        behind = puck - u * (PUCK_RADIUS + 0.03 + self.back)
        rel = tip[:2] - puck
        along, lateral = float(np.dot(rel, u)), float(abs(rel[0] * u[1] - rel[1] * u[0]))
        if self.phase == "push" and (lateral > 0.035 or along > 0.0 or along < -0.12):
            self.phase = "lift"
        if self.phase == "lift":
            if tip[2] > self.HIGH - 0.02:
                self.phase = "approach"
            return move_toward(env, np.array([tip[0], tip[1], self.HIGH + 0.02]), grip=1.0)
        if self.phase == "approach":
            if np.linalg.norm(tip[:2] - behind) < 0.015:
                self.phase = "descend"
            else:
                z = self.HIGH if np.linalg.norm(rel) < 0.09 or tip[2] > 0.04 else tip[2]
                return move_toward(env, np.array([behind[0], behind[1], max(z, self.HIGH)]), grip=1.0)
        if self.phase == "descend":
            if tip[2] < self.LOW + 0.01:
                self.phase, self.back, self.blocked = "push", 0.0, 0
            elif env._target[2] <= self.LOW + 1e-6:
                self.blocked += 1
                if self.blocked >= 3:  # resting on something: retry from further back
                    self.phase, self.back, self.blocked = "lift", min(self.back + 0.02, 0.06), 0
            return move_toward(env, np.array([behind[0], behind[1], self.LOW]), grip=1.0)
        # push: aim the hand a little past the zone centre, along the line through the puck
        aim = zone - u * (PUCK_RADIUS + 0.01)
        step = aim - tip[:2]
        correction = (puck - u * (PUCK_RADIUS + 0.025)) - tip[:2]
        correction -= np.dot(correction, u) * u
        desired = tip[:2] + np.clip(step, -0.02, 0.02) + 0.8 * correction
        return move_toward(env, np.array([desired[0], desired[1], self.LOW]), grip=1.0, gain=0.6)
