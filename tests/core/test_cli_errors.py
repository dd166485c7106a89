"""Bad command-line inputs: each ends in one line on stderr that names the field or id (with the
closest valid name where there is one), exit status 2, and leaves every earlier result byte-identical.
Everything runs through ``wmrl.cli.main`` on the toy domain (milliseconds per step)."""

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from wmrl.cli import main
from wmrl.config import ConfigError, DomainConfig, RunConfig, load_config
from wmrl.config_messages import field_names
from wmrl.report import TIME_KEYS
from wmrl.toy import ToyConfig

TINY = (
    "domain: {type: toy, n_contexts: 8, n_actions: 4}\nexecutor: {type: inline}\n"
    "tracking: {wandb: disabled, progress: false}\n"
    "grpo: {steps: 2, tasks_per_step: 4, group_size: 4, optimizer: sgd, lr: 10.0}\n"
)
COMPARE = TINY + "compare: {methods: [real, wmrl], seeds: [0], threshold_metric: eval/true_reward}\n"


def grid_spec(preset: Path, *overrides: str) -> str:
    """A comparison grid of the tiny preset: real and wmrl (with anchors_only and wmrl's placebo)."""
    over = json.dumps(list(overrides))
    return (
        f"methods: [real, wmrl]\nseeds: [0]\nexecutor: {{type: inline}}\n"
        f"domains:\n  - {{name: toy, preset: {preset}, overrides: {over}}}\n"
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Finished results that no bad input may touch: a single run, a comparison grid, and the root
    of a comparison made by `wmrl run` before comparisons were grids (its config, one run)."""
    root = tmp_path_factory.mktemp("cli_errors")
    (root / "tiny.yaml").write_text(TINY)
    (root / "cmp.yaml").write_text(COMPARE)
    (root / "grid.yaml").write_text(grid_spec(root / "tiny.yaml"))
    (root / "grid-changed.yaml").write_text(grid_spec(root / "tiny.yaml", "--anchors.fraction=0.5"))
    (root / "grid-zero.yaml").write_text(grid_spec(root / "tiny.yaml", "--grpo.steps=0"))
    assert main(["run", str(root / "tiny.yaml"), "--out-dir", str(root / "single")]) == 0
    assert main(["compare", str(root / "grid.yaml"), "--out-dir", str(root / "grid")]) == 0
    shutil.copytree(root / "single", root / "legacy" / "real" / "seed0")
    (root / "legacy" / "config.yaml").write_text(COMPARE)
    (root / "legacy" / "summary.json").write_text("{}\n")
    (root / "afile").write_text("not a directory\n")
    return root


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def unwritable_dir(root: Path) -> str:
    if os.geteuid() == 0:  # root writes through file modes; sysfs refuses new entries even to root
        return "/sys/wmrl-cli-test/run"
    ro = root / "read-only"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o500)
    return str(ro / "run")


# (command line with {root} for the results folder, what the one line must contain)
BAD_INPUTS = {
    "unknown field, close name": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--grpo.group_sise=4"],
        ["--grpo.group_sise", "did you mean --grpo.group_size?"],
    ),
    "unknown field, no close name": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--grpo.foo=1"],
        ["--grpo.foo", "grpo's fields: advantage, clip_eps"],
    ),
    "unknown section": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--gropo.steps=3"],
        ["--gropo.steps", "did you mean --grpo.steps?"],
    ),
    "unknown domain field": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--domain.nois=0.1"],
        ["--domain.nois for domain.type=toy", "did you mean --domain.noise?"],
    ),
    "unknown method": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--method=wmrll"],
        ["method='wmrll'", "did you mean 'wmrl'?"],
    ),
    "unknown preset": (
        ["run", "tyo", "--out-dir", "{root}/new"],
        ["unknown preset 'tyo'", "did you mean 'toy'?"],
    ),
    "unknown research task": (
        ["run", "research-debug", "--out-dir", "{root}/new", "--domain.train_tasks=[iris_clss]"],
        ["domain.train_tasks", "'iris_clss'", "did you mean 'iris_cls'?", "wmrl tasks research"],
    ),
    "unknown VLA task": (
        ["run", "vla-debug", "--out-dir", "{root}/new", "--domain.tasks=[wmrl/PushColour-v0]"],
        ["domain.tasks", "'wmrl/PushColour-v0'", "did you mean 'wmrl/PushColor-v0'?", "wmrl tasks vla"],
    ),
    "zero steps, single run": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--grpo.steps=0"],
        ["grpo.steps=0 must be >= 1"],
    ),
    "zero steps, comparison grid": (
        ["compare", "{root}/grid-zero.yaml", "--out-dir", "{root}/new"],
        ["domain 'toy'", "grpo.steps=0 must be >= 1"],
    ),
    "infinite learning rate": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--grpo.lr=inf"],
        ["grpo.lr=inf must be a finite number"],
    ),
    "nan in a domain field": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--domain.noise=nan"],
        ["domain.noise=nan must be a finite number"],
    ),
    "a group no memory holds": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--grpo.group_size=100000000"],
        [
            "grpo.group_size=100000000 x grpo.tasks_per_step=4 is 400_000_000 rollouts a step; at most 1_000_000"
        ],
    ),
    "steps no run reaches": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--grpo.steps=1000000000000"],
        ["grpo.steps=1000000000000 must be at most 10_000_000"],
    ),
    "bf16 with a lerobot policy, refused before the build": (
        [
            "run",
            "vla-debug",
            "--out-dir",
            "{root}/new",
            "--precision=bf16",
            "--domain.policy=lerobot_act",
            "--domain.imagine_input=pixels",
        ],  # fmt: skip
        [
            "precision=bf16 is not supported here: domain.policy=lerobot_act (a lerobot policy) is run in "
            "float32 only; use --precision=fp32"
        ],  # fmt: skip
    ),
    "out dir under a file": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/afile/run"],
        ["out_dir=", "afile is a file"],
    ),
    "unwritable out dir": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{unwritable}"],
        ["out_dir=", "is not a writable directory"],
    ),
    "comparison re-run with another config": (
        ["compare", "{root}/grid-changed.yaml", "--out-dir", "{root}/grid"],
        ["run with a different config", "anchors.fraction: 0.25 there vs 0.5 now"],
    ),
    "comparison preset given to run": (
        ["run", "{root}/cmp.yaml", "--out-dir", "{root}/new"],
        ["compare.methods in", "`wmrl run` trains one run", "wmrl compare SPEC"],
    ),
    "comparison override given to run": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/new", "--compare.methods=[real]"],
        ["--compare.methods=[real]", "`wmrl run` trains one run", "wmrl compare SPEC"],
    ),
    "run directory as a config override": (
        ["run", "{root}/tiny.yaml", "--out_dir={root}/new"],
        ["with --out-dir DIR, not as an --out_dir= override"],
    ),
    "single run into a used run directory": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/single"],
        ["already holds a run", "--resume"],
    ),
    "single run into a comparison grid": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/grid"],
        ["holds a comparison", "toy/real/seed0"],
    ),
    "single run into an old comparison root": (
        ["run", "{root}/tiny.yaml", "--out-dir", "{root}/legacy"],
        ["holds a comparison", "real/seed0"],
    ),
    "comparison into a single run's directory": (
        ["compare", "{root}/grid.yaml", "--out-dir", "{root}/single"],
        ["holds a single run, not a grid"],
    ),
    "resume a finished run": (
        ["run", "--resume", "{root}/single"],
        ["already finished", "nothing to resume"],
    ),
    "resume a comparison grid": (
        ["run", "--resume", "{root}/grid"],
        ["is a comparison grid", "wmrl compare SPEC --out-dir", "--resume", "/toy/anchors_only/seed0"],
    ),
    "resume an old comparison root": (
        ["run", "--resume", "{root}/legacy"],
        ["root of a comparison", "made by `wmrl run`", "--resume", "/real/seed0"],
    ),
    "resume a directory without a run": (
        ["run", "--resume", "{root}/nothing"],
        ["cannot resume", "no config.yaml"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line_and_loses_nothing(case, made, capfd):
    argv, expected = BAD_INPUTS[case]
    argv = [a.format(root=made, unwritable=unwritable_dir(made)) for a in argv]
    before = snapshot(made)
    capfd.readouterr()
    assert main(argv) == 2
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("wmrl: error: "), err
    assert "Traceback" not in err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert snapshot(made) == before
    assert not (made / "new").exists()


@pytest.mark.parametrize("command", ["run", "compare"])
def test_an_empty_out_dir_is_refused_not_replaced_by_the_default(command, made, tmp_path, monkeypatch, capfd):
    """``--out-dir=$UNSET``: one line, and no run under the preset's default directory."""
    monkeypatch.chdir(tmp_path)
    source = made / ("tiny.yaml" if command == "run" else "grid.yaml")
    capfd.readouterr()
    assert main([command, str(source), "--out-dir="]) == 2
    assert capfd.readouterr().err == f"wmrl: error: --out-dir is empty: give the {command} directory\n"
    assert list(tmp_path.iterdir()) == []


@DomainConfig.register_subclass("toy_refused_when_built")
@dataclass
class RefusedToyConfig(ToyConfig):
    """A domain whose build refuses the run (as a check that needs the built models)."""

    def build(self, run):
        raise ConfigError("domain.n_contexts: refused by a check of the built domain")


@pytest.mark.parametrize("existed", [False, True])
def test_a_run_refused_while_its_domain_builds_leaves_no_half_made_folder(existed, tmp_path, capfd):
    preset = tmp_path / "refused.yaml"
    preset.write_text(TINY.replace("type: toy,", "type: toy_refused_when_built,"))
    run = tmp_path / "run"
    if existed:
        run.mkdir()
        (run / "notes.txt").write_text("mine\n")
    capfd.readouterr()
    assert main(["run", str(preset), "--out-dir", str(run)]) == 2
    err = capfd.readouterr().err
    assert err == "wmrl: error: domain.n_contexts: refused by a check of the built domain\n"
    if existed:  # what was there stays; nothing of the refused run (config.yaml, checkpoints/, run.lock)
        assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    else:
        assert not run.exists()


def test_resume_drops_a_truncated_last_metrics_line_and_keeps_the_rest(tmp_path, capfd):
    """A run killed while writing a metrics row: resume warns, drops only that partial line and
    continues; the rows before it are kept byte for byte."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    run = tmp_path / "run"
    assert main(["run", str(tmp_path / "tiny.yaml"), "--out-dir", str(run)]) == 0
    # The state of a 4-step run killed after its step-2 checkpoint, midway through writing row 3.
    (run / "summary.json").unlink()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["grpo"]["steps"] = 4
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    kept = (run / "metrics.jsonl").read_text()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward/mean": 0.5')
    capfd.readouterr()
    assert main(["run", "--resume", str(run)]) == 0
    err = capfd.readouterr().err
    assert "wmrl: warning:" in err and "truncated last line" in err and "Traceback" not in err
    text = (run / "metrics.jsonl").read_text()
    assert text.startswith(kept)
    assert [json.loads(line)["step"] for line in text.splitlines()] == [1, 2, 3, 4]
    assert json.loads((run / "summary.json").read_text())["exec/real_total"] > 0


def test_rerun_of_a_comparison_grid_finishes_it(made, tmp_path, capsys):
    """Rerunning a grid continues it: finished runs are kept as they are, a run without
    summary.json is completed, and the report is rewritten with the same figures."""
    root = tmp_path / "grid"
    shutil.copytree(made / "grid", root)
    figures = json.loads((root / "report.json").read_text())["domains"]
    real_run = snapshot(root / "toy" / "real")
    (root / "report.json").unlink()
    (
        root / "toy" / "wmrl" / "seed0" / "summary.json"
    ).unlink()  # killed between its last checkpoint and summary
    capsys.readouterr()
    assert main(["compare", str(made / "grid.yaml"), "--out-dir", str(root)]) == 0
    assert "4 cells, 3 finished, 1 to run" in capsys.readouterr().out
    again = json.loads((root / "report.json").read_text())["domains"]
    for dom in (figures, again):  # the same figures, timings aside
        for entry in dom["toy"]["methods"].values():
            for fig in entry["per_seed"].values():
                for key in TIME_KEYS:
                    fig.pop(key, None)
            entry.pop("figures")
    assert again == figures
    assert snapshot(root / "toy" / "real") == real_run
    assert (root / "toy" / "wmrl" / "seed0" / "summary.json").exists()


def test_config_prints_every_field_with_value_and_comment(capsys, tmp_path):
    assert main(["config", "toy", "--grpo.group_size=4"]) == 0
    out = capsys.readouterr().out
    assert "grpo:\n  # Rollouts per task (a GRPO group).\n  group_size: 4  # default: 8\n" in out
    assert "  # Saturation of the WM's output" in out  # a domain field's comment
    names = [n for n in field_names(RunConfig) if not n.startswith("domain.")]
    data = yaml.safe_load(out)
    for name in names:
        section, _, leaf = name.rpartition(".")
        assert leaf in (data[section] if section else data), name
    # the listing is itself a preset that gives back the same configuration
    (tmp_path / "listed.yaml").write_text(out)
    assert load_config(tmp_path / "listed.yaml") == load_config("toy", ["--grpo.group_size=4"])


def test_run_preset_help_lists_the_presets_fields(capsys, tmp_path):
    argv = ["run", "research-debug", "--out-dir", str(tmp_path / "run"), "--grpo.steps=5", "--help"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: wmrl run")
    assert "# Task ids to train on" in out and "train_tasks: [iris_cls]" in out
    assert "  steps: 5  # default: 100" in out  # with the overrides applied
    assert not (tmp_path / "run").exists()  # help runs nothing
