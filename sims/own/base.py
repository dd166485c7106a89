"""Base class of our own tabletop tasks: one shared robot, language instructions, image + proprio.

A task subclass (one module per task, next to its MJCF, as in dm_control/suite) only says how to
sample an episode's *parameters* (colours, object positions, which object the instruction names),
how to write them into the model, and how to measure progress and success. Everything an episode
depends on lives in those parameters plus MuJoCo's state, so ``get_sim_state``/``set_sim_state``
replay a rollout exactly, and ``reset(seed=s)`` is a pure function of ``s``.

Action (4,) in [-1, 1]: (dx, dy, dz) moves the hand's position target by up to ``MOVE_SCALE`` metres
per step; ``grip`` sets the finger target directly (-1 open, +1 closed).
State (7,): hand tip position (3, metres, table frame), hand velocity (3, m/s), gripper opening in
[0, 1] (1 = fully open). Object positions are deliberately not in the state: the policy must read
them from the image and the instruction.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from sims import _gl  # noqa: F401  (selects the GL backend before mujoco is imported)

# Colours are few and far apart so that a 64x64 image still tells them apart.
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.12, 0.1),
    "green": (0.1, 0.72, 0.15),
    "blue": (0.12, 0.25, 0.95),
    "yellow": (0.95, 0.85, 0.1),
    "purple": (0.6, 0.15, 0.8),
    "cyan": (0.1, 0.85, 0.9),
}
COLOURS: list[str] = list(PALETTE)

ACTION_DIM = 4
STATE_DIM = 7
MOVE_SCALE = 0.03  # metres of hand-target motion per step at |action| = 1
N_SUBSTEPS = 25  # 25 x 2 ms = 50 ms per env step (20 Hz control)
FINGER_MAX = 0.032
WORKSPACE_LO = np.array([-0.28, -0.28, 0.0])
WORKSPACE_HI = np.array([0.28, 0.28, 0.25])
HAND_START = np.array([0.0, -0.25, 0.12])  # front edge, low: keeps the hand off the objects in the image

OBJECT_Y_SHIFT = 0.05
SPLITS = ("all", "train", "test")


def combo_split(*indices: int) -> str:
    """Which split an instruction/colour combination belongs to: about 1 in 5 is held out as "test"."""
    return "test" if sum((i + 1) * (k + 3) for k, i in enumerate(indices)) % 5 == 0 else "train"


class TabletopEnv(gym.Env):
    """Gymnasium env over one MJCF scene with the shared gantry robot. Subclasses fill the hooks."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": int(1 / (0.002 * N_SUBSTEPS))}

    #: registered id, e.g. "wmrl/ReachColor-v0"
    task_id: str = ""
    #: MJCF file next to the subclass's module
    xml_file: str = ""
    max_steps: int = 60
    #: instruction templates; formatted with the episode's parameters
    templates: tuple[str, ...] = ()

    def __init__(
        self,
        image_size: int = 64,
        seed: int | None = None,
        render: bool = True,
        split: str = "all",
        terminate_on_success: bool = True,
        camera: str = "front",
        max_steps: int | None = None,
    ) -> None:
        """
        Args:
            image_size: side of the square RGB observation.
            seed: seed used by the first ``reset()`` when that call passes none.
            render: when False, ``obs["image"]`` is all zeros and no renderer is created; for cheap
                state-only checks (expert success, timing). The physics is identical.
            split: "all", or "train"/"test" to keep to (or hold out) about one in five
                instruction/colour combinations, for held-out evaluation.
            terminate_on_success: end the episode (terminated=True) at the first success.
            camera: MJCF camera name.
            max_steps: override the task's time limit.
        """
        if split not in SPLITS:
            raise ValueError(f"split={split!r}; known: {SPLITS}")
        self.image_size = int(image_size)
        self.render_images = bool(render)
        self.split = split
        self.terminate_on_success = terminate_on_success
        self.camera = camera
        if max_steps is not None:
            self.max_steps = int(max_steps)
        self.render_mode = "rgb_array"
        path = Path(__import__(type(self).__module__, fromlist=["_"]).__file__).with_name(self.xml_file)
        self.model = mujoco.MjModel.from_xml_path(str(path))
        self.data = mujoco.MjData(self.model)
        self._renderer: mujoco.Renderer | None = None
        self._default_seed = seed
        self._has_reset = False
        m = self.model
        self._arm_qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in ("x", "y", "z")])
        self._arm_dadr = np.array([m.jnt_dofadr[m.joint(n).id] for n in ("x", "y", "z")])
        self._finger_qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in ("finger_l", "finger_r")])
        self._tip_site = m.site("tip").id
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), dtype=np.float32)
        s = self.image_size
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (s, s, 3), dtype=np.uint8),
                "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), dtype=np.float32),
            }
        )
        self.params: dict[str, Any] = {}
        self._target = HAND_START.copy()
        self._t = 0
        self._success = False
        self._progress = 0.0
        self._ref: dict[str, float] = {}

    # ---- hooks for subclasses -----------------------------------------------------------------
    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        """Draw an episode: colours, positions, the named object, the template index."""
        raise NotImplementedError

    def apply_params(self, params: dict[str, Any]) -> None:
        """Write the parameters into ``self.model`` / ``self.data`` (before ``mj_forward``)."""
        raise NotImplementedError

    def instruction_of(self, params: dict[str, Any]) -> str:
        raise NotImplementedError

    def combo_of(self, params: dict[str, Any]) -> tuple[int, ...]:
        """Indices (template, colours) identifying the instruction/colour combination, for splits."""
        raise NotImplementedError

    def measure(self) -> tuple[float, bool]:
        """(progress in [0, 1], success) of the current state."""
        raise NotImplementedError

    def privileged(self) -> dict[str, np.ndarray]:
        """Object positions for the scripted expert (never part of the observation)."""
        raise NotImplementedError

    # ---- helpers ------------------------------------------------------------------------------
    def tip_pos(self) -> np.ndarray:
        return self.data.site_xpos[self._tip_site].copy()

    def hand_vel(self) -> np.ndarray:
        return self.data.qvel[self._arm_dadr].copy()

    def gripper_opening(self) -> float:
        return float(np.clip(self.data.qpos[self._finger_qadr].mean() / FINGER_MAX, 0.0, 1.0))

    def _state(self) -> np.ndarray:
        return np.concatenate([self.tip_pos(), self.hand_vel(), [self.gripper_opening()]]).astype(np.float32)

    def _image(self) -> np.ndarray:
        s = self.image_size
        if not self.render_images:
            return np.zeros((s, s, 3), dtype=np.uint8)
        if self._renderer is None:
            self._renderer = _gl.make_renderer(self.model, s, s)
        self._renderer.update_scene(self.data, camera=self.camera)
        return self._renderer.render()

    def _obs(self) -> dict[str, np.ndarray]:
        return {"image": self._image(), "state": self._state()}

    def _info(self) -> dict[str, Any]:
        return {
            "instruction": self.instruction,
            "success": bool(self._success),
            "progress": float(self._progress),
            "task_id": self.task_id,
            "step": self._t,
        }

    @property
    def instruction(self) -> str:
        return self.instruction_of(self.params)

    # ---- gymnasium API ------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if seed is None and not self._has_reset:
            seed = self._default_seed
        super().reset(seed=seed)
        self._has_reset = True
        for _ in range(1000):
            params = self.sample_params(self.np_random)
            if self.split == "all" or combo_split(*self.combo_of(params)) == self.split:
                break
        params["hand_start"] = (HAND_START + self.np_random.uniform(-0.04, 0.04, 3) * [1, 1, 0.5]).tolist()
        self._start(params)
        return self._obs(), self._info()

    def _start(self, params: dict[str, Any]) -> None:
        """Put the simulator at the start of the episode that ``params`` describe."""
        self.params = params
        mujoco.mj_resetData(self.model, self.data)
        self.apply_params(params)
        hand = np.asarray(params["hand_start"], dtype=float)
        self.data.qpos[self._arm_qadr] = hand
        self.data.qpos[self._finger_qadr] = FINGER_MAX
        self._target = hand.copy()
        self.data.ctrl[:3] = hand
        self.data.ctrl[3:5] = FINGER_MAX
        mujoco.mj_forward(self.model, self.data)
        self._t = 0
        self._success = False
        self._ref = {}
        self._progress, self._success = self.measure()

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(ACTION_DIM), -1.0, 1.0)
        self._target = np.clip(self._target + a[:3] * MOVE_SCALE, WORKSPACE_LO, WORKSPACE_HI)
        self.data.ctrl[:3] = self._target
        self.data.ctrl[3:5] = (1.0 - a[3]) / 2.0 * FINGER_MAX
        mujoco.mj_step(self.model, self.data, nstep=N_SUBSTEPS)
        self._t += 1
        progress, success = self.measure()
        self._progress = progress
        self._success = self._success or success
        reward = 1.0 if self._success else float(np.clip(progress, 0.0, 1.0))
        terminated = bool(self._success and self.terminate_on_success)
        truncated = self._t >= self.max_steps and not terminated
        return self._obs(), reward, terminated, truncated, self._info()

    def render(self) -> np.ndarray:
        return self._image()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    # ---- replay -------------------------------------------------------------------------------
    def get_sim_state(self) -> dict[str, Any]:
        """Everything needed to continue this episode exactly (a deep copy; picklable)."""
        return {
            "task_id": self.task_id,
            "params": copy.deepcopy(self.params),
            "qpos": self.data.qpos.copy(),
            "qvel": self.data.qvel.copy(),
            "act": self.data.act.copy(),
            "ctrl": self.data.ctrl.copy(),
            "qacc_warmstart": self.data.qacc_warmstart.copy(),
            "time": float(self.data.time),
            "target": self._target.copy(),
            "t": self._t,
            "success": self._success,
            "ref": dict(self._ref),
        }

    def set_sim_state(self, state: dict[str, Any]) -> None:
        """Restore a state from ``get_sim_state`` (of an env of the same task)."""
        if state["task_id"] != self.task_id:
            raise ValueError(f"state of {state['task_id']!r} given to {self.task_id!r}")
        self._start(copy.deepcopy(state["params"]))
        self._has_reset = True
        self.data.qpos[:] = state["qpos"]
        self.data.qvel[:] = state["qvel"]
        self.data.act[:] = state["act"]
        self.data.ctrl[:] = state["ctrl"]
        self.data.qacc_warmstart[:] = state["qacc_warmstart"]
        self.data.time = state["time"]
        mujoco.mj_forward(self.model, self.data)
        self._target = np.array(state["target"], dtype=float)
        self._t = int(state["t"])
        self._success = bool(state["success"])
        self._ref = dict(state["ref"])
        self._progress, _ = self.measure()

    # ---- shared sampling helpers --------------------------------------------------------------
    @staticmethod
    def sample_positions(
        rng: np.random.Generator, n: int, lo: float, hi: float, min_dist: float, avoid: list | None = None
    ) -> np.ndarray:
        """``n`` xy positions in the square [lo, hi]^2 moved ``OBJECT_Y_SHIFT`` away from the camera,
        pairwise (and from ``avoid``) at least ``min_dist`` apart.

        The shift keeps objects out from under the hand's start position, which would hide them in
        the first frames.
        """
        avoid = [np.asarray(p) for p in (avoid or [])]
        for _ in range(10_000):
            pts = rng.uniform(lo, hi, size=(n, 2)) + np.array([0.0, OBJECT_Y_SHIFT])
            ok = all(
                np.linalg.norm(pts[i] - pts[j]) >= min_dist for i in range(n) for j in range(i + 1, n)
            ) and all(np.linalg.norm(p - q) >= min_dist for p in pts for q in avoid)
            if ok:
                return pts
        raise RuntimeError("could not place objects; relax min_dist")


class ColouredObjectsEnv(TabletopEnv):
    """A scene of ``n_objects`` objects of distinct colours, one of them named in the instruction.

    An episode draws the colours, the positions (``placement``: square bounds and minimum spacing,
    as :meth:`TabletopEnv.sample_positions` takes them), the named object and a template, in that
    order; a subclass places its objects (``apply_params``) and measures its task.
    """

    n_objects: int = 2
    #: (lo, hi, min_dist) of the objects' xy positions
    placement: tuple[float, float, float] = (-0.2, 0.2, 0.1)

    def sample_params(self, rng: np.random.Generator) -> dict[str, Any]:
        colours = rng.choice(len(COLOURS), self.n_objects, replace=False).tolist()
        pos = self.sample_positions(rng, self.n_objects, *self.placement)
        return {
            "colours": colours,
            "positions": pos.tolist(),
            "goal": int(rng.integers(self.n_objects)),
            "template": int(rng.integers(len(self.templates))),
        }

    def combo_of(self, p: dict[str, Any]) -> tuple[int, ...]:
        return (p["template"], p["colours"][p["goal"]])

    def instruction_of(self, p: dict[str, Any]) -> str:
        return self.templates[p["template"]].format(c=COLOURS[p["colours"][p["goal"]]])


def rgba(colour: str) -> np.ndarray:
    return np.array([*PALETTE[colour], 1.0])


def tolerance_progress(dist: float, start: float, margin: float) -> float:
    """Progress in [0, 1]: 0 at the episode's start distance, 1 within ``margin`` of the goal."""
    if start <= margin:
        return 1.0 if dist <= margin else 0.0
    return float(np.clip((start - dist) / (start - margin), 0.0, 1.0))


def move_toward(env: TabletopEnv, desired: np.ndarray, grip: float, gain: float = 1.0) -> np.ndarray:
    """Expert helper: the action that moves the hand's position target toward ``desired``."""
    delta = (np.asarray(desired, dtype=float) - env._target) * gain / MOVE_SCALE
    return np.concatenate([np.clip(delta, -1.0, 1.0), [grip]]).astype(np.float32)
