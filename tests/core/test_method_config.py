"""Each method's own settings (wmrl/method_config.py), and the shared and older forms that reach them
(wmrl/config_compat.py): every committed preset, grid spec and run directory means what it meant
when the run config had a `debias`, a `denoise` and a `ppi` section whatever the method."""

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

import draccus
import pytest
import torch
import yaml
from toy_runs import FAST as TOY_FAST
from toy_runs import reference_and_half

from wmrl.config import (
    ConfigError,
    DebiasConfig,
    DenoiseConfig,
    PPIConfig,
    config_fingerprint,
    load_config,
    presets,
    resolve_preset,
    save_config,
    to_dict,
)
from wmrl.grid_spec import base_method, grid_controls, load_spec
from wmrl.method_config import MethodConfig
from wmrl.methods import METHODS, Method, Step, get_method, register_method
from wmrl.runs import config_diffs
from wmrl.tracking import CHECKPOINT, check_checkpoint_config
from wmrl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "benchmarks" / "specs").glob("*.yaml"))


def _distinct_run_dirs() -> list[Path]:
    """The committed run directories, one of each config (seed and directory aside)."""
    seen, out = set(), []
    for path in sorted((ROOT / "benchmarks" / "results").rglob("config.yaml")):
        content = yaml.safe_load(path.read_text())
        key = yaml.safe_dump({k: v for k, v in content.items() if k not in ("seed", "out_dir")})
        if key not in seen:
            seen.add(key)
            out.append(path.parent)
    return out


RUN_DIRS = _distinct_run_dirs()
SHARED = ("debias", "denoise", "ppi")
# The components each method keeps: its config's fields.
KEEPS = {
    "real": set(),
    "anchors_only": set(),
    "wm": set(),
    "mix": set(),
    "debias": {"debias"},
    "denoise": {"denoise"},
    "wmrl": {"debias", "denoise"},
    "ppi": {"debias", "ppi"},
}


@dataclass
class Sections:
    """The oracle: the three sections every run config had before methods owned their settings,
    parsed by draccus from a preset's sections and a run's `--<section>.<field>=` flags."""

    debias: DebiasConfig = field(default_factory=DebiasConfig)
    denoise: DenoiseConfig = field(default_factory=DenoiseConfig)
    ppi: PPIConfig = field(default_factory=PPIConfig)


def sections_of(content: dict | None, overrides: list[str], tmp_path: Path) -> Sections:
    """The sections as ``content`` set them: at the top level (the older form) or, in a run config
    saved since methods owned their settings, under ``method_config``."""
    content = content or {}
    sections = {k: v for k, v in content.items() if k in SHARED}
    sections.update({k: v for k, v in (content.get("method_config") or {}).items() if k in SHARED})
    path = tmp_path / "sections.yaml"
    path.write_text(yaml.safe_dump(sections))
    flags = [o for o in overrides if o.startswith(tuple(f"--{s}." for s in SHARED))]
    return draccus.parse(Sections, config_path=path, args=flags)


def assert_means_the_same(cfg, content: dict | None, overrides: list[str], tmp_path: Path) -> None:
    """``cfg``'s method keeps exactly its components, each as the old sections set it."""
    kept = {f.name for f in dataclasses.fields(cfg.method_config)}
    assert kept == KEEPS[cfg.method]
    old = sections_of(content, overrides, tmp_path)
    for name in kept:
        assert getattr(cfg.method_config, name) == getattr(old, name), (cfg.method, name)


def test_the_methods_keep_their_components():
    assert {name: {f.name for f in dataclasses.fields(m.config)} for name, m in METHODS.items()} == KEEPS


@pytest.mark.parametrize("preset", sorted(presets()))
def test_every_preset_means_the_same_under_every_method(preset, tmp_path):
    """A preset's shared sections reach each method that keeps the component (vla-rl's `ppi:` under
    `--method=ppi`, though its own method is `real`), as its own settings."""
    content = yaml.safe_load(resolve_preset(preset).read_text())
    for method in KEEPS:
        overrides = [f"--method={method}"]
        assert_means_the_same(load_config(preset, overrides), content, overrides, tmp_path)


def _spec_runs(spec_path: Path):
    """Each (preset, overrides) that the spec's cells load, one seed of each domain and method
    (the cells' overrides as wmrl.grid.plan writes them, the seed and out_dir aside)."""
    spec, controls = load_spec(spec_path), grid_controls()
    for d in spec.domains:
        for label in spec.all_methods:
            control = controls[label][1] if label in controls else []
            yield d.preset, [*d.overrides, f"--method={base_method(label)}", *control]


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_committed_grid_spec_means_the_same(spec, tmp_path):
    """Shared overrides such as toy_few_anchors' `--ppi.prior_from_log=true` reach the cells whose
    method keeps the component; the others' configs load as before."""
    for preset, overrides in _spec_runs(spec):
        content = yaml.safe_load(resolve_preset(preset).read_text())
        assert_means_the_same(load_config(preset, overrides), content, overrides, tmp_path)


def test_every_committed_run_directory_loads_and_matches_its_saved_config(tmp_path):
    """Each committed run's config.yaml (older ones written before methods owned their settings, newer
    ones with a `method_config`) loads with its sections as its method's settings, and the grid's
    check finds no method setting changed (an archived run's domain may differ: fields of its domain
    added since). A run started from a user's policy folder that is not in the repository (built by
    the command its spec names) is refused with one line naming the folder."""
    assert len(RUN_DIRS) > 10
    for run_dir in RUN_DIRS:
        path = run_dir / "config.yaml"
        saved = yaml.safe_load(path.read_text())
        folder = (saved.get("domain") or {}).get("policy_path")
        if folder and not (ROOT / folder).exists():
            with pytest.raises(
                ConfigError, match=re.escape(f"domain.policy_path={folder} is neither a folder")
            ):
                load_config(path, [f"--out_dir={run_dir}"])
            continue
        cfg = load_config(path, [f"--out_dir={run_dir}"])
        assert_means_the_same(cfg, saved, [], tmp_path)
        changed = [d for d in config_diffs(path, cfg) if not d.startswith("domain.")]
        assert changed == [], run_dir


def test_the_own_and_the_shared_form_are_one_setting():
    own = load_config(
        "toy", ["--method=ppi", "--method_config.ppi.lam=0.3", "--method_config.debias.refit_every=8"]
    )
    shared = load_config("toy", ["--method=ppi", "--ppi.lam=0.3", "--debias.refit_every=8"])
    assert own == shared and own.method_config.ppi.lam == 0.3 and own.method_config.debias.refit_every == 8
    assert load_config("toy", ["--ppi.lam=0.3", "--method_config.ppi.lam=0.5"]).method_config.ppi.lam == 0.5
    assert load_config("toy", ["--method_config.ppi.lam=0.5", "--ppi.lam=0.3"]).method_config.ppi.lam == 0.3
    # a method without the component takes nothing of a shared section: as before, it changes nothing
    assert load_config("toy", ["--method=real", "--ppi.lam=0.3"]) == load_config("toy", ["--method=real"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["--method=real", "--method_config.ppi.lam=0"],
            "method_config.ppi.lam: method 'real' has no setting 'ppi' (method_config's settings: none)",
        ),
        (
            ["--method=wmrl", "--method_config.ppi.lam=0"],
            "method_config.ppi.lam: method 'wmrl' has no setting 'ppi' (method_config's settings: debias, "
            "denoise)",
        ),
        (
            ["--method=ppi", "--method_config.ppi.lamda=0"],
            "method_config.ppi.lamda: method 'ppi' has no setting 'ppi.lamda' (method_config.ppi's settings: "
            "window_groups, warmup_groups, lam, var_bins, prior_from_log, moments, shrink_confidence); "
            "did you mean 'lam'?",
        ),
        (
            ["--method=real", "--ppi.lamda=0"],
            "ppi.lamda: ppi has no setting 'lamda' (ppi's settings: window_groups, warmup_groups, lam, "
            "var_bins, prior_from_log, moments, shrink_confidence); did you mean 'lam'?",
        ),
        (["--method_config.type=ppi"], "--method_config.type: the run's method is --method=ppi"),
        # a shared value is checked whatever the method, as when every run config held every section
        (["--method=real", "--ppi.lam=2"], "ppi.lam=2.0 must lie in [0, 1]"),
        (["--method=ppi", "--method_config.ppi.lam=2"], "ppi.lam=2.0 must lie in [0, 1]"),
    ],
)
def test_a_setting_its_method_does_not_have_is_one_line_naming_it(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("toy", overrides)
    assert str(e.value).startswith(message)


def test_a_preset_with_a_setting_its_method_does_not_have_is_refused(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("method: real\nmethod_config: {ppi: {lam: 0}}\n")
    with pytest.raises(ConfigError, match=r"^method_config.ppi: method 'real' has no setting 'ppi'"):
        load_config(preset)
    preset.write_text("method: ppi\nmethod_config: {type: wmrl}\n")
    with pytest.raises(ConfigError, match=r"^method_config.type differs from method='ppi'"):
        load_config(preset)


def test_a_saved_run_config_holds_its_method_settings_only_and_loads_back(tmp_path):
    for method in KEEPS:
        cfg = load_config("toy", [f"--method={method}", "--ppi.lam=0.25", "--debias.warmup_pairs=16"])
        save_config(cfg, tmp_path / "config.yaml")
        saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
        assert not set(SHARED) & set(saved) and set(saved["method_config"]) == KEEPS[method]
        assert load_config(tmp_path / "config.yaml") == cfg
        # a file's method settings serve another method chosen on the command line as shared ones
        other = load_config(tmp_path / "config.yaml", ["--method=ppi"])
        assert other.method_config.ppi.lam == (0.25 if method == "ppi" else None)
        assert other.method_config.debias.warmup_pairs == (16 if "debias" in KEEPS[method] else 200)


def _legacy_layout(d: dict) -> dict:
    """A config's plain data as it was written before methods owned their settings: every section at
    the top level, those its method does not keep at their defaults."""
    d = dict(d)
    own = d.pop("method_config")
    defaults = draccus.encode(Sections())
    return d | {name: own.get(name, d.get(name, defaults[name])) for name in SHARED}


FAST = [*TOY_FAST, "--ppi.warmup_groups=2"]


@pytest.mark.parametrize("method", ["ppi", "wmrl", "real"])
def test_a_run_written_in_the_old_layout_resumes_exactly(tmp_path, method):
    """A run directory whose config.yaml and checkpoint fingerprint hold the old sections resumes to
    the policy and method state of an uninterrupted run."""

    def cfg(out, steps):
        return load_config(
            None, [*FAST, f"--out_dir={tmp_path / out}", f"--method={method}", f"--grpo.steps={steps}"]
        )

    ref, six = reference_and_half(tmp_path, cfg)
    run = tmp_path / "run"
    (run / "config.yaml").write_text(yaml.safe_dump(_legacy_layout(to_dict(six))))
    state = torch.load(run / CHECKPOINT, weights_only=False)
    state["fingerprint"] = _legacy_layout(state["fingerprint"])
    torch.save(state, run / CHECKPOINT)

    full = load_config(run / "config.yaml", [f"--out_dir={run}"])
    assert full == six
    check_checkpoint_config(run, full, state["fingerprint"])
    resumed = Trainer(full, full.domain.build(full), resume=True)
    resumed.train()
    assert torch.equal(ref.policy.theta, resumed.policy.theta)
    assert ref.method_state.state_dict() == resumed.method_state.state_dict()


def test_a_changed_method_setting_still_stops_a_resume(tmp_path):
    from wmrl.tracking import RunDirError

    cfg = load_config("toy", ["--method=ppi", f"--out_dir={tmp_path}"])
    old = _legacy_layout(config_fingerprint(cfg))
    old["ppi"]["lam"] = 0.5
    with pytest.raises(
        RunDirError, match=r"does not match the config: ppi.lam: checkpoint 0.5 vs config None. To continue"
    ):
        check_checkpoint_config(tmp_path, cfg, old)


# ---- a method with a setting of its own: its config class beside it ----------------------------
@dataclass
class TemperedRankConfig(MethodConfig):
    # The WM rows' reward is their within-group rank, scaled to [0, 1], to this power.
    power: float = 1.0

    def __post_init__(self) -> None:
        if self.power <= 0:
            raise ConfigError(f"method_config.power={self.power} must be > 0")


class TemperedRank(Method):
    name = "tempered_rank"
    summary = "the other groups rewarded by the rank of their WM score, to a power"
    config = TemperedRankConfig
    seen: list[float] = []

    def wm_scores(self, trainer, step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        power = trainer.cfg.method_config.power
        type(self).seen.append(power)
        metrics = self.observe_anchors(trainer, step)
        gid, ranks = step.batch.group_ids, torch.zeros_like(step.r_hat)
        for g in gid.unique():
            rows = (gid == g).nonzero().squeeze(-1)
            ranks[rows] = (step.r_hat[rows].argsort().argsort().float() / (rows.numel() - 1)) ** power
        return ranks, metrics


@pytest.fixture
def tempered_rank():
    TemperedRank.seen = []
    register_method(TemperedRank)
    yield METHODS["tempered_rank"]
    del METHODS["tempered_rank"]


def test_a_method_with_its_own_setting_reads_it_and_its_run_keeps_it(tmp_path, tempered_rank):
    cfg = load_config(
        "toy",
        [
            *FAST,
            "--method=tempered_rank",
            "--method_config.power=2",
            "--grpo.steps=2",
            f"--out_dir={tmp_path}",
        ],
    )
    assert get_method("tempered_rank").config is TemperedRankConfig and cfg.method_config.power == 2.0
    Trainer(cfg, cfg.domain.build(cfg)).train()
    assert TemperedRank.seen == [2.0, 2.0]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["method_config"] == {"power": 2.0}
    assert load_config(tmp_path / "config.yaml") == cfg
    with pytest.raises(ConfigError, match=r"^method_config.power=0.0 must be > 0"):
        load_config("toy", ["--method=tempered_rank", "--method_config.power=0"])
    with pytest.raises(ConfigError, match=r"^method_config.ppi.lam: method 'tempered_rank' has no setting"):
        load_config("toy", ["--method=tempered_rank", "--method_config.ppi.lam=0"])
