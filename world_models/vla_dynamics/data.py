"""Episodes and training windows of the world model: LeRobot records -> episodes, random windows
for :meth:`~world_models.vla_dynamics.model.VLADynamics.loss`, hashed instruction words."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np
import torch

from world_models.vla_dynamics.config import GOAL_DIM

MAX_INSTRUCTION_WORDS = 16


def instruction_ids(texts: Sequence[str], max_words: int = MAX_INSTRUCTION_WORDS) -> torch.Tensor:
    """Instructions -> ``[B, max_words]`` int64: each lower-cased word's CRC32 (+1, so that 0 pads),
    the same on every machine and run; a model folds them into its own buckets."""
    out = torch.zeros(len(texts), max_words, dtype=torch.long)
    for i, text in enumerate(texts):
        words = re.findall(r"[a-z0-9]+", str(text).lower())[:max_words]
        out[i, : len(words)] = torch.tensor([zlib.crc32(w.encode()) + 1 for w in words], dtype=torch.long)
    return out


def episodes_from_records(records: Sequence[dict]) -> list[dict[str, np.ndarray]]:
    """LeRobot-style records (``observation.image`` ``[T(+1), H, W, 3]`` or ``[T(+1), 3, H, W]``,
    ``observation.state``, ``action``, ``next.reward``, ``next.success``; or the short names of
    :func:`wmrl_vla.data.load_episodes`: ``image``, ``state``, ``reward``, ``success``) -> episodes."""

    def pick(r: dict, *keys: str):
        for k in keys:
            if k in r:
                return r[k]
        raise KeyError(f"episode record has none of {keys} (keys: {sorted(r)})")

    eps = []
    for r in records:
        img = np.asarray(pick(r, "observation.image", "image"))
        if img.ndim != 4:
            raise ValueError(f"observation.image must be [T, H, W, 3] or [T, 3, H, W], got {img.shape}")
        if img.shape[-1] == 3 and img.shape[1] != 3:
            img = img.transpose(0, 3, 1, 2)
        if img.dtype != np.uint8:
            img = (
                (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
                if img.max() <= 1.0
                else img.astype(np.uint8)
            )
        eps.append(
            {
                "images": img,
                "states": np.asarray(pick(r, "observation.state", "state"), dtype=np.float32),
                "actions": np.asarray(pick(r, "action"), dtype=np.float32),
                "progress": np.asarray(pick(r, "next.reward", "reward"), dtype=np.float32).reshape(-1),
                "success": np.asarray(pick(r, "next.success", "success"), dtype=np.float32).reshape(-1),
                "instruction": str(r.get("instruction", r.get("task", ""))),
                **({"goal": np.asarray(r["goal"], dtype=np.float32)[:GOAL_DIM]} if "goal" in r else {}),
            }
        )
    return eps


def sample_windows(
    episodes: Sequence[dict],
    n: int,
    horizon: int,
    rng: np.random.Generator,
    frames: bool = True,
    from_start: bool = False,
) -> dict[str, torch.Tensor]:
    """``n`` windows of ``horizon`` steps (padded where an episode ends) for :meth:`VLADynamics.loss`;
    ``frames=False``: ``images`` holds each window's first frame only (``[n, 1, 3, h, w]``, for
    :meth:`VLADynamics.grounded_loss`); ``from_start``: every window starts at its episode's first step."""
    if not episodes:
        raise ValueError("sample_windows needs at least one episode")
    h = horizon
    ex = episodes[0]
    img_shape, s_dim, a_dim = ex["images"].shape[1:], ex["states"].shape[1], ex["actions"].shape[1]
    images = np.zeros((n, h + 1 if frames else 1, *img_shape), np.uint8)
    states = np.zeros((n, h + 1, s_dim), np.float32)
    actions = np.zeros((n, h, a_dim), np.float32)
    prog = np.zeros((n, h), np.float32)
    succ = np.zeros((n, h), np.float32)
    fmask = np.zeros((n, h), np.float32)
    smask = np.zeros((n, h), np.float32)
    goal = np.zeros((n, GOAL_DIM), np.float32)
    tip0 = np.zeros((n, GOAL_DIM), np.float32)
    texts = []
    for i in range(n):
        e = episodes[rng.integers(len(episodes))]
        texts.append(e.get("instruction", ""))
        if "goal" in e:
            goal[i] = e["goal"]
        tip0[i] = e["states"][0, :GOAL_DIM]
        t_len = len(e["actions"])
        t0 = 0 if from_start else int(rng.integers(t_len))
        steps = min(h, t_len - t0)
        n_frames = min(h + 1, len(e["images"]) - t0)
        images[i, : n_frames if frames else 1] = e["images"][t0 : t0 + (n_frames if frames else 1)]
        states[i, :n_frames] = e["states"][t0 : t0 + n_frames]
        actions[i, :steps] = e["actions"][t0 : t0 + steps]
        prog[i, :steps] = e["progress"][t0 : t0 + steps]
        succ[i, :steps] = e["success"][t0 : t0 + steps]
        smask[i, :steps] = 1
        fmask[i, : max(n_frames - 1, 0)] = 1
    return {
        "images": torch.from_numpy(images),
        "states": torch.from_numpy(states),
        "actions": torch.from_numpy(actions),
        "progress": torch.from_numpy(prog),
        "success": torch.from_numpy(succ),
        "frame_mask": torch.from_numpy(fmask),
        "step_mask": torch.from_numpy(smask),
        "instr": instruction_ids(texts),
        "goal": torch.from_numpy(goal),
        "tip0": torch.from_numpy(tip0),
    }


def episode_goals(eps: Sequence[dict]) -> torch.Tensor:
    """``[E, 2]``: each episode's ``goal`` (the named object's table xy; zeros where unknown)."""
    return torch.from_numpy(
        np.stack([np.asarray(e.get("goal", np.zeros(GOAL_DIM)), np.float32) for e in eps])
    )
