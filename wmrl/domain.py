"""The Domain protocol: what a domain adapter hands the shared trainer, and what it gets back.

A domain (the toy problem, VLA robotics, AutoResearch) implements :class:`Domain`. The trainer only
orchestrates; it never looks inside a task, a trajectory or a solution. Both domains hand the
learner the same small batch structure, :class:`RolloutBatch`.

Shapes: ``N`` rollouts in ``N // G`` groups of ``G`` (group ``g`` holds rows ``g*G .. g*G+G-1``),
``T`` action tokens per rollout (padded; ``mask`` marks the real ones).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class RolloutBatch:
    """G rollouts for each of several tasks, as the learner sees them.

    Attributes:
        tokens: ``[N, T]`` long, the action tokens the policy sampled.
        logprobs: ``[N, T]`` float, their log-probs under the policy that sampled them (detached).
        mask: ``[N, T]`` float in {0, 1}, 1 on real action tokens.
        group_ids: ``[N]`` long, the group (task) each rollout belongs to, ``0 .. n_groups-1``.
        tasks: one task spec per group (domain-defined, e.g. initial state + instruction).
        payload: one domain-defined record per rollout (a trajectory, an edited solution, ...).
        extras: domain-defined batched tensors the policy needs to recompute log-probs
            (observations, prompts), keyed by name; each has ``N`` as its first dimension.
        twin_of: ``[n_groups]`` long or None. A domain whose WM rollouts are not its real ones
            (imagined robot rollouts) may append, after the groups of the sampled tasks, an
            imagined *twin* group for each anchor task: ``twin_of[g]`` is the real group it mirrors
            (its rollout j drawn with rollout j's sampling noise), -1 for every other group. Twins
            are scored by the WM and never executed; ``ppi`` uses them for the task-level
            correction ``g(t) - λ ĝ(t)`` (wmrl/ppi.py). None: no twins.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    group_ids: torch.Tensor
    tasks: list[Any]
    payload: list[Any] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    twin_of: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        for name in ("logprobs", "mask"):
            if getattr(self, name).shape != self.tokens.shape:
                raise ValueError(
                    f"RolloutBatch.{name} has shape {tuple(getattr(self, name).shape)}, "
                    f"expected tokens' shape {tuple(self.tokens.shape)}"
                )
        if self.group_ids.shape != (n,):
            raise ValueError(
                f"RolloutBatch.group_ids has shape {tuple(self.group_ids.shape)}, expected ({n},)"
            )
        if self.payload and len(self.payload) != n:
            raise ValueError(f"RolloutBatch.payload has {len(self.payload)} records for {n} rollouts")
        if self.twin_of is not None and self.twin_of.shape != (len(self.tasks),):
            raise ValueError(
                f"RolloutBatch.twin_of has shape {tuple(self.twin_of.shape)}, expected ({len(self.tasks)},)"
            )

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The rollouts ``rows`` (``[M]`` long). ``tasks`` and ``group_ids`` are kept as they are, so
        ``tasks[group_ids[i]]`` still names row i's task."""
        idx = rows.tolist()
        return RolloutBatch(
            tokens=self.tokens[rows],
            logprobs=self.logprobs[rows],
            mask=self.mask[rows],
            group_ids=self.group_ids[rows],
            tasks=self.tasks,
            payload=[self.payload[i] for i in idx] if self.payload else [],
            extras={k: v[rows] for k, v in self.extras.items()},
            twin_of=self.twin_of,
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch with its tensors (``extras`` included) on ``device``; payload and tasks as they are."""
        dev = torch.device(device)
        tensors = [self.tokens, self.logprobs, self.mask, self.group_ids, *self.extras.values()]
        if all(t.device == dev for t in tensors):
            return self
        return RolloutBatch(
            tokens=self.tokens.to(dev),
            logprobs=self.logprobs.to(dev),
            mask=self.mask.to(dev),
            group_ids=self.group_ids.to(dev),
            tasks=self.tasks,
            payload=self.payload,
            extras={k: v.to(dev) for k, v in self.extras.items()},
            twin_of=None if self.twin_of is None else self.twin_of.to(dev),
        )

    @property
    def n_rollouts(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_groups(self) -> int:
        return len(self.tasks)


@dataclass
class Prediction:
    """A world model's scores for a batch: ``mean`` ``[N]``; ``var`` ``[N]`` or None if it reports none."""

    mean: torch.Tensor
    var: torch.Tensor | None = None


@runtime_checkable
class Policy(Protocol):
    """A policy is a ``torch.nn.Module`` that can re-score the tokens of a batch it generated."""

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[N, T]`` log-probs of ``batch.tokens`` under the current parameters (differentiable)."""
        ...


@runtime_checkable
class WorldModel(Protocol):
    """Predicts the outcome of rollouts without executing them; refined online on anchor data."""

    def predict(self, batch: RolloutBatch) -> Prediction: ...

    def update(self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        """Refine on executed rollouts ``indices`` (``[M]`` long) with true ``rewards`` (``[M]``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


@dataclass
class Job:
    """One real execution: ``fn(*args)`` returns the true reward (a float) of one rollout.

    ``fn`` must be picklable (a module-level function) so that it can run in another process or on a
    Ray worker. Raising means the grader failed: the rollout is *ungraded* (excluded from the update),
    which is different from a rollout whose own code failed (that earns the task's failure score).
    """

    fn: Callable[..., float]
    args: tuple = ()


@runtime_checkable
class Domain(Protocol):
    """What a domain adapter implements. See docs/design.md section 3."""

    policy: torch.nn.Module
    world_model: WorldModel
    # Optional: a picklable function each execution worker runs once before its first job (e.g.
    # starting a sandbox), so that a worker's start-up does not count against a job's timeout.
    # worker_initializer: Callable[[], object]
    # Optional: an Executor the domain holds already (e.g. for its evaluation), built from the run's
    # executor config; the trainer then runs its anchor jobs on it instead of starting a second
    # pool, and leaves closing it to the domain.
    # executor: Executor

    def sample_tasks(self, n: int, split: str, generator: torch.Generator) -> list[Any]:
        """``n`` task specs from ``split`` ("train" or "eval"), drawn with ``generator``."""
        ...

    def generate(self, tasks: Sequence[Any], group_size: int, anchor_groups: torch.Tensor) -> RolloutBatch:
        """Sample ``group_size`` rollouts per task with the policy (no grad).

        ``anchor_groups`` is ``[n_groups]`` bool: the groups that will be executed for real. A domain
        whose rollouts do not depend on where they run (the toy, research edits) ignores it; a domain
        whose rollout is closed-loop (a robot) rolls anchor groups out in the real simulator here,
        and may append imagined twin groups of the anchor tasks (``RolloutBatch.twin_of``).
        """
        ...

    def execution_jobs(self, batch: RolloutBatch, indices: Sequence[int]) -> list[Job]:
        """One :class:`Job` per rollout in ``indices``, computing its true reward."""
        ...

    def evaluate(self, split: str) -> dict[str, float]:
        """Real-execution scores of the current policy on held-out tasks of ``split``."""
        ...

    def oracle_rewards(self, batch: RolloutBatch) -> torch.Tensor | None:
        """True rewards of every rollout, where the domain knows them without cost (the toy); else None.

        Used only for diagnostics (the update error), never for training.
        """
        ...

    def step_metrics(self) -> dict[str, float]:
        """Domain counters the trainer logs after every step as ``domain/<name>`` (e.g. real
        simulator steps so far); ``{}`` when there are none."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything besides policy and optimizer that a resumed run needs (WM weights, RNG, ...)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
