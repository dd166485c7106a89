"""The Domain contract: what a domain adapter hands the shared trainer, and what it gets back.

A domain (the toy problem, VLA robotics, AutoResearch) implements :class:`Domain`; the trainer only
orchestrates and never looks inside a task, a trajectory or a solution. Every domain hands the
learner the same small batch structure, :class:`RolloutBatch`.

- **Required** (:class:`Domain`): ``policy`` (a :class:`Policy`), ``world_model`` (a
  :class:`WorldModel`), ``sample_tasks``, ``generate``, ``execution_jobs``, ``evaluate``,
  ``oracle_rewards``, ``state_dict``, ``load_state_dict``.
- **Optional** (:class:`DomainCapabilities`): ``shard_rng``, ``extras_padding``,
  ``worker_initializer``, ``executor``, ``execution_outcomes``, ``step_metrics``, ``rollout_media``,
  ``prior_anchor_groups``, ``bf16_unsupported``, ``close``.
- :func:`check_domain` inspects a domain once, when the trainer starts, and refuses one that lacks
  a required member or has a member of the wrong kind, in one line naming both.
- **Declared by the domain's config class** (:class:`DomainConfigCapabilities`, checked by
  :func:`check_domain_config`): its default non-inferiority margin (``NONINFERIORITY_MARGIN``), its
  name for people (``DISPLAY_NAME``), whether its start depends on the run seed (``START_PER_SEED``)
  and the optional hooks ``export`` and ``sft_data_parallel``.
- **Closed-loop domains** (a robot whose real rollout *is* its execution) return the true rewards
  of the rows they rolled out for real in ``RolloutBatch.real_rewards``; the trainer takes them as
  they are and asks ``execution_jobs`` only for anchor rows without one.

To add a domain: implement :class:`Domain` (and the capabilities it needs); register a config
dataclass on :class:`wmrl.config.DomainConfig` (``@DomainConfig.register_subclass("name")``) whose
``build(run)`` returns the domain and which declares what it has of
:class:`DomainConfigCapabilities` (its margin, its name, its hooks), in a light module
(``wmrl_vla/plugin.py``, ``wmrl_research/plugin.py``) named under
``[project.entry-points."wmrl.domains"]``; add it to ``tests/test_domain_contract.py``, which runs
each domain through :func:`check_domain`, :func:`check_domain_config` and one round.

Shapes: ``N`` rollouts in ``N // G`` groups of ``G`` (group ``g`` holds rows ``g*G .. g*G+G-1``),
``T`` action tokens per rollout (padded; ``mask`` marks the real ones).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast, runtime_checkable

from wmrl.lazy import lazy

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")


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
        real_row: ``[N]`` long or None: the WM-row to real-row map. A domain whose WM rollouts are
            not its real ones (imagined robot rollouts) may append, after the groups of the sampled
            tasks, WM-only rows that stand for real rollouts: ``real_row[i]`` is the row of the real
            rollout that row ``i``'s WM score stands for (e.g. an imagined *twin* drawn with that
            rollout's sampling noise), -1 on every row that stands for itself. Rows that stand for
            another are scored by the WM and never executed, and the real rows they stand for leave
            the WM stream to them; ``ppi`` pairs them for its correction ``g(t) - λ ĝ(t)``
            (wmrl/ppi.py). None: every row stands for itself.
        real_rewards: ``[N]`` float or None. A closed-loop domain's true rewards of the rows it rolled
            out for real while generating (NaN on the others): the trainer uses them as the anchor
            rows' true rewards with no execution job. None: every anchor row is executed.
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    group_ids: torch.Tensor
    tasks: list[Any]
    payload: list[Any] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    real_row: torch.Tensor | None = None
    real_rewards: torch.Tensor | None = None

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
        if self.real_row is not None and self.real_row.shape != (n,):
            raise ValueError(f"RolloutBatch.real_row has shape {tuple(self.real_row.shape)}, expected ({n},)")
        if self.real_rewards is not None and self.real_rewards.shape != (n,):
            raise ValueError(
                f"RolloutBatch.real_rewards has shape {tuple(self.real_rewards.shape)}, expected ({n},)"
            )

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The rollouts ``rows`` (``[M]`` long). ``tasks`` and ``group_ids`` are kept as they are, so
        ``tasks[group_ids[i]]`` still names row i's task. ``real_row`` is dropped (row numbers change)."""
        idx = rows.tolist()
        return RolloutBatch(
            tokens=self.tokens[rows],
            logprobs=self.logprobs[rows],
            mask=self.mask[rows],
            group_ids=self.group_ids[rows],
            tasks=self.tasks,
            payload=[self.payload[i] for i in idx] if self.payload else [],
            extras={k: v[rows] for k, v in self.extras.items()},
            real_rewards=None if self.real_rewards is None else self.real_rewards[rows],
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
            real_row=self.real_row,
            real_rewards=self.real_rewards,
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


def log_probs(policy: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """``policy.log_probs(batch)`` ``[N, T]`` of a policy module (a :class:`Policy`)."""
    return cast(Policy, policy).log_probs(batch)


@runtime_checkable
class WorldModel(Protocol):
    """Predicts the outcome of rollouts without executing them; refined online on anchor data."""

    def predict(self, batch: RolloutBatch) -> Prediction: ...

    def update(self, batch: RolloutBatch, indices: torch.Tensor, rewards: torch.Tensor) -> dict[str, float]:
        """Refine on executed rollouts ``indices`` (``[M]`` long) with true ``rewards`` (``[M]``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class Graded(NamedTuple):
    """What a :class:`Job` may return instead of a bare float: the true reward and the domain's word
    for how the execution ended (the research sandbox's ``"ok"``, ``"timeout"``, ``"killed"``, ...),
    which the executor hands back as :attr:`wmrl.executors.JobResult.outcome`."""

    reward: float
    outcome: str


@dataclass
class Job:
    """One real execution: ``fn(*args)`` returns the true reward (a float, or a :class:`Graded`) of
    one rollout.

    ``fn`` must be picklable (a module-level function) so that it can run in another process or on a
    Ray worker. Raising means the grader failed: the rollout is *ungraded* (excluded from the update),
    which is different from a rollout whose own code failed (that earns the task's failure score).
    """

    fn: Callable[..., float | Graded]
    args: tuple = ()


PriorGroups = list[tuple[list[float], list[float]]]
"""Anchor groups executed before training: per group ``(raw WM scores, true rewards)``, ``G`` each."""


@runtime_checkable
class JobRunner(Protocol):
    """What :class:`wmrl.executors.Executor` offers: runs :class:`Job` s, returns one result per job
    (with ``.reward``: the float, NaN when ungraded)."""

    def run(self, jobs: list[Job]) -> list[Any]: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Domain(Protocol):
    """The members every domain has (docs/design.md section 3); the optional ones are
    :class:`DomainCapabilities`. :func:`check_domain` inspects both once, when the trainer starts."""

    @property
    def policy(self) -> torch.nn.Module:
        """The policy being trained: a ``torch.nn.Module`` that is a :class:`Policy`."""
        ...

    @property
    def world_model(self) -> WorldModel: ...

    def sample_tasks(self, n: int, split: str, generator: torch.Generator) -> list[Any]:
        """``n`` task specs from ``split`` ("train" or "eval"), drawn with ``generator``."""
        ...

    def generate(self, tasks: Sequence[Any], group_size: int, anchor_groups: torch.Tensor) -> RolloutBatch:
        """Sample ``group_size`` rollouts per task with the policy (no grad).

        ``anchor_groups`` is ``[n_groups]`` bool: the groups that will be executed for real. A domain
        whose rollouts do not depend on where they run (the toy, research edits) ignores it; a
        *closed-loop* domain (a robot) rolls anchor groups out in the real simulator here, hands
        their true rewards back in ``RolloutBatch.real_rewards`` (no execution job is then made for
        them) and may append imagined twins of them that stand for them (``RolloutBatch.real_row``).
        """
        ...

    def execution_jobs(self, batch: RolloutBatch, indices: Sequence[int]) -> list[Job]:
        """One :class:`Job` per rollout in ``indices``, computing its true reward. Called for the
        anchor rows whose ``batch.real_rewards`` is NaN (every anchor row when it is None)."""
        ...

    def evaluate(self, split: str) -> dict[str, float]:
        """Real-execution scores of the current policy on held-out tasks of ``split``."""
        ...

    def oracle_rewards(self, batch: RolloutBatch) -> torch.Tensor | None:
        """True rewards ``[N]`` of every rollout, where the domain knows them without cost (the toy);
        else None. Used only for diagnostics (the update error), never for training."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything besides policy and optimizer that a resumed run needs (WM weights, RNG, ...)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class DomainCapabilities:
    """The optional members of a domain, as :func:`check_domain` found them (None: not offered).

    Each is a member of the domain object under the same name; the trainer and the grid read them
    here, never from the domain by name.
    """

    # Data-parallel ``generation="shard"``: ``shard_rng(rank, step)`` reseeds the domain's sampling
    # generator before each step's generation (wmrl.distributed.shard_seed), so ranks draw
    # independent rollouts and a resumed run draws what an uninterrupted one drew. Without it a
    # sharded run is refused.
    shard_rng: Callable[[int, int], None] | None = None
    # Data-parallel: how each rank's ``extras[key]`` is padded to the longest share when gathered,
    # ``{key: (side, value)}`` with side "left" (prompts) or "right"; keys not named are right-padded
    # with 0.
    extras_padding: dict[str, tuple[str, float]] | None = None
    # A picklable function each execution worker runs once before its first job (e.g. starting a
    # sandbox), so that a worker's start-up does not count against a job's timeout.
    worker_initializer: Callable[[], object] | None = None
    # An executor the domain holds already (e.g. for its evaluation): the trainer runs the anchor
    # jobs on it instead of starting a second pool, and leaves closing it to the domain.
    executor: JobRunner | None = None
    # ``execution_outcomes(outcomes: list[str])``: the outcomes of a step's completed execution jobs
    # whose functions returned a :class:`Graded` (e.g. to count the sandbox's timeouts), in the main
    # process after they come back.
    execution_outcomes: Callable[[list[str]], None] | None = None
    # ``step_metrics() -> {name: float}``, called after every step, logged as ``domain/<name>``
    # (e.g. real simulator steps so far).
    step_metrics: Callable[[], dict[str, float]] | None = None
    # ``rollout_media(batch, predicted [N] | None, true [N]) -> {key: media}``: wandb media of a
    # step's rollouts (tables, videos) every ``tracking.media_every`` steps; its RNG draws are undone.
    rollout_media: Callable[[RolloutBatch, torch.Tensor | None, torch.Tensor], dict[str, Any]] | None = None
    # ``prior_anchor_groups() -> PriorGroups | None``: groups of the starting policy executed and
    # WM-scored before training, called once when the trainer starts with ``ppi.prior_from_log``
    # (they seed ppi's λ window); None when this build made none.
    prior_anchor_groups: Callable[[], PriorGroups | None] | None = None
    # Why this domain's policy cannot run under ``--precision=bf16`` (a str shown to the user).
    bf16_unsupported: str | None = None
    # ``close()``: release what the domain holds (simulator pools, executor workers) once the run is
    # over; called by whoever built the domain.
    close: Callable[[], None] | None = None

    @classmethod
    def of(cls, domain: object) -> DomainCapabilities:
        """:func:`check_domain`."""
        return check_domain(domain)

    def close_domain(self) -> None:
        """``close()`` when the domain has one."""
        if self.close is not None:
            self.close()


class DomainContractError(TypeError, RuntimeError):
    """A domain lacks a member of the contract or has one of the wrong kind (the message is one line;
    a RuntimeError too, so ``wmrl`` prints it as its one-line error with exit code 2)."""


# Required members: name -> the positional arguments it is called with (None: an attribute).
REQUIRED: dict[str, tuple[str, ...] | None] = {
    "policy": None,
    "world_model": None,
    "sample_tasks": ("n", "split", "generator"),
    "generate": ("tasks", "group_size", "anchor_groups"),
    "execution_jobs": ("batch", "indices"),
    "evaluate": ("split",),
    "oracle_rewards": ("batch",),
    "state_dict": (),
    "load_state_dict": ("state",),
}
WORLD_MODEL: dict[str, tuple[str, ...]] = {
    "predict": ("batch",),
    "update": ("batch", "indices", "rewards"),
    "state_dict": (),
    "load_state_dict": ("state",),
}
# Optional callables: name -> the positional arguments it is called with.
OPTIONAL_CALLS: dict[str, tuple[str, ...]] = {
    "shard_rng": ("rank", "step"),
    "worker_initializer": (),
    "execution_outcomes": ("outcomes",),
    "step_metrics": (),
    "rollout_media": ("batch", "predicted", "true"),
    "prior_anchor_groups": (),
    "close": (),
}


def _takes(fn: Any, args: tuple[str, ...]) -> bool:
    """Whether ``fn`` is callable with ``len(args)`` positional arguments."""
    if not callable(fn):
        return False
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: trust it
        return True
    return True


def _call_form(name: str, args: tuple[str, ...]) -> str:
    return f"{name}({', '.join(args)})"


def check_domain(domain: object) -> DomainCapabilities:
    """Check ``domain`` against the contract once, at the start of a run, and return what it offers.

    Raises :class:`DomainContractError`, one line naming the domain's class and the member that is
    missing or of the wrong kind, e.g. ``domain MyDomain has no generate(tasks, group_size,
    anchor_groups) (the Domain contract, wmrl/domain.py)``.
    """
    name = type(domain).__name__

    def refuse(what: str) -> DomainContractError:
        return DomainContractError(f"domain {name} {what} (the Domain contract, wmrl/domain.py)")

    for member, args in REQUIRED.items():
        if not hasattr(domain, member):
            raise refuse(f"has no {member if args is None else _call_form(member, args)}")
        if args is not None and not _takes(getattr(domain, member), args):
            raise refuse(f"has {member}, but it is not a method taking {_call_form(member, args)}")
    policy = domain.policy  # type: ignore[attr-defined]
    if not isinstance(policy, torch.nn.Module) or not _takes(getattr(policy, "log_probs", None), ("batch",)):
        raise refuse(f"has policy {type(policy).__name__}, not a torch.nn.Module with log_probs(batch)")
    wm = domain.world_model  # type: ignore[attr-defined]
    for member, args in WORLD_MODEL.items():
        if not _takes(getattr(wm, member, None), args):
            raise refuse(f"has world_model {type(wm).__name__} without {_call_form(member, args)}")

    found: dict[str, Any] = {}
    for member, args in OPTIONAL_CALLS.items():
        value = getattr(domain, member, None)
        if value is not None and not _takes(value, args):
            raise refuse(f"has {member}, but it is not a method taking {_call_form(member, args)}")
        found[member] = value
    executor = getattr(domain, "executor", None)
    if executor is not None and not all(
        callable(getattr(executor, m, None)) for m in ("run", "cancel", "close")
    ):
        raise refuse(f"has executor {type(executor).__name__}, not an executor with run, cancel and close")
    padding = getattr(domain, "extras_padding", None)
    if padding is not None and not (
        isinstance(padding, dict)
        and all(
            isinstance(k, str) and isinstance(v, tuple) and len(v) == 2 and v[0] in ("left", "right")
            for k, v in padding.items()
        )
    ):
        raise refuse(f"has extras_padding {padding!r}, not a dict of key -> ('left' | 'right', value)")
    bf16 = getattr(domain, "bf16_unsupported", None)
    if bf16 is not None and not isinstance(bf16, str):
        raise refuse(f"has bf16_unsupported {bf16!r}, not a str saying why")
    return DomainCapabilities(executor=executor, extras_padding=padding, bf16_unsupported=bf16, **found)


# ---- what a domain's config class declares ------------------------------------------------------


@dataclass(frozen=True)
class DomainConfigCapabilities:
    """What a domain's config class (registered on :class:`wmrl.config.DomainConfig`) declares besides
    ``build``, as :func:`check_domain_config` found it (None: not declared). The core reads them here,
    never from the config by name."""

    # ``NONINFERIORITY_MARGIN``: the default non-inferiority margin on the domain's held-out score (a
    # grid's ``DomainEntry.margin`` overrides it): a WM method is non-inferior to the baseline where
    # the one-sided 95% lower bound of their paired difference is above -margin. Without it, a grid
    # of the domain must state its margin.
    margin: float | None = None
    # ``DISPLAY_NAME``: the domain's name for people (the title of an exported model card); None: its
    # registered type name.
    display_name: str | None = None
    # ``START_PER_SEED``: True where the policy the domain's build starts from depends on the run seed
    # (e.g. its SFT is seeded by it), so each seed of a grid starts from its own policy; a grid then
    # records and checks one start per seed (``DIR/<domain>/start.json``), not one for every seed,
    # and a spec cannot pin one (``start_sha1``). False (the default): every seed shares one start.
    start_per_seed: bool = False
    # ``export(run, state, out, adapter=False) -> dict``: ``wmrl export`` of a run's checkpoint, the
    # policy and the world model written under ``out`` (:class:`wmrl.export.Exporter`). Without it,
    # ``wmrl export`` refuses the domain's runs.
    export: Callable[..., dict[str, Any]] | None = None
    # ``sft_data_parallel(run, accelerator)``: the SFT stage on every process of a data-parallel run,
    # before ``build`` (which then reads the cached SFT policy). Without it, only the main process
    # builds first and the others read its caches.
    sft_data_parallel: Callable[[Any, Any], None] | None = None


# The domain config's optional hooks: name -> the positional arguments it is called with.
CONFIG_CALLS: dict[str, tuple[str, ...]] = {
    "export": ("run", "state", "out"),
    "sft_data_parallel": ("run", "accelerator"),
}


def check_domain_config(cfg: object) -> DomainConfigCapabilities:
    """Check what the domain config ``cfg`` (an instance of a registered
    :class:`wmrl.config.DomainConfig`) declares and return it.

    Raises :class:`DomainContractError`, one line naming the config's class and the declaration of
    the wrong kind, e.g. ``domain config MyConfig has NONINFERIORITY_MARGIN -1, not a number >= 0
    (the Domain contract, wmrl/domain.py)``.
    """
    name = type(cfg).__name__

    def refuse(what: str) -> DomainContractError:
        return DomainContractError(f"domain config {name} {what} (the Domain contract, wmrl/domain.py)")

    found: dict[str, Any] = {}
    for member, args in CONFIG_CALLS.items():
        value = getattr(cfg, member, None)
        if value is not None and not _takes(value, args):
            raise refuse(f"has {member}, but it is not a method taking {_call_form(member, args)}")
        found[member] = value
    margin = getattr(cfg, "NONINFERIORITY_MARGIN", None)
    number = isinstance(margin, (int, float)) and not isinstance(margin, bool)
    if margin is not None and not (number and 0 <= margin < float("inf")):
        raise refuse(f"has NONINFERIORITY_MARGIN {margin!r}, not a number >= 0")
    display = getattr(cfg, "DISPLAY_NAME", None)
    if display is not None and not (isinstance(display, str) and display.strip()):
        raise refuse(f"has DISPLAY_NAME {display!r}, not a non-empty str")
    per_seed = getattr(cfg, "START_PER_SEED", False)
    if not isinstance(per_seed, bool):
        raise refuse(f"has START_PER_SEED {per_seed!r}, not a bool")
    return DomainConfigCapabilities(
        margin=None if margin is None else float(margin),
        display_name=display,
        start_per_seed=per_seed,
        **found,
    )
