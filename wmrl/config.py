"""Composed run configuration: one dataclass per component, CLI overrides and YAML presets (draccus).

A run is ``RunConfig``: the method, the domain (a registered choice, ``--domain.type=toy``) and one
dataclass per component. Every field is overridable from the command line
(``--grpo.group_size=8 --anchors.fraction=0.25``) and presets are YAML files in ``configs/``.
Validation lives in ``__post_init__`` and quotes the offending values.

Domains register their config class by name through the ``wmrl.domains`` entry-point group, so the
core never imports a domain package until that domain is asked for.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import draccus

if TYPE_CHECKING:
    from wmrl.domain import Domain

METHODS = ("real", "wm", "mix", "debias", "denoise", "wmrl")
"""`real` executes every group (standard GRPO); `wm` none; `mix` anchors + raw WM scores; `debias`
calibrates WM scores; `denoise` up-weights anchor advantages by w (residual on raw scores); `wmrl`
does both (residual after calibration)."""

EXECUTORS = ("process", "ray", "inline")
# RunConfig.device: auto | cpu | cuda | cuda:N (resolved by wmrl.device.resolve_device)
DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the offending value."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, f"{name}={value!r} is not one of {', '.join(choices)}")


@dataclass
class GRPOConfig:
    # Rollouts per task (a GRPO group).
    group_size: int = 8
    # Tasks (groups) sampled per training step.
    tasks_per_step: int = 16
    # Training steps.
    steps: int = 100
    # "adamw" or "sgd" (plain gradient steps keep the advantages' sizes in the update; the toy uses it).
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    # PPO clip range for the probability ratio.
    clip_eps: float = 0.2
    # Optimizer passes over each batch, and minibatches per pass (split by group).
    epochs: int = 1
    minibatches: int = 1
    # "grpo": (r - mean) / (std + std_eps) per group; "dr_grpo": r - mean (Dr.GRPO, arXiv:2503.20783).
    advantage: str = "grpo"
    std_eps: float = 1e-4
    # "token_mean": mean over all real tokens of the batch; "seq_mean": mean over tokens, then rollouts.
    loss_agg: str = "token_mean"
    # Coefficient of the k3 KL estimate to a frozen copy of the initial policy (0 disables it).
    kl_coef: float = 0.0
    # Global gradient-norm clip (<= 0 disables it).
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        _check(
            self.group_size >= 2,
            f"grpo.group_size={self.group_size} must be >= 2 (advantages are within-group)",
        )
        _check(self.tasks_per_step >= 1, f"grpo.tasks_per_step={self.tasks_per_step} must be >= 1")
        _check(self.steps >= 0, f"grpo.steps={self.steps} must be >= 0")
        _check(self.lr > 0, f"grpo.lr={self.lr} must be > 0")
        _check(0 < self.clip_eps < 1, f"grpo.clip_eps={self.clip_eps} must lie in (0, 1)")
        _check(self.epochs >= 1, f"grpo.epochs={self.epochs} must be >= 1")
        _check(
            1 <= self.minibatches <= self.tasks_per_step,
            f"grpo.minibatches={self.minibatches} must lie in [1, grpo.tasks_per_step={self.tasks_per_step}]",
        )
        _one_of("grpo.optimizer", self.optimizer, ("adamw", "sgd"))
        _one_of("grpo.advantage", self.advantage, ("grpo", "dr_grpo"))
        _one_of("grpo.loss_agg", self.loss_agg, ("token_mean", "seq_mean"))
        _check(self.kl_coef >= 0, f"grpo.kl_coef={self.kl_coef} must be >= 0")


@dataclass
class AnchorConfig:
    # Target fraction of groups executed for real (ignored by `real`, which executes all, and `wm`, none).
    fraction: float = 0.25
    # At least this many anchor groups per step.
    min_groups: int = 1
    # Cap on concurrent real executions (executor workers).
    max_concurrent: int = 2

    def __post_init__(self) -> None:
        _check(0 <= self.fraction <= 1, f"anchors.fraction={self.fraction} must lie in [0, 1]")
        _check(self.min_groups >= 0, f"anchors.min_groups={self.min_groups} must be >= 0")
        _check(self.max_concurrent >= 1, f"anchors.max_concurrent={self.max_concurrent} must be >= 1")


@dataclass
class DebiasConfig:
    # The calibration stays the identity until this many anchor (r_hat, r) pairs were seen.
    warmup_pairs: int = 200
    # Refit the isotonic map every this many new pairs.
    refit_every: int = 64
    # FIFO capacity of the pair buffer.
    buffer_size: int = 5000

    def __post_init__(self) -> None:
        _check(self.warmup_pairs >= 2, f"debias.warmup_pairs={self.warmup_pairs} must be >= 2")
        _check(self.refit_every >= 1, f"debias.refit_every={self.refit_every} must be >= 1")
        _check(
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
        _check(self.half_life > 0, f"denoise.half_life={self.half_life} must be > 0")
        _check(self.warmup_obs >= 1, f"denoise.warmup_obs={self.warmup_obs} must be >= 1")
        _check(
            1 <= self.w_target <= self.w_max,
            f"denoise.w_target={self.w_target} must lie in [1, denoise.w_max={self.w_max}]",
        )
        _check(self.var_floor > 0, f"denoise.var_floor={self.var_floor} must be > 0")
        _check(
            self.sample_weight_max >= 1, f"denoise.sample_weight_max={self.sample_weight_max} must be >= 1"
        )


@dataclass
class ExecutorConfig:
    # "process": local process pool (default); "ray": Ray tasks on a cluster; "inline": in this process.
    type: str = "process"
    # Wall-clock limit per job, seconds; a job past it is killed and reported ungraded.
    timeout_s: float = 120.0
    # Ray cluster address (None starts a local one); CPUs per Ray task.
    ray_address: str | None = None
    ray_num_cpus: float = 1.0

    def __post_init__(self) -> None:
        _one_of("executor.type", self.type, EXECUTORS)
        _check(self.timeout_s > 0, f"executor.timeout_s={self.timeout_s} must be > 0")


@dataclass
class TrackingConfig:
    # wandb mode: "offline" (default, sync later with `wandb sync`), "online", or "disabled".
    wandb: str = "offline"
    project: str = "wmrl"
    # Save a checkpoint every this many steps (and at the end).
    checkpoint_every: int = 10
    # Evaluate on the held-out split every this many steps (0: only at the end).
    eval_every: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        _one_of("tracking.wandb", self.wandb, ("offline", "online", "disabled"))
        _check(self.checkpoint_every >= 1, f"tracking.checkpoint_every={self.checkpoint_every} must be >= 1")


@dataclass
class CompareConfig:
    # Methods and seeds that `wmrl run` sweeps when it runs a comparison (empty: one run).
    methods: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    # A run reaches the threshold at the first step whose training metric `threshold_metric` >= it.
    threshold: float | None = None
    threshold_metric: str = "true_reward/policy"

    def __post_init__(self) -> None:
        for m in self.methods:
            _one_of("compare.methods entry", m, METHODS)


@dataclass
class DomainConfig(draccus.ChoiceRegistry):
    """Base of the per-domain configs, registered by name (``--domain.type=toy``)."""

    def build(self, run: RunConfig) -> Domain:  # pragma: no cover - interface
        """The ready-to-train domain: whatever it needs first (demos, SFT, WM pretraining) happens
        here, cached under ``run.out_dir`` or the domain's own cache directory."""
        raise NotImplementedError

    @classmethod
    def task_lines(cls) -> list[str]:  # pragma: no cover - interface
        """One line per registered task for ``wmrl tasks <domain>``: the id, then tab-separated columns."""
        raise NotImplementedError


_DOMAINS_LOADED = False


def load_domains() -> list[str]:
    """Import the config module of every domain registered under the ``wmrl.domains`` entry points."""
    global _DOMAINS_LOADED
    if not _DOMAINS_LOADED:
        for ep in entry_points(group="wmrl.domains"):
            ep.load()
        _DOMAINS_LOADED = True
    return sorted(DomainConfig.get_known_choices())


def _default_domain() -> DomainConfig:
    load_domains()
    return DomainConfig.get_choice_class("toy")()


@dataclass
class RunConfig:
    # `real` | `wm` | `mix` | `debias` | `denoise` | `wmrl` (see wmrl.config.METHODS).
    method: str = "wmrl"
    seed: int = 0
    # Run directory: config, metrics.jsonl, checkpoints, plots.
    out_dir: str = "runs/latest"
    # Torch intra-op threads per process (1 is fastest for small models on a few cores).
    torch_threads: int = 1
    # Refine the WM on a step's anchors in a thread while the policy updates (the two are
    # independent). For bit-exact reruns both must draw randomness from their own generators.
    overlap_wm_update: bool = True
    # Where the domain's models train and run: auto (CUDA when present) | cpu | cuda | cuda:N.
    device: str = "cpu"
    domain: DomainConfig = field(default_factory=_default_domain)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    anchors: AnchorConfig = field(default_factory=AnchorConfig)
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)

    def __post_init__(self) -> None:
        _one_of("method", self.method, METHODS)
        _check(self.torch_threads >= 1, f"torch_threads={self.torch_threads} must be >= 1")
        _check(
            DEVICE_RE.match(str(self.device)) is not None,
            f"device={self.device!r} is not one of auto, cpu, cuda, cuda:N",
        )
        if self.method in ("mix", "debias", "denoise", "wmrl"):
            _check(
                self.anchors.fraction > 0 or self.anchors.min_groups > 0,
                f"method={self.method!r} needs anchor groups but anchors.fraction=0 and anchors.min_groups=0",
            )

    @property
    def uses_calibration(self) -> bool:
        return self.method in ("debias", "wmrl")

    @property
    def uses_anchor_weight(self) -> bool:
        return self.method in ("denoise", "wmrl")


def presets() -> dict[str, Path]:
    """Named presets: ``configs/<name>.yaml``."""
    return {p.stem: p for p in sorted(CONFIGS_DIR.glob("*.yaml"))}


def resolve_preset(name_or_path: str) -> Path:
    """A preset name (``toy``) or a path to a YAML file; unknown names list the known ones."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        return path
    known = presets()
    if name_or_path not in known:
        raise ConfigError(f"unknown preset {name_or_path!r}; known presets: {', '.join(known) or '(none)'}")
    return known[name_or_path]


def load_config(preset: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Parse a RunConfig from an optional preset (name or YAML path) plus ``--a.b=value`` overrides.

    Every problem (unknown preset, malformed YAML, unknown field, invalid value) raises ConfigError
    with a message that names it.
    """
    import yaml

    load_domains()
    path = resolve_preset(str(preset)) if preset is not None else None
    if path is not None:
        try:
            content = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"malformed YAML in {path}: {e}") from None
        if content is not None and not isinstance(content, dict):
            raise ConfigError(f"{path} must hold a mapping of config fields, got {type(content).__name__}")
    try:
        return draccus.parse(RunConfig, config_path=path, args=list(overrides or []), exit_on_error=False)
    except (draccus.ParsingError, argparse.ArgumentError, ValueError, TypeError, KeyError) as e:
        cause = _root_config_error(e)
        if cause is not None:
            raise cause from None
        where = f" (preset {path})" if path else ""
        raise ConfigError(f"invalid configuration{where}: {e}") from None
    except SystemExit as e:  # argparse exits on unknown flags even with exit_on_error=False
        raise ConfigError(f"invalid command-line overrides {overrides}: see the message above") from e


def _root_config_error(e: BaseException | None) -> ConfigError | None:
    """The ConfigError a dataclass raised, if draccus wrapped one while instantiating it."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ConfigError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def to_dict(cfg: Any) -> dict:
    """The config as plain data (what ``config.yaml`` in a run directory holds)."""
    return draccus.encode(cfg)


def save_config(cfg: RunConfig, path: Path) -> None:
    with open(path, "w") as f:
        draccus.dump(cfg, f)


def config_fingerprint(cfg: RunConfig) -> dict:
    """The fields a checkpoint must agree with to be resumed (everything but bookkeeping)."""
    d = to_dict(cfg)
    for k in ("out_dir", "tracking", "compare", "executor", "torch_threads"):
        d.pop(k, None)
    d["grpo"] = {k: v for k, v in d["grpo"].items() if k != "steps"}
    return d


def half_life_to_alpha(half_life: float) -> float:
    """EWMA weight of a new observation so that an old one's weight halves every ``half_life`` steps."""
    return 1.0 - math.pow(0.5, 1.0 / half_life)
