"""What a comparison grid is made of: its spec, its cells, their controls, margins and ledger.

Plain data and the functions that read a cell's state from its run directory. The grid that runs
the cells (wmrl/grid.py) and the report that reads them (wmrl/report/) both import this module;
neither imports the other at module level.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import draccus
from draccus.utils import DraccusException

from wmrl.config import ConfigError, DomainConfig, ExecutorConfig, did_you_mean, load_methods
from wmrl.config_messages import malformed_yaml
from wmrl.domain import check_domain_config
from wmrl.methods import controls as method_controls
from wmrl.methods import wm_methods
from wmrl.methods.base import method_with_role
from wmrl.tracking import CHECKPOINT, read_metrics


def grid_controls() -> dict[str, tuple[str, list[str]]]:
    """Control label -> (the method whose code path it runs, its config overrides), as each registered
    method declares them (wmrl/methods): ``<m>_placebo`` beside each WM method, the placebo WM (scores
    permuted within each group, wmrl/methods/placebo.py); ``ppi_lambda0``: ppi with λ = 0. Read from
    the registry when asked, so a method registered after this module was imported (an entry point,
    a library's own) is in it."""
    return {label: (c.base.name, list(c.overrides)) for label, c in method_controls().items()}


def grid_methods() -> tuple[str, ...]:
    """What a grid spec's ``methods`` may name: every registered method, then every control."""
    return (*load_methods(), *grid_controls())


def __getattr__(name: str):
    """``CONTROLS`` and ``GRID_METHODS``, the names these had as constants: :func:`grid_controls` and
    :func:`grid_methods` as of the access."""
    if name == "CONTROLS":
        return grid_controls()
    if name == "GRID_METHODS":
        return grid_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


LEDGER = "ledger.json"
# DIR/<domain>/start.json: the SHA-1 of the policy every cell of the domain starts from (one per seed,
# under "per_seed", for a domain whose start depends on the run seed: START_PER_SEED)
START = "start.json"


def base_method(label: str) -> str:
    """The ``--method`` a grid label runs (a control's method, else the label itself)."""
    controls = grid_controls()
    return controls[label][0] if label in controls else label


def controls_of(method: str) -> list[str]:
    """The control labels of ``method`` (empty for a control, ``real`` and ``anchors_only``)."""
    return [c for c, (m, _) in grid_controls().items() if m == method]


def with_control(methods: list[str]) -> list[str]:
    """``methods`` plus the registry's baseline, ``anchors_only`` (right after its reference,
    ``real``, else first; :data:`wmrl.methods.base.ROLES`) when a WM method is among them: GRPO on
    the same real executions without a WM is the bar every WM method must clear."""
    baseline, reference = method_with_role("baseline"), method_with_role("reference")
    if baseline is None or baseline in methods or not any(m in wm_methods() for m in methods):
        return list(methods)
    at = methods.index(reference) + 1 if reference in methods else 0
    return [*methods[:at], baseline, *methods[at:]]


@dataclass
class DomainEntry:
    # Label of the domain in the grid and the report; its cells live under DIR/<name>/.
    name: str = ""
    # Preset name (wmrl/configs/) or YAML path the domain's cells start from.
    preset: str = ""
    # Config overrides for every cell of this domain (e.g. a step budget: --grpo.steps=30). Quote
    # one whose value is a list inside [...]: ["--domain.train_tasks=[a,b]", --grpo.steps=30].
    overrides: list[str] = field(default_factory=list)
    # Held-out episodes or samples per task for this domain's re-evaluation (None: the grid's).
    reeval_episodes: int | None = None
    # Further overrides for the re-evaluation only (e.g. --domain.n_videos=0).
    reeval_overrides: list[str] = field(default_factory=list)
    # Key of the domain's evaluation that is its score ("": the domain's own, e.g. success).
    score: str = ""
    # The SHA-1 of the policy every cell of this domain starts from, on every machine ("": the one
    # the grid's first preparation built, recorded in DIR/<name>/start.json). Pinned, a machine
    # whose preparation builds another start (floating-point sums differ between CPUs) is refused
    # before any cell trains: copy the cache_dir of the machine that built it (docs/compare.md).
    start_sha1: str = ""
    # Non-inferiority margin on that score: a WM method is non-inferior to anchors_only where the
    # one-sided 95% lower bound of their paired difference is above -margin (None: the default its
    # domain's config declares, NONINFERIORITY_MARGIN, e.g. vla 0.01 = 1 point of success).
    margin: float | None = None


@dataclass
class GridSpec:
    # Methods every domain runs (wmrl.methods.METHODS, or a control label such as ppi_placebo);
    # the controls join them when `control`.
    methods: list[str] = field(default_factory=list)
    # Fixed before the grid runs (DIR/ledger.json records when each cell was planned).
    seeds: list[int] = field(default_factory=lambda: [0])
    # Add the controls when a WM method is among `methods`: `anchors_only` (the same real executions
    # without a WM), `<method>_placebo` beside each WM method (its WM's scores permuted within each
    # group) and `ppi_lambda0` beside ppi (lambda fixed at 0).
    control: bool = True
    # Seeds whose results were seen before this spec's variant (a method, preset or override) was
    # chosen, e.g. the seeds of the grid it varies: its WM methods' figures on them are exploratory,
    # left out of the evidence table (which rests on the other, fresh seeds).
    seen_seeds: list[int] = field(default_factory=list)
    # Methods that run on only some of the seeds, e.g. the controls and `real` on the first 8 of a
    # grid of many: label -> the seeds it runs on (of `seeds`; a part run with --seeds=[k] runs it
    # where k is listed). Every other method runs on every seed.
    method_seeds: dict[str, list[int]] = field(default_factory=dict)
    # Held-out episodes or samples per task of the final re-evaluation (None: each preset's own).
    reeval_episodes: int | None = None
    domains: list[DomainEntry] = field(default_factory=list)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)

    def __post_init__(self) -> None:
        if not self.methods:
            raise ConfigError("methods is empty: name at least one of " + ", ".join(load_methods()))
        known = grid_methods()
        for m in self.methods:
            if m not in known:
                raise ConfigError(
                    f"methods entry {m!r} is not one of {', '.join(load_methods())} or a control "
                    f"({', '.join(grid_controls())}){did_you_mean(m, known)}"
                )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds={self.seeds} must be a non-empty list of distinct seeds")
        if not self.domains:
            raise ConfigError("domains is empty: add entries with a name and a preset")
        names = [d.name for d in self.domains]
        for d in self.domains:
            if not d.name or not d.name.replace("-", "_").isidentifier():
                raise ConfigError(f"domains entry {asdict(d)}: name must be a plain word (letters, -, _)")
            if names.count(d.name) > 1:
                raise ConfigError(f"domain name {d.name!r} is used twice")
            if not d.preset:
                raise ConfigError(f"domain {d.name!r} has no preset")
            for n in (self.reeval_episodes, d.reeval_episodes):
                if n is not None and n < 1:
                    raise ConfigError(f"domain {d.name!r}: reeval_episodes={n} must be >= 1")
            if d.margin is not None and not d.margin >= 0:
                raise ConfigError(f"domain {d.name!r}: margin={d.margin} must be >= 0")
        for m in self.method_seeds:
            if m not in known:
                raise ConfigError(
                    f"method_seeds names {m!r}, which is not a method or control ({', '.join(known)})"
                    f"{did_you_mean(m, known)}"
                )

    def stray_method_seeds(self) -> list[str]:
        """The methods ``method_seeds`` names that this grid does not run."""
        return [m for m in self.method_seeds if m not in self.all_methods]

    @property
    def all_methods(self) -> list[str]:
        """``methods``, with ``control``: ``anchors_only`` and each WM method's controls after it."""
        if not self.control:
            return list(self.methods)
        out = []
        for m in with_control(self.methods):
            out += [m, *(c for c in controls_of(m) if c not in self.methods)]
        return out

    def seeds_of(self, method: str) -> list[int]:
        """The seeds ``method`` runs on: ``seeds``, or those of them ``method_seeds`` lists for it."""
        if method not in self.method_seeds:
            return list(self.seeds)
        return [s for s in self.seeds if s in self.method_seeds[method]]


def load_spec(path: str | Path, overrides: list[str] | None = None) -> GridSpec:
    """Parse a grid spec from a YAML file plus ``--field=value`` overrides; every problem (missing
    file, malformed YAML, unknown field, bad value) raises one ConfigError that names it."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid spec {str(path)!r} does not exist")
    try:
        content = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(malformed_yaml(path, e)) from None
    if not isinstance(content, dict):
        raise ConfigError(
            f"{path} must hold a mapping (methods, seeds, domains, ...), got {type(content).__name__}"
        )
    known = [f.name for f in GridSpec.__dataclass_fields__.values()]
    for key in content:
        if key not in known:
            raise ConfigError(
                f"{path}: unknown field {key!r}{did_you_mean(key, known)} (fields: {', '.join(known)})"
            )
    try:
        spec = draccus.parse(GridSpec, config_path=path, args=list(overrides or []), exit_on_error=False)
    except ConfigError:
        raise
    except (draccus.ParsingError, argparse.ArgumentError, ValueError, TypeError, KeyError) as e:
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__ or cause.__context__
        raise (cause or ConfigError(f"invalid grid spec {path}: {e}")) from None
    except (DraccusException, SystemExit) as e:
        raise ConfigError(f"invalid grid spec overrides {overrides}: {e}") from None
    if stray := spec.stray_method_seeds():
        narrowed = [o for o in overrides or [] if o.split("=")[0] in ("--methods", "--control")]
        if not narrowed:  # the file itself names a method it does not run
            raise ConfigError(
                f"{path}: method_seeds names {', '.join(map(repr, stray))}, which the grid does not run "
                f"({', '.join(spec.all_methods)})"
            )
        # a part run (--methods=[...]) keeps the seeds of the methods it runs
        spec = replace(spec, method_seeds={m: s for m, s in spec.method_seeds.items() if m not in stray})
    return spec


# ---- cells ---------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One run of the grid: everything a worker needs to train and re-evaluate it (plain data)."""

    domain: str
    method: str
    seed: int
    preset: str
    overrides: list[str]  # for load_config: the domain's, then method, seed, out_dir
    reeval_overrides: list[str]
    run_dir: str
    start_path: str  # the starting policy's held-out evaluation, shared by the domain's seed
    start_sha1: str = ""  # the domain's pinned start (DomainEntry.start_sha1), "" where not pinned

    @property
    def grid_start_path(self) -> Path:
        """``DIR/<domain>/start.json``: the start every cell of the domain (or of its seed) shares."""
        return Path(self.start_path).parent / START

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.method}/seed{self.seed}"


def domain_margin(d: DomainEntry, cfg) -> float:
    """The domain's non-inferiority margin: its own, else the default its config declares
    (``NONINFERIORITY_MARGIN``, :class:`wmrl.domain.DomainConfigCapabilities`)."""
    if d.margin is not None:
        return d.margin
    margin = check_domain_config(cfg.domain).margin
    if margin is None:
        kind = DomainConfig.get_choice_name(type(cfg.domain))
        raise ConfigError(
            f"domain {d.name!r} (type {kind}) has no default non-inferiority margin: "
            "state one in the spec (margin: ...)"
        )
    return margin


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def cell_status(c: Cell) -> str:
    """``finished`` (summary.json and an up-to-date reeval.json), ``trained`` (re-evaluation
    missing), ``killed`` (a checkpoint to resume), ``started`` (metrics, no checkpoint) or ``pending``."""
    d = Path(c.run_dir)
    if (d / "summary.json").exists():
        return "finished" if reeval_current(c) is not None else "trained"
    if (d / CHECKPOINT).exists():
        return "killed"
    return "started" if (d / "metrics.jsonl").exists() else "pending"


def reeval_current(c: Cell) -> dict | None:
    """The cell's cached re-evaluation if it was made with today's overrides of its last step."""
    cached = read_cached(Path(c.run_dir) / "reeval.json", c.reeval_overrides)
    if cached is None:
        return None
    rows = read_metrics(c.run_dir)
    return cached if rows and cached.get("step") == rows[-1]["step"] else None


def read_cached(path: Path, reeval_overrides: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return data if data.get("reeval_overrides") == reeval_overrides else None
