"""Sim state as (reset seed, actions so far), for environments whose state lives partly outside
MuJoCo's arrays (MetaWorld and the dm_control suite keep task state in Python objects, which a
snapshot of qpos/qvel would miss). The simulation is deterministic, so replaying the actions from
``reset(seed)`` restores the state exactly."""

from __future__ import annotations

from typing import Any

import numpy as np


class ReplayState:
    """Mixin for a ``gym.Env`` that sets ``task_id``, ``render_images``, ``_episode_seed`` (at
    reset) and appends every action it steps to ``_actions``."""

    task_id: str
    render_images: bool
    _episode_seed: int
    _actions: list[np.ndarray]

    def get_sim_state(self) -> dict[str, Any]:
        """``{"task_id", "seed", "actions": [T, action_dim] float64}`` of the episode so far."""
        return {
            "task_id": self.task_id,
            "seed": self._episode_seed,
            "actions": np.array(self._actions, dtype=np.float64).reshape(-1, self.action_space.shape[0]),  # type: ignore[attr-defined]
        }

    def set_sim_state(self, state: dict[str, Any]) -> None:
        """Restore a state from ``get_sim_state`` by replaying its actions (without rendering)."""
        if state["task_id"] != self.task_id:
            raise ValueError(f"state of {state['task_id']!r} given to {self.task_id!r}")
        render, self.render_images = self.render_images, False
        try:
            self.reset(seed=int(state["seed"]))  # type: ignore[attr-defined]
            for a in state["actions"]:
                self.step(a)  # type: ignore[attr-defined]
        finally:
            self.render_images = render
