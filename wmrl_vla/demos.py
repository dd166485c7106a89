"""The data behaviour cloning learns from: the demos' cache fields, goal labels from the simulator,
and DAgger records (expert labels on the policy's own states); the stages' cache key.

Below :mod:`wmrl_vla.pipeline` (which records and caches the demos) and the policy kinds
(:mod:`wmrl_vla.policies`, which clone from them): it reads the domain config through
:class:`DemoConfig`, the fields the demos depend on.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # numpy and torch are imported where used: the config imports this module
    import numpy as np

    from wmrl_vla.policy import SmallVLA


class DemoConfig(Protocol):
    """The domain config fields the demos depend on (:class:`wmrl_vla.config.VLAConfig` has them)."""

    tasks: list[str]
    image_size: int
    max_steps: int | None
    demos_per_task: int
    demo_seed: int
    demo_split: str
    dataset_root: str | None


def cache_key(d: dict[str, Any]) -> str:
    """The 10-hex-digit SHA-1 of the JSON of ``d`` (keys sorted): a cached stage's name."""
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def demo_fields(cfg: DemoConfig) -> dict[str, Any]:
    """The config fields the demos depend on (the SFT's and every later stage's cache keys include them)."""
    if cfg.dataset_root is not None:
        from wmrl_vla.lerobot_policy import folder_stamp

        return {"tasks": list(cfg.tasks), "image_size": cfg.image_size, "dataset_root": str(cfg.dataset_root),
                "dataset_stamp": folder_stamp(cfg.dataset_root), "max_steps": cfg.max_steps}  # fmt: skip
    return {
        "tasks": list(cfg.tasks),
        "image_size": cfg.image_size,
        "demos_per_task": cfg.demos_per_task,
        "demo_seed": cfg.demo_seed,
        **({"demo_split": cfg.demo_split} if cfg.demo_split != "all" else {}),
        "max_steps": cfg.max_steps,
    }


def task_dims(tasks: list[str]) -> tuple[int, int]:
    """(state dim, action dim) shared by ``tasks``; ``ValueError`` if they differ."""
    import sims

    infos = [sims.task_info(t) for t in tasks]
    dims = {(i["state_dim"], i["action_dim"]) for i in infos}
    if len(dims) != 1:
        raise ValueError(
            f"domain.tasks must share state and action dims; got {dict(zip(tasks, dims, strict=False))}"
        )
    return dims.pop()


DAGGER_SEED0 = 900_000


def target_labels(env) -> tuple[np.ndarray, np.ndarray] | None:
    """Auxiliary SFT labels of an env's current episode, from the simulator: the named object's table
    xy (:func:`wmrl_vla.rollout.goal_position`) and where the env's camera sees it (image x, y in [-1, 1]^2, y down; pinhole model of
    the MuJoCo camera). None for envs without our tabletop interface (no labels: SFT falls back to
    the demo's last hand position)."""
    import math

    import numpy as np

    from wmrl_vla.rollout import goal_position

    u = getattr(env, "unwrapped", env)
    target = goal_position(u)
    if target is None:
        return None
    try:
        cam = u.model.camera(u.camera).id
        pos, mat = u.data.cam_xpos[cam], u.data.cam_xmat[cam].reshape(3, 3)  # columns: camera axes
        tan = math.tan(math.radians(float(u.model.cam_fovy[cam])) / 2)
    except (AttributeError, KeyError):
        return None
    d = target - pos
    depth = -float(d @ mat[:, 2])  # the camera looks along its -z axis
    px = np.array([d @ mat[:, 0] / depth / tan, -(d @ mat[:, 1]) / depth / tan], dtype=np.float32)
    return target[:2].astype(np.float32), px


def label_goals(records: list[dict], split: str = "all") -> list[dict]:
    """Add ``goal`` / ``goal_px`` (see :func:`target_labels`) to records that know their task id and
    reset seed (as :func:`wmrl_vla.data.load_episodes` returns them), by resetting the task's env
    without rendering in ``split`` (the one they were recorded with)."""
    import sims

    envs: dict[str, Any] = {}
    out = []
    try:
        for r in records:
            task, seed = r.get("task_id"), r.get("seed", -1)
            if task is None or seed is None or int(seed) < 0:
                out.append(r)
                continue
            if task not in envs:
                envs[task] = sims.make(task, render=False, split=split)
            envs[task].reset(seed=int(seed))
            lab = target_labels(envs[task])
            out.append(r if lab is None else {**r, "goal": lab[0], "goal_px": lab[1]})
    finally:
        for e in envs.values():
            e.close()
    return out


def dagger_records(
    policy: SmallVLA,
    tasks: list[str],
    episodes_per_task: int,
    image_size: int,
    seed0: int,
    temperature: float = 0.0,
    max_steps: int | None = None,
) -> list[dict]:
    """DAgger (Ross et al. 2011): roll out ``policy`` in the simulator ("train" combinations) and label
    every visited frame with the scripted expert's action from that state. Behaviour cloning on the
    expert's own states alone compounds small errors (the policy overshoots, then never saw how to
    come back); these records teach the recovery. Records are LeRobot-style, like the demos."""
    import numpy as np
    import torch

    import sims

    out = []
    gen = torch.Generator().manual_seed(seed0)
    with torch.no_grad():
        for task in tasks:
            kwargs = {"split": "train"} if max_steps is None else {"split": "train", "max_steps": max_steps}
            env = sims.make(task, image_size=image_size, **kwargs)
            ex = sims.expert(task)
            try:
                for k in range(episodes_per_task):
                    ex.reset()
                    o, info = env.reset(seed=seed0 + k)
                    lab = target_labels(env)
                    instr = policy.tokenizer.encode([info["instruction"]])
                    imgs, sts, acts, prog, succ = [], [], [], [], []
                    while True:
                        label = np.clip(np.asarray(ex.act(o, info, env), dtype=np.float32), -1, 1)
                        img = np.asarray(o["image"])
                        _, _, a = policy.act(
                            torch.from_numpy(img.transpose(2, 0, 1)[None].copy()),
                            torch.from_numpy(np.asarray(o["state"], np.float32)[None]),
                            instr,
                            temperature=temperature,
                            generator=gen,
                        )
                        imgs.append(img)
                        sts.append(np.asarray(o["state"], np.float32))
                        acts.append(label)
                        o, r, term, trunc, info = env.step(a[0].numpy().astype(np.float32))
                        prog.append(float(r))
                        succ.append(bool(info["success"]))
                        if term or trunc:
                            break
                    rec = {
                        "observation.image": np.stack(imgs),
                        "observation.state": np.stack(sts),
                        "action": np.stack(acts),
                        "next.reward": np.array(prog, np.float32),
                        "next.success": np.array(succ),
                        "instruction": info["instruction"],
                        "task": info["instruction"],
                    }
                    if lab is not None:
                        rec.update(goal=lab[0], goal_px=lab[1])
                    out.append(rec)
            finally:
                env.close()
    return out


def mean_success(records: list[dict]) -> float:
    """The fraction of ``records`` (episodes) that succeeded at any step."""
    import numpy as np

    return float(np.mean([np.asarray(r.get("success", r.get("next.success"))).max() for r in records]))
