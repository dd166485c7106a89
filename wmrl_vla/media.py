"""Media of the VLA domain: a step's wandb videos and table, the real-vs-imagined clips and GIFs of
evaluation episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from wmrl.domain import RolloutBatch
from wmrl_vla.rollout import SimRollout, goal_or_zeros
from world_models.vla_dynamics import VLADynamics, instruction_ids


def rollout_media(
    wm: VLADynamics, batch: RolloutBatch, predicted: torch.Tensor | None, true: torch.Tensor, scale: int = 4
) -> dict:
    """wandb media of a step: the first real (simulator) rollout beside the world model's
    imagined frames under the very same actions (``rollouts/real_vs_imagined``), the first
    rollout of the policy in imagination (``rollouts/imagined``), and a table of every rollout
    (task, kind, steps, predicted and true score). Frames are upscaled ``scale`` times."""
    from wmrl.tracking import Table, Video, table_value

    def big(frames: np.ndarray) -> np.ndarray:  # [T, 3, H, W] -> [T, 3, sH, sW]
        return np.asarray(frames).repeat(scale, -2).repeat(scale, -1)

    def score(i: int) -> str:
        p = "n/a" if predicted is None else f"{float(predicted[i]):.2f}"
        return f"WM score {p}, true {float(true[i]):.2f}"

    media: dict = {}
    kinds = [p["kind"] for p in batch.payload]
    if "sim" in kinds:
        i = kinds.index("sim")
        p = batch.payload[i]
        executed = p.get("executed_actions", p["actions"])  # every step's, where chunks ran open loop
        actions = torch.as_tensor(np.asarray(executed), dtype=torch.float32)  # [T, A]
        n = actions.shape[0]
        wm.eval()
        out = wm.imagine(
            batch.extras["init_images"][i : i + 1],
            batch.extras["init_states"][i : i + 1],
            lambda frames, states, t: actions[min(t, n - 1)][None],
            n,
            generator=torch.Generator().manual_seed(0),
            instr=batch.extras["wm_instr"][i : i + 1],
            goal=batch.extras["wm_goal"][i : i + 1],
        )
        seen = p["images"] if p.get("rollout") is None else p["rollout"].images[:-1]  # every step's
        real, dreamt = np.asarray(seen)[:n], out["images"][0, :n].numpy()
        media["rollouts/real_vs_imagined"] = Video(
            big(np.concatenate([real, dreamt], axis=-1)),
            caption=f"{p['task_id']} seed {p['seed']}: {p['instruction']!r}; left: simulator, right: "
            f"world model on the same actions; {score(i)}",
        )
    if "imagined" in kinds:
        i = kinds.index("imagined")
        p = batch.payload[i]
        frames = p["images"]
        if "latents" in p:  # imagined on the latent: decode its frames for the video only
            lat = p["latents"]
            init = batch.extras["init_images"][i : i + 1].expand(lat.shape[0], -1, -1, -1)
            frames = wm.frames_from_latents(init, lat).cpu().numpy()
        media["rollouts/imagined"] = Video(
            big(frames), caption=f"{p['task_id']}: {p['instruction']!r} in imagination; {score(i)}"
        )
    rows = [
        [
            p["task_id"],
            p["kind"],
            int(batch.group_ids[i]),
            len(p["actions"]),
            None if predicted is None else table_value(predicted[i]),
            table_value(true[i]),
        ]
        for i, p in enumerate(batch.payload)
    ]
    media["rollouts/table"] = Table(["task", "kind", "group", "steps", "predicted", "true"], rows)
    return media


@torch.no_grad()
def real_vs_imagined(wm: VLADynamics, policy, r: SimRollout, horizon: int, temperature: float) -> np.ndarray:
    """Frames ``[T, 3, H, 3W]`` uint8 of one task three ways, side by side: the real rollout
    ``r`` | the world model replaying its actions open-loop | the policy acting in the world
    model from the same first frame (at ``temperature``, on decoded frames, for ``horizon`` steps at most). Each
    clip holds its last frame until the longest ends."""
    wm.eval()
    gen = torch.Generator().manual_seed(0)  # its own generator: a video never changes a run
    img, st = torch.from_numpy(r.images[:1]), torch.from_numpy(r.states[:1])
    acts, n, words = torch.from_numpy(r.actions), r.length, instruction_ids([r.instruction])
    goal = torch.from_numpy(goal_or_zeros(r.goal))[None]
    replay = wm.imagine(img, st, lambda f, s, t: acts[min(t, n - 1)][None], n + 1,
                        success_threshold=2.0, generator=gen, instr=words, goal=goal)  # fmt: skip
    instr_ids = policy.tokenizer.encode([r.instruction])

    def act(frames: torch.Tensor, states: torch.Tensor, t: int) -> torch.Tensor:
        return policy.act(frames, states, instr_ids, temperature, gen)[2]

    dream = wm.imagine(img, st, act, horizon, generator=gen, instr=words, goal=goal)
    dreamt = dream["images"][0, : int(dream["mask"][0].sum()) + 1].numpy()
    clips = [r.images, replay["images"][0].numpy(), dreamt]
    t_len = max(len(c) for c in clips)
    clips = [np.concatenate([c, np.repeat(c[-1:], t_len - len(c), 0)]) for c in clips]
    return np.concatenate(clips, axis=3)


def save_gif(images: np.ndarray, path: Path, fps: int = 10, scale: int = 2) -> None:
    """``[T, 3, H, W]`` uint8 frames -> an animated GIF, each pixel shown as a ``scale`` x ``scale`` block
    (:func:`wmrl.tracking.write_gif`)."""
    from wmrl.tracking import write_gif

    write_gif(np.asarray(images).repeat(scale, -2).repeat(scale, -1), Path(path), fps)
