"""The VLA domain adapter: GRPO groups of closed-loop robot rollouts, real (MuJoCo) or imagined (WM).

One task = (task id, reset seed, env split). A GRPO group = G rollouts of the policy from that same
initial state and instruction.

- **Anchor groups** are rolled out in the real simulator (sim anchor rollouts), the policy acting on
  rendered frames: a closed loop, so the real rollout is the execution, and its reward goes back in
  ``RolloutBatch.real_rewards`` (``regrade=True``: none does; the anchors' execution jobs re-simulate
  the recorded actions from the seed without rendering and grade them).
- **Other groups** are imagined entirely in the world model: the first frame comes from the
  simulator's reset (the task's initial observation, not an execution), then the policy acts on
  predicted frames.
- ``world_model.predict`` scores *every* rollout the same way: the WM imagines the rollout's own
  action sequence from its own initial observation with every ensemble member; the score is the
  members' mean rollout reward and the variance is their spread. So an anchor's ``(r_hat, r)`` pair
  measures the WM's error on one trajectory.
- ``world_model.update`` trains the WM on the anchor rollouts (and appends them to the LeRobot
  dataset of the run).
- ``twin_anchors``: each anchor group also gets an imagined *twin* group (appended after the
  sampled tasks' groups, its rows standing for the real ones: ``RolloutBatch.real_row``) from the
  same initial observation, whose rollout
  j samples its actions with real rollout j's uniforms (common random numbers, inverse-CDF
  sampling): ``ppi``'s task-level correction ``g_real - λ ĝ_twin`` then has a low variance.

Reward of a rollout: ``0.5 * success + 0.5 * max progress`` (:func:`wmrl_vla.rollout.rollout_reward`).

Batch layout: :mod:`wmrl_vla.batch`. Modules beside this one: :mod:`wmrl_vla.world_model` (the core's
WorldModel over the VLA world model), :mod:`wmrl_vla.latent` (latent imagination and its adapter's
fitting), :mod:`wmrl_vla.media` (videos, tables, GIFs).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.device import module_device
from wmrl.domain import Job, RolloutBatch
from wmrl_vla import latent, media
from wmrl_vla.batch import collate, sim_payload
from wmrl_vla.config import IMAGINE_INPUTS, VLAEvaluation
from wmrl_vla.latent import LatentActor, LatentAdapter
from wmrl_vla.media import save_gif
from wmrl_vla.policy import SmallVLA
from wmrl_vla.rollout import (
    EnvPool,
    SimRollout,
    goal_or_zeros,
    goal_xy,
    lockstep_parts,
    policy_actor,
    replay_reward,
    run_in_lockstep,
)
from wmrl_vla.world_model import VLAWorldModel
from world_models.vla_dynamics import VLADynamics, instruction_ids

TRAIN_SEEDS = (0, 1_000_000)
EVAL_SEEDS = (1_000_000, 2_000_000)
ENV_SPLIT = {"train": "train", "eval": "test", "test": "test"}


@dataclass(frozen=True)
class VLATask:
    task_id: str
    seed: int
    # "train" keeps to the training instruction/colour combinations, "test" holds them out.
    env_split: str = "train"


class VLADomain:
    """See the module docstring."""

    def __init__(
        self,
        policy: SmallVLA,
        world_model: VLAWorldModel,
        tasks: Sequence[str],
        image_size: int,
        temperature: float = 1.0,
        evaluation: VLAEvaluation | None = None,
        regrade: bool = False,
        max_steps: int | None = None,
        out_dir: str | Path | None = None,
        seed: int = 0,
        twin_anchors: bool = False,
        imagine_input: str = "pixels",
        latent_refresh_steps: int = 5,
        bf16_unsupported: str | None = None,
        rollout_lockstep: int | None = None,
    ) -> None:
        import sims

        if imagine_input not in IMAGINE_INPUTS:
            raise ValueError(f"imagine_input={imagine_input!r} is not one of {', '.join(IMAGINE_INPUTS)}")
        if imagine_input == "latent" and not isinstance(policy, SmallVLA):
            raise ValueError(
                f"imagine_input=latent needs the small VLA (its visual features are what the latent "
                f"adapter predicts), not {type(policy).__name__}; use imagine_input=pixels"
            )

        ev = evaluation if evaluation is not None else VLAEvaluation()
        if ev.combos not in ("test", "train"):
            raise ValueError(f"eval_combos={ev.combos!r} is not one of test, train")
        if ev.lockstep < 1:
            raise ValueError(f"eval_lockstep={ev.lockstep} must be >= 1")
        if rollout_lockstep is not None and rollout_lockstep < 1:
            raise ValueError(
                f"rollout_lockstep={rollout_lockstep} must be >= 1 (or None: a step's all at once)"
            )
        if ev.sampled and ev.temperature == temperature:
            raise ValueError(
                f"eval_sampled: the evaluation already samples at temperature {temperature} (eval_temperature)"
            )
        if not tasks:
            raise ValueError("VLADomain needs at least one task")
        for t in tasks:
            sims.task_info(t)  # raises KeyError listing the known tasks
        self.policy = policy
        self.world_model = world_model
        self.tasks = list(tasks)
        self.image_size = image_size
        self.temperature = temperature
        self.evaluation = ev
        self.regrade = regrade
        self.max_steps = max_steps
        self.horizon = {t: max_steps or sims.task_info(t)["max_steps"] for t in self.tasks}
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.twin_anchors = twin_anchors
        # simulated training rollouts at once (None: all of a step's); with a bound, the pool holds
        # at most that many envs or evaluation's eval_lockstep, whichever is larger
        self.rollout_lockstep = rollout_lockstep
        capacity = None if rollout_lockstep is None else max(rollout_lockstep, ev.lockstep)
        self.pool = EnvPool(image_size, max_steps, capacity)
        self.seed = seed
        self.gen = torch.Generator().manual_seed(seed)
        self.n_evals = 0
        self.sim_steps = 0
        self.imagined_steps = 0
        self.imagine_input = imagine_input
        self.latent_refresh_steps = latent_refresh_steps
        self.latent_adapter: LatentAdapter | None = None
        self.latent_optimizer: torch.optim.Optimizer | None = None
        self.latent_metrics: dict[str, float] = {}
        self.bf16_unsupported = bf16_unsupported  # why --precision=bf16 is refused (a lerobot policy)

    def shard_rng(self, rank: int, step: int) -> None:
        """Data-parallel ``generation="shard"`` (wmrl/distributed.py), before each step's generation:
        reseed the sampling generator (policy actions in the simulator and in imagination) from
        ``(seed, step, rank)``; each rank's rollouts are padded to the longest share when gathered."""
        from wmrl.distributed import shard_seed

        self.gen.manual_seed(shard_seed(self.seed, step, rank))

    # ------------------------------------------------------------------ tasks
    def sample_tasks(self, n: int, split: str, generator: torch.Generator) -> list[VLATask]:
        if split not in ENV_SPLIT:
            raise ValueError(f"split={split!r} is not one of {', '.join(ENV_SPLIT)}")
        lo, hi = TRAIN_SEEDS if split == "train" else EVAL_SEEDS
        ids = torch.randint(len(self.tasks), (n,), generator=generator).tolist()
        seeds = torch.randint(lo, hi, (n,), generator=generator).tolist()
        return [VLATask(self.tasks[i], int(s), ENV_SPLIT[split]) for i, s in zip(ids, seeds, strict=True)]

    def _initial_obs(self, task: VLATask) -> tuple[np.ndarray, np.ndarray, str, np.ndarray]:
        """A task's first frame ``[3, H, W]``, state ``[S]``, instruction and goal (``goal_xy``;
        zeros for a task that does not expose it), from the simulator's reset."""
        env = self.pool.get(task.task_id, task.env_split)
        o, info = env.reset(seed=task.seed)
        goal = goal_or_zeros(goal_xy(env))
        self.pool.put(task.task_id, task.env_split, env)
        return (
            np.ascontiguousarray(o["image"].transpose(2, 0, 1)),
            o["state"].astype(np.float32),
            info["instruction"],
            goal,
        )

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self, tasks: Sequence[VLATask], group_size: int, anchor_groups: torch.Tensor
    ) -> RolloutBatch:
        self.policy.eval()
        n_groups = len(tasks)
        if anchor_groups.shape != (n_groups,):
            raise ValueError(f"anchor_groups has shape {tuple(anchor_groups.shape)}, expected ({n_groups},)")
        rollouts: list[dict | None] = [None] * (n_groups * group_size)
        sim_groups = [g for g in range(n_groups) if bool(anchor_groups[g])]
        wm_groups = [g for g in range(n_groups) if not bool(anchor_groups[g])]
        twins = self.twin_anchors and bool(sim_groups)
        noise = None
        if twins:  # common random numbers: [group, rollout, step, action dim] uniforms
            horizon = max(self.horizon[tasks[g].task_id] for g in sim_groups)
            shape = (n_groups, group_size, horizon, self.policy.cfg.action_dim)
            noise = torch.rand(shape, generator=self.gen)
        if sim_groups:
            # per env split, at most rollout_lockstep rollouts in lockstep at a time (a group may
            # straddle two calls: only the order the sampling generator is drawn in changes)
            for split in sorted({tasks[g].env_split for g in sim_groups}):
                sel = [g for g in sim_groups if tasks[g].env_split == split]
                specs = [(tasks[g].task_id, tasks[g].seed) for g in sel for _ in range(group_size)]
                sim = run_in_lockstep(
                    policy_actor(self.policy, self.temperature, self.gen),
                    specs,
                    self.pool,
                    split,
                    self.rollout_lockstep,
                    noise=None if noise is None else noise[sel].flatten(0, 1),
                )
                for k, ep in enumerate(sim):
                    g = sel[k // group_size]
                    self.sim_steps += ep.length
                    rollouts[g * group_size + k % group_size] = sim_payload(ep)
        if wm_groups:
            for k, r in enumerate(self._imagine([tasks[g] for g in wm_groups], group_size)):
                g = wm_groups[k // group_size]
                rollouts[g * group_size + k % group_size] = r
        filled = [r for r in rollouts if r is not None]  # every group is simulated or imagined
        if not twins or noise is None:
            return self._collate(filled, tasks, group_size)
        # an imagined twin of every anchor group: rollout j drawn with real rollout j's uniforms
        twin_noise = noise[sim_groups].flatten(0, 1)
        filled += self._imagine([tasks[g] for g in sim_groups], group_size, noise=twin_noise)
        real_row = torch.tensor(
            [-1] * (n_groups * group_size)
            + [g * group_size + j for g in sim_groups for j in range(group_size)]
        )
        return self._collate(filled, [*tasks, *(tasks[g] for g in sim_groups)], group_size, real_row)

    def _imagine(
        self, tasks: Sequence[VLATask], group_size: int, noise: torch.Tensor | None = None
    ) -> list[dict]:
        """Roll ``group_size`` copies of each task forward together in the world model; ``noise``
        ``[len(tasks) * group_size, T, A]``: each rollout's sampling uniforms (else the generator)."""
        inits = [self._initial_obs(t) for t in tasks]
        imgs = torch.from_numpy(np.stack([i[0] for i in inits])).repeat_interleave(group_size, 0)
        sts = torch.from_numpy(np.stack([i[1] for i in inits])).repeat_interleave(group_size, 0)
        instrs = [i[2] for i in inits for _ in range(group_size)]
        instr_ids = self.policy.tokenizer.encode(instrs)
        wm_instr = instruction_ids(instrs)
        goals = torch.from_numpy(np.stack([i[3] for i in inits])).repeat_interleave(group_size, 0)
        horizon = max(self.horizon[t.task_id] for t in tasks)
        limits = torch.tensor([self.horizon[t.task_id] for t in tasks]).repeat_interleave(group_size)
        latent = self.imagine_input == "latent"
        wm: VLADynamics = self.world_model.model
        wm.eval()
        chains: torch.Tensor | None = None  # a chain policy's denoising chains (pixel imagination)
        every = getattr(self.policy, "act_steps", 1)  # env steps a decision's chunk covers, open loop
        if latent:  # the policy reads the WM latent through the adapter: no frame decoded
            if self.latent_adapter is None:
                raise RuntimeError("imagine_input=latent: fit_latent_adapter() must run before imagining")
            dev = module_device(self.policy)
            f0 = self.policy.visual_features(  # each task's real first frame, encoded once
                torch.from_numpy(np.stack([i[0] for i in inits])).to(dev),
                self.policy.tokenizer.encode([i[2] for i in inits]).to(dev),
            ).repeat_interleave(group_size, 0)
            actor = LatentActor(
                self.policy, self.latent_adapter, instr_ids, self.temperature, self.gen, f0=f0, noise=noise
            )
            out = wm.imagine(imgs, sts, actor, horizon, generator=self.gen, observe="latents", instr=wm_instr,
                             goal=goals)  # fmt: skip
            bins, lps, feats = actor.stacked()  # [B, T', A], [B, T', A], [B, T', F]
        else:
            rec_bins, rec_lp = [], []
            rec_chains: list[torch.Tensor] = []
            still = self.imagine_input == "first_frame"  # the first frame throughout, none decoded
            chained = getattr(self.policy, "records_chain", False)
            sample: Callable[..., tuple[torch.Tensor, ...]] = getattr(
                self.policy, "act_with_chain" if chained else "act"
            )

            plan: list[torch.Tensor] = []  # the decision's chunk [B, k, A]

            def act(seen: torch.Tensor, states: torch.Tensor, t: int) -> torch.Tensor:
                if t % every:  # mid-chunk: the decision's next action, as the simulator executes it
                    return plan[0][:, t % every]
                kw = {} if noise is None else {"noise": noise[:, t]}
                frames = imgs if still else seen
                bins, lp, a, *chain = sample(frames, states, instr_ids, self.temperature, self.gen, **kw)
                rec_bins.append(bins)
                rec_lp.append(lp)
                rec_chains.extend(chain)
                plan[:] = [a if a.dim() == 3 else a[:, None]]
                return plan[0][:, 0]

            out = wm.imagine(imgs, sts, act, horizon, generator=self.gen, instr=wm_instr, goal=goals,
                             observe="latents" if still else "frames")  # fmt: skip
            bins = torch.stack(rec_bins, 1)  # [B, D, A], D decisions: T' / every, rounded up
            lps = torch.stack(rec_lp, 1)
            chains = torch.stack(rec_chains, 1) if rec_chains else None  # [B, D, K+1, H, A]
        res = []
        lengths = []
        for i in range(imgs.shape[0]):
            n = int(out["mask"][i].sum().item())
            n = max(1, min(n, int(limits[i])))
            lengths.append(n)
            self.imagined_steps += n
            d, nd = slice(0, n, every), -(-n // every)  # the decisions' steps, as a sim rollout keeps them
            r = {
                "kind": "imagined",
                "task_id": tasks[i // group_size].task_id,
                "seed": tasks[i // group_size].seed,
                "instruction": instrs[i],
                "images": out["images"][i, d].numpy(),
                "states": out["states"][i, d].numpy(),
                "actions": out["actions"][i, d].numpy(),
                "bins": bins[i, :nd].numpy(),
                "logprobs": lps[i, :nd].numpy(),
                "reward": float("nan"),  # unknown: never executed
                "success": float("nan"),
                "goal": goals[i].numpy(),
                "rollout": None,
            }
            if every > 1:  # the chunks' every action, which the world model scores
                r["executed_actions"] = out["actions"][i, :n].numpy()
            if latent:  # no frame but the first was decoded: keep what the policy read instead
                r["features"] = feats[i, :n]
                r["latents"] = out["latents"][i, :n]
            elif chains is not None:
                r["chains"] = chains[i, :nd].numpy()
            res.append(r)
        if latent and self.latent_refresh_steps > 0:
            self.refresh_latent_adapter(imgs, out["latents"], f0, instr_ids, lengths)
        return res

    # ------------------------------------------------------------------ latent imagination
    def fit_latent_adapter(
        self, n_tasks: int = 48, group_size: int = 4, steps: int = 500
    ) -> dict[str, float]:
        """Distill a new latent adapter (:func:`wmrl_vla.latent.fit_latent_adapter`) on ``n_tasks``
        training tasks x ``group_size`` rollouts imagined over the whole horizon; returns its fit
        (also logged with every step's metrics)."""
        gen = torch.Generator().manual_seed(self.seed + 4242)
        tasks = self.sample_tasks(n_tasks, "train", gen)
        inits = [self._initial_obs(t) for t in tasks]
        self.latent_adapter, self.latent_optimizer, stats = latent.fit_latent_adapter(
            self.policy,
            self.world_model.model,
            torch.from_numpy(np.stack([i[0] for i in inits])).repeat_interleave(group_size, 0),
            torch.from_numpy(np.stack([i[1] for i in inits])).repeat_interleave(group_size, 0),
            [i[2] for i in inits for _ in range(group_size)],
            torch.from_numpy(np.stack([i[3] for i in inits])).repeat_interleave(group_size, 0),
            torch.tensor([self.horizon[t.task_id] for t in tasks]).repeat_interleave(group_size),
            group_size,
            self.temperature,
            gen,
            steps,
        )
        self.latent_metrics = stats
        return dict(stats)

    def refresh_latent_adapter(
        self,
        imgs: torch.Tensor,
        latents: torch.Tensor,
        f0: torch.Tensor,
        instr: torch.Tensor,
        lengths: list[int],
    ) -> None:
        """``latent_refresh_steps`` distillation steps on latents of the batch just imagined
        (:func:`wmrl_vla.latent.refresh_latent_adapter`); logs ``latent/refresh_loss``."""
        assert self.latent_adapter is not None and self.latent_optimizer is not None  # imagine_input=latent
        self.latent_metrics["latent/refresh_loss"] = latent.refresh_latent_adapter(
            self.latent_adapter,
            self.latent_optimizer,
            self.policy,
            self.world_model.model,
            imgs,
            latents,
            f0,
            instr,
            lengths,
            self.latent_refresh_steps,
            self.gen,
        )

    def _collate(
        self,
        rollouts: list[dict],
        tasks: Sequence[VLATask],
        group_size: int,
        real_row: torch.Tensor | None = None,
    ) -> RolloutBatch:
        # the simulator's rewards of the anchor rollouts (NaN on imagined ones): the closed loop
        real_rewards = None if self.regrade else torch.tensor([float(r["reward"]) for r in rollouts])
        tokenizer = self.policy.tokenizer
        return collate(rollouts, tasks, group_size, self.image_size, tokenizer, real_row, real_rewards)

    # ------------------------------------------------------------------ media
    def rollout_media(
        self, batch: RolloutBatch, predicted: torch.Tensor | None, true: torch.Tensor, scale: int = 4
    ) -> dict:
        """wandb media of a step (:func:`wmrl_vla.media.rollout_media`)."""
        return media.rollout_media(self.world_model.model, batch, predicted, true, scale)

    def real_vs_imagined(self, r: SimRollout) -> np.ndarray:
        """The real rollout ``r`` | the WM replaying its actions | the policy in the WM, side by side
        (:func:`wmrl_vla.media.real_vs_imagined`, at the evaluation temperature)."""
        return media.real_vs_imagined(
            self.world_model.model, self.policy, r, self.horizon[r.task_id], self.evaluation.temperature
        )

    # ------------------------------------------------------------------ execution
    def execution_jobs(self, batch: RolloutBatch, indices: Sequence[int]) -> list[Job]:
        """A second real execution of sim rollouts ``indices``: their recorded actions re-simulated
        from the seed, without rendering (the trainer asks for it with ``regrade=True`` only; else
        the rewards recorded in the closed loop, ``RolloutBatch.real_rewards``, are the true ones)."""
        jobs = []
        for i in indices:
            p = batch.payload[int(i)]
            if p["kind"] != "sim":
                raise ValueError(
                    f"rollout {int(i)} was imagined, not rolled out in the simulator: only anchor groups "
                    "(passed to generate as anchor_groups) can be executed"
                )
            task = batch.tasks[int(batch.group_ids[int(i)])]
            args = (p["task_id"], p["seed"], task.env_split, p["actions"], self.max_steps)
            jobs.append(Job(replay_reward, args))
        return jobs

    def oracle_rewards(self, batch: RolloutBatch) -> torch.Tensor | None:
        return None

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, split: str = "eval") -> dict[str, float]:
        """Success rate in MuJoCo on held-out seeds, on held-out instruction/colour combinations (on
        the training ones with ``eval_combos="train"``); ``split="train"``: training seeds and
        combinations. The policy acts at ``eval_temperature`` (0: each action dimension's most likely
        bin); with ``eval_sampled`` the same episodes are run again with the policy sampled at the
        training ``temperature`` (the policy GRPO trains), reported as ``success_sampled``,
        ``reward_sampled`` and ``success_sampled/<task>``."""
        self.policy.eval()
        lo, _ = EVAL_SEEDS if split != "train" else TRAIN_SEEDS
        env_split = ENV_SPLIT["train"] if split == "train" else self.evaluation.combos
        specs = [(t, lo + 7919 * k) for t in self.tasks for k in range(self.evaluation.episodes_per_task)]
        film = set()  # indices of the filmed episodes
        if self.out_dir is not None and self.evaluation.n_videos > 0:
            n = self.evaluation.n_videos
            film = set(range(0, len(specs), max(1, len(specs) // n))[:n])
        rows, videos = self._run_evaluation(specs, env_split, self.evaluation.temperature, film)
        out = self._evaluation_scores(rows, "")
        # training cost so far (evaluation episodes not counted)
        out |= {"sim_steps_train": float(self.sim_steps), "imagined_steps_train": float(self.imagined_steps)}
        if self.evaluation.sampled:
            out |= self._evaluation_scores(
                self._run_evaluation(specs, env_split, self.temperature, set())[0], "_sampled"
            )
        if videos and self.out_dir is not None:
            vdir = self.out_dir / "videos"
            vdir.mkdir(parents=True, exist_ok=True)
            for k, r in enumerate(videos):
                ok = "success" if r.success.max() > 0 else "fail"
                stem = f"eval{self.n_evals:03d}_{k}_{r.task_id.split('/')[-1]}"
                save_gif(r.images, vdir / f"{stem}_{ok}.gif")
                save_gif(self.real_vs_imagined(r), vdir / f"{stem}_real_vs_imagined.gif")
        self.n_evals += 1
        return out

    def _run_evaluation(
        self, specs: list[tuple[str, int]], env_split: str, temperature: float, film: set[int]
    ) -> tuple[list[tuple[str, float, float, float]], list]:
        """The episodes ``specs`` with the policy at ``temperature`` (its sampling seeded alike on
        every call), at most ``eval_lockstep`` at a time (each an env and a renderer): per episode
        ``(task, success, reward, length)``, and the episodes of the indices in ``film`` (frames kept
        for those only)."""
        actor = policy_actor(self.policy, temperature, torch.Generator().manual_seed(12345))
        rows, videos = [], []
        episodes = itertools.chain.from_iterable(
            lockstep_parts(actor, specs, self.pool, env_split, self.evaluation.lockstep)
        )  # each part's frames dropped as the next runs, but the films'
        for k, r in enumerate(episodes):
            rows.append((r.task_id, float(r.success.max()), float(r.reward), float(r.length)))
            if k in film:
                videos.append(r)
        return rows, videos

    def _evaluation_scores(
        self, rows: list[tuple[str, float, float, float]], suffix: str
    ) -> dict[str, float]:
        """``success``, ``reward``, ``episode_length`` and ``success/<task>`` of ``rows``, each key
        with ``suffix`` after its first word."""
        task_ids, success, reward, length = zip(*rows, strict=True)
        out = {
            f"success{suffix}": float(np.mean(success)),
            f"reward{suffix}": float(np.mean(reward)),
            f"episode_length{suffix}": float(np.mean(length)),
        }
        for t in self.tasks:
            out[f"success{suffix}/{t.split('/')[-1]}"] = float(
                np.mean([s for tid, s in zip(task_ids, success, strict=True) if tid == t])
            )
        return out

    def step_metrics(self) -> dict[str, float]:
        """Real simulator steps taken by training rollouts so far (logged as ``domain/sim_steps``),
        and with ``imagine_input=latent`` the latent adapter's fit (:meth:`fit_latent_adapter`)."""
        return {"sim_steps": float(self.sim_steps), **self.latent_metrics}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "world_model": self.world_model.state_dict(),
            "gen": self.gen.get_state(),
            "n_evals": self.n_evals,
            "sim_steps": self.sim_steps,
            "imagined_steps": self.imagined_steps,
            **(
                {
                    "latent_adapter": self.latent_adapter.state_dict(),
                    "latent_optimizer": self.latent_optimizer.state_dict(),
                }
                if self.latent_adapter is not None and self.latent_optimizer is not None
                else {}
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.world_model.load_state_dict(state["world_model"])
        self.gen.set_state(state["gen"])
        self.n_evals = int(state["n_evals"])
        self.sim_steps = int(state["sim_steps"])
        self.imagined_steps = int(state["imagined_steps"])
        if "latent_adapter" in state:
            if self.latent_adapter is None or self.latent_optimizer is None:
                raise ValueError("the checkpoint holds a latent adapter but this run imagines on pixels")
            self.latent_adapter.load_state_dict(state["latent_adapter"])
            self.latent_optimizer.load_state_dict(state["latent_optimizer"])

    def close(self) -> None:
        try:
            self.world_model.close()
        finally:
            self.pool.close()
