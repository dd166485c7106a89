import subprocess
import sys

from wmrl.cli import main
from wmrl.methods import METHODS


def test_help_lists_methods_and_presets():
    for args in (["--help"], ["run", "--help"], ["tasks", "--help"], ["presets", "--help"]):
        out = subprocess.run([sys.executable, "-m", "wmrl.cli", *args], capture_output=True, text=True)
        assert out.returncode == 0
        assert all(m in out.stdout for m in METHODS) and "toy" in out.stdout


def test_tasks_toy_prints_one_id_per_line(capsys):
    assert main(["tasks", "toy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 64 and lines[0].split("\t")[0] == "toy/context-0"


def test_errors_are_one_clear_line_and_exit_2(capsys, tmp_path):
    assert main(["run", "no-such-preset"]) == 2
    assert "unknown preset 'no-such-preset'; known presets:" in capsys.readouterr().err
    assert main(["tasks", "robots"]) == 2
    assert "unknown domain 'robots'" in capsys.readouterr().err
    assert main(["run", "toy", "--method=magic", "--out-dir", str(tmp_path)]) == 2
    assert "method='magic' is not one of" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nothing")]) == 2
    assert "config" in capsys.readouterr().err


def test_run_single_and_resume_finished_run(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "domain: {type: toy}\nexecutor: {type: inline}\ntracking: {wandb: disabled, progress: false}\n"
        "grpo: {steps: 3, tasks_per_step: 4}\n"
    )
    out = tmp_path / "run"
    assert main(["run", str(preset), "--out-dir", str(out), "--method=mix"]) == 0
    assert (out / "summary.json").exists() and (out / "config.yaml").exists()
    assert "eval/true_reward" in capsys.readouterr().out
    summary = (out / "summary.json").read_bytes()
    assert main(["run", "--resume", str(out)]) == 2  # already at its last step: nothing to resume
    assert "already finished" in capsys.readouterr().err
    assert (out / "summary.json").read_bytes() == summary  # not overwritten with {}
