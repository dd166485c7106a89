"""MuJoCo tasks with language instructions for the VLA domain, behind one Gymnasium interface.

Every task, whatever its source, gives::

    obs  = {"image": uint8 [S, S, 3] from a fixed camera (S = image_size, 64 by default),
            "state": float32 [state_dim] proprioception}
    info = {"instruction": str, "success": bool, "progress": float in [0, 1], "task_id": str, "step": int}
    action: Box(-1, 1, (action_dim,)); reward in [0, 1] (dense progress; 1.0 once successful)

``reset(seed=s)`` is deterministic in ``s``. Episodes end with ``terminated`` at the first success
(``terminate_on_success=False`` to keep going) and ``truncated`` at the task's time limit.

Sources:

- ``own``: our tabletop tasks (``sims/own``), one gantry robot with a gripper, action_dim 4
  (dx, dy, dz, grip), state_dim 7 (hand position, hand velocity, gripper opening); colours, positions
  and instruction templates are randomised per episode; ``get_sim_state``/``set_sim_state`` replay
  exactly; ``split="train"|"test"`` keeps to / holds out about 1 in 5 instruction-colour combinations.
- ``metaworld``: the ten MT10 v3 tasks are listed; every other MetaWorld v3 task is served by its
  id alone (``wmrl/MetaWorld-<name>``, resolved by ``sims.registry.get``); same action (4) and state
  (7) layout; MetaWorld's own scripted policies are the experts.
- ``dm_control``: suite tasks (reacher, manipulator) with their own action/state sizes.

Rendering is offscreen through ``mujoco.Renderer`` with EGL (``MUJOCO_GL=egl`` is set here unless
the user chose a backend), shadows/reflections/multisampling off. Call ``env.close()``.

Experts: ``sims.expert(task_id)`` returns an object with ``reset()`` and
``act(obs, info, env) -> action`` (it may read privileged simulator state through ``env``);
``sims.expert_for(env)`` binds one to an env as a plain ``callable(obs, info) -> action`` that resets
itself at each episode start (``info["step"] == 0``).
"""

from __future__ import annotations

from typing import Any

from sims import _gl  # noqa: F401  (must run before anything imports mujoco)
from sims.registry import OWN_TASKS, TASKS, get, load, register_gym

__all__ = [
    "OWN_TASKS",
    "Expert",
    "expert",
    "expert_for",
    "list_tasks",
    "make",
    "task_info",
    "task_lines",
]

register_gym()


def list_tasks(source: str | None = None) -> list[str]:
    """Every registered task id (optionally of one source: "own", "metaworld", "dm_control")."""
    return [t for t, s in TASKS.items() if source is None or s.source == source]


def task_info(task_id: str) -> dict[str, Any]:
    """Static facts about a task, without building it: source, action_dim, state_dim, max_steps,
    instruction (an example), has_expert."""
    return get(task_id).info()


def make(task_id: str, image_size: int = 64, seed: int | None = None, **kw: Any):
    """Build the (unwrapped) env of ``task_id``.

    ``seed`` seeds the first ``reset()`` that passes none. Extra keywords go to the env: ``render``
    (False: zero images, no renderer; for cheap state-only rollouts), ``max_steps``,
    ``terminate_on_success``, ``camera``; own tasks also take ``split``.
    """
    spec = get(task_id)
    cls = load(spec.entry_point)
    return cls(**spec.kwargs, image_size=image_size, seed=seed, **kw)


class Expert:
    """Protocol of a scripted expert (documentation; experts are duck-typed)."""

    def reset(self) -> None: ...

    def act(self, obs: dict, info: dict, env: Any) -> Any: ...


def expert(task_id: str):
    """A fresh scripted expert for ``task_id``; raises KeyError if the task has none."""
    spec = get(task_id)
    if spec.expert is None:
        raise KeyError(f"task {task_id!r} has no scripted expert")
    return load(spec.expert)(**spec.expert_kwargs)


def expert_for(env: Any):
    """``callable(obs, info) -> action``: the task's expert bound to ``env``."""
    ex = expert(env.unwrapped.task_id)

    def act(obs: dict, info: dict):
        if info.get("step", 1) == 0:
            ex.reset()
        return ex.act(obs, info, env)

    act.expert = ex  # type: ignore[attr-defined]
    return act


def task_lines(all_metaworld: bool = False) -> list[str]:
    """One line per task for ``wmrl tasks vla``: id, source, action_dim, time limit (``N steps``),
    ``expert`` or ``no expert`` (the VLA domain records its demonstrations with the expert), example
    instruction (tab-separated). ``all_metaworld``: also every MetaWorld v3 task outside MT10."""
    from sims.registry import all_task_ids

    ids = all_task_ids() if all_metaworld else list(TASKS)
    specs = [get(t) for t in ids]
    return [
        f"{s.task_id}\t{s.source}\t{s.action_dim}\t{s.max_steps} steps\t"
        f"{'expert' if s.expert else 'no expert'}\t{s.example_instruction}"
        for s in specs
    ]
