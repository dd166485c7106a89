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

Batch layout (``T`` = longest rollout in steps, ``A`` = action dims; tokens step-major):
``tokens``/``logprobs``/``mask`` ``[N, T*A]``; ``extras``: ``images`` ``[N, T, 3, H, W]`` uint8 (the
frames the policy saw), ``states`` ``[N, T, S]``, ``instr`` ``[N, L]``, ``actions`` ``[N, T, A]``,
``step_mask`` ``[N, T]``, ``init_images`` ``[N, 3, H, W]``, ``init_states`` ``[N, S]``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wmrl.domain import Job, Prediction, RolloutBatch
from wmrl_vla.config import IMAGINE_INPUTS
from wmrl_vla.latent import LatentActor, LatentAdapter, distill, distill_loss, encoder_targets
from wmrl_vla.policy import SmallVLA
from wmrl_vla.rollout import (
    EnvPool,
    SimRollout,
    goal_or_zeros,
    goal_xy,
    policy_actor,
    replay_reward,
    run_episodes,
)
from world_models.vla_dynamics import (
    VLADynamics,
    calibration_stats,
    fit_variance_calibration,
    instruction_ids,
    rollout_score,
    train_dynamics,
)

TRAIN_SEEDS = (0, 1_000_000)
EVAL_SEEDS = (1_000_000, 2_000_000)
ENV_SPLIT = {"train": "train", "eval": "test", "test": "test"}

# Latents (rollout steps) decoded per refresh of the latent adapter after an imagined batch.
LATENT_REFRESH_SAMPLES = 64
# Distillation steps between two held-out checks when the adapter is first fitted.
LATENT_CHECK_EVERY = 50


@dataclass(frozen=True)
class VLATask:
    task_id: str
    seed: int
    # "train" keeps to the training instruction/colour combinations, "test" holds them out.
    env_split: str = "train"


class VLAWorldModel:
    """The core's WorldModel interface over :class:`VLADynamics`, with online refinement and a
    calibrated variance.

    ``predict``'s variance is ``var_scale * (ensemble variance) + var_floor``
    (:func:`~world_models.vla_dynamics.fit_variance_calibration`): fitted first on held-out real
    episodes at pretraining (``calibration``), then refitted at every ``update`` on the last
    ``calib_window`` anchor pairs, each scored by the WM *before* it trains on them (held out). The
    z^2 of each step's anchors under the calibration fitted before them is logged
    (``wm/z2_raw``, ``wm/z2``).
    """

    def __init__(
        self,
        model: VLADynamics,
        episodes: list[dict],
        update_steps: int = 20,
        batch_size: int = 32,
        horizon: int = 8,
        state_horizon: int = 50,
        lr: float = 3e-4,
        max_episodes: int = 2000,
        dataset: tuple[str, str] | None = None,
        seed: int = 0,
        calibration: tuple[float, float] = (1.0, 0.0),
        calibrate: bool = True,
        calib_window: int = 256,
    ) -> None:
        self.model = model
        self.var_scale, self.var_floor = (float(c) for c in calibration)
        self.calibrate = calibrate
        self.calib_window = calib_window
        self.calib_pairs: list[tuple[float, float]] = []  # (squared error, raw variance) of anchors
        self.episodes = list(episodes)  # replay: demos, then anchor rollouts
        self.update_steps = update_steps
        self.batch_size = batch_size
        self.horizon = horizon
        self.state_horizon = state_horizon
        self.max_episodes = max_episodes
        self.dataset = dataset  # (root, repo_id) of the LeRobot dataset anchor rollouts go to
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.n_updates = 0
        self.seed = seed

    @torch.no_grad()
    def raw_predict(self, batch: RolloutBatch) -> Prediction:
        """The members' mean rollout score and their (uncalibrated) variance ``[N]``."""
        ex = batch.extras
        prog, succ = self.model.score_actions(
            ex["init_images"],
            ex["init_states"],
            ex["actions"],
            ex["step_mask"].float(),
            ex["wm_instr"],
            ex["wm_goal"],
        )  # [K, N, T]
        scores = rollout_score(prog.cpu(), succ.cpu())  # [K, N]
        var = scores.var(0, unbiased=False) if scores.shape[0] > 1 else None
        return Prediction(mean=scores.mean(0), var=var)

    def predict(self, batch: RolloutBatch) -> Prediction:
        pred = self.raw_predict(batch)
        if pred.var is None:
            return pred
        return Prediction(mean=pred.mean, var=self.var_scale * pred.var + self.var_floor)

    def _calibrate(
        self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor
    ) -> dict[str, float]:
        """Score the new anchors (held out: the WM has not trained on them), log their z^2 under the
        calibration so far, add them to the window and refit."""
        pred = self.raw_predict(batch.select(indices))
        if pred.var is None:
            return {}
        sq = ((pred.mean - rewards.float().cpu()) ** 2).numpy()
        var = pred.var.numpy()
        out = {
            "z2_raw": calibration_stats(sq, var)["z2_mean"],
            "z2": calibration_stats(sq, var, self.var_scale, self.var_floor)["z2_mean"],
        }
        self.calib_pairs = (self.calib_pairs + list(zip(sq.tolist(), var.tolist(), strict=True)))[
            -self.calib_window :
        ]
        pairs = np.asarray(self.calib_pairs)
        self.var_scale, self.var_floor = fit_variance_calibration(pairs[:, 0], pairs[:, 1])
        return {**out, "var_scale": self.var_scale, "var_floor": self.var_floor}

    def update(self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        new = [batch.payload[int(i)]["rollout"] for i in indices]
        new = [r for r in new if r is not None]
        if not new:
            return {}
        calib = self._calibrate(batch, indices, rewards) if self.calibrate else {}
        self.episodes.extend(r.as_episode() for r in new)
        if len(self.episodes) > self.max_episodes:
            self.episodes = self.episodes[-self.max_episodes :]
        if self.dataset is not None:
            from wmrl_vla.data import append_episodes

            root, repo_id = self.dataset
            append_episodes(
                root, repo_id, [to_frames(r) for r in new], [r.task_id for r in new], [r.seed for r in new]
            )
        self.model.train()
        _, hist = train_dynamics(
            self.model,
            self.episodes,
            self.update_steps,
            self.batch_size,
            self.horizon,
            seed=self.seed + self.n_updates,
            optimizer=self.optimizer,
            state_horizon=self.state_horizon,
        )
        self.n_updates += 1
        return {
            "update_loss": float(np.mean(hist)) if hist else float("nan"),
            "episodes": float(len(self.episodes)),
            **calib,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "n_updates": self.n_updates,
            "calibration": [self.var_scale, self.var_floor],
            "calib_pairs": list(self.calib_pairs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.n_updates = int(state["n_updates"])
        if "calibration" in state:  # checkpoints from before the calibration keep the raw variance
            self.var_scale, self.var_floor = (float(c) for c in state["calibration"])
            self.calib_pairs = [tuple(p) for p in state["calib_pairs"]]


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


class VLADomain:
    """See the module docstring."""

    def __init__(
        self,
        policy: SmallVLA,
        world_model: VLAWorldModel,
        tasks: Sequence[str],
        image_size: int,
        temperature: float = 1.0,
        eval_temperature: float = 1.0,
        eval_episodes_per_task: int = 10,
        eval_combos: str = "test",
        eval_lockstep: int = 64,
        n_videos: int = 2,
        regrade: bool = False,
        max_steps: int | None = None,
        out_dir: str | Path | None = None,
        seed: int = 0,
        twin_anchors: bool = False,
        imagine_input: str = "pixels",
        latent_refresh_steps: int = 5,
        bf16_unsupported: str | None = None,
    ) -> None:
        import sims

        if imagine_input not in IMAGINE_INPUTS:
            raise ValueError(f"imagine_input={imagine_input!r} is not one of {', '.join(IMAGINE_INPUTS)}")
        if imagine_input == "latent" and not isinstance(policy, SmallVLA):
            raise ValueError(
                f"imagine_input=latent needs the small VLA (its visual features are what the latent "
                f"adapter predicts), not {type(policy).__name__}; use imagine_input=pixels"
            )

        if eval_combos not in ("test", "train"):
            raise ValueError(f"eval_combos={eval_combos!r} is not one of test, train")
        if eval_lockstep < 1:
            raise ValueError(f"eval_lockstep={eval_lockstep} must be >= 1")
        if not tasks:
            raise ValueError("VLADomain needs at least one task")
        for t in tasks:
            sims.task_info(t)  # raises KeyError listing the known tasks
        self.policy = policy
        self.world_model = world_model
        self.tasks = list(tasks)
        self.image_size = image_size
        self.temperature = temperature
        self.eval_temperature = eval_temperature
        self.eval_episodes_per_task = eval_episodes_per_task
        self.eval_combos = eval_combos
        self.eval_lockstep = eval_lockstep
        self.n_videos = n_videos
        self.regrade = regrade
        self.max_steps = max_steps
        self.horizon = {t: max_steps or sims.task_info(t)["max_steps"] for t in self.tasks}
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.twin_anchors = twin_anchors
        self.pool = EnvPool(image_size, max_steps)
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
            # one lockstep call per env split
            for split in sorted({tasks[g].env_split for g in sim_groups}):
                sel = [g for g in sim_groups if tasks[g].env_split == split]
                specs = [(tasks[g].task_id, tasks[g].seed) for g in sel for _ in range(group_size)]
                sim = run_episodes(
                    policy_actor(self.policy, self.temperature, self.gen),
                    specs,
                    self.pool,
                    split,
                    noise=None if noise is None else noise[sel].flatten(0, 1),
                )
                for k, r in enumerate(sim):
                    g = sel[k // group_size]
                    self.sim_steps += r.length
                    rollouts[g * group_size + k % group_size] = self._from_sim(r)
        if wm_groups:
            for k, r in enumerate(self._imagine([tasks[g] for g in wm_groups], group_size)):
                g = wm_groups[k // group_size]
                rollouts[g * group_size + k % group_size] = r
        if not twins:
            return self._collate(rollouts, tasks, group_size)
        # an imagined twin of every anchor group: rollout j drawn with real rollout j's uniforms
        twin_noise = noise[sim_groups].flatten(0, 1)
        rollouts += self._imagine([tasks[g] for g in sim_groups], group_size, noise=twin_noise)
        real_row = torch.tensor(
            [-1] * (n_groups * group_size)
            + [g * group_size + j for g in sim_groups for j in range(group_size)]
        )
        return self._collate(rollouts, [*tasks, *(tasks[g] for g in sim_groups)], group_size, real_row)

    def _from_sim(self, r: SimRollout) -> dict:
        return {
            "kind": "sim",
            "task_id": r.task_id,
            "seed": r.seed,
            "instruction": r.instruction,
            "images": r.images[:-1],
            "states": r.states[:-1],
            "actions": r.actions,
            "bins": r.bins,
            "logprobs": r.logprobs,
            "reward": r.reward,
            "success": float(r.success.max()),
            "goal": goal_or_zeros(r.goal),
            "rollout": r,
        }

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
        if latent:  # the policy reads the WM latent through the adapter: no frame decoded
            if self.latent_adapter is None:
                raise RuntimeError("imagine_input=latent: fit_latent_adapter() must run before imagining")
            dev = self.policy.centers.device
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

            def act(frames: torch.Tensor, states: torch.Tensor, t: int) -> torch.Tensor:
                kw = {} if noise is None else {"noise": noise[:, t]}
                bins, lp, a = self.policy.act(frames, states, instr_ids, self.temperature, self.gen, **kw)
                rec_bins.append(bins)
                rec_lp.append(lp)
                return a

            out = wm.imagine(imgs, sts, act, horizon, generator=self.gen, instr=wm_instr, goal=goals)
            bins = torch.stack(rec_bins, 1)  # [B, T', A]
            lps = torch.stack(rec_lp, 1)
        res = []
        lengths = []
        for i in range(imgs.shape[0]):
            n = int(out["mask"][i].sum().item())
            n = max(1, min(n, int(limits[i])))
            lengths.append(n)
            self.imagined_steps += n
            r = {
                "kind": "imagined",
                "task_id": tasks[i // group_size].task_id,
                "seed": tasks[i // group_size].seed,
                "instruction": instrs[i],
                "images": out["images"][i, :n].numpy(),
                "states": out["states"][i, :n].numpy(),
                "actions": out["actions"][i, :n].numpy(),
                "bins": bins[i, :n].numpy(),
                "logprobs": lps[i, :n].numpy(),
                "reward": float("nan"),  # unknown: never executed
                "success": float("nan"),
                "goal": goals[i].numpy(),
                "rollout": None,
            }
            if latent:  # no frame but the first was decoded: keep what the policy read instead
                r["features"] = feats[i, :n]
                r["latents"] = out["latents"][i, :n]
            res.append(r)
        if latent and self.latent_refresh_steps > 0:
            self.refresh_latent_adapter(imgs, out["latents"], f0, instr_ids, lengths)
        return res

    # ------------------------------------------------------------------ latent imagination
    def fit_latent_adapter(
        self, n_tasks: int = 48, group_size: int = 4, steps: int = 500
    ) -> dict[str, float]:
        """Distill a new :class:`~wmrl_vla.latent.LatentAdapter` from the policy's pixel encoder on
        the world model's own rollouts: ``n_tasks`` training tasks x ``group_size`` rollouts imagined
        over the whole horizon with the policy acting on decoded frames. Every 5th task is held out
        to stop the distillation early (the state of lowest held-out loss, checked every
        ``LATENT_CHECK_EVERY`` steps, the untrained copy of the first frame included) and to measure
        the fit (so the held-out figures are slightly optimistic): ``latent/heldout_mse`` (squared error of the features standardised by
        their spread), ``latent/heldout_tv`` (total variation between the policy's per-dimension
        action distributions from the adapter's features and from the encoder's, mean over steps and
        dimensions), ``latent/heldout_agreement`` (how often their greedy bins agree), and the same
        two for copying the first frame's features (``..._first_frame``, the baseline to beat)."""
        pol, wm = self.policy, self.world_model.model
        dev = pol.centers.device
        gen = torch.Generator().manual_seed(self.seed + 4242)
        tasks = self.sample_tasks(n_tasks, "train", gen)
        inits = [self._initial_obs(t) for t in tasks]
        imgs = torch.from_numpy(np.stack([i[0] for i in inits])).repeat_interleave(group_size, 0)
        sts = torch.from_numpy(np.stack([i[1] for i in inits])).repeat_interleave(group_size, 0)
        texts = [i[2] for i in inits for _ in range(group_size)]
        goals = torch.from_numpy(np.stack([i[3] for i in inits])).repeat_interleave(group_size, 0)
        instr = pol.tokenizer.encode(texts)
        horizon = max(self.horizon[t.task_id] for t in tasks)
        pol.eval()
        wm.eval()

        def act(f: torch.Tensor, s: torch.Tensor, t: int) -> torch.Tensor:
            return pol.act(f, s, instr, self.temperature, gen)[2]

        out = wm.imagine(
            imgs,
            sts,
            act,
            horizon,
            success_threshold=2.0,
            generator=gen,
            instr=instruction_ids(texts),
            goal=goals,
        )  # the whole horizon
        mask = torch.arange(horizon).unsqueeze(0) < torch.tensor(
            [self.horizon[t.task_id] for t in tasks]
        ).repeat_interleave(group_size).unsqueeze(1)  # [B, T]
        b = mask.shape[0]
        rows = torch.arange(b).unsqueeze(1).expand_as(mask)[mask]
        with torch.no_grad():
            targets = pol.visual_features(out["images"][mask].to(dev), instr[rows].to(dev))
            f0 = pol.visual_features(imgs.to(dev), instr.to(dev))[rows]
            sentence = pol.sentence(instr[rows].to(dev))
        z = out["latents"].to(dev)
        inputs = (z[mask.to(dev)], z[:, 0][rows.to(dev)], f0, sentence)
        held = (rows // group_size % 5 == 4).to(dev)
        adapter = LatentAdapter(z.shape[-1], sentence.shape[1], pol.feature_dim).to(dev)
        adapter.set_normalisation(targets[~held], f0[~held])
        opt = torch.optim.Adam(adapter.parameters(), lr=1e-3)
        fit = tuple(x[~held] for x in inputs)
        h_in = tuple(x[held] for x in inputs)

        def held_loss() -> float:
            with torch.no_grad():
                return float(distill_loss(adapter, h_in, targets[held]))

        # early stopping on the held-out tasks, checked every LATENT_CHECK_EVERY steps; step 0 (the
        # untrained adapter: the first frame's features) included
        best, best_state, hist = held_loss(), copy.deepcopy(adapter.state_dict()), []
        for done in range(0, steps, LATENT_CHECK_EVERY):
            hist += distill(
                adapter, opt, fit, targets[~held], min(LATENT_CHECK_EVERY, steps - done), generator=gen
            )
            if (loss := held_loss()) < best:
                best, best_state = loss, copy.deepcopy(adapter.state_dict())
        adapter.load_state_dict(best_state)
        self.latent_adapter, self.latent_optimizer = adapter, opt
        with torch.no_grad():
            st, ins = out["states"][mask].to(dev)[held], instr[rows].to(dev)[held]
            p_pix = torch.softmax(pol.logits_from_features(targets[held], st, ins), -1)  # [M, A, K]
            err = ((adapter(*h_in) - targets[held]) / adapter.in_std) ** 2
            stats = {"latent/fit_samples": float((~held).sum()), "latent/fit_loss": hist[-1],
                     "latent/heldout_mse": float(err.mean())}  # fmt: skip
            for name, feats in (("", adapter(*h_in)), ("_first_frame", h_in[2])):
                p = torch.softmax(pol.logits_from_features(feats, st, ins), -1)
                stats[f"latent/heldout_tv{name}"] = float(0.5 * (p - p_pix).abs().sum(-1).mean())
                stats[f"latent/heldout_agreement{name}"] = float(
                    (p.argmax(-1) == p_pix.argmax(-1)).float().mean()
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
        """``latent_refresh_steps`` distillation steps on up to ``LATENT_REFRESH_SAMPLES`` latents of
        the batch just imagined (``latents`` ``[B, T, D]``, rollout ``i`` real for ``lengths[i]``
        steps, first frames ``imgs`` ``[B, 3, H, W]`` whose features are ``f0`` ``[B, F]``), decoded
        now for this purpose only, with the current encoder's targets."""
        b, t = latents.shape[:2]
        real = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # [B, T]
        rows, cols = real.nonzero(as_tuple=True)
        pick = torch.randperm(rows.numel(), generator=self.gen)[:LATENT_REFRESH_SAMPLES]
        rows, cols = rows[pick], cols[pick]
        dev = self.policy.centers.device
        self.policy.eval()
        z = latents[rows, cols].to(dev)
        targets = encoder_targets(self.policy, self.world_model.model, imgs[rows], z, instr[rows])
        with torch.no_grad():
            sentence = self.policy.sentence(instr[rows].to(dev))
        inputs = (z, latents[rows, 0].to(dev), f0[rows.to(f0.device)].to(dev), sentence)
        hist = distill(
            self.latent_adapter,
            self.latent_optimizer,
            inputs,
            targets,
            self.latent_refresh_steps,
            generator=self.gen,
        )
        self.latent_metrics["latent/refresh_loss"] = hist[0]  # before this refresh's steps: held out

    def _collate(
        self,
        rollouts: list[dict],
        tasks: Sequence[VLATask],
        group_size: int,
        real_row: torch.Tensor | None = None,
    ) -> RolloutBatch:
        n = len(rollouts)
        t_max = max(len(r["actions"]) for r in rollouts)
        a = rollouts[0]["actions"].shape[1]
        s_dim = rollouts[0]["states"].shape[1]
        h = self.image_size
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
        latent_extras = {}
        if any("features" in r for r in rollouts):  # latent imagination: what the policy read
            f_dim = next(r["features"].shape[1] for r in rollouts if "features" in r)
            features = torch.zeros(n, t_max, f_dim)
            for i, r in enumerate(rollouts):
                if "features" in r:
                    features[i, : len(r["actions"])] = r["features"]
            latent_extras = {
                "features": features,
                "latent": torch.tensor(["features" in r for r in rollouts]),
            }
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
                "instr": self.policy.tokenizer.encode([r["instruction"] for r in rollouts]),
                "wm_instr": instruction_ids([r["instruction"] for r in rollouts]),  # the WM's words
                "wm_goal": torch.from_numpy(np.stack([r["goal"] for r in rollouts])),  # [N, 2]
                "actions": actions,
                "step_mask": step_mask,
                "init_images": images[:, 0].clone(),
                "init_states": states[:, 0].clone(),
                **latent_extras,
            },
            real_row=real_row,
            # the simulator's rewards of the anchor rollouts (NaN on imagined ones): the closed loop
            real_rewards=None if self.regrade else torch.tensor([float(r["reward"]) for r in rollouts]),
        )

    # ------------------------------------------------------------------ media
    def rollout_media(
        self, batch: RolloutBatch, predicted: torch.Tensor | None, true: torch.Tensor, scale: int = 4
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
            actions = torch.as_tensor(np.asarray(p["actions"]), dtype=torch.float32)  # [T, A]
            n = actions.shape[0]
            wm: VLADynamics = self.world_model.model
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
            real, dreamt = np.asarray(p["images"])[:n], out["images"][0, :n].numpy()
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
                frames = self.world_model.model.frames_from_latents(init, lat).cpu().numpy()
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
    def real_vs_imagined(self, r: SimRollout) -> np.ndarray:
        """Frames ``[T, 3, H, 3W]`` uint8 of one task three ways, side by side: the real rollout
        ``r`` | the world model replaying its actions open-loop | the policy acting in the world
        model from the same first frame (at the evaluation temperature, on decoded frames). Each
        clip holds its last frame until the longest ends."""
        wm: VLADynamics = self.world_model.model
        wm.eval()
        gen = torch.Generator().manual_seed(0)  # its own generator: a video never changes a run
        img, st = torch.from_numpy(r.images[:1]), torch.from_numpy(r.states[:1])
        acts, n, words = torch.from_numpy(r.actions), r.length, instruction_ids([r.instruction])
        goal = torch.from_numpy(goal_or_zeros(r.goal))[None]
        replay = wm.imagine(img, st, lambda f, s, t: acts[min(t, n - 1)][None], n + 1,
                            success_threshold=2.0, generator=gen, instr=words, goal=goal)  # fmt: skip
        instr_ids = self.policy.tokenizer.encode([r.instruction])

        def act(frames: torch.Tensor, states: torch.Tensor, t: int) -> torch.Tensor:
            return self.policy.act(frames, states, instr_ids, self.eval_temperature, gen)[2]

        dream = wm.imagine(img, st, act, self.horizon[r.task_id], generator=gen, instr=words, goal=goal)
        dreamt = dream["images"][0, : int(dream["mask"][0].sum()) + 1].numpy()
        clips = [r.images, replay["images"][0].numpy(), dreamt]
        t_len = max(len(c) for c in clips)
        clips = [np.concatenate([c, np.repeat(c[-1:], t_len - len(c), 0)]) for c in clips]
        return np.concatenate(clips, axis=3)

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
        combinations."""
        self.policy.eval()
        lo, _ = EVAL_SEEDS if split != "train" else TRAIN_SEEDS
        env_split = ENV_SPLIT["train"] if split == "train" else self.eval_combos
        specs = [(t, lo + 7919 * k) for t in self.tasks for k in range(self.eval_episodes_per_task)]
        actor = policy_actor(self.policy, self.eval_temperature, torch.Generator().manual_seed(12345))
        film = set()  # indices of the filmed episodes
        if self.out_dir is not None and self.n_videos > 0:
            film = set(range(0, len(specs), max(1, len(specs) // self.n_videos))[: self.n_videos])
        # at most eval_lockstep episodes (each an env and renderer) at a time; frames kept for the filmed ones only
        rows, videos = [], []
        for first in range(0, len(specs), self.eval_lockstep):
            chunk = run_episodes(actor, specs[first : first + self.eval_lockstep], self.pool, env_split)
            for k, r in enumerate(chunk, start=first):
                rows.append((r.task_id, float(r.success.max()), float(r.reward), float(r.length)))
                if k in film:
                    videos.append(r)
        task_ids, success, reward, length = zip(*rows, strict=True)
        out: dict[str, float] = {
            "success": float(np.mean(success)),
            "reward": float(np.mean(reward)),
            "episode_length": float(np.mean(length)),
            # training cost so far (evaluation episodes not counted)
            "sim_steps_train": float(self.sim_steps),
            "imagined_steps_train": float(self.imagined_steps),
        }
        for t in self.tasks:
            name = t.split("/")[-1]
            out[f"success/{name}"] = float(
                np.mean([s for tid, s in zip(task_ids, success, strict=True) if tid == t])
            )
        if videos:
            vdir = self.out_dir / "videos"
            vdir.mkdir(parents=True, exist_ok=True)
            for k, r in enumerate(videos):
                ok = "success" if r.success.max() > 0 else "fail"
                stem = f"eval{self.n_evals:03d}_{k}_{r.task_id.split('/')[-1]}"
                save_gif(r.images, vdir / f"{stem}_{ok}.gif")
                save_gif(self.real_vs_imagined(r), vdir / f"{stem}_real_vs_imagined.gif")
        self.n_evals += 1
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
                if self.latent_adapter is not None
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
            if self.latent_adapter is None:
                raise ValueError("the checkpoint holds a latent adapter but this run imagines on pixels")
            self.latent_adapter.load_state_dict(state["latent_adapter"])
            self.latent_optimizer.load_state_dict(state["latent_optimizer"])

    def close(self) -> None:
        self.pool.close()


def save_gif(images: np.ndarray, path: Path, fps: int = 10, scale: int = 2) -> None:
    """``[T, 3, H, W]`` uint8 frames -> an animated GIF."""
    from PIL import Image

    frames = [
        Image.fromarray(f.transpose(1, 2, 0)).resize((f.shape[2] * scale, f.shape[1] * scale)) for f in images
    ]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
