"""Progress (issue 28, item 9): one switch, ``tracking.progress``, for the training bar and every
long stage of a build; the datasets library's "Map" bars stay out of the training bar."""

import os
from dataclasses import dataclass

from wmrl.cli import main
from wmrl.config import DomainConfig, load_config
from wmrl.toy import ToyConfig
from wmrl.tracking import say, stage

FAST = ["--executor.type=inline", "--tracking.wandb=disabled", "--grpo.steps=3", "--grpo.tasks_per_step=4",
        "--tracking.eval_every=0"]  # fmt: skip


def test_a_stage_shows_its_description_and_elapsed_time_only_when_enabled(capfd):
    with stage("[research] SFT: 200 steps", enabled=True):
        pass
    say("[research] SFT edits apply: 0.9", enabled=True)
    err = capfd.readouterr().err
    assert "[research] SFT: 200 steps [00:00]" in err and "[research] SFT edits apply: 0.9\n" in err
    with stage("[research] SFT: 200 steps", enabled=False):
        pass
    say("[research] quiet", enabled=False)
    assert capfd.readouterr().err == ""


def test_a_stage_without_a_terminal_writes_a_line_while_it_runs(capfd):
    """stderr to a file (a batch job's log): a line at the start, one every ``log_every_s`` while
    the stage runs, one at its end; before, a stage of minutes showed nothing between the two."""
    import time

    with stage("[vla] writing the anchor dataset", enabled=True, log_every_s=0.2):
        time.sleep(0.7)
    lines = capfd.readouterr().err.splitlines()
    running = [x for x in lines if x.startswith("[vla] writing the anchor dataset [00:00, running]")]
    assert len(running) >= 2, lines
    assert lines[-1].startswith("[vla] writing the anchor dataset [00:00]"), lines


@DomainConfig.register_subclass("toy_writes_datasets")
@dataclass
class DatasetWritingToyConfig(ToyConfig):
    """The toy domain writing a small HF dataset every step (as the VLA domain records its anchors
    in a LeRobot dataset), whose ``map`` draws a "Map" bar unless datasets' bars are off."""

    def build(self, run):
        domain = super().build(run)

        def step_metrics():
            import datasets

            datasets.Dataset.from_dict({"a": list(range(4))}).map(lambda row: row)
            return {}

        domain.step_metrics = step_metrics
        return domain


def test_the_training_bar_is_the_one_switch_and_map_bars_stay_out(tmp_path, capfd):
    import datasets  # noqa: F401  imported before training: its bars are turned off while training

    preset = tmp_path / "p.yaml"
    preset.write_text("domain: {type: toy_writes_datasets}\nmethod: wmrl\n")
    assert main(["run", str(preset), "--out-dir", str(tmp_path / "on"), *FAST]) == 0
    err = capfd.readouterr().err
    assert "wmrl seed=0: 100%" in err and "3/3" in err  # the training bar, on by default
    assert "Map" not in err
    off = ["--tracking.progress=false"]
    assert main(["run", str(preset), "--out-dir", str(tmp_path / "off"), *FAST, *off]) == 0
    assert capfd.readouterr().err == ""


def test_an_older_config_with_domain_progress_still_loads(tmp_path):
    """``domain.progress`` became ``tracking.progress``: a run directory's config.yaml written
    before still loads (so the run resumes and exports)."""
    old = tmp_path / "config.yaml"
    old.write_text("method: wmrl\ndomain: {type: toy, n_actions: 4, progress: false}\n")
    assert load_config(old) == load_config(None, ["--domain.type=toy", "--domain.n_actions=4"])


def test_the_cli_keeps_map_bars_off_even_after_lerobot_turns_them_back_on():
    """lerobot's ``SuppressProgressBars`` calls datasets' ``enable_progress_bar()`` on exit, which
    would bring "Map" bars back under the training bar of a VLA run recording its anchors; the CLI
    sets datasets' environment switch first, which that call cannot override (and no warning)."""
    import subprocess
    import sys

    code = (
        "from wmrl.cli import main; main(['presets'])\n"
        "from lerobot.utils.utils import SuppressProgressBars\n"
        "import datasets\n"
        "with SuppressProgressBars():\n"
        "    pass\n"
        "datasets.Dataset.from_dict({'a': [1, 2]}).map(lambda row: row)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_DISABLE_PROGRESS_BARS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Map" not in done.stderr and "arning" not in done.stderr, done.stderr


def test_a_spawned_worker_of_the_cli_does_not_warn_about_the_bars():
    """A grid's cells run in spawned processes, which inherit the environment but not the warning
    filters: without the filter in ``PYTHONWARNINGS`` every cell's log repeats datasets' "Cannot
    enable progress bars" warning once per LeRobot read."""
    import subprocess
    import sys

    code = (
        "import multiprocessing as mp\n"
        "from wmrl.cli import main\n"
        "main(['presets'])\n"
        "import datasets\n"
        "p = mp.get_context('spawn').Process(target=datasets.enable_progress_bars)\n"
        "p.start(); p.join()\n"
        "assert p.exitcode == 0\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_DATASETS_DISABLE_PROGRESS_BARS", "PYTHONWARNINGS")
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Cannot enable progress bars" not in done.stderr, done.stderr
