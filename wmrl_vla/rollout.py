"""Real-simulator rollouts of a policy: many MuJoCo envs stepped in lockstep, the policy batched.

Also the rollout reward (shared with the world model's score, :func:`world_models.vla_dynamics.
rollout_score`) and the re-simulation grader used as a real execution job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SUCCESS_WEIGHT = 0.5


@dataclass
class SimRollout:
    """One episode. ``T`` steps; frames and states include the observation after the last action.

    ``bins``, ``logprobs`` and ``chains`` are per *decision* (one policy call): per step (``D = T``)
    in closed loop, or, for a policy that executes a chunk of actions open loop, one per chunk, made
    at env steps ``decision_steps`` (``D <= T``)."""

    task_id: str
    seed: int
    instruction: str
    images: np.ndarray  # [T+1, 3, H, W] uint8
    states: np.ndarray  # [T+1, S] float32
    actions: np.ndarray  # [T, A] float32 (bin centres for a discrete policy)
    bins: np.ndarray  # [D, A] int64 (action tokens; zeros for an expert)
    logprobs: np.ndarray  # [D, A] float32
    progress: np.ndarray  # [T] reward after each action (1 once succeeded)
    success: np.ndarray  # [T] float32, 0/1
    goal: np.ndarray | None = None  # [2] the named object's table xy at reset (goal_xy)
    # [D, K+1, H, A] float32: a chain policy's denoising chains (wmrl_vla.diffusion_bridge), else None
    chains: np.ndarray | None = None
    # [D] int64: the env step at which each decision was made, for a policy that executes chunks open
    # loop (the actor returned actions [B, k, A]); None: closed loop, one decision per step (D = T)
    decision_steps: np.ndarray | None = None

    @property
    def length(self) -> int:
        return len(self.actions)

    @property
    def reward(self) -> float:
        return rollout_reward(self.progress, self.success)

    def as_record(self) -> dict:
        """The LeRobot-style record of this episode (frames before each action)."""
        return {
            "observation.image": self.images[:-1].transpose(0, 2, 3, 1),
            "observation.state": self.states[:-1],
            "action": self.actions,
            "next.reward": self.progress,
            "next.success": self.success.astype(bool),
            "instruction": self.instruction,
            "task": self.instruction,
        }

    def as_episode(self) -> dict:
        """The world model's episode format (all frames)."""
        return {
            "images": self.images,
            "states": self.states,
            "actions": self.actions,
            "progress": self.progress,
            "success": self.success,
            "instruction": self.instruction,
            **({} if self.goal is None else {"goal": self.goal}),
        }


def goal_position(env) -> np.ndarray | None:
    """The named object's world position (metres, ``[3]`` float64) in an env's current episode: the
    first entry of our tabletop tasks' ``privileged()`` (the target disc, the button cap, the puck,
    the cube), as the simulator placed it at reset. None for envs without that interface."""
    u = getattr(env, "unwrapped", env)
    try:
        return np.asarray(next(iter(u.privileged().values())), dtype=float)[:3].copy()
    except (AttributeError, StopIteration):
        return None


def goal_xy(env) -> np.ndarray | None:
    """The table xy (``[2]`` float32) of :func:`goal_position`; None where it is None."""
    pos = goal_position(env)
    return None if pos is None else pos[:2].astype(np.float32)


def goal_or_zeros(goal: np.ndarray | None) -> np.ndarray:
    """A :func:`goal_xy`, or zeros ``[2]`` where the task does not expose one (dm_control, MetaWorld):
    a grounded world model then has the state and the instruction alone to go on."""
    return np.zeros(2, np.float32) if goal is None else np.asarray(goal, np.float32)


def rollout_reward(progress: np.ndarray, success: np.ndarray) -> float:
    """``0.5 * succeeded + 0.5 * max progress``, in [0, 1]. Same formula as the WM's score."""
    if len(progress) == 0:
        return 0.0
    return float(SUCCESS_WEIGHT * np.max(success) + (1 - SUCCESS_WEIGHT) * np.max(progress))


class EnvPool:
    """Reusable envs per (task, split): building a model and a renderer costs more than a reset.

    Envs of a task whose ``split`` changes nothing (MetaWorld, dm_control, lerobot's MetaWorld:
    ``TaskSpec.splits_combos`` false) are shared by every split, so training and evaluation reuse
    the same ones. ``capacity`` bounds the envs alive (lent and idle): building one past it first
    closes the longest-idle env of another (task, split), so a run that asks for at most
    ``capacity`` at once never holds more. None: the bound is the most envs lent at once so far (a
    step's simulated rollouts, an evaluation's lockstep), so envs idle under one (task, split) make
    room for another's instead of piling up per key (each env holds its model and renderer: about
    0.16 GB for lerobot's MetaWorld, benchmarks/results/metaworld_env_memory.json; 0.02 GB for our
    own tasks at 64 px, benchmarks/results/vla_step_memory.json). An env's episode depends on its
    reset seed alone, so which env serves a rollout changes no result.
    """

    def __init__(self, image_size: int, max_steps: int | None = None, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"EnvPool capacity={capacity} must be >= 1 (or None: no bound)")
        self.image_size = image_size
        self.max_steps = max_steps
        self.capacity = capacity
        self.live = 0  # envs built and not yet closed
        self.most_lent = 0  # the most envs lent at once so far (the bound where capacity is None)
        self._idle: list[tuple[tuple[str, str], Any]] = []  # (key, env), longest idle first

    @staticmethod
    def key(task_id: str, split: str) -> tuple[str, str]:
        """Which envs can stand for each other: ``(task_id, split)``, the split ``"all"`` where it
        changes nothing."""
        from sims.registry import get

        return (task_id, split if get(task_id).splits_combos else "all")

    def get(self, task_id: str, split: str):
        key = self.key(task_id, split)
        for i in range(len(self._idle) - 1, -1, -1):  # the most recently returned of its key
            if self._idle[i][0] == key:
                return self._idle.pop(i)[1]
        self.most_lent = max(self.most_lent, self.live - len(self._idle) + 1)  # with this one
        bound = self.most_lent if self.capacity is None else self.capacity
        if self.live >= bound:
            if not self._idle:
                raise RuntimeError(
                    f"EnvPool: all {self.live} envs of its capacity are in use; ask for at most {self.capacity} at once"
                )
            self._idle.pop(0)[1].close()
            self.live -= 1
        import sims

        kwargs = {"split": key[1]}
        if self.max_steps is not None:
            kwargs["max_steps"] = self.max_steps
        env = sims.make(task_id, image_size=self.image_size, **kwargs)
        self.live += 1
        return env

    def put(self, task_id: str, split: str, env) -> None:
        self._idle.append((self.key(task_id, split), env))

    def close(self) -> None:
        for _, e in self._idle:
            e.close()
        self.live -= len(self._idle)
        self._idle.clear()


def _chw(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))


#: ``actor(images, states, instructions)``, or with ``noise=`` (per-row uniforms ``[B, A]``) when
#: :func:`run_episodes` is given common random numbers: ``(bins, logprobs, actions)``, plus the
#: denoising chains ``[B, K+1, H, A]`` for a chain policy (``policy.records_chain``); ``actions``
#: ``[B, A]`` (one step) or ``[B, k, A]`` (a chunk of ``k`` steps executed open loop).
Actor = Callable[..., tuple[torch.Tensor, ...]]


def run_episodes(
    actor: Actor,
    specs: Sequence[tuple[str, int]],
    pool: EnvPool,
    split: str = "train",
    noise: torch.Tensor | None = None,
) -> list[SimRollout]:
    """Roll out ``actor`` in the real simulator from each ``(task_id, seed)``, all in lockstep.

    ``actor(images [B, 3, H, W] uint8, states [B, S], instructions) -> (bins [B, A], logprobs
    [B, A], actions [B, A])`` (+ ``chains [B, K+1, H, A]``, kept as ``SimRollout.chains``). Episodes
    end at success (terminated) or the time limit. ``actions [B, k, A]`` instead: each row's ``k``
    actions are executed open loop (an episode that ends mid-chunk drops the rest) before the actor
    is called again, one decision per chunk (``SimRollout.decision_steps``). ``noise``
    ``[len(specs), T, A]`` (T at least the longest episode): episode i's sampling uniforms at
    decision t (step t in closed loop), passed to the actor as ``noise=`` (common random numbers
    with an imagined twin).
    """
    envs, obs, instrs, goals = [], [], [], []
    for task_id, seed in specs:
        env = pool.get(task_id, split)
        o, info = env.reset(seed=int(seed))
        envs.append(env)
        obs.append(o)
        instrs.append(info["instruction"])
        goals.append(goal_xy(env))
    n = len(specs)
    rec = [
        {
            "images": [_chw(o["image"])],
            "states": [o["state"]],
            "actions": [],
            "bins": [],
            "lp": [],
            "p": [],
            "s": [],
            "chains": [],
            "decisions": [],
        }
        for o in obs
    ]
    alive = list(range(n))
    t = 0
    chunked = False  # the actor returns chunks of actions [B, k, A], executed open loop
    while alive:
        imgs = torch.from_numpy(np.stack([rec[i]["images"][-1] for i in alive]))
        sts = torch.from_numpy(np.stack([rec[i]["states"][-1] for i in alive]).astype(np.float32))
        kw = {} if noise is None else {"noise": noise[alive, t]}
        bins, lps, acts, *chains = actor(imgs, sts, [instrs[i] for i in alive], **kw)
        t += 1
        chunked = acts.dim() == 3
        plan = acts if chunked else acts[:, None]  # [B, k, A]
        for j, i in enumerate(alive):  # one decision per actor call
            rc = rec[i]
            rc["decisions"].append(len(rc["actions"]))
            rc["bins"].append(bins[j].numpy())
            rc["lp"].append(lps[j].numpy())
            if chains:
                rc["chains"].append(chains[0][j].numpy())
        live = list(enumerate(alive))  # (the actor's row, the episode) still running
        for p in range(plan.shape[1]):
            still = []
            for j, i in live:
                a = plan[j, p].numpy().astype(np.float32)
                o, r, term, trunc, info = envs[i].step(a)
                rc = rec[i]
                rc["actions"].append(a)
                rc["p"].append(float(r))
                rc["s"].append(float(info["success"]))
                rc["images"].append(_chw(o["image"]))
                rc["states"].append(o["state"])
                if not (term or trunc):
                    still.append((j, i))
            live = still
        alive = [i for _, i in live]
    out = []
    for (task_id, seed), rc, instr, env, goal in zip(specs, rec, instrs, envs, goals, strict=True):
        pool.put(task_id, split, env)
        out.append(
            SimRollout(
                task_id=task_id,
                seed=int(seed),
                instruction=instr,
                images=np.stack(rc["images"]).astype(np.uint8),
                states=np.stack(rc["states"]).astype(np.float32),
                actions=np.stack(rc["actions"]).astype(np.float32),
                bins=np.stack(rc["bins"]).astype(np.int64),
                logprobs=np.stack(rc["lp"]).astype(np.float32),
                progress=np.array(rc["p"], np.float32),
                success=np.array(rc["s"], np.float32),
                goal=goal,
                chains=np.stack(rc["chains"]).astype(np.float32) if rc["chains"] else None,
                decision_steps=np.array(rc["decisions"], np.int64) if chunked else None,
            )
        )
    return out


def lockstep_parts(
    actor: Actor,
    specs: Sequence[tuple[str, int]],
    pool: EnvPool,
    split: str,
    lockstep: int | None = None,
    noise: torch.Tensor | None = None,
) -> Iterator[list[SimRollout]]:
    """:func:`run_episodes` over ``specs``, at most ``lockstep`` episodes (an env each) at a time, in
    order (None: all of them in one call), yielding each call's rollouts as it ends (a caller may
    drop their frames before the next); ``noise`` ``[len(specs), T, A]`` is sliced alike."""
    size = lockstep or max(1, len(specs))
    for first in range(0, len(specs), size):
        part = None if noise is None else noise[first : first + size]
        yield run_episodes(actor, specs[first : first + size], pool, split, noise=part)


def run_in_lockstep(
    actor: Actor,
    specs: Sequence[tuple[str, int]],
    pool: EnvPool,
    split: str,
    lockstep: int | None = None,
    noise: torch.Tensor | None = None,
) -> list[SimRollout]:
    """Every rollout of :func:`lockstep_parts`, in the order of ``specs``."""
    return [r for part in lockstep_parts(actor, specs, pool, split, lockstep, noise) for r in part]


def policy_actor(policy, temperature: float, generator: torch.Generator | None = None) -> Actor:
    """Wrap a policy (:class:`~wmrl_vla.policy.SmallVLA`, a bridge) as an actor (instructions tokenised
    per call); a chain policy's actor also returns its chains (``act_with_chain``)."""
    sample = policy.act_with_chain if getattr(policy, "records_chain", False) else policy.act

    @torch.no_grad()
    def act(images, states, instructions, noise=None):
        instr = policy.tokenizer.encode(instructions)
        kw = {} if noise is None else {"noise": noise}
        return sample(images, states, instr, temperature=temperature, generator=generator, **kw)

    return act


def replay(
    task_id: str, seed: int, split: str, actions: np.ndarray, max_steps: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Re-simulate a recorded action sequence from its seed (no rendering): ``(progress, success)``,
    each ``[T']`` per step, ``T' <= len(actions)`` (the episode may end first). MuJoCo is
    deterministic, so these are the values recorded while the rollout was generated."""
    import sims

    kwargs = {"split": split, "render": False}
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    env = sims.make(task_id, **kwargs)
    try:
        env.reset(seed=int(seed))
        prog, succ = [], []
        for a in np.asarray(actions, dtype=np.float32):
            _, r, term, trunc, info = env.step(a)
            prog.append(r)
            succ.append(float(info["success"]))
            if term or trunc:
                break
    finally:
        env.close()
    return np.array(prog), np.array(succ)


def replay_reward(
    task_id: str, seed: int, split: str, actions: np.ndarray, max_steps: int | None = None
) -> float:
    """:func:`replay`, graded: a real execution, picklable for an executor; equal to the reward
    recorded while the rollout was generated."""
    return rollout_reward(*replay(task_id, seed, split, actions, max_steps))


def run_expert_episodes(
    specs: Sequence[tuple[str, int]],
    pool: EnvPool,
    split: str = "train",
    action_noise: float = 0.0,
    rng: np.random.Generator | None = None,
) -> list[SimRollout]:
    """Scripted-expert episodes from each ``(task_id, seed)`` (envs stepped one by one). With
    ``action_noise`` > 0, Gaussian noise of that std (from ``rng``) is added to every expert action
    before clipping to [-1, 1]; the executed action is the one recorded."""
    import sims

    if action_noise > 0 and rng is None:
        raise ValueError("action_noise > 0 needs an rng")

    out = []
    for task_id, seed in specs:
        env = pool.get(task_id, split)
        ex = sims.expert(task_id)
        ex.reset()
        o, info = env.reset(seed=int(seed))
        imgs, sts, acts, prog, succ = [_chw(o["image"])], [o["state"]], [], [], []
        while True:
            a = np.asarray(ex.act(o, info, env), dtype=np.float32)
            if action_noise > 0:
                a = a + action_noise * rng.standard_normal(a.shape).astype(np.float32)  # type: ignore[union-attr]
            a = np.clip(a, -1, 1)
            o, r, term, trunc, info = env.step(a)
            acts.append(a)
            prog.append(float(r))
            succ.append(float(info["success"]))
            imgs.append(_chw(o["image"]))
            sts.append(o["state"])
            if term or trunc:
                break
        pool.put(task_id, split, env)
        t = len(acts)
        out.append(
            SimRollout(
                task_id,
                int(seed),
                info["instruction"],
                np.stack(imgs),
                np.stack(sts).astype(np.float32),
                np.stack(acts),
                np.zeros((t, len(a)), np.int64),
                np.zeros((t, len(a)), np.float32),
                np.array(prog, np.float32),
                np.array(succ, np.float32),
            )
        )
    return out


def to_frames(r: SimRollout) -> list[tuple]:
    """A rollout as :func:`wmrl_vla.data.append_episodes` frames (plus the final observation)."""
    frames = [
        (
            {"image": r.images[t].transpose(1, 2, 0), "state": r.states[t]},
            r.actions[t],
            float(r.progress[t]),
            bool(r.success[t]),
            r.instruction,
        )
        for t in range(r.length)
    ]
    frames.append(
        ({"image": r.images[-1].transpose(1, 2, 0), "state": r.states[-1]}, None, None, None, r.instruction)
    )
    return frames
