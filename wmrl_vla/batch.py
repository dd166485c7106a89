"""The VLA domain's rollouts as the core's :class:`~wmrl.domain.RolloutBatch`.

A rollout is a payload dict (``kind`` "sim" or "imagined", ``task_id``, ``seed``, ``instruction``,
``images`` ``[T, 3, H, W]`` uint8 (the frames the policy saw), ``states`` ``[T, S]``, ``actions``
``[T, A]``, ``bins`` / ``logprobs`` ``[T, A]``, ``reward``, ``success``, ``goal`` ``[2]``, ``rollout``:
the :class:`~wmrl_vla.rollout.SimRollout` of a simulated one, else None; latent imagination adds
``features`` ``[T, F]`` and ``latents`` ``[T, D]``).

Batch layout (``T`` = longest rollout in steps, ``A`` = action dims; tokens step-major):
``tokens``/``logprobs``/``mask`` ``[N, T*A]``; ``extras``: ``images`` ``[N, T, 3, H, W]`` uint8 (the
frames the policy saw), ``states`` ``[N, T, S]``, ``instr`` ``[N, L]``, ``actions`` ``[N, T, A]``,
``step_mask`` ``[N, T]``, ``init_images`` ``[N, 3, H, W]``, ``init_states`` ``[N, S]``; a chain
policy's rollouts (payload ``chains`` ``[T, K+1, H, A]``) add ``chains`` ``[N, T, K+1, H, A]``. A
policy that executes chunks open loop has one step per decision (:func:`sim_payload`): ``T`` counts
decisions, and ``actions`` holds each chunk's first action; its payload's ``executed_actions``
``[T_env, A]`` holds every action the environment (or the world model) stepped. ``wm_actions``
``[N, T_env, A]`` and ``wm_step_mask`` ``[N, T_env]`` are those, what the world model scores (the
same tensors as ``actions`` and ``step_mask`` where every step is a decision).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from wmrl.domain import RolloutBatch
from wmrl_vla.rollout import SimRollout, goal_or_zeros
from world_models.vla_dynamics import instruction_ids


def sim_payload(r: SimRollout) -> dict:
    """A simulated rollout's payload dict (its frames without the last observation), one step per
    decision: a rollout of chunks executed open loop (``r.decision_steps``) keeps the frames, states
    and first actions of its decisions alone (the chunk's other actions are in ``rollout``)."""
    d = slice(None) if r.decision_steps is None else r.decision_steps
    return {
        "kind": "sim",
        "task_id": r.task_id,
        "seed": r.seed,
        "instruction": r.instruction,
        "images": r.images[:-1][d],
        "states": r.states[:-1][d],
        "actions": r.actions[d],
        "bins": r.bins,
        "logprobs": r.logprobs,
        "reward": r.reward,
        "success": float(r.success.max()),
        "goal": goal_or_zeros(r.goal),
        "rollout": r,
        **({} if r.chains is None else {"chains": r.chains}),
        **({} if r.decision_steps is None else {"executed_actions": r.actions}),
    }


def collate(
    rollouts: list[dict],
    tasks: Sequence[Any],
    group_size: int,
    image_size: int,
    tokenizer,
    real_row: torch.Tensor | None = None,
    real_rewards: torch.Tensor | None = None,
) -> RolloutBatch:
    """Payload dicts (``group_size`` consecutive ones per task of ``tasks``) -> a padded batch (the
    module docstring's layout); ``tokenizer`` encodes the policy's instructions. ``real_row`` and
    ``real_rewards`` ``[N]`` go into the batch as they are (``RolloutBatch``'s fields)."""
    n = len(rollouts)
    t_max = max(len(r["actions"]) for r in rollouts)
    a = rollouts[0]["actions"].shape[1]
    s_dim = rollouts[0]["states"].shape[1]
    h = image_size
    images = torch.zeros(n, t_max, 3, h, h, dtype=torch.uint8)
    states = torch.zeros(n, t_max, s_dim)
    actions = torch.zeros(n, t_max, a)
    tokens = torch.zeros(n, t_max, a, dtype=torch.long)
    logprobs = torch.zeros(n, t_max, a)
    step_mask = torch.zeros(n, t_max)
    for i, r in enumerate(rollouts):
        t = len(r["actions"])
        images[i, :t] = torch.as_tensor(r["images"][:t])
        states[i, :t] = torch.as_tensor(r["states"][:t])
        actions[i, :t] = torch.as_tensor(r["actions"])
        tokens[i, :t] = torch.as_tensor(r["bins"])
        logprobs[i, :t] = torch.as_tensor(r["logprobs"])
        step_mask[i, :t] = 1
    mask = step_mask.unsqueeze(-1).expand(n, t_max, a).reshape(n, t_max * a).contiguous()
    optional_extras = {}
    if any("features" in r for r in rollouts):  # latent imagination: what the policy read
        f_dim = next(r["features"].shape[1] for r in rollouts if "features" in r)
        features = torch.zeros(n, t_max, f_dim)
        for i, r in enumerate(rollouts):
            if "features" in r:
                features[i, : len(r["actions"])] = r["features"]
        optional_extras = {
            "features": features,
            "latent": torch.tensor(["features" in r for r in rollouts]),
        }
    if any("chains" in r for r in rollouts):  # a chain policy's denoising chains
        if not all("chains" in r for r in rollouts):
            raise ValueError("some rollouts carry denoising chains and others do not")
        chains = torch.zeros(n, t_max, *rollouts[0]["chains"].shape[1:])
        for i, r in enumerate(rollouts):
            chains[i, : len(r["actions"])] = torch.as_tensor(r["chains"])
        optional_extras["chains"] = chains
    wm_actions, wm_step_mask = actions, step_mask  # what the world model scores: every executed action
    if any("executed_actions" in r for r in rollouts):  # chunks executed open loop
        done = [np.asarray(r.get("executed_actions", r["actions"])) for r in rollouts]
        wm_actions = torch.zeros(n, max(len(x) for x in done), a)
        wm_step_mask = torch.zeros(n, wm_actions.shape[1])
        for i, x in enumerate(done):
            wm_actions[i, : len(x)] = torch.as_tensor(x)
            wm_step_mask[i, : len(x)] = 1
    return RolloutBatch(
        tokens=tokens.reshape(n, t_max * a),
        logprobs=logprobs.reshape(n, t_max * a),
        mask=mask,
        group_ids=torch.arange(len(tasks)).repeat_interleave(group_size),
        tasks=list(tasks),
        payload=rollouts,
        extras={
            "images": images,
            "states": states,
            "instr": tokenizer.encode([r["instruction"] for r in rollouts]),
            "wm_instr": instruction_ids([r["instruction"] for r in rollouts]),  # the WM's words
            "wm_goal": torch.from_numpy(np.stack([r["goal"] for r in rollouts])),  # [N, 2]
            "actions": actions,
            "step_mask": step_mask,
            "wm_actions": wm_actions,
            "wm_step_mask": wm_step_mask,
            "init_images": images[:, 0].clone(),
            "init_states": states[:, 0].clone(),
            **optional_extras,
        },
        real_row=real_row,
        real_rewards=real_rewards,
    )
