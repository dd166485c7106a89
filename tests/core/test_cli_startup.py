"""The CLI's quick commands import no torch and no scikit-learn (seconds to import, tens of seconds
on a loaded machine): ``--help``, ``presets``, ``config``, ``tasks``, ``status`` and every parse
error answer at the pace of the interpreter's own start. Each command runs in a fresh interpreter
(this test process has torch loaded) that then reports which heavy modules were imported."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "sklearn", "scipy", "metaworld")
PROBE = (
    "import sys\n"
    "from wmrl.cli import main\n"
    "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
    f"print('PROBE', __import__('json').dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
)


def _probe(*argv: str, cwd: Path) -> tuple[int, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=cwd, timeout=300
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("PROBE "))
    code, heavy = json.loads(line.removeprefix("PROBE "))
    return code, heavy


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run folder as `wmrl status` finds one (its config.yaml, nothing trained yet)."""
    from wmrl.config import load_config, save_config

    run = tmp_path_factory.mktemp("startup") / "run"
    run.mkdir()
    save_config(load_config("toy", [f"--out_dir={run}"]), run / "config.yaml")
    return run


COMMANDS = {
    "help": (["--help"], 0),
    "run help": (["run", "--help"], 0),
    "presets": (["presets"], 0),
    "config": (["config", "toy", "--grpo.group_size=4"], 0),
    "config research": (["config", "research-debug"], 0),
    "tasks": (["tasks", "toy"], 0),
    "tasks research": (["tasks", "research"], 0),
    "tasks vla": (["tasks", "vla"], 0),
    "status": (["status", "{run}"], 0),
    "unknown preset": (["run", "tyo"], 2),
    "unknown field": (["run", "toy", "--grpo.group_sise=4", "--out-dir", "{tmp}/new"], 2),
    "bad value": (["run", "toy", "--grpo.lr=inf", "--out-dir", "{tmp}/new"], 2),
    "resume of nothing": (["run", "--resume", "{tmp}/none"], 2),
    "unknown command": (["rnu", "toy"], 2),
}


@pytest.mark.parametrize("case", list(COMMANDS))
def test_quick_commands_import_no_torch_or_sklearn(case, run_dir, tmp_path):
    argv, expected = COMMANDS[case]
    argv = [a.format(run=run_dir, tmp=tmp_path) for a in argv]
    code, heavy = _probe(*argv, cwd=tmp_path)
    assert code == expected
    assert heavy == [], f"`wmrl {' '.join(argv)}` imported {heavy}"


def test_a_run_still_imports_them_when_it_trains(tmp_path):
    """The lazy imports are imports all the same: a run that trains loads torch and works."""
    argv = ["run", "toy", "--grpo.steps=1", "--executor.type=inline", "--tracking.wandb=disabled",
            "--tracking.progress=false", "--out-dir", str(tmp_path / "run")]  # fmt: skip
    code, heavy = _probe(*argv, cwd=tmp_path)
    assert code == 0 and "torch" in heavy
