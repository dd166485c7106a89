"""The toy problem's domain (wmrl/toy.py describes it; its config, ``ToyConfig``, lives there and
imports this module only when a run builds the domain, so that reading a config imports no torch)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from wmrl.domain import Job, Prediction, PriorGroups, RolloutBatch


class ToyParams(Protocol):
    """The fields of ``wmrl.toy.ToyConfig`` the problem reads (the config imports this module when
    it builds the domain; this module does not import the config)."""

    n_contexts: int
    n_actions: int
    problem_seed: int
    bias_strength: float
    rank_error_frac: float
    noise: float
    exec_cost_s: float
    twin_anchors: bool
    twin_common_noise: bool
    log_groups: int


@dataclass
class Problem:
    """The known ground truth, all ``[K, A]``: the true ``reward``, the WM's internal (pre-squash)
    estimate ``wm_latent`` (equal to ``reward`` except in ranking-error contexts) and its noise
    ``wm_sigma``; ``rank_error`` ``[K]`` marks the contexts with a ranking error."""

    reward: torch.Tensor
    wm_latent: torch.Tensor
    wm_sigma: torch.Tensor
    rank_error: torch.Tensor
    strength: float

    @staticmethod
    def make(cfg: ToyParams) -> Problem:
        g = torch.Generator().manual_seed(cfg.problem_seed)
        k, a = cfg.n_contexts, cfg.n_actions
        reward = torch.rand(k, a, generator=g)
        wm_latent = reward.clone()
        n_err = round(cfg.rank_error_frac * k)
        rank_error = torch.zeros(k, dtype=torch.bool)
        rank_error[torch.randperm(k, generator=g)[:n_err]] = True
        order = reward.argsort(dim=1, descending=True)
        for ctx in rank_error.nonzero().squeeze(-1).tolist():
            best, decoy = order[ctx, 0], order[ctx, a // 2]  # swap the best with a median action
            wm_latent[ctx, best], wm_latent[ctx, decoy] = reward[ctx, decoy], reward[ctx, best]
        wm_sigma = cfg.noise * (0.25 + 1.5 * torch.rand(k, a, generator=g))
        return Problem(reward, wm_latent, wm_sigma, rank_error, cfg.bias_strength)


def saturate(x: torch.Tensor, strength: float) -> torch.Tensor:
    """The WM's output distortion ``g(x) = tanh(s x) / tanh(s)``, ``s = 4 * strength`` (identity at 0)."""
    s = 4.0 * strength
    return x if s == 0 else torch.tanh(s * x) / math.tanh(s)


def saturate_slope(x: torch.Tensor, strength: float) -> torch.Tensor:
    """``g'(x) = s (1 - tanh(s x)^2) / tanh(s)``."""
    s = 4.0 * strength
    return torch.ones_like(x) if s == 0 else s * (1 - torch.tanh(s * x) ** 2) / math.tanh(s)


def true_reward_job(reward: float, cost_s: float = 0.0) -> float:
    """A toy 'real execution': the true reward, after an optional emulated cost."""
    if cost_s > 0:
        import time

        time.sleep(cost_s)
    return reward


class SoftmaxPolicy(torch.nn.Module):
    """``pi(a | k) = softmax(theta[k])``, theta ``[K, A]`` initialised to zero (uniform)."""

    def __init__(self, n_contexts: int, n_actions: int):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(n_contexts, n_actions))

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[N, 1]``: log pi(token | context) for each rollout."""
        logp = torch.log_softmax(self.theta[batch.extras["context"]], dim=-1)  # [N, A]
        return logp.gather(1, batch.tokens)


class ToyWorldModel:
    """The fixed, distorted and noisy WM of the module docstring."""

    def __init__(self, problem: Problem, generator: torch.Generator):
        self.problem = problem
        self.generator = generator

    def predict(self, batch: RolloutBatch) -> Prediction:
        p = self.problem
        ctx, act = batch.extras["context"], batch.tokens[:, 0]
        latent, sigma = p.wm_latent[ctx, act], p.wm_sigma[ctx, act]
        noise = torch.randn(ctx.shape[0], generator=self.generator)
        mean = saturate(latent + sigma * noise, p.strength)
        return Prediction(mean=mean, var=(saturate_slope(latent, p.strength) * sigma) ** 2)

    def update(self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ToyDomain:
    def __init__(self, cfg: ToyParams, seed: int, group_size: int = 8):
        self.cfg = cfg
        self.seed = seed
        self.group_size = group_size  # the run's, for the execution log's groups
        self.problem = Problem.make(cfg)
        self.policy = SoftmaxPolicy(cfg.n_contexts, cfg.n_actions)
        self.sample_gen = torch.Generator().manual_seed(seed * 7919 + 17)
        self.wm_gen = torch.Generator().manual_seed(seed * 7919 + 29)
        self.world_model = ToyWorldModel(self.problem, self.wm_gen)

    def shard_rng(self, rank: int, step: int) -> None:
        """Data-parallel ``generation="shard"`` (wmrl/distributed.py), before each step's generation:
        reseed the sampling noise from ``(seed, step, rank)``, so that ranks draw independent actions
        for their shares and a resumed run draws what an uninterrupted one drew."""
        from wmrl.distributed import shard_seed

        self.sample_gen.manual_seed(shard_seed(self.seed, step, rank))

    def sample_tasks(self, n: int, split: str, generator: torch.Generator) -> list[int]:
        return torch.randint(self.cfg.n_contexts, (n,), generator=generator).tolist()

    def generate(self, tasks: Sequence[int], group_size: int, anchor_groups: torch.Tensor) -> RolloutBatch:
        ctx = torch.tensor(list(tasks)).repeat_interleave(group_size)  # [N]
        probs = torch.softmax(self.policy.theta.detach()[ctx], dim=-1)  # [N, A]
        tokens = torch.multinomial(probs, 1, generator=self.sample_gen)  # [N, 1]
        tasks, real_row = list(tasks), None
        if self.cfg.twin_anchors and anchor_groups.any():
            real = anchor_groups.nonzero().squeeze(-1)  # [n]
            rows = (real[:, None] * group_size + torch.arange(group_size)).flatten()  # [n * G]
            twin_tokens = (
                tokens[rows]
                if self.cfg.twin_common_noise
                else torch.multinomial(probs[rows], 1, generator=self.sample_gen)
            )
            ctx, tokens = torch.cat([ctx, ctx[rows]]), torch.cat([tokens, twin_tokens])
            probs = torch.cat([probs, probs[rows]])
            real_row = torch.cat([torch.full((len(tasks) * group_size,), -1), rows])  # twins -> real rows
            tasks = tasks + [tasks[g] for g in real.tolist()]
        logprobs = probs.gather(1, tokens).log()
        return RolloutBatch(
            tokens=tokens,
            logprobs=logprobs,
            mask=torch.ones_like(logprobs),
            group_ids=torch.arange(len(tasks)).repeat_interleave(group_size),
            tasks=tasks,
            extras={"context": ctx},
            real_row=real_row,
        )

    def execution_log(self, n_groups: int, group_size: int) -> list[tuple[list[float], list[float]]]:
        """``n_groups`` groups of the current policy on random contexts, each rollout's ``(WM score,
        true reward)`` per group, drawn from their own generators (the run's streams are untouched)."""
        gen = torch.Generator().manual_seed(self.seed * 7919 + 41)
        ctx = torch.randint(self.cfg.n_contexts, (n_groups,), generator=gen).repeat_interleave(group_size)
        probs = torch.softmax(self.policy.theta.detach()[ctx], dim=-1)  # [n_groups * G, A]
        tokens = torch.multinomial(probs, 1, generator=gen)
        batch = RolloutBatch(
            tokens=tokens,
            logprobs=probs.gather(1, tokens).log(),
            mask=torch.ones(len(ctx), 1),
            group_ids=torch.arange(n_groups).repeat_interleave(group_size),
            tasks=ctx[::group_size].tolist(),
            extras={"context": ctx},
        )
        wm = ToyWorldModel(self.problem, torch.Generator().manual_seed(self.seed * 7919 + 43))
        r_hat, r = wm.predict(batch).mean.view(n_groups, -1), self.oracle_rewards(batch).view(n_groups, -1)
        return [(h.tolist(), t.tolist()) for h, t in zip(r_hat, r, strict=True)]

    def prior_anchor_groups(self) -> PriorGroups:
        """``cfg.log_groups`` groups of the starting policy as a pre-training execution log
        (``ppi.prior_from_log``): :meth:`execution_log`, the same on every call."""
        return self.execution_log(self.cfg.log_groups, self.group_size)

    def execution_jobs(self, batch: RolloutBatch, indices: Sequence[int]) -> list[Job]:
        r = self.oracle_rewards(batch)
        return [Job(true_reward_job, (float(r[i]), self.cfg.exec_cost_s)) for i in indices]

    def oracle_rewards(self, batch: RolloutBatch) -> torch.Tensor:
        return self.problem.reward[batch.extras["context"], batch.tokens[:, 0]]

    def rollout_media(self, batch: RolloutBatch, predicted: torch.Tensor | None, true: torch.Tensor) -> dict:
        """wandb media of a step: one row per rollout (context, action, the WM's score, the executed
        reward where executed, the true reward)."""
        from wmrl.tracking import Table, table_value

        oracle = self.oracle_rewards(batch)
        rows = [
            [
                int(batch.group_ids[i]),
                int(batch.extras["context"][i]),
                int(batch.tokens[i, 0]),
                None if predicted is None else table_value(predicted[i]),
                table_value(true[i]),
                float(oracle[i]),
            ]
            for i in range(batch.n_rollouts)
        ]
        return {
            "rollouts/table": Table(["group", "context", "action", "predicted", "executed", "true"], rows)
        }

    def evaluate(self, split: str) -> dict[str, float]:
        """Exact expected true reward of the policy over all contexts, and the optimum's."""
        pi = torch.softmax(self.policy.theta.detach(), dim=-1)
        reward = self.problem.reward
        err = self.problem.rank_error
        per_ctx = (pi * reward).sum(-1)
        return {
            "true_reward": float(per_ctx.mean()),
            "true_reward_rank_error_ctx": float(per_ctx[err].mean()) if err.any() else float("nan"),
            "optimum": float(reward.max(-1).values.mean()),
            "p_best": float(pi.gather(1, reward.argmax(-1, keepdim=True)).mean()),
        }

    def state_dict(self) -> dict:
        return {"sample_gen": self.sample_gen.get_state(), "wm_gen": self.wm_gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.sample_gen.set_state(state["sample_gen"])
        self.wm_gen.set_state(state["wm_gen"])
