"""Composed run configuration: one dataclass per component, CLI overrides and YAML presets (draccus).

A run is ``RunConfig``: the method and its own settings (``method_config``, the method's config
class: wmrl/method_config.py), the domain (a registered choice, ``--domain.type=toy``) and one
dataclass per component. Every field is overridable from the command line
(``--grpo.group_size=8 --method_config.ppi.lam=0``) and presets are YAML files in ``wmrl/configs/``
(package data: an installed wheel has them too). A preset's or flag's shared component sections
(``--ppi.lam=0``) reach the method that keeps the component (wmrl/config_compat.py).
Validation lives in ``__post_init__`` and quotes the offending values.

Domains register their config class by name through the ``wmrl.domains`` entry-point group, so the
core never imports a domain package until that domain is asked for. Methods register themselves in
``METHODS`` the same way (the ``wmrl.methods`` group: wmrl/methods, and any package's own), so this
module reads the registry and imports no method.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import draccus
from draccus.utils import DraccusException

from wmrl.advantages import ADVANTAGES
from wmrl.config_checks import ConfigError as ConfigError
from wmrl.config_checks import check, finite, one_of
from wmrl.config_compat import SECTION, check_unused, route_settings, upgrade_saved, written_as
from wmrl.config_messages import (
    did_you_mean,
    malformed_yaml,
    selected_domain,
    unknown_flags_message,
    with_suggestion,
)
from wmrl.extras import domain_extras, missing_extra_message
from wmrl.method_config import DEFAULT_METHOD, MethodConfig, registered_method
from wmrl.method_config import METHODS as METHODS
from wmrl.method_config import DebiasConfig as DebiasConfig
from wmrl.method_config import DenoiseConfig as DenoiseConfig
from wmrl.method_config import PPIConfig as PPIConfig
from wmrl.method_config import load_methods as load_methods

if TYPE_CHECKING:
    from wmrl.domain import Domain


EXECUTORS = ("process", "ray", "inline")
# RunConfig.precision (wmrl.device.autocast)
PRECISIONS = ("fp32", "bf16")
# RunConfig.device: auto | cpu | cuda | cuda:N (resolved by wmrl.device.resolve_device)
DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
# The named presets: package data of wmrl, found through importlib.resources (a wheel ships them).
CONFIGS_DIR = Path(str(resources.files("wmrl") / "configs"))


# Bounds that no run reaches but a typo does (an extra zero or three): refused at parse time, one
# line naming the field, instead of failing in the allocator or training for ever.
MAX_ROLLOUTS_PER_STEP = 1_000_000
MAX_STEPS = 10_000_000


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
    # Rollouts a forward and backward pass holds at most: a minibatch's gradient is accumulated over
    # passes of this many (the same update, a fraction of the memory); null: a minibatch at once.
    micro_batch: int | None = None
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
    # Early stop of a step's update (as PPO implementations do, e.g. Stable-Baselines3's target_kl):
    # before each optimizer step after the first, when the minibatch's approx_kl to the rollout
    # policy exceeds 1.5 x target_kl, the step's remaining minibatches and epochs are skipped; null: none.
    target_kl: float | None = None

    def __post_init__(self) -> None:
        finite(self, "grpo.")
        check(
            self.group_size >= 2,
            f"grpo.group_size={self.group_size} must be >= 2 (advantages are within-group)",
        )
        check(self.tasks_per_step >= 1, f"grpo.tasks_per_step={self.tasks_per_step} must be >= 1")
        check(self.steps >= 1, f"grpo.steps={self.steps} must be >= 1")
        check(self.steps <= MAX_STEPS, f"grpo.steps={self.steps} must be at most {MAX_STEPS:_}")
        rollouts = self.group_size * self.tasks_per_step
        check(
            rollouts <= MAX_ROLLOUTS_PER_STEP,
            f"grpo.group_size={self.group_size} x grpo.tasks_per_step={self.tasks_per_step} is {rollouts:_} "
            f"rollouts a step; at most {MAX_ROLLOUTS_PER_STEP:_}",
        )
        check(self.lr > 0, f"grpo.lr={self.lr} must be > 0")
        check(0 < self.clip_eps < 1, f"grpo.clip_eps={self.clip_eps} must lie in (0, 1)")
        check(self.epochs >= 1, f"grpo.epochs={self.epochs} must be >= 1")
        check(
            1 <= self.minibatches <= self.tasks_per_step,
            f"grpo.minibatches={self.minibatches} must lie in [1, grpo.tasks_per_step={self.tasks_per_step}]",
        )
        check(
            self.micro_batch is None or self.micro_batch >= 1,
            f"grpo.micro_batch={self.micro_batch} must be >= 1 (or null: a minibatch at once)",
        )
        one_of("grpo.optimizer", self.optimizer, ("adamw", "sgd"))
        one_of("grpo.advantage", self.advantage, tuple(ADVANTAGES))
        one_of("grpo.loss_agg", self.loss_agg, ("token_mean", "seq_mean"))
        check(self.kl_coef >= 0, f"grpo.kl_coef={self.kl_coef} must be >= 0")
        check(
            self.target_kl is None or self.target_kl > 0,
            f"grpo.target_kl={self.target_kl} must be > 0 (or null: no early stop)",
        )


@dataclass
class AnchorConfig:
    # Target fraction of groups executed for real (ignored by `real`, which executes all, and `wm`, none).
    fraction: float = 0.25
    # At least this many anchor groups per step.
    min_groups: int = 1
    # Cap on concurrent real executions (executor workers).
    max_concurrent: int = 2

    def __post_init__(self) -> None:
        finite(self, "anchors.")
        check(0 <= self.fraction <= 1, f"anchors.fraction={self.fraction} must lie in [0, 1]")
        check(self.min_groups >= 0, f"anchors.min_groups={self.min_groups} must be >= 0")
        check(self.max_concurrent >= 1, f"anchors.max_concurrent={self.max_concurrent} must be >= 1")

    def count(self, n_groups: int) -> int:
        """Anchor groups among ``n_groups``: ``max(min_groups, round(fraction * n_groups))``, at most
        ``n_groups`` (the methods that execute some groups, not all or none)."""
        return min(n_groups, max(self.min_groups, math.floor(self.fraction * n_groups + 0.5)))

    def check_for(self, method: str, n_groups: int) -> None:
        """Refuse a count the method cannot use: ``fraction=0`` (it would still execute ``min_groups``
        groups a step) and 0 groups a step (``ppi`` would train on the WM alone, a biased update)."""
        check(
            self.fraction > 0,
            f"anchors.fraction=0 with method={method!r}: it would still execute "
            f"anchors.min_groups={self.min_groups} group(s) per step; set the fraction you mean (one group "
            f"of grpo.tasks_per_step={n_groups} is {1 / n_groups:.4g}), or use method='wm' for no execution",
        )
        check(
            self.count(n_groups) >= 1,
            f"anchors.fraction={self.fraction} of grpo.tasks_per_step={n_groups} rounds to 0 anchor groups "
            f"per step with anchors.min_groups=0; method={method!r} needs at least one (a step without "
            "anchors gives no unbiased update): set anchors.min_groups=1 or raise anchors.fraction to "
            f">= {0.5 / n_groups:.4g}",
        )


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
        finite(self, "executor.")
        one_of("executor.type", self.type, EXECUTORS)
        missing_ray = self.type == "ray" and missing_extra_message("ray", "executor.type=ray")
        if missing_ray:
            raise ConfigError(missing_ray)
        check(self.workers >= 1, f"executor.workers={self.workers} must be >= 1")
        check(self.timeout_s > 0, f"executor.timeout_s={self.timeout_s} must be > 0")
        check(
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
        one_of("distributed.generation", self.generation, DIST_GENERATION)


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
        one_of("tracking.wandb", self.wandb, ("offline", "online", "disabled"))
        check(self.checkpoint_every >= 1, f"tracking.checkpoint_every={self.checkpoint_every} must be >= 1")
        check(self.media_every >= 0, f"tracking.media_every={self.media_every} must be >= 0")
        check(
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
    method: str = DEFAULT_METHOD
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
    # The method's own settings, those of the components it keeps (its config class, Method.config):
    # `debias` (the calibration: debias, wmrl, ppi), `denoise` (the denoiser: denoise, wmrl), `ppi`
    # (ppi's lambda tuner); none for real, anchors_only, wm, mix. `--method_config.ppi.lam=0`, or
    # shared by every method that keeps the component: `--ppi.lam=0` (wmrl/config_compat.py).
    method_config: MethodConfig = field(default_factory=lambda: registered_method(DEFAULT_METHOD).config())
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        method = registered_method(self.method)
        check(self.torch_threads >= 1, f"torch_threads={self.torch_threads} must be >= 1")
        check(
            DEVICE_RE.match(str(self.device)) is not None,
            f"device={self.device!r} is not one of auto, cpu, cuda, cuda:N",
        )
        one_of("precision", self.precision, PRECISIONS)
        check(bool(str(self.out_dir).strip()), "out_dir is empty: give the run directory")
        finite(self, "")
        finite(self.domain, "domain.")
        unsupported = self.domain.bf16_unsupported() if self.precision == "bf16" else None
        check(
            not unsupported,
            f"precision=bf16 is not supported here: {unsupported}; use --precision=fp32",
        )
        check(
            type(self.method_config) is method.config,
            f"method_config holds {type(self.method_config).__qualname__}, not method={self.method!r}'s "
            f"settings ({method.config.__qualname__})",
        )
        self.method_config.check(self)  # what its components need of the domain
        method.check(self)  # the rest of the run, and wm_placebo


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
    cleaned = upgrade_saved(content, fill_added=False) if isinstance(content, dict) else content
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    routed, args, unused = route_settings(cleaned, list(overrides or []), run_fields)
    try:
        with written_as(path, content, routed) as parsed_path:
            cfg = draccus.parse(RunConfig, config_path=parsed_path, args=args, exit_on_error=False)
        check_unused(unused, cfg)
        return cfg
    except (draccus.ParsingError, argparse.ArgumentError, ValueError, TypeError, KeyError) as e:
        cause = _root_config_error(e)
        if cause is not None:
            raise cause from None
        where = f" (preset {path})" if path else ""
        raise ConfigError(
            f"invalid configuration{where}: {with_suggestion(RunConfig, str(e), content)}"
        ) from None
    except DraccusException as e:  # unrecognized --flags
        raise ConfigError(unknown_flags_message(RunConfig, args, content, str(e))) from None
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
    """The config as plain data (what ``config.yaml`` in a run directory holds). A run config's
    ``method_config`` is written without draccus's ``type``: ``method`` names the method."""
    d = draccus.encode(cfg)
    if isinstance(cfg, RunConfig):
        d[SECTION].pop("type", None)
    return d


def config_text(cfg: RunConfig) -> str:
    """What ``save_config`` writes for ``cfg``: :func:`to_dict` as YAML."""
    buf = io.StringIO()
    draccus.cfgparsing.save_config(to_dict(cfg), buf)
    return buf.getvalue()


def save_config(cfg: RunConfig, path: Path) -> None:
    Path(path).write_text(config_text(cfg))


def config_fingerprint(cfg: RunConfig) -> dict:
    """The fields a checkpoint must agree with to be resumed (everything but bookkeeping), in the
    form of :func:`upgrade_saved` (each of the method's components under its own name)."""
    d = upgrade_saved(to_dict(cfg))
    for k in ("out_dir", "tracking", "executor", "torch_threads", "distributed"):
        d.pop(k, None)
    d["grpo"] = {k: v for k, v in d["grpo"].items() if k != "steps"}
    return d


def half_life_to_alpha(half_life: float) -> float:
    """EWMA weight of a new observation so that an old one's weight halves every ``half_life`` steps."""
    return 1.0 - math.pow(0.5, 1.0 / half_life)
