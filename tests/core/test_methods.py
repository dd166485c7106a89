"""The method registry (wmrl/methods): one object per method, and every method's maths unchanged."""

import dataclasses

import pytest
import torch
from toy_runs import FAST as TOY_FAST
from toy_runs import reference_and_half

import wmrl.grid_spec  # imported before a test registers a method
from wmrl.cli import main
from wmrl.config import ConfigError, RunConfig, load_config
from wmrl.domain import Prediction
from wmrl.methods import (
    METHODS,
    Control,
    Method,
    Placebo,
    PPILambda0,
    Step,
    controls,
    get_method,
    method_of,
    register_method,
)
from wmrl.tracking import read_metrics
from wmrl.trainer import Trainer

DOCUMENTED = ["real", "anchors_only", "wm", "mix", "debias", "denoise", "wmrl", "ppi"]
CONTROLS = [
    "wm_placebo",
    "mix_placebo",
    "debias_placebo",
    "denoise_placebo",
    "wmrl_placebo",
    "ppi_placebo",
    "ppi_lambda0",
]


def test_the_registry_holds_exactly_the_documented_methods_and_their_controls():
    assert list(METHODS) == DOCUMENTED
    assert all(get_method(name).name == name and get_method(name).summary for name in DOCUMENTED)
    sections = {f.name for f in dataclasses.fields(RunConfig)}
    assert all(set(get_method(name).config_sections) <= sections for name in DOCUMENTED)
    assert {name: (c.base.name, c.overrides) for name, c in controls().items()} == {
        **{f"{m}_placebo": (m, ("--wm_placebo=true",)) for m in DOCUMENTED[2:]},
        "ppi_lambda0": ("ppi", ("--ppi.lam=0",)),
    }
    assert list(controls()) == CONTROLS


@pytest.mark.parametrize(
    "name, hint", [("reinforce", ""), ("wmrll", "; did you mean 'wmrl'?"), ("ppi_placebo", "")]
)
def test_an_unknown_method_is_one_line_naming_the_known_ones(name, hint):
    known = "real, anchors_only, wm, mix, debias, denoise, wmrl, ppi"
    with pytest.raises(ConfigError) as e:
        get_method(name)
    assert str(e.value) == f"method={name!r} is not one of {known}{hint}"
    with pytest.raises(ConfigError) as e:  # the config path says the same
        load_config(None, [f"--method={name}"])
    assert str(e.value) == f"method={name!r} is not one of {known}{hint}"


def test_the_placebo_of_a_method_without_a_world_model_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--method=anchors_only", "--wm_placebo=true"])
    assert str(e.value) == (
        "wm_placebo=true permutes a world model's scores: method='anchors_only' queries none "
        "(use one of wm, mix, debias, denoise, wmrl, ppi)"
    )
    run = load_config(None, ["--method=wmrl", "--wm_placebo=true"])
    assert method_of(run).name == "wmrl_placebo" and method_of(run).base is get_method("wmrl")


# ---- a new method is one file: this class and its registration --------------------------------
class WMRank(Method):
    """The WM rows take their score's rank within their group, scaled to [0, 1]: a reward that no
    monotone distortion of the WM changes (a calibration-free alternative to ``debias``)."""

    name = "wm_rank"
    summary = "anchor groups executed for real, the other groups rewarded by the rank of their WM score"
    config_sections = ("anchors",)
    calls = 0  # steps it scored (for the test)

    def wm_scores(self, trainer, step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        type(self).calls += 1
        metrics = self.observe_anchors(trainer, step)
        gid, ranks = step.batch.group_ids, torch.zeros_like(step.r_hat)
        for g in gid.unique():
            rows = (gid == g).nonzero().squeeze(-1)
            ranks[rows] = step.r_hat[rows].argsort().argsort().float() / (rows.numel() - 1)
        return ranks, metrics


@pytest.fixture
def wm_rank():
    WMRank.calls = 0
    register_method(WMRank)
    yield METHODS["wm_rank"]
    del METHODS["wm_rank"]


def test_a_method_defined_in_one_file_trains_through_the_normal_config_path(tmp_path, wm_rank, capsys):
    """Registered, the new method is a `--method` value of `wmrl run`, executes its anchors, runs its
    own hook every step, has a placebo control for free and shows in the unknown-method message."""
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "domain: {type: toy}\nexecutor: {type: inline}\ntracking: {wandb: disabled, progress: false}\n"
        "grpo: {steps: 3, tasks_per_step: 8, optimizer: sgd, lr: 20}\n"
    )
    assert main(["run", str(preset), "--out-dir", str(tmp_path / "run"), "--method=wm_rank"]) == 0
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3] and WMRank.calls == 3
    assert rows[-1]["exec/real_total"] == 3 * 2 * 8  # a quarter of 8 groups of 8, each step
    assert "method: wm_rank" in (tmp_path / "run" / "config.yaml").read_text()
    assert "wm_rank_placebo" in controls()
    assert (
        main(["run", str(preset), "--out-dir", str(tmp_path / "p"), "--method=wm_rank", "--wm_placebo=true"])
        == 0
    )
    with pytest.raises(ConfigError, match=r"is not one of real, .*, ppi, wm_rank$"):
        get_method("nope")


FAST = [
    *TOY_FAST,
    "--grpo.steps=6",
    "--seed=3",
    # short warm-ups, so that calibration, the denoiser's w and ppi's λ all act within 6 steps
    "--debias.refit_every=8",
    "--ppi.warmup_groups=2",
]

# Each method, and each option or control that takes its own branch, as `wmrl run` flags.
CASES: dict[str, list[str]] = {
    "real": ["--method=real"],
    "anchors_only": ["--method=anchors_only"],
    "wm": ["--method=wm"],
    "mix": ["--method=mix"],
    "debias": ["--method=debias"],
    "denoise": ["--method=denoise"],
    "wmrl": ["--method=wmrl"],
    "ppi": ["--method=ppi"],
    "wmrl+sample_weights": ["--method=wmrl", "--denoise.sample_weights=true"],
    "ppi+prior_from_log": ["--method=ppi", "--ppi.prior_from_log=true"],
    "ppi+gradient_moments": ["--method=ppi", "--ppi.moments=gradient", "--ppi.shrink_confidence=null"],
    "ppi+twins": ["--method=ppi", "--domain.type=toy", "--domain.twin_anchors=true"],
    "wmrl_placebo": ["--method=wmrl", "--wm_placebo=true"],
    "ppi_placebo+prior_from_log": ["--method=ppi", "--wm_placebo=true", "--ppi.prior_from_log=true"],
    "ppi_lambda0": ["--method=ppi", "--ppi.lam=0"],
}


def final_digest(out_dir, overrides: list[str]) -> tuple[float, float, float]:
    """A 6-step toy run's final policy parameters ``theta`` ``[K, A]`` as three numbers: their sum
    of squares and their dot products with ``cos(i)`` and ``sin(i)`` (``i`` the flat index)."""
    cfg = load_config(None, [*FAST, f"--out_dir={out_dir}", *overrides])
    domain = cfg.domain.build(cfg)
    Trainer(cfg, domain).train()
    theta = domain.policy.theta.detach().double().flatten()
    i = torch.arange(theta.numel(), dtype=torch.float64)
    return float((theta**2).sum()), float(theta @ i.cos()), float(theta @ i.sin())


# ``final_digest`` of each case, recorded from the code before the method registry existed (commit
# ee520cf); a change to any method's maths moves these by far more than the tolerance, which only
# absorbs last-bit differences between CPUs.
RECORDED: dict[str, tuple[float, float, float]] = {
    "real": (80.05170039537813, 4.077611728942152, -4.171384581305105),
    "anchors_only": (279.84898199213114, 8.5115886955933, -11.819027996522522),
    "wm": (51.25051861344376, 6.618485108347171, -6.552774702914431),
    "mix": (58.22266645880094, 6.394034190517089, -4.794020534265503),
    "debias": (65.91550692955256, 4.091934536394614, 0.9737652230384999),
    "denoise": (72.49911519354382, 7.068562920400501, -7.397056244089274),
    "wmrl": (78.29302005060586, 5.041943911848504, -2.2359508771379013),
    "ppi": (270.1814577895178, 12.23557248788228, -5.223263838565399),
    "wmrl+sample_weights": (95.30081530019189, -1.7521917477586681, 2.709892873699272),
    "ppi+prior_from_log": (234.27478815935515, 8.287271830876115, -7.254663546287377),
    "ppi+gradient_moments": (232.0641002121355, 8.037274012137903, 4.005837394517938),
    "ppi+twins": (280.3526162258231, 12.815815680074994, -14.19507450679452),
    "wmrl_placebo": (62.019261813985445, 5.9051671647981445, -7.327277494055967),
    "ppi_placebo+prior_from_log": (324.532595743979, 12.071572198907893, -17.376984878102164),
    "ppi_lambda0": (323.7600164465331, 11.806925368681023, -17.12625673247854),
}


@pytest.mark.parametrize("case", CASES)
def test_every_method_trains_exactly_as_before_the_registry(tmp_path, case):
    assert final_digest(tmp_path, CASES[case]) == pytest.approx(RECORDED[case], rel=1e-6, abs=1e-9)


# ---- each method keeps, checkpoints and logs its own state; the trainer names none ------------
OWN_STATE = {
    "real": set(),
    "anchors_only": set(),
    "wm": set(),
    "mix": set(),
    "debias": {"debiaser"},
    "denoise": {"denoiser"},
    "wmrl": {"debiaser", "denoiser"},
    "ppi": {"debiaser", "tuner"},
}
COMPONENT_METRICS = {"debiaser": {"debias/fitted"}, "denoiser": {"denoise/w", "denoise/s2"}}


@pytest.mark.parametrize("name", DOCUMENTED)
def test_each_method_keeps_checkpoints_and_logs_only_its_own_components(tmp_path, name):
    cfg = load_config(None, [*FAST, f"--out_dir={tmp_path}", f"--method={name}", "--grpo.steps=2"])
    trainer = Trainer(cfg, cfg.domain.build(cfg))
    assert set(trainer.method_state.components) == OWN_STATE[name]
    row = trainer.train_step()
    logged = {k for k in row if k.startswith(("debias/fitted", "denoise/"))}
    assert logged == set().union(*(COMPONENT_METRICS.get(c, set()) for c in OWN_STATE[name]))
    state = trainer.state_dict()
    assert set(state["method"]) == OWN_STATE[name]
    assert not {"debiaser", "denoiser", "ppi"} & set(state)  # the trainer's own keys name no component
    assert ("w" in trainer.method.progress(row)) == get_method(name).denoises


def test_the_trainer_imports_and_names_no_method():
    """wmrl/trainer.py reaches methods through the registry and the method's state alone."""
    import ast
    import re
    from pathlib import Path

    import wmrl.trainer

    source = Path(wmrl.trainer.__file__).read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported & {"wmrl.methods.ppi", "wmrl.ppi", "wmrl.debias", "wmrl.denoise"} == set()
    assert {m for m in imported if m.startswith("wmrl.methods")} <= {"wmrl.methods", "wmrl.methods.base"}
    named = set(
        re.findall(r"\b(ppi|debias|denoise|debiaser|denoiser|tuner|anchors_only|wmrl_placebo)\b", source)
    )
    assert named == set()


@pytest.mark.parametrize("name", ["ppi", "wmrl"])
def test_a_checkpoint_from_before_methods_kept_their_state_resumes_exactly(tmp_path, name):
    """A checkpoint of the old layout (every run's calibration, denoiser and ppi tuner at its top
    level) resumes to the same policy and method state as an uninterrupted run."""
    from wmrl.tracking import CHECKPOINT

    def cfg(out, steps):
        return load_config(
            None, [*FAST, f"--out_dir={tmp_path / out}", f"--method={name}", f"--grpo.steps={steps}"]
        )

    ref, full = reference_and_half(tmp_path, cfg)
    path = tmp_path / "run" / CHECKPOINT
    state = torch.load(path, weights_only=False)
    own = state.pop("method")

    def new_state(method):  # each method builds its components from its own settings
        return get_method(method).new_state(load_config(None, [*FAST, f"--method={method}"])).state_dict()

    fresh = new_state("ppi") | new_state("wmrl")
    legacy = {"debiaser": "debiaser", "denoiser": "denoiser", "tuner": "ppi"}
    state.update({legacy[k]: own.get(k, fresh[k]) for k in legacy})  # every run wrote all three
    torch.save(state, path)
    resumed = Trainer(full, full.domain.build(full), resume=True)
    assert set(resumed.method_state.components) == set(own)
    resumed.train()
    assert torch.equal(ref.policy.theta, resumed.policy.theta)
    assert ref.method_state.state_dict() == resumed.method_state.state_dict()


# ---- a control runs every hook of its base ----------------------------------------------------
class BareControl(Control):
    """A control that defines nothing of its own: all of it is its base's."""

    suffix = "bare"
    overrides = ("--seed=1",)


def _contract():
    """Method's public hooks and attributes, read from the class (a new one is covered unasked)."""
    public = {n: v for n, v in vars(Method).items() if not n.startswith("_")}
    return [n for n, v in public.items() if callable(v)], [n for n, v in public.items() if not callable(v)]


# The hooks a control's own class defines, each still running its base's (the placebo permutes
# what its base's returns), with arguments it can run on.
OWN_HOOK_ARGS = {
    "prediction": (Prediction(torch.arange(4.0), torch.ones(4)), torch.tensor([0, 0, 1, 1]), 3, 1),
    "prior_groups": ([([0.1, 0.2, 0.3], [1.0, 0.0, 1.0])], 3),
}


@pytest.mark.parametrize("control_class", [BareControl, Placebo, PPILambda0])
def test_a_control_runs_every_hook_of_its_base(control_class, monkeypatch):
    """Every hook of Method, one added to it after the controls were written included, runs its
    base's code under a control with the same arguments; every attribute is its base's."""
    import inspect

    monkeypatch.setattr(Method, "a_later_hook", lambda self, x: x, raising=False)
    hooks, attributes = _contract()
    assert "a_later_hook" in hooks and {"advantages", "wm_scores", "new_state", "check"} <= set(hooks)
    calls: list = []

    def recording(hook):
        def run(self, *args):
            calls.append((hook, args))
            return args[0]

        return run

    values = {a: f"the base's {a}" for a in attributes}
    base = type("Recording", (Method,), {h: recording(h) for h in hooks} | values)()
    control = control_class(base)
    assert control.name == f"the base's name_{control_class.suffix}" and control.base is base
    assert all(getattr(control, a) == values[a] for a in attributes if a != "name")
    own = {h for h in hooks if h in vars(control_class)}
    assert own <= set(OWN_HOOK_ARGS), f"{control_class.__name__} defines {own}: give them arguments here"
    for hook in hooks:
        if hook == "controls":  # a control has no controls of its own
            continue
        n_args = len(inspect.signature(getattr(Method, hook)).parameters) - 1
        args = OWN_HOOK_ARGS[hook] if hook in own else tuple(object() for _ in range(n_args))
        calls.clear()
        result = getattr(control, hook)(*args)
        assert calls == [(hook, args)], f"{control_class.__name__}.{hook} did not run its base's"
        if hook not in own:
            assert result is args[0]


def test_a_method_registered_after_the_grid_spec_was_imported_is_in_the_grid(wm_rank):
    """The grid's methods and controls are read from the registry when asked, not when
    wmrl.grid_spec is imported (this module imported it before ``wm_rank`` was registered)."""
    assert "wm_rank_placebo" in wmrl.grid_spec.CONTROLS and "wm_rank" in wmrl.grid_spec.GRID_METHODS
    spec = wmrl.grid_spec.GridSpec(
        methods=["wm_rank_placebo"], domains=[wmrl.grid_spec.DomainEntry(name="toy", preset="toy")]
    )
    assert spec.all_methods == ["wm_rank_placebo"]
    from wmrl.grid_spec import base_method, controls_of, grid_controls, grid_methods

    assert {"wm_rank", "wm_rank_placebo"} <= set(grid_methods())
    assert grid_controls()["wm_rank_placebo"] == ("wm_rank", ["--wm_placebo=true"])
    assert base_method("wm_rank_placebo") == "wm_rank" and controls_of("wm_rank") == ["wm_rank_placebo"]


def test_the_comparisons_reference_baseline_and_controls_are_declared_on_the_registry():
    """What the grid and the reports read of a method instead of its name: `real` is the reference
    (every group executed), `anchors_only` the baseline (its real executions, no WM), one method each;
    a control names its kind and what it is, and the report's evidence columns follow them."""
    from wmrl.methods.base import ROLES, method_with_role
    from wmrl.report import control_kinds, evidence_head

    assert {r: method_with_role(r) for r in ROLES} == {"reference": "real", "baseline": "anchors_only"}
    assert get_method("real").executes == "all" and not get_method("anchors_only").uses_wm
    assert [m for m in DOCUMENTED if get_method(m).role] == ["real", "anchors_only"]
    assert control_kinds() == {
        "placebo": "`<method>_placebo`: its WM's scores permuted within each group",
        "λ=0": "`ppi_lambda0`: ppi with λ = 0",
    }
    assert evidence_head()[3] == "Δ vs anchors_only"
    assert evidence_head()[9:11] == ["LB vs placebo", "LB vs λ=0"]
    for role in ("reference", "auditor"):  # a second method in a role, or a role that is none
        cls = type("Another", (Method,), {"name": "another", "role": role})
        with pytest.raises(ValueError, match=f"role={role!r}"):
            register_method(cls)
        assert "another" not in METHODS
