"""An environment lerobot knows (``lerobot.envs``), as a WMRL VLA task.

``--domain.env.type=metaworld --domain.env.task=reach-v3`` (lerobot's spelling, its
``MetaworldEnv`` config) names lerobot's own gym env, ``lerobot.envs.metaworld.MetaworldEnv``.
:class:`LeRobotMetaWorldTask` steps that env and presents it to WMRL's rollouts as a task
(``lerobot/metaworld-<task>``, registered at config time by :func:`register_task`):

- ``obs["image"]``: lerobot's ``pixels`` (uint8 [S, S, 3], its camera ``corner2`` flipped upright
  as lerobot does), ``obs["state"]``: lerobot's ``agent_pos`` (float32 [4]: hand xyz, gripper);
  a policy trained on a dataset of this env reads them through lerobot's ``preprocess_observation``
  as ``observation.image`` / ``observation.state``;
- reward: MetaWorld's shaped reward / 10 (in [0, 1]), 1.0 once successful; ``info["success"]`` is
  lerobot's ``is_success``; the episode ends at success or after ``max_steps``.

At lerobot's own values (``--domain.image_size=480 --domain.env.episode_length=500``) the env is
exactly the one ``lerobot-eval --env.type=metaworld`` steps. Below them, two settings of the same env
class differ from ``lerobot-eval``'s: images are rendered at ``image_size`` (lerobot's MetaworldEnv
stores ``observation_width/height`` but renders 480 x 480, and its env config has no size field) with
shadows off, which is what makes CPU rollouts affordable; and the time limit is ``max_steps`` (lerobot's
``_max_episode_steps``, fixed at 500, which its ``rollout`` reads). A policy is then evaluated by
lerobot's Python API in this env through :func:`lerobot_vector_env` (see :func:`evaluate_with_lerobot`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ENV_TYPES = ("metaworld",)
TASK_PREFIX = "lerobot/metaworld-"
#: Why each other lerobot env is refused (``--domain.env.type``), in one clause: what is true of it.
_NOT_HERE = ("is not in WMRL's locked environment (uv.lock): `uv sync` does not install it; and no "
             "WMRL task adapter serves it yet (one would need")  # fmt: skip
NOT_WIRED = {
    "pusht": "lerobot's PushT simulator installs from PyPI (pip install 'lerobot[pusht]': gym-pusht, "
    f"pymunk) but {_NOT_HERE} its 2-D action and state, its coverage reward and an expert for demos)",
    "aloha": "lerobot's ALOHA simulator installs from PyPI (pip install 'lerobot[aloha]': gym-aloha) but "
    f"{_NOT_HERE} its 14-D bimanual action and state, its 480 x 640 frames and an expert for demos)",
    "libero": "LIBERO downloads its assets at import (no network here) and no WMRL task adapter serves it",
}


@dataclass
class LeRobotEnvConfig:
    # lerobot's env type (`lerobot.envs.configs`); null: the task comes from domain.tasks instead.
    type: str | None = None
    # lerobot's task name for that env type, e.g. reach-v3 (MetaWorld; a "metaworld-" prefix is dropped).
    task: str | None = None
    # Time limit of an episode (env steps).
    episode_length: int = 200

    def check(self) -> None:
        """One line naming what is wrong (raised as the config's error by the caller)."""
        if self.type not in ENV_TYPES:
            why = NOT_WIRED.get(str(self.type), "not wired in yet")
            raise ValueError(
                f"domain.env.type={self.type!r}: WMRL runs lerobot's {', '.join(ENV_TYPES)} env so far; "
                f"{self.type}: {why}"
            )
        names = metaworld_task_names()
        if self.task_name not in names:
            from sims.registry import close_names

            close = close_names(self.task_name or "", names)
            raise ValueError(
                f"domain.env.task={self.task!r} is not a lerobot MetaWorld task"
                f"{'; close: ' + ', '.join(close) if close else ''} (e.g. reach-v3)"
            )
        if self.episode_length < 1:
            raise ValueError(f"domain.env.episode_length={self.episode_length} must be >= 1")

    @property
    def task_name(self) -> str | None:
        return None if self.task is None else self.task.removeprefix("metaworld-")

    @property
    def task_id(self) -> str:
        return f"{TASK_PREFIX}{self.task_name}"


def metaworld_task_names() -> list[str]:
    """The task names of lerobot's MetaWorld config (``metaworld_config.json``), without importing
    MetaWorld."""
    import json
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("lerobot")
    path = Path(spec.origin).parent / "envs" / "metaworld_config.json"
    return sorted(json.loads(path.read_text())["TASK_DESCRIPTIONS"])


def register_task(env: LeRobotEnvConfig) -> str:
    """Serve ``env`` as the WMRL task ``lerobot/metaworld-<task>`` (``sims.make`` builds it; its
    expert is MetaWorld's scripted policy), with this config's episode length (a later config in the
    same process replaces an earlier one's); returns the task id."""
    from sims import registry

    env.check()
    task_id = env.task_id
    registry.TASKS[task_id] = registry.TaskSpec(
        task_id,
        "metaworld",
        "wmrl_vla.lerobot_env:LeRobotMetaWorldTask",
        4,
        4,
        env.episode_length,
        _description(env.task_name),
        "sims.metaworld_tasks:MetaWorldExpert",
        kwargs={"task": env.task_name, "episode_length": env.episode_length},
        expert_kwargs={"env_name": env.task_name},
    )
    return task_id


def _description(task: str) -> str:
    import json
    from importlib.util import find_spec
    from pathlib import Path

    path = Path(find_spec("lerobot").origin).parent / "envs" / "metaworld_config.json"
    return json.loads(path.read_text())["TASK_DESCRIPTIONS"][task]


def lerobot_image_size() -> int:
    """The square size lerobot's ``MetaworldEnv`` renders at (its ``observation_width`` default: 480),
    the only size ``lerobot-eval --env.type=metaworld`` can render, since lerobot's MetaWorld env
    config has no size field."""
    import inspect

    from lerobot.envs.metaworld import MetaworldEnv

    return int(inspect.signature(MetaworldEnv.__init__).parameters["observation_width"].default)


def lerobot_metaworld_env(task: str, image_size: int, max_steps: int):
    """lerobot's ``MetaworldEnv`` (obs_type ``pixels_agent_pos``), its time limit ``max_steps``.

    At lerobot's own size (:func:`lerobot_image_size`) the env renders exactly as lerobot builds it
    (shadows on): the env ``lerobot-eval --env.type=metaworld`` steps, so a policy post-trained there
    is evaluated by lerobot's command line in the same env (with ``max_steps`` = its 500). At any
    other size the MuJoCo renderer draws ``image_size`` pixels with shadows off (affordable on a CPU;
    lerobot's Python API evaluates it, :func:`evaluate_with_lerobot`)."""
    from sims._gl import select_backend

    select_backend()  # MUJOCO_GL as `wmrl run` sets it, before MetaWorld imports MuJoCo
    import metaworld
    from lerobot.envs.metaworld import MetaworldEnv

    native = image_size == lerobot_image_size()

    class SizedMetaworldEnv(MetaworldEnv):
        def _ensure_env(self) -> None:
            if self._env is not None or native:
                return super()._ensure_env()
            mt1 = metaworld.MT1(self._env_name, seed=42)
            env = mt1.train_classes[self._env_name](
                render_mode="rgb_array",
                camera_name=self.camera_name,
                width=self.observation_width,
                height=self.observation_height,
            )
            env.set_task(mt1.train_tasks[0])
            if self.camera_name == "corner2":
                env.model.cam_pos[2] = [0.75, 0.075, 0.7]
            env.model.light_castshadow[:] = 0
            env.model.vis.quality.offsamples = 0
            env.reset()
            env._freeze_rand_vec = False
            env.seeded_rand_vec = True
            self._env = env

        def _format_raw_obs(self, raw_obs):
            full = np.array(raw_obs, dtype=np.float64)
            full[-3:] = self._env._get_pos_goal()  # MetaWorld's scripted expert reads the goal
            self.mw_obs = full
            return super()._format_raw_obs(raw_obs)

    env = SizedMetaworldEnv(
        task=task,
        obs_type="pixels_agent_pos",
        observation_width=image_size,
        observation_height=image_size,
    )
    env._max_episode_steps = int(max_steps)
    return env


class LeRobotMetaWorldTask:
    """lerobot's MetaWorld env behind WMRL's task interface. See the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}  # lerobot's MetaworldEnv's

    def __init__(
        self,
        task: str,
        image_size: int = 64,
        seed: int | None = None,
        episode_length: int = 200,
        max_steps: int | None = None,
        split: str = "all",
        render: bool = True,
        terminate_on_success: bool = True,
        **_: Any,
    ) -> None:
        self.max_steps = int(max_steps or episode_length)  # domain.max_steps overrides the env's
        self.lerobot_env = lerobot_metaworld_env(task, image_size, self.max_steps)
        self.task_id = f"{TASK_PREFIX}{task}"
        self.split = split  # one instruction per task: held-out evaluation is by seed only
        self._default_seed = seed
        self._t = 0
        self._success = False

    @property
    def unwrapped(self):
        return self

    @property
    def instruction(self) -> str:
        return self.lerobot_env.task_description

    @property
    def mw_obs(self) -> np.ndarray:
        return self.lerobot_env.mw_obs

    def _obs(self, o: dict) -> dict[str, np.ndarray]:
        return {"image": np.ascontiguousarray(o["pixels"]), "state": np.asarray(o["agent_pos"], np.float32)}

    def reset(self, seed: int | None = None, **kw: Any):
        if seed is None:
            seed, self._default_seed = self._default_seed, None
        o, _ = self.lerobot_env.reset(seed=seed)
        self._t, self._success = 0, False
        return self._obs(o), {"instruction": self.instruction, "success": False, "progress": 0.0, "step": 0}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        o, r, term, _, info = self.lerobot_env.step(a)
        self._t += 1
        self._success = self._success or bool(info["is_success"])
        progress = 1.0 if self._success else float(np.clip(r / 10.0, 0.0, 1.0))
        trunc = self._t >= self.max_steps
        out = {
            "instruction": self.instruction,
            "success": self._success,
            "progress": progress,
            "step": self._t,
        }
        return self._obs(o), progress, bool(term), bool(trunc and not term), out

    def close(self) -> None:
        self.lerobot_env.close()


def lerobot_vector_env(task: str, image_size: int, max_steps: int, n_envs: int = 1):
    """A gymnasium ``SyncVectorEnv`` of the same lerobot env, as ``lerobot.envs.make_env`` builds
    for ``lerobot-eval``."""
    import gymnasium as gym

    return gym.vector.SyncVectorEnv(
        [lambda: lerobot_metaworld_env(task, image_size, max_steps) for _ in range(n_envs)]
    )


def action_steps_config(cfg, n_action_steps: int | None, policy_dir: str):
    """``cfg`` (a lerobot ``PreTrainedConfig``) executing ``n_action_steps`` actions of each chunk
    (``None``: as saved); one line if the policy has no chunks, the number is outside
    ``[1, chunk_size]``, or temporal ensembling (which needs 1) is on."""
    if n_action_steps is None:
        return cfg
    chunk = getattr(cfg, "chunk_size", None)
    if chunk is None or not hasattr(cfg, "n_action_steps"):
        raise ValueError(
            f"n_action_steps={n_action_steps}: the {cfg.type} policy {policy_dir} has no chunk_size to run it against"
        )
    if not 1 <= n_action_steps <= chunk:
        raise ValueError(
            f"n_action_steps={n_action_steps} is outside [1, chunk_size={chunk}] of {policy_dir}"
        )
    if n_action_steps != 1 and getattr(cfg, "temporal_ensemble_coeff", None) is not None:
        raise ValueError(
            f"n_action_steps={n_action_steps}: {policy_dir} uses temporal ensembling, which runs 1 step per chunk"
        )
    cfg.n_action_steps = n_action_steps
    return cfg


def evaluate_with_lerobot(
    policy_dir: str,
    task: str,
    image_size: int,
    max_steps: int,
    n_episodes: int,
    start_seed: int,
    seeds: list[int] | None = None,
    n_action_steps: int | None = None,
) -> dict:
    """lerobot's own evaluation (``lerobot.scripts.lerobot_eval.eval_policy``) of the policy folder
    ``policy_dir`` in this env: lerobot loads the policy and its processors, steps the env, counts
    successes. Returns its ``aggregated`` dict (``pc_success``, ...) and ``per_episode``. Episodes
    are reset from seeds ``start_seed, start_seed + 1, ...`` (lerobot's rule), or with ``seeds`` one
    ``eval_policy`` call per seed (``n_episodes`` and ``start_seed`` ignored; ``per_episode`` in order,
    ``aggregated`` = ``{"pc_success"}`` over them), the policy and env built once.

    ``n_action_steps`` replaces the folder's (how many actions of each chunk lerobot executes
    open-loop; :func:`action_steps_config`): 1 runs a policy trained with chunks closed loop, as
    WMRL's rollouts do (:func:`wmrl_vla.lerobot_policy.load_lerobot_folder`)."""
    from sims._gl import select_backend

    select_backend()  # MUJOCO_GL as `wmrl run` sets it, before lerobot's envs import MuJoCo
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.envs.configs import MetaworldEnv as MetaworldEnvConfig
    from lerobot.envs.factory import make_env_pre_post_processors
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors
    from lerobot.scripts.lerobot_eval import eval_policy

    cfg = action_steps_config(PreTrainedConfig.from_pretrained(policy_dir), n_action_steps, policy_dir)
    cfg.device = "cpu"
    policy = get_policy_class(cfg.type).from_pretrained(policy_dir, config=cfg).eval()
    pre, post = make_pre_post_processors(
        cfg, pretrained_path=policy_dir, preprocessor_overrides={"device_processor": {"device": "cpu"}}
    )
    env_pre, env_post = make_env_pre_post_processors(MetaworldEnvConfig(task=task), cfg)
    venv = lerobot_vector_env(task, image_size, max_steps)
    try:
        with torch.no_grad():
            if seeds is None:
                return eval_policy(
                    venv, policy, env_pre, env_post, pre, post, n_episodes, start_seed=start_seed
                )
            per_episode = []
            for s in seeds:
                (ep,) = eval_policy(venv, policy, env_pre, env_post, pre, post, 1, start_seed=s)[
                    "per_episode"
                ]
                per_episode.append({**ep, "episode_ix": len(per_episode)})
    finally:
        venv.close()
    rate = 100.0 * sum(bool(e["success"]) for e in per_episode) / max(1, len(per_episode))
    return {"per_episode": per_episode, "aggregated": {"pc_success": rate}}


#: The columns the world model needs from a LeRobotDataset, lerobot's standard names: frames, states,
#: actions, and what followed each action (lerobot's ``next.reward`` / ``next.success``, the names
#: ``lerobot.utils.constants`` gives them and WMRL's recorders write): it learns to predict them.
WM_COLUMNS = ("observation.image", "observation.state", "action", "next.reward", "next.success")
#: WMRL's own bookkeeping, optional: the extra row of the observation after the last action (``wmrl.final``;
#: ``observation.final`` in datasets recorded before) and each episode's reset seed (``env.seed``).
WMRL_COLUMNS = ("wmrl.final", "env.seed")
#: What a dataset without each WMRL column loses (logged once when it is read).
LOST_WITHOUT = {
    "wmrl.final": "the observation after each episode's last action (the world model learns from its "
    "T - 1 frame pairs, not T)",
    "env.seed": "each episode's reset seed (no simulator labels of the named object's position, which "
    "domain.wm_outcome=state and the small VLA's locator read)",
}
#: lerobot's MetaWorld env returns MetaWorld's shaped reward, in [0, 10]; WMRL's task and the world model
#: read it / 10, and 1 once the episode has succeeded (:class:`LeRobotMetaWorldTask`).
METAWORLD_REWARD_SCALE = 10.0


def dataset_features(root: str | Path) -> dict[str, Any]:
    """The ``features`` of a LeRobotDataset folder's ``meta/info.json``; one line if it is not one."""
    info = Path(root) / "meta" / "info.json"
    if not info.is_file():
        raise ValueError(f"domain.dataset_root={root} is not a LeRobotDataset folder (no meta/info.json)")
    return json.loads(info.read_text())["features"]


def missing_wmrl_columns(features) -> list[str]:
    """The optional WMRL columns (:data:`WMRL_COLUMNS`) a dataset lacks."""
    from wmrl_vla.data import LEGACY_FINAL_KEY

    have = set(features) | ({"wmrl.final"} if LEGACY_FINAL_KEY in features else set())
    return [c for c in WMRL_COLUMNS if c not in have]


def check_dataset(root: str | Path) -> None:
    """A LeRobotDataset folder the world model can pretrain on; one line naming what is missing.
    WMRL's own columns (:data:`WMRL_COLUMNS`) are optional (:data:`LOST_WITHOUT`)."""
    features = dataset_features(root)
    missing = [c for c in WM_COLUMNS if c not in features]
    if missing:
        raise ValueError(
            f"domain.dataset_root={root} lacks {', '.join(missing)}: the world model learns frames, "
            "states, actions, rewards and successes from them; record the dataset with lerobot's "
            "standard columns (observation.image, observation.state, action, next.reward, "
            "next.success), as `python -m wmrl_vla.record_demos` does"
        )


def load_dataset(root: str | Path, env_type: str | None = None) -> list[dict[str, Any]]:
    """The user's LeRobotDataset as WMRL episodes (:func:`wmrl_vla.data.load_episodes`).

    A dataset WMRL recorded (it has ``wmrl.final``) is read as it is. Any other (lerobot's own
    recording, the user's ``add_frame`` loop) has the env's own reward: with ``env_type="metaworld"``
    it becomes WMRL's (MetaWorld's reward / 10, clipped to [0, 1], and 1 once successful) and its
    success is made sticky within an episode; rewards outside [0, 1] of an env WMRL cannot convert
    are an error. The WMRL columns it lacks are logged once with what their absence loses."""
    import logging

    from wmrl_vla.data import load_episodes

    check_dataset(root)
    lacking = missing_wmrl_columns(dataset_features(root))
    episodes = load_episodes(root, f"local/{Path(root).name}")
    if lacking:
        log = logging.getLogger("wmrl")
        for c in lacking:
            log.warning(
                f"domain.dataset_root={root} has no {c} column: the world model goes without {LOST_WITHOUT[c]}"
            )
    if "wmrl.final" not in lacking:
        return episodes
    for e in episodes:
        success = np.maximum.accumulate(e["success"].astype(bool)) if len(e["success"]) else e["success"]
        reward = e["reward"].astype(np.float32)
        if env_type == "metaworld":
            reward = np.clip(reward / METAWORLD_REWARD_SCALE, 0.0, 1.0)
            reward = np.where(success, 1.0, reward).astype(np.float32)
        elif len(reward) and (reward.min() < 0 or reward.max() > 1):
            raise ValueError(
                f"domain.dataset_root={root}: episode {e['episode_index']} has next.reward in "
                f"[{reward.min():g}, {reward.max():g}]; the world model reads rewards in [0, 1] and WMRL "
                "converts an env's own reward only for --domain.env.type=metaworld"
            )
        e["reward"], e["success"] = reward, success
    return episodes
