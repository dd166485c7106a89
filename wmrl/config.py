"""Composed run configuration: one dataclass per component, CLI overrides and YAML presets (draccus).

A run is ``RunConfig``: the method, the domain (a registered choice, ``--domain.type=toy``) and one
dataclass per component. Every field is overridable from the command line
(``--grpo.group_size=8 --anchors.fraction=0.25``) and presets are YAML files in ``wmrl/configs/``
(package data: an installed wheel has them too).
Validation lives in ``__post_init__`` and quotes the offending values.

Domains register their config class by name through the ``wmrl.domains`` entry-point group, so the
core never imports a domain package until that domain is asked for. Methods register themselves in
``METHODS`` the same way (the ``wmrl.methods`` group: wmrl/methods, and any package's own), so this
module reads the registry and imports no method.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import draccus
from draccus.utils import DraccusException

from wmrl.advantages import ADVANTAGES
from wmrl.config_messages import (
    did_you_mean,
    malformed_yaml,
    selected_domain,
    unknown_flags_message,
    with_suggestion,
)
from wmrl.extras import domain_extras, missing_extra_message

if TYPE_CHECKING:
    from wmrl.domain import Domain


class RegisteredMethod(Protocol):
    """What the config reads of a registered method (the contract is wmrl/methods/base.py)."""

    def check(self, run: RunConfig) -> None: ...


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


EXECUTORS = ("process", "ray", "inline")
# RunConfig.precision (wmrl.device.autocast)
PRECISIONS = ("fp32", "bf16")
# RunConfig.device: auto | cpu | cuda | cuda:N (resolved by wmrl.device.resolve_device)
DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
# The named presets: package data of wmrl, found through importlib.resources (a wheel ships them).
CONFIGS_DIR = Path(str(resources.files("wmrl") / "configs"))


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the offending value."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _finite(section: Any, prefix: str) -> None:
    """Refuse a float field of ``section`` that is inf or nan (``--grpo.lr=inf`` parses as a float,
    then failed deep inside torch without naming the field)."""
    import dataclasses

    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name}={value} must be a finite number")


# Bounds that no run reaches but a typo does (an extra zero or three): refused at parse time, one
# line naming the field, instead of failing in the allocator or training for ever.
MAX_ROLLOUTS_PER_STEP = 1_000_000
MAX_STEPS = 10_000_000


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    _check(
        value in choices, f"{name}={value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}"
    )


def check_ids(field_name: str, given, known, listing: str) -> None:
    """Raise a ConfigError naming the first of ``given`` not in ``known``, with the closest known id
    and the command that lists them (``listing``). For task ids, before anything is built."""
    known = list(known)
    for task_id in given or ():
        if task_id not in known:
            raise ConfigError(
                f"{field_name}: unknown task id {task_id!r}{did_you_mean(task_id, known)} "
                f"(`{listing}` lists the {len(known)} ids)"
            )


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
    # A registered advantage kind (wmrl/advantages.py): "grpo": (r - mean) / (std + std_eps) per group;
    # "dr_grpo": r - mean (Dr.GRPO, arXiv:2503.20783).
    advantage: str = "grpo"
    std_eps: float = 1e-4
    # "token_mean": mean over all real tokens of the batch; "seq_mean": mean over tokens, then rollouts.
    loss_agg: str = "token_mean"
    # Coefficient of the k3 KL estimate to a frozen copy of the initial policy (0 disables it).
    kl_coef: float = 0.0
    # Global gradient-norm clip (<= 0 disables it).
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        _finite(self, "grpo.")
        _check(
            self.group_size >= 2,
            f"grpo.group_size={self.group_size} must be >= 2 (advantages are within-group)",
        )
        _check(self.tasks_per_step >= 1, f"grpo.tasks_per_step={self.tasks_per_step} must be >= 1")
        _check(self.steps >= 1, f"grpo.steps={self.steps} must be >= 1")
        _check(self.steps <= MAX_STEPS, f"grpo.steps={self.steps} must be at most {MAX_STEPS:_}")
        rollouts = self.group_size * self.tasks_per_step
        _check(
            rollouts <= MAX_ROLLOUTS_PER_STEP,
            f"grpo.group_size={self.group_size} x grpo.tasks_per_step={self.tasks_per_step} is {rollouts:_} "
            f"rollouts a step; at most {MAX_ROLLOUTS_PER_STEP:_}",
        )
        _check(self.lr > 0, f"grpo.lr={self.lr} must be > 0")
        _check(0 < self.clip_eps < 1, f"grpo.clip_eps={self.clip_eps} must lie in (0, 1)")
        _check(self.epochs >= 1, f"grpo.epochs={self.epochs} must be >= 1")
        _check(
            1 <= self.minibatches <= self.tasks_per_step,
            f"grpo.minibatches={self.minibatches} must lie in [1, grpo.tasks_per_step={self.tasks_per_step}]",
        )
        _one_of("grpo.optimizer", self.optimizer, ("adamw", "sgd"))
        _one_of("grpo.advantage", self.advantage, tuple(ADVANTAGES))
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
        _finite(self, "anchors.")
        _check(0 <= self.fraction <= 1, f"anchors.fraction={self.fraction} must lie in [0, 1]")
        _check(self.min_groups >= 0, f"anchors.min_groups={self.min_groups} must be >= 0")
        _check(self.max_concurrent >= 1, f"anchors.max_concurrent={self.max_concurrent} must be >= 1")

    def count(self, n_groups: int) -> int:
        """Anchor groups among ``n_groups``: ``max(min_groups, round(fraction * n_groups))``, at most
        ``n_groups`` (the methods that execute some groups, not all or none)."""
        return min(n_groups, max(self.min_groups, math.floor(self.fraction * n_groups + 0.5)))

    def check_for(self, method: str, n_groups: int) -> None:
        """Refuse a count the method cannot use: ``fraction=0`` (it would still execute ``min_groups``
        groups a step) and 0 groups a step (``ppi`` would train on the WM alone, a biased update)."""
        _check(
            self.fraction > 0,
            f"anchors.fraction=0 with method={method!r}: it would still execute "
            f"anchors.min_groups={self.min_groups} group(s) per step; set the fraction you mean (one group "
            f"of grpo.tasks_per_step={n_groups} is {1 / n_groups:.4g}), or use method='wm' for no execution",
        )
        _check(
            self.count(n_groups) >= 1,
            f"anchors.fraction={self.fraction} of grpo.tasks_per_step={n_groups} rounds to 0 anchor groups "
            f"per step with anchors.min_groups=0; method={method!r} needs at least one (a step without "
            "anchors gives no unbiased update): set anchors.min_groups=1 or raise anchors.fraction to "
            f">= {0.5 / n_groups:.4g}",
        )


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
        _finite(self, "denoise.")
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
        _finite(self, "ppi.")
        _one_of("ppi.moments", self.moments, ("advantage", "gradient"))
        _check(
            self.shrink_confidence is None or 0.5 <= self.shrink_confidence < 1,
            f"ppi.shrink_confidence={self.shrink_confidence} must lie in [0.5, 1) (or null: no shrinkage)",
        )
        _check(
            not (self.prior_from_log and self.moments == "gradient"),
            "ppi.prior_from_log logs no gradients: it needs ppi.moments=advantage",
        )
        _check(self.window_groups >= 2, f"ppi.window_groups={self.window_groups} must be >= 2")
        _check(self.warmup_groups >= 1, f"ppi.warmup_groups={self.warmup_groups} must be >= 1")
        _check(self.lam is None or 0 <= self.lam <= 1, f"ppi.lam={self.lam} must lie in [0, 1]")
        _check(self.var_bins >= 1, f"ppi.var_bins={self.var_bins} must be >= 1")


@dataclass
class ExecutorConfig:
    """Where work runs: a run's real executions (jobs), or a comparison grid's cells (its spec's
    ``executor:`` section, wmrl/grid.py). One config for both."""

    # "process": local worker processes (default); "ray": Ray tasks on a cluster; "inline": in this process.
    type: str = "process"
    # Local worker processes of a grid (type=process); with type=ray and no address, the CPUs of the
    # local cluster it starts. A run's concurrent executions are anchors.max_concurrent.
    workers: int = 2
    # Wall-clock limit per job of a run, seconds; a job past it is killed and reported ungraded (a
    # grid's cells take theirs from their presets and overrides).
    timeout_s: float = 120.0
    # Ray cluster address (None starts a local one); resources each Ray task declares (a run's job,
    # a grid's cell).
    ray_address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        _finite(self, "executor.")
        _one_of("executor.type", self.type, EXECUTORS)
        missing_ray = self.type == "ray" and missing_extra_message("ray", "executor.type=ray")
        if missing_ray:
            raise ConfigError(missing_ray)
        _check(self.workers >= 1, f"executor.workers={self.workers} must be >= 1")
        _check(self.timeout_s > 0, f"executor.timeout_s={self.timeout_s} must be > 0")
        _check(
            self.num_cpus >= 0 and self.num_gpus >= 0,
            f"executor.num_cpus={self.num_cpus} and executor.num_gpus={self.num_gpus} must be >= 0",
        )


DIST_GENERATION = ("shard", "replicate")


@dataclass
class DistributedConfig:
    # Data-parallel training through accelerate (DDP: gloo on CPU, NCCL on GPU) over the processes
    # that `torchrun` or `accelerate launch` started; also on when WORLD_SIZE > 1 is set. One process
    # without it trains exactly as before. See docs/scaling.md.
    enabled: bool = False
    # "shard": each rank generates its contiguous share of the step's tasks (the domain must offer
    # `shard_rng(rank, step)`, called before each step's generation, so ranks draw independent
    # noise); "replicate": every rank generates the whole step
    # with the same generators and keeps its share (bit-for-bit the 1-process batch; for domains
    # whose generation is cheap, and for checking equivalence with a 1-process run).
    generation: str = "shard"
    # DDP's find_unused_parameters (needed by policies whose loss skips some trainable parameters).
    find_unused_parameters: bool = False

    def __post_init__(self) -> None:
        _one_of("distributed.generation", self.generation, DIST_GENERATION)


@dataclass
class TrackingConfig:
    # wandb mode: "offline" (default, sync later with `wandb sync`), "online", or "disabled".
    wandb: str = "offline"
    project: str = "wmrl"
    # Save a checkpoint every this many steps (and at the end).
    checkpoint_every: int = 10
    # Evaluate on the held-out split every this many steps (0: only at the end).
    eval_every: int = 0
    # Progress bars and stage messages (training, and the domain's build: sandbox start, execution
    # log, demos, SFT, WM pretraining, evaluation) on stderr; false silences them all.
    progress: bool = True
    # Stop the run (checkpoint saved, exit status 2) after this many steps in a row whose every anchor
    # rollout came back ungraded (exec/ungraded == exec/step > 0): real execution is failing, not the
    # policy. One such step can be a transient (a worker restarting, a timeout under load); a cause
    # that persists fails every step. 0: never stop (each such step still warns).
    max_ungraded_steps: int = 3
    # Log rollout media to wandb every this many steps (0: never): the domain's rollout_media (VLA:
    # real simulator frames beside the WM's imagined frames of the same actions, as a GIF; research:
    # a table of edits with predicted and true scores; toy: a table of actions). Not with wandb disabled.
    media_every: int = 10

    def __post_init__(self) -> None:
        _one_of("tracking.wandb", self.wandb, ("offline", "online", "disabled"))
        _check(self.checkpoint_every >= 1, f"tracking.checkpoint_every={self.checkpoint_every} must be >= 1")
        _check(self.media_every >= 0, f"tracking.media_every={self.media_every} must be >= 0")
        _check(
            self.max_ungraded_steps >= 0,
            f"tracking.max_ungraded_steps={self.max_ungraded_steps} must be >= 0",
        )


@dataclass
class DomainConfig(draccus.ChoiceRegistry):
    """Base of the per-domain configs, registered by name (``--domain.type=toy``).

    Two class attributes (not config fields) tell a comparison grid how to read a domain's held-out
    evaluation: ``HELDOUT_SCORE``, the key of ``Domain.evaluate`` that is its score, and
    ``HELDOUT_SIZE``, the config field that sets how many held-out episodes or samples per task it
    runs (None: the evaluation is exact). A third, ``HAS_EXECUTION_LOG``, says whether the built
    domain offers ``prior_anchor_groups`` (``ppi.prior_from_log``)."""

    HELDOUT_SCORE = "score"
    HELDOUT_SIZE: str | None = None
    HAS_EXECUTION_LOG = False  # the built domain offers prior_anchor_groups (ppi.prior_from_log)

    def bf16_unsupported(self) -> str | None:
        """Why this domain's models do not run under ``precision=bf16`` (None: they do), so that
        ``RunConfig`` refuses it when the config is parsed, not after the domain was built."""
        return None

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
    # `real` | `anchors_only` | `wm` | `mix` | `debias` | `denoise` | `wmrl` | `ppi`: a method registered
    # in wmrl/methods (METHODS).
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
    # Autocast of the policy's forward passes (generation, the update, the reference), the WM's
    # predictions and evaluation: fp32 (none) | bf16 (torch.autocast to bfloat16 on the run's device;
    # the losses, SFT and the WM's refinement stay in float32).
    precision: str = "fp32"
    # Placebo world model, a control (wmrl/methods/placebo.py): every step the WM's predictions are
    # permuted within each group, so the method runs its own code path on scores that rank nothing.
    wm_placebo: bool = False
    domain: DomainConfig = field(default_factory=_default_domain)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    anchors: AnchorConfig = field(default_factory=AnchorConfig)
    debias: DebiasConfig = field(default_factory=DebiasConfig)
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)
    ppi: PPIConfig = field(default_factory=PPIConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        method = registered_method(self.method)
        _check(self.torch_threads >= 1, f"torch_threads={self.torch_threads} must be >= 1")
        _check(
            DEVICE_RE.match(str(self.device)) is not None,
            f"device={self.device!r} is not one of auto, cpu, cuda, cuda:N",
        )
        _one_of("precision", self.precision, PRECISIONS)
        _check(bool(str(self.out_dir).strip()), "out_dir is empty: give the run directory")
        _finite(self, "")
        _finite(self.domain, "domain.")
        unsupported = self.domain.bf16_unsupported() if self.precision == "bf16" else None
        _check(
            not unsupported,
            f"precision=bf16 is not supported here: {unsupported}; use --precision=fp32",
        )
        _check(
            not self.ppi.prior_from_log or type(self.domain).HAS_EXECUTION_LOG,
            f"ppi.prior_from_log=true needs a domain with a pre-training execution log (research); "
            f"domain.type={DomainConfig.get_choice_name(type(self.domain))!r} has none",
        )
        method.check(self)  # its own fields, and wm_placebo


def presets() -> dict[str, Path]:
    """Named presets: ``wmrl/configs/<name>.yaml``."""
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
        raise ConfigError(
            f"unknown preset {name_or_path!r}; known presets: {', '.join(known) or '(none)'}"
            + did_you_mean(name_or_path, known)
        )
    return known[name_or_path]


def load_config(preset: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Parse a RunConfig from an optional preset (name or YAML path) plus ``--a.b=value`` overrides.

    Every problem (unknown preset, malformed YAML, unknown field, invalid value) raises ConfigError
    with a message that names it.
    """
    import yaml

    load_domains()
    path = resolve_preset(str(preset)) if preset is not None else None
    content = None
    if path is not None:
        try:
            content = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(malformed_yaml(path, e)) from None
        if content is not None and not isinstance(content, dict):
            raise ConfigError(f"{path} must hold a mapping of config fields, got {type(content).__name__}")
    _refuse_comparison(path, content, list(overrides or []))
    _check_extras(selected_domain(list(overrides or []), content))
    try:
        with _without_obsolete_fields(path, content) as parsed_path:
            return draccus.parse(
                RunConfig, config_path=parsed_path, args=list(overrides or []), exit_on_error=False
            )
    except (draccus.ParsingError, argparse.ArgumentError, ValueError, TypeError, KeyError) as e:
        cause = _root_config_error(e)
        if cause is not None:
            raise cause from None
        where = f" (preset {path})" if path else ""
        raise ConfigError(
            f"invalid configuration{where}: {with_suggestion(RunConfig, str(e), content)}"
        ) from None
    except DraccusException as e:  # unrecognized --flags
        raise ConfigError(unknown_flags_message(RunConfig, list(overrides or []), content, str(e))) from None
    except SystemExit as e:  # argparse exits on unknown flags even with exit_on_error=False
        raise ConfigError(f"invalid command-line overrides {overrides}: see the message above") from e


def _check_extras(domain: str | None) -> None:
    """A domain whose extra is not installed fails here, before anything is built or written, in
    one line naming the extra to install (wmrl/extras.py)."""
    for extra in domain_extras(domain) if domain else ():
        message = missing_extra_message(extra, f"domain.type={domain}")
        if message:
            raise ConfigError(message)


def _refuse_comparison(path: Path | None, content: dict | None, overrides: list[str]) -> None:
    """A preset or override that asks ``wmrl run`` for a comparison (``compare.methods``, gone):
    one ConfigError pointing to the grid. A saved run's empty ``compare`` section still loads."""
    given = [o for o in overrides if o.startswith("--compare.")]
    swept = (content or {}).get("compare")
    if given or (isinstance(swept, dict) and swept.get("methods")):
        what = given[0] if given else f"compare.methods in {path}"
        raise ConfigError(
            f"{what}: `wmrl run` trains one run (--method, --seed); a comparison of methods over seeds "
            "is a grid: `wmrl compare SPEC` (methods and seeds in the spec, e.g. benchmarks/specs/toy.yaml)"
        )


# A run folder or checkpoint saved before a field existed holds no value for it: the value that
# reproduces how such runs trained (a field added since whose default changes training, such as
# ppi's lambda shrinkage, is then named in the resume's mismatch message, not switched on silently).
FIELDS_ADDED: dict[str, Any] = {"wm_placebo": False, "ppi.shrink_confidence": None}
# Fields that no longer exist, dropped from an older run's files: domain.progress is now
# tracking.progress, the one switch for every progress bar; compare (the methods and seeds `wmrl run`
# swept) is a grid spec's now (`wmrl compare SPEC`); executor.ray_num_cpus is executor.num_cpus.
FIELDS_REMOVED = ("domain.progress", "compare", "executor.ray_num_cpus")


def upgrade_saved(d: dict, fill_added: bool = True) -> dict:
    """A copy of a saved config (or checkpoint fingerprint) as plain data with ``FIELDS_REMOVED``
    dropped and, with ``fill_added``, ``FIELDS_ADDED`` filled where absent, so that it compares
    with a config of today. (A preset is only cleaned: a field it leaves out takes its default.)"""
    d = copy.deepcopy(d)
    for name in FIELDS_REMOVED:
        section, _, leaf = name.rpartition(".")
        parent = d.get(section) if section else d
        if isinstance(parent, dict):
            parent.pop(leaf, None)
    for name, value in FIELDS_ADDED.items() if fill_added else ():
        section, _, leaf = name.rpartition(".")
        parent = d.get(section) if section else d
        if isinstance(parent, dict):
            parent.setdefault(leaf, value)
    return d


@contextlib.contextmanager
def _without_obsolete_fields(path: Path | None, content: dict | None):
    """``path``, or a copy of it without ``FIELDS_REMOVED``, so that the ``config.yaml`` of an older
    run still loads."""
    cleaned = upgrade_saved(content, fill_added=False) if isinstance(content, dict) else content
    if path is None or cleaned == content:
        yield path
        return
    import tempfile

    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        copy_path = Path(tmp) / path.name
        copy_path.write_text(yaml.safe_dump(cleaned, sort_keys=False))
        yield copy_path


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
    for k in ("out_dir", "tracking", "executor", "torch_threads", "distributed"):
        d.pop(k, None)
    d["grpo"] = {k: v for k, v in d["grpo"].items() if k != "steps"}
    return d


def half_life_to_alpha(half_life: float) -> float:
    """EWMA weight of a new observation so that an old one's weight halves every ``half_life`` steps."""
    return 1.0 - math.pow(0.5, 1.0 / half_life)
