"""The method contract: what the trainer, the config, the report and the domains ask of a method.

A method (``real``, ``wmrl``, ``ppi``, ...) is one object in the registry ``METHODS``, as verl
registers its advantage estimators: a subclass of :class:`Method`, decorated with
:func:`register_method`, in a file of its own under ``wmrl/methods/``. A run names its method in its
config (``method: ppi``); ``wmrl.methods.method_of(run)`` gives the object, wrapped in its placebo
control under ``wm_placebo``. A method states what it is with a few class attributes and changes the
training step through a few hooks, which :class:`wmrl.trainer.Trainer` calls in this order::

    start_from_log(trainer, groups)     once, before a new run's first step (ppi.prior_from_log)
    select_tasks(tasks, anchor_groups)  which sampled tasks are generated (anchors_only: the anchors)
    prediction(pred, group_ids, ...)    the WM's prediction as the method sees it (placebo: permuted)
    wm_scores(trainer, step)            the WM rows' rewards; the step's anchors measure the WM's
                                        error and feed the calibration and the denoiser first
    advantages(trainer, step)           per-row advantages and the rows in the loss

The components a method keeps between steps are its own: :meth:`Method.new_state` builds them
once per run as a :class:`MethodState` (the default: the online isotonic calibration,
wmrl/debias.py, where it ``calibrates``, the denoiser's anchor weight ``w``, wmrl/denoise.py, where it
``denoises``; ppi adds its λ tuner, wmrl/ppi.py). A hook reaches them as ``trainer.method_state``;
the trainer checkpoints their state under the checkpoint's ``"method"`` key and logs their metrics
with each step, naming none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from wmrl.config import METHODS as REGISTRY
from wmrl.config import ConfigError, load_methods, registered_method
from wmrl.debias import OnlineDebiaser, centred_residual
from wmrl.denoise import InverseVarianceDenoiser, normalise_weights, sample_weights
from wmrl.domain import Prediction, PriorGroups, RolloutBatch
from wmrl.lazy import lazy
from wmrl.learner import group_advantages
from wmrl.method_config import Calibrates, Denoises, MethodConfig, method_config_class

if TYPE_CHECKING:
    import torch
else:
    torch = lazy("torch")

if TYPE_CHECKING:
    from wmrl.config import AnchorConfig, RunConfig
    from wmrl.domain import Domain

EXECUTES = ("all", "anchors", "none")
# A method's part in a comparison (docs/design.md section 7), one method each: "reference" executes
# every group (the figures the others are measured against, `real`); "baseline" has the WM methods'
# real executions and no WM (the bar every WM method must clear, `anchors_only`).
ROLES = ("reference", "baseline")


class Component(Protocol):
    """A part of a method's per-run state (the calibration, the denoiser, ppi's tuner): it
    checkpoints itself and says what the step's metrics show of it."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def metrics(self) -> dict[str, float]: ...


class MethodState:
    """What one run of a method keeps between steps: the components :meth:`Method.new_state` built
    for it, by name, each an attribute (``state.debiaser``). The trainer checkpoints
    :meth:`state_dict` and logs :meth:`metrics` with every step, whatever the components are."""

    def __init__(self, **components: Component):
        self.components: dict[str, Component] = components

    def __getattr__(self, name: str) -> Any:
        components = self.__dict__.get("components", {})
        if name in components:
            return components[name]
        raise AttributeError(
            f"this run's method keeps no {name!r} (it keeps: {', '.join(components) or 'none'})"
        )

    def state_dict(self) -> dict[str, dict]:
        """``{component name: its state_dict()}``."""
        return {name: c.state_dict() for name, c in self.components.items()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Restore every component from ``state`` (:meth:`state_dict`'s layout); entries for
        components this run does not keep are ignored."""
        missing = [name for name in self.components if name not in state]
        if missing:
            raise KeyError(f"the checkpoint holds no state for the method's {', '.join(missing)}")
        for name, c in self.components.items():
            c.load_state_dict(state[name])

    def metrics(self) -> dict[str, float]:
        """Every component's metrics, for the step's row."""
        return {k: v for c in self.components.values() for k, v in c.metrics().items()}


def legacy_method_state(checkpoint: dict) -> dict[str, dict]:
    """A checkpoint's method state in :meth:`MethodState.state_dict`'s layout, also from a
    checkpoint written before methods kept their own state: those held every run's calibration,
    denoiser and ppi tuner at the top level (``"debiaser"``, ``"denoiser"``, ``"ppi"``; the last
    absent from checkpoints older than the ppi method)."""
    if "method" in checkpoint:
        return checkpoint["method"]
    top_level = {"debiaser": "debiaser", "denoiser": "denoiser", "ppi": "tuner"}
    return {name: checkpoint[key] for key, name in top_level.items() if key in checkpoint}


class TrainerView(Protocol):
    """What a method's hooks use of the trainer (:class:`wmrl.trainer.Trainer`): its config, policy,
    domain and method, and the run's state of its method (:meth:`Method.new_state`)."""

    cfg: RunConfig
    policy: torch.nn.Module
    domain: Domain
    method: Method
    method_state: MethodState


@dataclass
class Step:
    """What one training step hands its method.

    ``batch``: the step's rollouts (``R`` rows); ``n_tasks``: the tasks sampled and generated (the
    groups after them, if any, are WM-only twins of the anchor tasks, ``batch.real_row``);
    ``group_anchor`` ``[n_groups]`` bool: the groups executed for real; ``r_true`` ``[R]``: true
    rewards, NaN off executed rows and on ungraded ones; ``pred``: the WM's prediction as the method
    sees it (None for a method without a WM); ``r_wm`` ``[R]``: the rewards the method gives the WM
    rows (:meth:`Method.wm_scores`; None without a WM)."""

    batch: RolloutBatch
    n_tasks: int
    group_anchor: torch.Tensor
    r_true: torch.Tensor
    pred: Prediction | None = None
    r_wm: torch.Tensor | None = None

    @property
    def is_anchor(self) -> torch.Tensor:
        """``[R]`` bool: the rows of executed groups."""
        return self.group_anchor[self.batch.group_ids]

    @property
    def anchor_rows(self) -> torch.Tensor:
        """``[n_executed]`` long: the indices of the executed rows."""
        return self.is_anchor.nonzero().squeeze(-1)

    @property
    def r_hat(self) -> torch.Tensor:
        """``[R]`` the WM's raw scores (as the method sees them)."""
        assert self.pred is not None, "a method without a WM has no WM scores"
        return self.pred.mean

    @property
    def rewards(self) -> torch.Tensor:
        """``[R]`` the step's rewards: true ones on executed rows, the WM rows' ``r_wm`` elsewhere."""
        if self.r_wm is None:
            return self.r_true.clone()
        return torch.where(self.is_anchor, self.r_true, self.r_wm)


@dataclass
class Advantages:
    """A method's answer for one step: ``adv`` ``[R]`` per-row advantages, ``used`` ``[R]`` bool the
    rows in the loss, ``counted`` ``[R]`` bool the rows the loss divides by (None: the used ones)
    and the method's metrics."""

    adv: torch.Tensor
    used: torch.Tensor
    counted: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class Method:
    """One way to turn a step's rollouts into an update. The defaults are GRPO on mixed rewards:
    anchor rows take their true rewards, the other rows the WM's scores (calibrated where
    ``calibrates``), group advantages, anchor rows weighted by the denoiser's ``w`` where
    ``denoises``. A subclass sets the class attributes and overrides the hooks it changes."""

    # The registry key and the config's `method` value.
    name: str = ""
    # One line on what it does (an exported policy's model card).
    summary: str = ""
    # Which groups of a step are executed for real: "all" (GRPO), "anchors" (a random fraction,
    # `anchors`), "none".
    executes: str = "anchors"
    # Whether it queries the world model (the other groups are scored by it, or it corrects it).
    uses_wm: bool = True
    # Whether the WM's scores go through the online isotonic calibration (wmrl/debias.py).
    calibrates: bool = False
    # Whether anchor advantages are weighted by the denoiser's w (wmrl/denoise.py).
    denoises: bool = False
    # Whether a closed-loop domain should add imagined twin groups of the anchor tasks
    # (RolloutBatch.real_row): only a method that pairs the WM's and the real rollouts of a task uses them.
    uses_twins: bool = False
    # The RunConfig sections that change what it does, besides grpo and its own settings (a reader's
    # and a tool's guide: the others' values are ignored by it).
    config_sections: tuple[str, ...] = ()
    # Its part in a comparison, one of ROLES, which the grid and the reports read ("": a method
    # compared with them).
    role: str = ""
    # Its own settings, the run's `method_config` (wmrl/method_config.py): a MethodConfig dataclass
    # (`--method_config.<field>=...`). Left out, register_method gives it one made of the components it
    # keeps: Calibrates' `debias` where it calibrates, Denoises' `denoise` where it denoises. (Declared,
    # not set, here: a class is no hook of the contract a control takes from its base.)
    config: type[MethodConfig]

    def __repr__(self) -> str:
        return f"<method {self.name}>"

    # ---- what the config, the grid and the reports ask ---------------------------------------
    def controls(self) -> list[Control]:
        """Its own controls, which a comparison runs beside it (docs/design.md section 7), besides
        the placebo every WM method gets (its WM's scores permuted within each group:
        ``wmrl.methods.controls``)."""
        return []

    def check(self, run: RunConfig) -> None:
        """Raise a ConfigError for a config it cannot run (the run's other fields are valid)."""
        if run.wm_placebo and not self.uses_wm:
            raise ConfigError(
                f"wm_placebo=true permutes a world model's scores: method={run.method!r} queries none "
                f"(use one of {', '.join(wm_methods())})"
            )
        if self.executes == "anchors":
            run.anchors.check_for(self.name, run.grpo.tasks_per_step)

    def wants_execution_log(self, run: RunConfig) -> bool:
        """Whether the domain should build its pre-training execution log as prior anchor groups
        (``Domain.prior_anchor_groups``) for this run."""
        return False

    def n_anchor_groups(self, n_groups: int, cfg: AnchorConfig) -> int:
        """How many of a step's ``n_groups`` groups are executed for real."""
        if self.executes == "all":
            return n_groups
        return 0 if self.executes == "none" else cfg.count(n_groups)

    def progress(self, metrics: dict[str, float]) -> dict[str, str]:
        """What the training bar shows of a step's metrics besides the reward and the executions."""
        return {"w": f"{metrics['denoise/w']:.2f}"} if self.denoises else {}

    def new_state(self, run: RunConfig) -> MethodState:
        """The components one run of it keeps between steps, built once per run (their state is
        checkpointed with the run, their metrics logged with each step): the online isotonic
        calibration where it ``calibrates``, the denoiser where it ``denoises``."""
        components: dict[str, Component] = {}
        if self.calibrates:
            components["debiaser"] = OnlineDebiaser(cast(Calibrates, run.method_config).debias)
        if self.denoises:
            components["denoiser"] = InverseVarianceDenoiser(cast(Denoises, run.method_config).denoise)
        return MethodState(**components)

    # ---- the training step's hooks (called by wmrl.trainer.Trainer, in this order) ---------------
    def start_from_log(self, trainer: TrainerView, prior_groups: PriorGroups | None) -> None:
        """Once, before the first step of a new run for which :meth:`wants_execution_log` holds:
        ``prior_groups`` is the domain's execution log as ``(raw WM scores, true rewards)`` groups."""

    def select_tasks(self, tasks: list, anchor_groups: torch.Tensor) -> tuple[list, torch.Tensor]:
        """The tasks to generate and their ``[n]`` bool anchor mask, from the step's sampled tasks."""
        return tasks, anchor_groups

    def prediction(self, pred: Prediction, group_ids: torch.Tensor, seed: int, step: int) -> Prediction:
        """The WM's prediction ``[R]`` as the method sees it."""
        return pred

    def prior_groups(self, groups: PriorGroups, seed: int) -> PriorGroups:
        """The execution log's ``(WM scores, true rewards)`` groups as the method sees them."""
        return groups

    def wm_scores(self, trainer: TrainerView, step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        """``[R]`` the rewards the WM rows take, and metrics. The step's anchors are observed first
        (:meth:`observe_anchors`), so a calibrating method uses the map refitted on them."""
        metrics = self.observe_anchors(trainer, step)
        return (trainer.method_state.debiaser(step.r_hat) if self.calibrates else step.r_hat), metrics

    def observe_anchors(self, trainer: TrainerView, step: Step) -> dict[str, float]:
        """Measure the WM's error on this step's anchors with the calibration fitted *before* them
        (out of sample), feed the denoiser (``denoises``: the residual after calibration where the
        method calibrates, else on raw scores), then refit the calibration on the new pairs
        (``calibrates``; a method that does not calibrate measures its raw scores twice)."""
        r_hat, r_true, rows, state = step.r_hat, step.r_true, step.anchor_rows, trainer.method_state
        out: dict[str, float] = {"wm/pred_mean": nanmean(r_hat)}
        if rows.numel() == 0:
            return out
        gid = torch.unique(step.batch.group_ids[rows], return_inverse=True)[1]
        a_hat, a_true = r_hat[rows], r_true[rows]
        a_cal = state.debiaser(a_hat) if self.calibrates else a_hat.clone()
        out["wm/residual_before"] = nanmean(centred_residual(a_hat, a_true, gid))
        out["wm/residual_after"] = nanmean(centred_residual(a_cal, a_true, gid))
        if self.denoises:
            state.denoiser.observe(a_cal if self.calibrates else a_hat, a_true, gid)
        if self.calibrates:
            out["debias/refit"] = float(state.debiaser.observe(a_hat, a_true))
        return out

    def advantages(self, trainer: TrainerView, step: Step) -> Advantages:
        """Group advantages of :attr:`Step.rewards`; with ``denoises``, anchor rows weighted by the
        denoiser's ``w`` and, with ``denoise.sample_weights``, WM rows by their reported variance;
        the weights rescaled to mean 1 over the used rows."""
        cfg, is_anchor, pred = trainer.cfg, step.is_anchor, step.pred
        adv, used = group_advantages(step.rewards, step.batch.group_ids, cfg.grpo.advantage, cfg.grpo.std_eps)
        weights = torch.ones_like(adv)
        if self.denoises:
            weights = torch.where(is_anchor, torch.full_like(adv, trainer.method_state.denoiser.w), weights)
            d = cast(Denoises, cfg.method_config).denoise
            if d.sample_weights and pred is not None and pred.var is not None:
                wm_rows = ~is_anchor & torch.isfinite(pred.var)
                if wm_rows.any():
                    weights[wm_rows] = sample_weights(
                        pred.var[wm_rows].float(), d.var_floor, d.sample_weight_max
                    )
        return Advantages(adv * normalise_weights(weights, used), used)


class Control(Method):
    """A control run beside its ``base`` method (docs/design.md section 7): the base's own code path
    under the config ``overrides`` (``wmrl run`` flags), named ``<base>_<suffix>``. It answers every
    question and runs every hook as its base does, except those its own class defines: every member
    of the contract (:func:`contract_members`, :class:`Method`'s public attributes and hooks) that
    the control's class does not define is the base's own, so a hook added to :class:`Method` runs
    the base's under every control with no change here."""

    suffix: str = ""
    overrides: tuple[str, ...] = ()
    # Its kind as the report names it (the evidence table's column "LB vs <label>") and one line
    # on what it is (the table's notes).
    label: str = ""
    note: str = ""

    def __init__(self, base: Method):
        self.base = base
        own = {n for cls in type(self).__mro__[: type(self).__mro__.index(Method)] for n in vars(cls)}
        for member in contract_members():
            if member not in own:
                setattr(self, member, getattr(base, member))  # a bound hook of the base, or its value
        self.name = f"{base.name}_{self.suffix}"

    def controls(self) -> list[Control]:
        """None: a control is not compared with controls of its own."""
        return []


def contract_members() -> list[str]:
    """The public attributes and hooks of :class:`Method` by name (those a :class:`Control` takes
    from its base), read from the class itself."""
    return [name for name in vars(Method) if not name.startswith("_")]


METHODS = cast("dict[str, Method]", REGISTRY)
"""Every registered method by name, in registration order: the config's registry (``wmrl.config.METHODS``,
filled through the ``wmrl.methods`` entry points), the same dict."""


def register_method[M: type[Method]](cls: M) -> M:
    """Class decorator: register one instance of ``cls`` under ``cls.name`` in the registry
    (``wmrl.config.METHODS``, read by the config, the grid and the reports), and its config class
    (:func:`wmrl.method_config.method_config_class`) as the ``method_config`` of its runs."""
    if not cls.name or cls.name in METHODS:
        raise ValueError(f"method class {cls.__qualname__} needs a new, non-empty name, got {cls.name!r}")
    if cls.executes not in EXECUTES:
        raise ValueError(f"{cls.__qualname__}.executes={cls.executes!r} is not one of {', '.join(EXECUTES)}")
    if cls.role and (cls.role not in ROLES or method_with_role(cls.role) is not None):
        raise ValueError(
            f"{cls.__qualname__}.role={cls.role!r}: not one of {ROLES}, or taken by another method"
        )
    cls.config = method_config_class(cls)
    METHODS[cls.name] = cls()
    return cls


def get_method(name: str) -> Method:
    """The registered method ``name``; a ConfigError naming the known ones otherwise."""
    return cast(Method, registered_method(name))


def method_with_role(role: str) -> str | None:
    """The name of the registered method whose ``role`` is ``role`` (one of :data:`ROLES`), None
    where none has it."""
    return next((name for name, m in METHODS.items() if m.role == role), None)


def wm_methods() -> tuple[str, ...]:
    """The registered methods that query a world model."""
    return tuple(name for name, m in load_methods().items() if cast(Method, m).uses_wm)


def nanmean(x: torch.Tensor) -> float:
    """The mean of the finite entries of ``x`` (NaN when there are none)."""
    x = x[torch.isfinite(x)]
    return float(x.mean()) if x.numel() else float("nan")
