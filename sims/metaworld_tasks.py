"""MetaWorld v3 tasks behind our observation/action interface (a benchmark none of us wrote).

Each env wraps one MetaWorld ``SawyerXYZEnv`` (constructed directly, as ``metaworld.MT1`` does, with
seeded goal/object randomisation so ``reset(seed=s)`` is a pure function of ``s``) and exposes:

- ``obs["image"]``: uint8 [S, S, 3] from a fixed camera (default ``"corner"``, flipped upright: MetaWorld's
  cameras are mounted upside down), rendered by our own ``mujoco.Renderer`` with shadows, reflections
  and multisampling off;
- ``obs["state"]``: float32 [7], the same layout as our own tasks: hand position (3), hand velocity
  (3, finite difference over one env step), gripper opening in [0, 1] (MetaWorld's proprio part; the
  object and goal positions of MetaWorld's 39-d vector are *not* in the state);
- reward: MetaWorld's v2 shaped reward / 10 (so in [0, 1]), 1.0 once successful;
  ``info["progress"]`` is the same shaped reward / 10, ``info["success"]`` MetaWorld's own test.

The full 39-d MetaWorld observation (goal visible) is kept as ``env.mw_obs`` for the scripted
experts (MetaWorld's own ``policies``), never handed to a policy.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sims import _gl  # noqa: F401  (selects the GL backend before mujoco is imported)
from sims.replay import ReplayState
from sims.specs import mw_instruction, mw_max_steps, mw_task_id

ACTION_DIM = 4
STATE_DIM = 7


def task_id_of(env_name: str) -> str:
    return mw_task_id(env_name)


#: MetaWorld expert class names that do not follow the task name (as lerobot's mapping has them).
_POLICY_EXCEPTIONS = {"peg-insert-side-v3": "SawyerPegInsertionSideV3Policy"}


def expert_class_name(env_name: str) -> str:
    if env_name in _POLICY_EXCEPTIONS:
        return _POLICY_EXCEPTIONS[env_name]
    base = "".join(w.capitalize() for w in env_name.removesuffix("-v3").split("-"))
    return f"Sawyer{base}V3Policy"


class MetaWorldEnv(ReplayState, gym.Env):
    """One MetaWorld v3 task with image + proprio observations and seeded resets."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(
        self,
        env_name: str,
        image_size: int = 64,
        seed: int | None = None,
        render: bool = True,
        camera: str = "corner",
        max_steps: int | None = None,
        terminate_on_success: bool = True,
        split: str = "all",
        instruction: str | None = None,
    ) -> None:
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS, ML1_args_kwargs

        if env_name not in ALL_V3_ENVIRONMENTS:
            from sims.registry import close_names

            raise KeyError(
                f"unknown MetaWorld task {env_name!r}; close: {close_names(env_name, ALL_V3_ENVIRONMENTS)}; "
                f"known: {sorted(ALL_V3_ENVIRONMENTS)}"
            )
        self.env_name = env_name
        self.task_id = task_id_of(env_name)
        self.max_steps = int(max_steps or mw_max_steps(env_name))
        self._instruction = instruction or mw_instruction(env_name)
        self.image_size = int(image_size)
        self.render_images = bool(render)
        self.camera = camera
        self.terminate_on_success = terminate_on_success
        self.render_mode = "rgb_array"
        if split not in ("all", "train", "test"):
            raise ValueError(f"split={split!r}; known: ('all', 'train', 'test')")
        # one fixed instruction: there are no instruction/colour combinations to hold out, so a
        # split is accepted for interface parity and held-out evaluation is by seed only
        self.split = split
        self._episode_seed = 0
        self._actions: list[np.ndarray] = []

        env = ALL_V3_ENVIRONMENTS[env_name]()
        kwargs = dict(ML1_args_kwargs[env_name]["kwargs"])
        kwargs.pop("task_id", None)
        env._set_task_inner(**kwargs)
        env._set_task_called = True
        # goal visible in the 39-d vector: MetaWorld's experts read it (our policies never see it)
        env._partially_observable = False
        env.__dict__.pop("sawyer_observation_space", None)
        # seeded randomisation of object/goal positions at every reset (as lerobot's wrapper does)
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        env.max_path_length = max(env.max_path_length, self.max_steps)
        self._mw = env
        self._dt = float(env.model.opt.timestep * env.frame_skip)
        self._renderer = None
        self._default_seed = seed
        self._has_reset = False
        self._t = 0
        self._success = False
        self._progress = 0.0
        self._prev_hand = np.zeros(3)
        self.mw_obs = np.zeros(39)
        s = self.image_size
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), dtype=np.float32)
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (s, s, 3), dtype=np.uint8),
                "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), dtype=np.float32),
            }
        )

    @property
    def instruction(self) -> str:
        return self._instruction

    @property
    def model(self):
        return self._mw.model

    @property
    def data(self):
        return self._mw.data

    def _image(self) -> np.ndarray:
        s = self.image_size
        if not self.render_images:
            return np.zeros((s, s, 3), dtype=np.uint8)
        if self._renderer is None:
            self._renderer = _gl.make_renderer(self._mw.model, s, s)
        self._renderer.update_scene(self._mw.data, camera=self.camera)
        # MetaWorld mounts its cameras upside down
        return np.ascontiguousarray(self._renderer.render()[::-1])

    def _obs(self, mw_obs: np.ndarray, vel: np.ndarray) -> dict[str, np.ndarray]:
        state = np.concatenate([mw_obs[:3], vel, mw_obs[3:4]]).astype(np.float32)
        return {"image": self._image(), "state": state}

    def _info(self) -> dict[str, Any]:
        return {
            "instruction": self._instruction,
            "success": bool(self._success),
            "progress": float(self._progress),
            "task_id": self.task_id,
            "step": self._t,
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if seed is None and not self._has_reset:
            seed = self._default_seed
        super().reset(seed=seed)
        if seed is None:  # continue the env's own stream, but from our generator so runs repeat
            seed = int(self.np_random.integers(2**31 - 1))
        self._has_reset = True
        self._episode_seed = int(seed)
        self._actions = []
        self._mw.seed(int(seed))
        mw_obs, _ = self._mw.reset()
        self.mw_obs = np.asarray(mw_obs, dtype=np.float64)
        self._prev_hand = self.mw_obs[:3].copy()
        self._t = 0
        self._success = False
        self._progress = 0.0
        return self._obs(self.mw_obs, np.zeros(3)), self._info()

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        a = np.clip(np.asarray(action, dtype=np.float32).reshape(ACTION_DIM), -1.0, 1.0)
        self._actions.append(a.copy())
        mw_obs, mw_reward, _, _, mw_info = self._mw.step(a)
        self.mw_obs = np.asarray(mw_obs, dtype=np.float64)
        vel = (self.mw_obs[:3] - self._prev_hand) / self._dt
        self._prev_hand = self.mw_obs[:3].copy()
        self._t += 1
        self._progress = float(np.clip(mw_reward / 10.0, 0.0, 1.0))
        self._success = self._success or bool(mw_info.get("success", 0.0))
        reward = 1.0 if self._success else self._progress
        terminated = bool(self._success and self.terminate_on_success)
        truncated = self._t >= self.max_steps and not terminated
        info = self._info()
        info["mw_reward"] = float(mw_reward)
        return self._obs(self.mw_obs, vel), reward, terminated, truncated, info

    def render(self) -> np.ndarray:
        return self._image()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._mw.close()


class MetaWorldExpert:
    """MetaWorld's own scripted policy for the task; reads the env's full 39-d observation."""

    def __init__(self, env_name: str) -> None:
        import metaworld.policies as policies

        self.env_name = env_name
        self.policy = getattr(policies, expert_class_name(env_name))()

    def reset(self) -> None:
        pass

    def act(self, obs: dict, info: dict, env: MetaWorldEnv) -> np.ndarray:
        mw_obs = env.unwrapped.mw_obs
        with warnings.catch_warnings():  # "Constant(s) may be too high": it clips, as we do
            warnings.simplefilter("ignore", UserWarning)
            action = self.policy.get_action(mw_obs)
        return np.clip(action, -1.0, 1.0).astype(np.float32)
