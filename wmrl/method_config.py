"""Each method's own settings: one config dataclass per method, as lerobot has one per policy.

A run names its method (``method: ppi``, ``--method=ppi``: a method of the registry ``METHODS``,
filled by ``wmrl.methods.register_method`` through the ``wmrl.methods`` entry points) and holds that
method's settings, and no other method's, in its ``method_config`` section: an instance of the
method's config class (``Method.config``), a draccus choice (``draccus.ChoiceRegistry``) whose
registry is the method registry itself, so a method and its config are registered once, together.
Flags reach them by path (``--method_config.ppi.lam=0``); one that the run's method does not have
is refused in one line (wmrl/config_compat.py, which also reads the shared ``--ppi.lam=0`` form).

A method's config is made of the configs of the components it keeps: :class:`Calibrates` gives a
method the online isotonic calibration's ``debias`` (wmrl/debias.py), :class:`Denoises` the
denoiser's ``denoise`` (wmrl/denoise.py); ``ppi`` adds its λ tuner's ``ppi`` (:class:`PPIConfig`,
wmrl/ppi.py). A method that declares no config gets one made of the components its ``calibrates``
and ``denoises`` attributes say it keeps (:func:`method_config_class`).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol

import draccus

from wmrl.config_checks import ConfigError, check, finite, one_of
from wmrl.config_messages import did_you_mean


class RunView(Protocol):
    """What the methods' settings read of a run (a :class:`wmrl.config.RunConfig`, not imported: the
    run config imports this module): a dataclass with the domain's config."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    domain: Any


DEFAULT_METHOD = "wmrl"


class RegisteredMethod(Protocol):
    """What the config reads of a registered method (the contract is wmrl/methods/base.py)."""

    config: type[MethodConfig]

    def check(self, run: RunView) -> None: ...


METHODS: dict[str, RegisteredMethod] = {}
"""The method registry: name -> method object, in registration order. Filled by
``wmrl.methods.register_method`` when :func:`load_methods` imports the ``wmrl.methods`` entry points."""
_METHODS_LOADED = False


def load_methods() -> dict[str, RegisteredMethod]:
    """Import every module registered under the ``wmrl.methods`` entry points (each registers its
    methods), once; the registry."""
    global _METHODS_LOADED
    if not _METHODS_LOADED:
        for ep in entry_points(group="wmrl.methods"):
            ep.load()
        _METHODS_LOADED = True
    return METHODS


def registered_method(name: str) -> RegisteredMethod:
    """The registered method ``name``; a ConfigError naming the known ones otherwise."""
    methods = load_methods()
    if name not in methods:
        raise ConfigError(f"method={name!r} is not one of {', '.join(methods)}{did_you_mean(name, methods)}")
    return methods[name]


@dataclass
class MethodConfig(draccus.ChoiceRegistry):
    """Base of the methods' configs (the run's ``method_config``), one registered per method: the
    choice's name is the method's (``Method.name``), read from the method registry."""

    # wmrl.config_messages.field_names lists this section as one name: the fields it has are the
    # run's method's, checked against that method (wmrl/config_compat.py), not every method's.
    FIELDS_LISTED = False

    @classmethod
    def get_known_choices(cls) -> dict[str, Any]:
        return {name: method.config for name, method in load_methods().items()}

    @classmethod
    def get_choice_class(cls, name: str) -> Any:
        return registered_method(name).config

    @classmethod
    def get_choice_name(cls, subcls: type) -> str:
        for name, config in cls.get_known_choices().items():
            if config is subcls:
                return name
        raise ValueError(f"{subcls.__qualname__} is the config of no registered method")

    def check(self, run: RunView) -> None:
        """Refuse a setting that ``run`` cannot use (its domain lacks what it needs): each component's
        own ``check``, where it has one."""
        for f in dataclasses.fields(self):
            component_check = getattr(getattr(self, f.name), "check", None)
            if component_check is not None:
                component_check(run)


@dataclass
class DebiasConfig:
    # The calibration stays the identity until this many anchor (r_hat, r) pairs were seen.
    warmup_pairs: int = 200
    # Refit the isotonic map every this many new pairs.
    refit_every: int = 64
    # FIFO capacity of the pair buffer.
    buffer_size: int = 5000

    def __post_init__(self) -> None:
        check(self.warmup_pairs >= 2, f"debias.warmup_pairs={self.warmup_pairs} must be >= 2")
        check(self.refit_every >= 1, f"debias.refit_every={self.refit_every} must be >= 1")
        check(
            self.buffer_size >= self.warmup_pairs,
            f"debias.buffer_size={self.buffer_size} must be >= debias.warmup_pairs={self.warmup_pairs}",
        )


@dataclass
class DenoiseConfig:
    # Half-life, in observations (anchor groups), of the EWMA of the normalised residual s2.
    half_life: float = 64.0
    # c is fixed after this many observations so that w equals w_target at that moment, then frozen.
    warmup_obs: int = 32
    w_target: float = 2.0
    # w = clip(1 + c * s2, 1, w_max).
    w_max: float = 4.0
    # Optional per-sample weight 1 / (var + var_floor) from WM-reported variance, mean 1 over the WM stream.
    sample_weights: bool = False
    var_floor: float = 1e-3
    sample_weight_max: float = 4.0

    def __post_init__(self) -> None:
        finite(self, "denoise.")
        check(self.half_life > 0, f"denoise.half_life={self.half_life} must be > 0")
        check(self.warmup_obs >= 1, f"denoise.warmup_obs={self.warmup_obs} must be >= 1")
        check(
            1 <= self.w_target <= self.w_max,
            f"denoise.w_target={self.w_target} must lie in [1, denoise.w_max={self.w_max}]",
        )
        check(self.var_floor > 0, f"denoise.var_floor={self.var_floor} must be > 0")
        check(self.sample_weight_max >= 1, f"denoise.sample_weight_max={self.sample_weight_max} must be >= 1")


@dataclass
class PPIConfig:
    # lambda is estimated from the last this-many anchor groups of earlier steps.
    window_groups: int = 64
    # lambda stays 0 (anchors alone) until this many anchor groups of earlier steps were seen.
    warmup_groups: int = 8
    # A fixed lambda in [0, 1] instead of the power-tuned one (None: tuned).
    lam: float | None = None
    # Tune lambda per quantile bin of the WM's reported variance (1: one lambda for every rollout).
    var_bins: int = 3
    # Start lambda's window with the domain's pre-training execution log as anchor groups (out-of-fold
    # WM scores of the starting policy's logged samples), so lambda need not wait for warmup_groups
    # of the run's own anchors; a domain without such a log (HAS_EXECUTION_LOG) refuses it.
    prior_from_log: bool = False
    # What lambda's covariances are taken on: "advantage" (per-rollout advantages, the score
    # directions taken as orthonormal) or "gradient" (each anchor group's real and WM gradients, from
    # per-rollout score directions: one extra forward and backward pass per anchor rollout and WM row).
    moments: str = "advantage"
    # Shrink the tuned lambda toward 0 while rho is uncertain: lambda is taken at the one-sided lower
    # confidence bound of rho at this level (Fisher z on the window's effective sample size) instead
    # of its estimate, lambda * max(0, rho_lo) / rho (wmrl.ppi.shrink_lambda); null: the point estimate.
    shrink_confidence: float | None = 0.9

    def __post_init__(self) -> None:
        finite(self, "ppi.")
        one_of("ppi.moments", self.moments, ("advantage", "gradient"))
        check(
            self.shrink_confidence is None or 0.5 <= self.shrink_confidence < 1,
            f"ppi.shrink_confidence={self.shrink_confidence} must lie in [0.5, 1) (or null: no shrinkage)",
        )
        check(
            not (self.prior_from_log and self.moments == "gradient"),
            "ppi.prior_from_log logs no gradients: it needs ppi.moments=advantage",
        )
        check(self.window_groups >= 2, f"ppi.window_groups={self.window_groups} must be >= 2")
        check(self.warmup_groups >= 1, f"ppi.warmup_groups={self.warmup_groups} must be >= 1")
        check(self.lam is None or 0 <= self.lam <= 1, f"ppi.lam={self.lam} must lie in [0, 1]")
        check(self.var_bins >= 1, f"ppi.var_bins={self.var_bins} must be >= 1")

    def check(self, run: RunView) -> None:
        """``prior_from_log`` needs a domain that keeps a pre-training execution log."""
        domain = type(run.domain)
        check(
            not self.prior_from_log or domain.HAS_EXECUTION_LOG,
            f"ppi.prior_from_log=true needs a domain with a pre-training execution log (research); "
            f"domain.type={domain.get_choice_name(domain)!r} has none",
        )


@dataclass
class Calibrates(MethodConfig):
    """The settings of a method that calibrates the world model's scores (``Method.calibrates``)."""

    # The online isotonic calibration of the world model's scores (wmrl/debias.py).
    debias: DebiasConfig = field(default_factory=DebiasConfig)


@dataclass
class Denoises(MethodConfig):
    """The settings of a method that weights its anchor advantages (``Method.denoises``)."""

    # The denoiser: the anchor rows' weight w from the WM's residual on them (wmrl/denoise.py).
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)


def method_config_class(method_cls: Any) -> type[MethodConfig]:
    """The config class of the method class ``method_cls``: its own ``config`` where it declares one,
    else a subclass of the config it inherits from a registered method, else one made of the
    components its ``calibrates`` and ``denoises`` say it keeps (no field for a method that keeps
    none), created once per method class. A ValueError where a declared
    config lacks a component the method keeps."""
    declared, inherited = vars(method_cls).get("config"), getattr(method_cls, "config", MethodConfig)
    keeps: dict[type[MethodConfig], bool] = {Calibrates: method_cls.calibrates, Denoises: method_cls.denoises}
    if declared is None:  # a subclass of a registered method's config, or of the components it keeps
        # (bases reversed: a dataclass's fields follow its bases from the last, so debias comes first)
        own = tuple(c for c, kept in reversed(keeps.items()) if kept) or (MethodConfig,)
        bases = own if inherited is MethodConfig else (inherited,)
        name = f"{method_cls.__name__}MethodConfig"
        declared = dataclasses.make_dataclass(name, [], bases=bases)
        declared.__module__ = method_cls.__module__
        setattr(sys.modules[method_cls.__module__], name, declared)  # importable by name (pickle)
    if not (isinstance(declared, type) and issubclass(declared, MethodConfig)):
        raise ValueError(f"{method_cls.__qualname__}.config={declared!r} is not a MethodConfig subclass")
    for component, kept in keeps.items():
        if kept and not issubclass(declared, component):
            raise ValueError(
                f"{method_cls.__qualname__}.config={declared.__qualname__} must subclass {component.__name__}: "
                f"the method keeps its component ({', '.join(f.name for f in dataclasses.fields(component))})"
            )
    return declared
