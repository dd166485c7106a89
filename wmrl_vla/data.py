"""Demonstrations and rollouts as LeRobot datasets (lerobot's own ``LeRobotDataset``, local root).

One dataset holds episodes of any tasks that share image size, state and action dims (our own tasks
and the MetaWorld ones all have action 4 / state 7; dm_control tasks need their own dataset).

Frame layout (per row; lerobot's convention of ``next.*`` for what followed the action):

==================  ==================  ===============================================================
feature             dtype / shape       meaning
==================  ==================  ===============================================================
observation.image   image (H, W, 3)     camera frame o_t (stored as PNG: use_videos=False, lossless)
observation.state   float32 (S,)        proprioception s_t
action              float32 (A,)        a_t (zeros on the final frame)
next.reward         float32 (1,)        r_{t+1} in [0, 1] (0 on the final frame)
next.success        bool (1,)           success after a_t (sticky; on the final frame: the episode's)
next.done           bool (1,)           True on the last *transition* of the episode
wmrl.final          bool (1,)           True on the extra last row holding o_T, the observation
                                        after the last action (so world models see whole trajectories);
                                        no ``observation.`` prefix, so ``lerobot-train`` takes no policy
                                        input from it (datasets written before: ``observation.final``)
env.seed            int64 (1,)          reset seed of the episode (-1 if unknown)
task                (lerobot's task)    the language instruction
==================  ==================  ===============================================================

The task id of each episode (``"wmrl/PushColor-v0"``) is kept in ``meta/wmrl_episodes.jsonl`` next to
lerobot's metadata, with the seed, so ``sims.make(task_id).reset(seed=seed)`` re-creates the start.

Measured on the 2-core CPU machine (while loaded by other jobs): recording 20 expert episodes of
PushColor/LiftColor (596 frames at 64x64, simulation included) took 11 s, ``load_episodes`` 1.3 s;
importing lerobot itself takes 15-35 s the first time in a process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Frame = tuple[dict[str, np.ndarray], np.ndarray | None, float | None, bool | None, str]
EPISODES_FILE = "meta/wmrl_episodes.jsonl"
FINAL_KEY, LEGACY_FINAL_KEY = "wmrl.final", "observation.final"  # the final-row flag (module docstring)


def _features(image_shape: Sequence[int], state_dim: int, action_dim: int) -> dict[str, dict]:
    return {
        "observation.image": {
            "dtype": "image",
            "shape": tuple(int(x) for x in image_shape),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (state_dim,), "names": None},
        "action": {"dtype": "float32", "shape": (action_dim,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        FINAL_KEY: {"dtype": "bool", "shape": (1,), "names": None},
        "env.seed": {"dtype": "int64", "shape": (1,), "names": None},
    }


def final_column(columns) -> str:
    """The final-row flag's column among ``columns``: :data:`FINAL_KEY`, or the name datasets
    recorded before it used (``observation.final``)."""
    return FINAL_KEY if FINAL_KEY in columns else LEGACY_FINAL_KEY


@contextlib.contextmanager
def _quiet_datasets():
    """Silence the per-episode "Map: ..." progress bars of ``datasets`` while writing."""
    import datasets

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was:
            datasets.enable_progress_bars()


def _open(root: Path, repo_id: str, features: dict, fps: int):
    """A write-mode dataset: created if ``root`` holds none, else resumed (appending)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    if (root / "meta" / "info.json").exists():
        ds = LeRobotDataset.resume(repo_id, root=root, video_backend="pyav")
        for key in ("observation.image", "observation.state", "action"):
            have, want = tuple(ds.features[key]["shape"]), tuple(features[key]["shape"])
            if have != want:
                raise ValueError(f"{root}: {key} has shape {have}, these episodes have {want}")
        return ds
    return LeRobotDataset.create(
        repo_id, fps=fps, features=features, root=root, use_videos=False, video_backend="pyav"
    )


def _write_episode(ds, frames: Sequence[Frame], seed: int) -> int:
    """Add one episode's frames; returns the number of transitions written."""
    action_dim = int(ds.features["action"]["shape"][0])
    final_key = final_column(ds.features)
    transitions = [f for f in frames if f[1] is not None]
    finals = [f for f in frames if f[1] is None]
    if not transitions:
        raise ValueError("an episode needs at least one (obs, action, ...) frame")
    if len(finals) > 1 or (finals and frames[-1][1] is not None):
        raise ValueError("only the last frame of an episode may have action None (the final observation)")
    last_success = False
    for i, (obs, action, reward, success, instruction) in enumerate(transitions):
        last_success = bool(success)
        ds.add_frame(
            {
                "observation.image": np.asarray(obs["image"], dtype=np.uint8),
                "observation.state": np.asarray(obs["state"], dtype=np.float32),
                "action": np.asarray(action, dtype=np.float32).reshape(action_dim),
                "next.reward": np.array([reward], dtype=np.float32),
                "next.success": np.array([bool(success)]),
                "next.done": np.array([i == len(transitions) - 1]),
                final_key: np.array([False]),
                "env.seed": np.array([seed], dtype=np.int64),
                "task": str(instruction),
            }
        )
    for obs, _, _, _, instruction in finals:
        ds.add_frame(
            {
                "observation.image": np.asarray(obs["image"], dtype=np.uint8),
                "observation.state": np.asarray(obs["state"], dtype=np.float32),
                "action": np.zeros(action_dim, dtype=np.float32),
                "next.reward": np.zeros(1, dtype=np.float32),
                "next.success": np.array([last_success]),
                "next.done": np.array([False]),
                final_key: np.array([True]),
                "env.seed": np.array([seed], dtype=np.int64),
                "task": str(instruction),
            }
        )
    ds.save_episode()
    return len(transitions)


def _append_index(root: Path, rows: Iterable[dict[str, Any]]) -> None:
    path = root / EPISODES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _read_index(root: Path) -> dict[int, dict[str, Any]]:
    path = root / EPISODES_FILE
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["episode_index"]): r for r in rows}


def rollout(
    env: Any, policy: Callable[[dict, dict], np.ndarray], seed: int | None
) -> tuple[list[Frame], dict[str, Any]]:
    """Run one episode; frames are (o_t, a_t, r_{t+1}, success_{t+1}, instruction) plus a final
    (o_T, None, None, None, instruction)."""
    obs, info = env.reset(seed=seed)
    frames: list[Frame] = []
    done = False
    while not done:
        action = np.asarray(policy(obs, info), dtype=np.float32)
        next_obs, reward, terminated, truncated, info = env.step(action)
        frames.append((obs, action, float(reward), bool(info["success"]), info["instruction"]))
        obs, done = next_obs, terminated or truncated
    frames.append((obs, None, None, None, info["instruction"]))
    return frames, info


class DemoError(RuntimeError):
    """Demonstrations that cannot teach the task (no expert episode succeeded)."""


def check_demo_success(task_id: str, succeeded: int, recorded: int, max_steps: int | None) -> None:
    """Raise :class:`DemoError` if none of a task's ``recorded`` scripted-expert episodes succeeded
    (the message names the task, the horizon and the fix); warn if only some did."""
    import sims

    own = sims.task_info(task_id)["max_steps"]
    horizon = max_steps or own
    where = f"within {horizon} steps" + (
        f" (max_steps={max_steps}; the task's own limit is {own})" if max_steps else ""
    )
    if succeeded == 0:
        fix = (
            "raise domain.max_steps, or set it to null for each task's own limit"
            if max_steps and max_steps < own
            else "its expert fails at this horizon: check the task's expert"
        )
        raise DemoError(
            f"no scripted-expert demo of {task_id} succeeded (0 of {recorded}) {where}, so SFT would "
            f"learn from failures; {fix}"
        )
    if succeeded < recorded:
        logging.getLogger("wmrl").warning(
            f"{succeeded} of {recorded} scripted-expert demos of {task_id} succeeded {where}; the failed "
            "ones are kept"
        )


def record_demos(
    task_ids: Sequence[str],
    episodes_per_task: int,
    root: str | Path,
    repo_id: str = "wmrl/demos",
    image_size: int = 64,
    seed: int = 0,
    policy: Callable[[dict, dict], np.ndarray] | None = None,
    only_success: bool = False,
    max_steps: int | None = None,
    split: str = "all",
):
    """Roll out ``policy`` (None: each task's scripted expert) and write the episodes under ``root``.

    Episode ``i`` of a task is reset with seed ``seed + i`` (with ``only_success``, failed episodes
    are dropped and further seeds tried, up to 3x as many). ``split="train"`` keeps the held-out
    instruction/colour combinations of our own tasks out of the demos (see ``sims``). Appends if
    ``root`` already holds a dataset. Returns the dataset reopened for reading
    (``LeRobotDataset(repo_id, root=root)``). With the scripted experts (``policy=None``), a task none
    of whose episodes succeeded (e.g. a ``max_steps`` shorter than the expert needs) raises
    :class:`DemoError` (:func:`check_demo_success`).
    """
    with _quiet_datasets():
        return _record(
            task_ids,
            episodes_per_task,
            Path(root),
            repo_id,
            image_size,
            seed,
            policy,
            only_success,
            max_steps,
            split,
        )


def _record(
    task_ids: Sequence[str],
    episodes_per_task: int,
    root: Path,
    repo_id: str,
    image_size: int,
    seed: int,
    policy: Callable[[dict, dict], np.ndarray] | None,
    only_success: bool,
    max_steps: int | None,
    split: str,
):
    import sims

    ds = None
    next_index = 0
    index_rows: list[dict[str, Any]] = []
    try:
        for task_id in task_ids:
            kw: dict[str, Any] = {"split": split}
            if max_steps:
                kw["max_steps"] = max_steps
            env = sims.make(task_id, image_size=image_size, **kw)
            try:
                act = policy if policy is not None else sims.expert_for(env)
                if ds is None:
                    info = sims.task_info(task_id)
                    features = _features((image_size, image_size, 3), info["state_dim"], info["action_dim"])
                    fps = int(env.metadata.get("render_fps", 20))
                    ds = _open(root, repo_id, features, fps)
                    next_index = ds.meta.total_episodes
                kept, k, succeeded = 0, 0, 0
                while kept < episodes_per_task and k < episodes_per_task * (3 if only_success else 1):
                    s = seed + k
                    k += 1
                    frames, info = rollout(env, act, s)
                    if only_success and not info["success"]:
                        continue
                    _write_episode(ds, frames, s)
                    index_rows.append(
                        {
                            "episode_index": next_index,
                            "task_id": task_id,
                            "seed": s,
                            "success": bool(info["success"]),
                            "length": len(frames) - 1,
                            "instruction": info["instruction"],
                        }
                    )
                    next_index += 1
                    kept += 1
                    succeeded += bool(info["success"])
                if policy is None:
                    check_demo_success(task_id, succeeded, kept, max_steps)
            finally:
                env.close()
    finally:
        if ds is not None:
            ds.finalize()
            _append_index(root, index_rows)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(repo_id, root=root, video_backend="pyav")


def append_episodes(
    root: str | Path,
    repo_id: str,
    episodes: Sequence[Sequence[Frame]],
    task_ids: Sequence[str | None] | None = None,
    seeds: Sequence[int | None] | None = None,
    fps: int = 20,
) -> int:
    """Append episodes (e.g. RL anchor rollouts) in the same format; creates the dataset if needed.

    An episode is a list of ``(obs, action, reward, success, instruction)`` frames; its last frame may
    be ``(obs_T, None, None, None, instruction)`` (the observation after the last action). Returns the
    number of episodes in the dataset afterwards.
    """
    if not episodes:
        raise ValueError("no episodes to append")
    with _quiet_datasets():
        return _append(Path(root), repo_id, episodes, task_ids, seeds, fps)


def _append(
    root: Path,
    repo_id: str,
    episodes: Sequence[Sequence[Frame]],
    task_ids: Sequence[str | None] | None,
    seeds: Sequence[int | None] | None,
    fps: int,
) -> int:
    obs0, a0 = episodes[0][0][0], episodes[0][0][1]
    features = _features(np.shape(obs0["image"]), int(np.size(obs0["state"])), int(np.size(a0)))
    ds = _open(root, repo_id, features, fps)
    start = ds.meta.total_episodes
    rows = []
    try:
        for i, ep in enumerate(episodes):
            s = seeds[i] if seeds is not None and seeds[i] is not None else -1
            n = _write_episode(ds, ep, int(s))
            last = [f for f in ep if f[1] is not None][-1]
            rows.append(
                {
                    "episode_index": start + i,
                    "task_id": task_ids[i] if task_ids is not None else None,
                    "seed": int(s),
                    "success": bool(last[3]),
                    "length": n,
                    "instruction": str(last[4]),
                }
            )
    finally:
        ds.finalize()
        _append_index(root, rows)
    return start + len(episodes)


def load_episodes(root: str | Path, repo_id: str = "wmrl/demos") -> list[dict[str, Any]]:
    """Read every episode back as numpy arrays, for SFT and world-model training.

    Each episode dict: ``image`` uint8 [N, H, W, 3], ``state`` float32 [N, S] (N = T + 1 when the
    final observation was recorded, else T), ``action`` float32 [T, A], ``reward`` float32 [T],
    ``success`` bool [T], ``instruction`` str, ``episode_index`` int, ``seed`` int, ``task_id``
    (str or None), ``final`` (bool: whether row N-1 is o_T). A dataset without ``wmrl.final`` (e.g.
    recorded by lerobot's own tools) has N = T; without ``env.seed`` every seed is -1.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from PIL import Image

    root = Path(root)
    ds = LeRobotDataset(repo_id, root=root, video_backend="pyav")
    # lerobot installs a to-torch transform (float images in [0, 1]); read the raw columns instead
    hf = ds.hf_dataset.with_format(None)
    tasks = ds.meta.tasks  # DataFrame indexed by task string with a task_index column
    task_of = {int(i): str(t) for t, i in zip(tasks.index, tasks["task_index"], strict=True)}
    index = _read_index(root)

    ep_idx = np.asarray(hf["episode_index"]).reshape(-1)
    frame_idx = np.asarray(hf["frame_index"]).reshape(-1)
    state = np.asarray(hf["observation.state"], dtype=np.float32)
    action = np.asarray(hf["action"], dtype=np.float32)
    reward = np.asarray(hf["next.reward"], dtype=np.float32).reshape(-1)
    success = np.asarray(hf["next.success"]).reshape(-1).astype(bool)
    n_rows = len(ep_idx)
    # WMRL's own columns are optional (a dataset recorded by lerobot's tools has neither): without the
    # final-row flag every row is a transition; without env.seed an episode's seed is -1 (unknown)
    fcol = final_column(hf.column_names)
    final = (np.asarray(hf[fcol]).reshape(-1).astype(bool) if fcol in hf.column_names
             else np.zeros(n_rows, dtype=bool))  # fmt: skip
    seed = np.asarray(hf["env.seed"]).reshape(-1) if "env.seed" in hf.column_names else np.full(n_rows, -1)
    task_index = np.asarray(hf["task_index"]).reshape(-1)
    images = hf["observation.image"]

    def to_uint8(img: Any) -> np.ndarray:
        if isinstance(img, Image.Image):
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
        if isinstance(img, dict):  # undecoded {"bytes", "path"}
            import io

            return np.asarray(Image.open(io.BytesIO(img["bytes"])).convert("RGB"), dtype=np.uint8)
        return np.asarray(img, dtype=np.uint8)

    episodes = []
    for e in np.unique(ep_idx):
        rows = np.flatnonzero(ep_idx == e)
        rows = rows[np.argsort(frame_idx[rows])]
        trans = rows[~final[rows]]
        meta = index.get(int(e), {})
        episodes.append(
            {
                "episode_index": int(e),
                "image": np.stack([to_uint8(images[int(r)]) for r in rows]),
                "state": state[rows],
                "action": action[trans],
                "reward": reward[trans],
                "success": success[trans],
                "instruction": task_of[int(task_index[rows[0]])],
                "seed": int(seed[rows[0]]),
                "task_id": meta.get("task_id"),
                "final": bool(final[rows[-1]]),
            }
        )
    return episodes
