"""dm_control suite tasks behind our interface.

- ``obs["image"]``: uint8 [S, S, 3] from the task's camera 0 (rendered by ``mujoco.Renderer`` on the
  suite's own model/data, shadows and reflections off);
- ``obs["state"]``: float32, the suite's observation dict flattened in its key order (so it may
  contain task information such as reacher's ``to_target``: that is how the suite defines it);
- actions: Box(-1, 1) of the task's action dimension, rescaled affinely to the actuator ranges;
- reward: the suite's reward in [0, 1], averaged over ``action_repeat`` physics control steps;
  ``info["progress"]`` is the same; ``info["success"]`` is the task's own goal test (finger/ball/mass
  inside the target), sticky and terminating when ``terminate_on_success``.

Seeded: ``reset(seed=s)`` reseeds the suite task's ``RandomState`` with ``s``, so the initial state
is a pure function of ``s``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from sims import _gl  # noqa: F401  (selects the GL backend before mujoco is imported)
from sims.replay import ReplayState
from sims.specs import DMC_TASKS, dmc_task_id


def _reacher_success(env: DMCEnv, reward: float) -> bool:
    physics = env.physics
    radius = physics.named.model.geom_size[["target", "finger"], 0].sum()
    return bool(physics.finger_to_target_dist() <= radius)


def _reward_success(env: DMCEnv, reward: float) -> bool:
    return reward >= 0.99


_SUCCESS = {"reacher": _reacher_success, "reward": _reward_success}


def task_id_of(name: str) -> str:
    return dmc_task_id(name)


class DMCEnv(ReplayState, gym.Env):
    """A dm_control suite task as a Gymnasium env with image + flattened-state observations."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 25}

    def __init__(
        self,
        name: str,
        image_size: int = 64,
        seed: int | None = None,
        render: bool = True,
        camera: int | str = 0,
        max_steps: int | None = None,
        action_repeat: int | None = None,
        terminate_on_success: bool = True,
        split: str = "all",
    ) -> None:
        from dm_control import suite

        if name not in DMC_TASKS:
            raise KeyError(f"unknown dm_control task {name!r}; known: {sorted(DMC_TASKS)}")
        self.spec_dmc = DMC_TASKS[name]
        self.name = name
        self.task_id = task_id_of(name)
        self.image_size = int(image_size)
        self.render_images = bool(render)
        self.camera = camera
        self.max_steps = int(max_steps or self.spec_dmc.max_steps)
        self.action_repeat = int(action_repeat or self.spec_dmc.action_repeat)
        self.terminate_on_success = terminate_on_success
        self.render_mode = "rgb_array"
        if split not in ("all", "train", "test"):
            raise ValueError(f"split={split!r}; known: ('all', 'train', 'test')")
        # one fixed instruction: there are no instruction/colour combinations to hold out, so a
        # split is accepted for interface parity and held-out evaluation is by seed only
        self.split = split
        self._episode_seed = 0
        self._actions: list[np.ndarray] = []
        self._rng_state = np.random.RandomState(0 if seed is None else seed)
        self._env = suite.load(
            self.spec_dmc.domain, self.spec_dmc.task, task_kwargs={"random": self._rng_state}
        )
        self._default_seed = seed
        self._has_reset = False
        aspec = self._env.action_spec()
        self._a_lo, self._a_hi = aspec.minimum.astype(np.float64), aspec.maximum.astype(np.float64)
        self.state_dim = int(sum(int(np.prod(v.shape)) for v in self._env.observation_spec().values()))
        self.action_dim = int(aspec.shape[0])
        s = self.image_size
        self.action_space = spaces.Box(-1.0, 1.0, (self.action_dim,), dtype=np.float32)
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (s, s, 3), dtype=np.uint8),
                "state": spaces.Box(-np.inf, np.inf, (self.state_dim,), dtype=np.float32),
            }
        )
        self._renderer: mujoco.Renderer | None = None
        self._t = 0
        self._success = False
        self._progress = 0.0

    @property
    def physics(self):
        return self._env.physics

    @property
    def instruction(self) -> str:
        return self.spec_dmc.instruction

    def _image(self) -> np.ndarray:
        s = self.image_size
        if not self.render_images:
            return np.zeros((s, s, 3), dtype=np.uint8)
        model, data = self.physics.model.ptr, self.physics.data.ptr
        if self._renderer is None:
            self._renderer = _gl.make_renderer(model, s, s)
        self._renderer.update_scene(data, camera=self.camera)
        return self._renderer.render()

    def _obs(self, ts) -> dict[str, np.ndarray]:
        state = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in ts.observation.values()])
        return {"image": self._image(), "state": state.astype(np.float32)}

    def _info(self) -> dict[str, Any]:
        return {
            "instruction": self.instruction,
            "success": bool(self._success),
            "progress": float(self._progress),
            "task_id": self.task_id,
            "step": self._t,
        }

    def _is_success(self, reward: float) -> bool:
        return _SUCCESS[self.spec_dmc.success](self, reward)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if seed is None and not self._has_reset:
            seed = self._default_seed
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self._has_reset = True
        self._episode_seed = int(seed)
        self._actions = []
        # the suite task keeps a reference to this RandomState: reseeding it in place reseeds the task
        self._rng_state.seed(int(seed))
        ts = self._env.reset()
        self._t = 0
        self._success = False
        self._progress = 0.0
        return self._obs(ts), self._info()

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(self.action_dim), -1.0, 1.0)
        self._actions.append(a.copy())
        ctrl = self._a_lo + (a + 1.0) / 2.0 * (self._a_hi - self._a_lo)
        total = 0.0
        for _ in range(self.action_repeat):
            ts = self._env.step(ctrl)
            total += float(ts.reward or 0.0)
            if ts.last():
                break
        reward_dm = float(np.clip(total / self.action_repeat, 0.0, 1.0))
        self._t += 1
        self._progress = reward_dm
        self._success = self._success or self._is_success(reward_dm)
        reward = 1.0 if self._success else reward_dm
        terminated = bool(self._success and self.terminate_on_success)
        truncated = (self._t >= self.max_steps or ts.last()) and not terminated
        return self._obs(ts), reward, terminated, truncated, self._info()

    def render(self) -> np.ndarray:
        return self._image()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


class ReacherExpert:
    """Analytic inverse kinematics of reacher's two 0.12 m links, then joint-space PD (reads physics)."""

    LINK = 0.12

    def __init__(self, kp: float = 8.0, kd: float = 0.6) -> None:
        self.kp, self.kd = kp, kd

    def reset(self) -> None:
        pass

    def act(self, obs: dict, info: dict, env: DMCEnv) -> np.ndarray:
        physics = env.unwrapped.physics
        target = physics.named.data.geom_xpos["target", :2] - physics.named.data.xpos["arm", :2]
        # each named joint reads as a length-1 array: ravel to [2], or the action comes out [2, 1]
        q = np.array(
            [physics.named.data.qpos["shoulder"], physics.named.data.qpos["wrist"]], dtype=float
        ).ravel()
        qd = np.array(
            [physics.named.data.qvel["shoulder"], physics.named.data.qvel["wrist"]], dtype=float
        ).ravel()
        link = self.LINK
        r = min(float(np.linalg.norm(target)), 2 * link - 1e-6)
        c2 = np.clip((r**2 - 2 * link**2) / (2 * link**2), -1.0, 1.0)
        q2 = float(np.arccos(c2)) * (1.0 if q[1] >= 0 else -1.0)
        q1 = float(np.arctan2(target[1], target[0]) - np.arctan2(link * np.sin(q2), link + link * np.cos(q2)))
        err = np.array([q1 - q[0], q2 - q[1]])
        err = (err + np.pi) % (2 * np.pi) - np.pi  # the shoulder turns freely: take the short way
        return np.clip(self.kp * err - self.kd * qd, -1.0, 1.0).astype(np.float32)
